"""Run one simulation: trace + configuration -> results; write a run directory.

``run_simulation`` wires the pieces of DESIGN.md's data flow: the policy preprocesses the trace and
supplies router and schedulers, the cluster runs on simpy, a SimExecutor prices every Batch with the
cost model, and the metrics module turns the records into summary, step and request tables.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from blendsim.sim.errors import UserError
from blendsim.sim.rundir import RunResult, check_run_dir, schedule_table, write_run
from blendsim.sim.seq import EngineConfig, RequestRecords, int_list

ENGINE_FIELDS = ("token_budget", "max_seqs", "block_size", "round_tokens", "mix", "prefix_caching",
                 "prefix_retain", "gpu_memory_utilization", "fast_forward", "admission", "reserve_ratio", "kv_full")


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines a run besides the trace. ``None`` means "the policy's default"."""

    policy: str = "fcfs"  # a registered name, an entry point's, path/to/file.py:ClassName, or a Policy subclass
    model: str = "llama-3-8b"
    hardware: str = "a100-80gb"
    tp: int = 1
    replicas: int = 1
    mode: str | None = None  # None: the engine's (overlap for nanoflow, else sequential)
    engine: str | None = None  # engine key (sim.engines: NAME[@VERSION][:field=value]); None: DEFAULT_ENGINE
    profile: str | None = None  # calibration profile JSON
    dtype: str | None = None
    weights: str | None = None  # GEMM weight precision (None: the model's)
    kv_dtype: str | None = None  # KV-cache dtype (None: the model's)
    ep: int = 1  # expert-parallel degree (MoE models)
    pp: int = 1  # pipeline-parallel degree (stages per replica; each replica runs pp virtual engines)
    expert_skew: float = 0.0  # MoE routing skew (Zipf exponent of expert popularity; 0 uniform)
    token_budget: int | None = None
    max_seqs: int | None = None
    block_size: int | None = None
    round_tokens: int | None = None
    mix: str | None = None
    prefix_caching: bool | None = None
    prefix_retain: bool | None = None
    gpu_memory_utilization: float | None = None
    fast_forward: bool | None = None
    admission: str | None = None  # reserve or greedy
    reserve_ratio: float | None = None
    kv_full: str | None = None  # preempt or stall: what a decode finding no free KV block does (sim.seq.EngineConfig)
    offline: bool = False  # release every request at t=0
    seed: int = 0
    record_schedule: bool = False
    kv_capacity_override: int = 0  # bytes per replica (tests, replay on a smaller device)
    host_kv_gb: float = 0.0  # host-memory KV tier per replica (GB = 1e9 bytes; 0: none), sim.kv_tiers
    disk_kv_gb: float = 0.0  # local-NVMe KV tier per replica (GB; 0: none)
    kv_load: str | None = None  # stall | overlap | async: how a tier load meets the step (None: the engine profile's)
    host_link_gbps: float | None = None  # host link GB/s per GPU per direction (None: the hardware preset's)
    disk_read_gbps: float | None = None  # local NVMe GB/s per GPU (None: the preset's)
    disk_write_gbps: float | None = None
    options: dict = field(default_factory=dict)  # policy-specific options

    def __post_init__(self) -> None:
        from blendsim.sim.checks import check_run_config

        check_run_config(self)  # types and ranges of every field, whoever builds the configuration


def deployment_limits(eng: EngineConfig, profile) -> dict:
    """The Deployment settings a run's scheduler settings and engine profile give (its KV fraction and what it is a
    fraction of -- ``EngineProfile.kv_of_free``, ``static_fraction`` --, the largest step's tokens and sequences, attention data
    parallelism): one rule for simulate, plan's feasibility check and cost, so all three say the same of whether a
    model fits."""
    return {"gpu_memory_utilization": eng.gpu_memory_utilization, "max_batched_tokens": eng.token_budget,
            "max_seqs": eng.max_seqs or 1024, "kv_of_free": profile.kv_of_free,
            "static_fraction": profile.static_fraction, "attn_dp": profile.attn_dp}


def run_limits(cfg: RunConfig) -> tuple[EngineConfig, dict]:
    """The scheduler settings a run of ``cfg`` gets under its policy (:func:`engine_config`) and the Deployment
    settings they give (:func:`deployment_limits`): the one sizing rule of `simulate`, the feasibility checks of
    `plan` and `sweep`, and `cost`."""
    from blendsim.policies.registry import resolve_policy
    from blendsim.sim.engines import DEFAULT_ENGINE, get_profile

    eng = engine_config(cfg, resolve_policy(cfg.policy).cls)
    return eng, deployment_limits(eng, get_profile(cfg.engine or DEFAULT_ENGINE, {}))


def engine_config(cfg: RunConfig, policy_cls) -> EngineConfig:
    """The run's scheduler settings (see :func:`scheduler_settings`)."""
    return scheduler_settings(cfg, policy_cls)[0]


def scheduler_settings(cfg: RunConfig, policy_cls) -> tuple[EngineConfig, list[str]]:
    """EngineConfig defaults < the engine profile's (``--engine``, else ``DEFAULT_ENGINE``) < what the policy
    declares (``engine_defaults``) < the options given explicitly; and a note for every setting the policy
    changes from the engine's, and for an engine setting that changes what the policy does. A policy that
    reorders for prefix reuse (``needs_prefix_caching``) gets prefix caching on an engine that has it off
    (noted), and is refused when the options turn it off."""
    from blendsim.sim.engines import DEFAULT_ENGINE, get_profile

    prof = get_profile(cfg.engine or DEFAULT_ENGINE)
    engine = {f.name: getattr(EngineConfig(), f.name) for f in dataclasses.fields(EngineConfig)}
    try:
        from blendsim.sim.hardware import get_hardware

        # an offline job: the engine's limits for its offline entry point on this GPU
        engine.update(prof.scheduler_for(get_hardware(cfg.hardware), tp=cfg.tp, pp=cfg.pp))
    except UserError:
        engine.update(prof.scheduler)  # hardware that is not known yet: refused further on
    notes = []
    ranks = attn_dp_ranks(prof, cfg)
    if ranks == 1 and "attn_dp" in str(cfg.engine or ""):  # asked for, and nothing to spread
        from blendsim.sim.engines import parse_key

        try:
            asked = parse_key(str(cfg.engine)).overrides.get("attn_dp")
        except UserError:
            asked = None
        if asked:
            notes.append(f"attn_dp=1 changes nothing for {cfg.model} at tp {cfg.tp}: attention data parallelism "
                         f"spreads a MoE model's attention over a TP group of 2 or more")
    per_rank = {}
    if ranks > 1 and prof.limits_per_rank:  # each rank schedules under the engine's limits: the replica's are
        per_rank = {k: engine[k] for k in ("token_budget", "max_seqs")}  # ranks times them
        for k, v in per_rank.items():
            engine[k] = v * ranks
    if ranks > 1 and prof.attn_dp_reserve_scale != 1.0 and engine.get("admission") == "reserve":
        own = engine["reserve_ratio"]
        engine["reserve_ratio"] = round(own * prof.attn_dp_reserve_scale, 6)
        if cfg.reserve_ratio is None:
            notes.append(f"{prof.label} with attention data parallelism: reserve_ratio {engine['reserve_ratio']:g} "
                         f"({prof.attn_dp_reserve_scale:g} x its {own:g}: it admits less conservatively)")
    base = dict(engine)
    who = getattr(policy_cls, "name", "policy")
    for k, v in policy_cls.engine_defaults.items():
        if engine.get(k) != v:
            notes.append(f"{who}: {k} {_show(v, k)} (policy) over {prof.label}'s {_show(engine.get(k), k)}")
        base[k] = v
    needs = getattr(policy_cls, "needs_prefix_caching", False)
    if needs and cfg.prefix_caching is False:
        raise UserError(f"policy {who} orders requests for prefix reuse and cannot run with prefix caching "
                        "off (--no-prefix-cache); drop that option or choose another policy")
    if needs and not base["prefix_caching"]:
        base["prefix_caching"] = True
        notes.append(f"{who}: prefix_caching on (the policy orders for prefix reuse) over {prof.label}'s off")
    elif not base["prefix_caching"] and cfg.prefix_caching is None and "prefix_caching" in prof.scheduler:
        notes.append(f"{prof.label}: prefix_caching off (engine): {who} reuses no cached prefix (--prefix-cache, "
                     f"or prefix_caching=True from Python, turns it on)")
    for k in ENGINE_FIELDS:
        v = getattr(cfg, k)
        if v is not None:
            base[k] = v
    shown = [f"{k} {base[k] or 'no cap'} ({v or 'no cap'} on each of its {ranks} ranks)" for k, v in per_rank.items()
             if base[k] == engine[k]]  # as the engine sets it: not the policy's, not given
    if shown:
        notes.append(f"{prof.label} schedules each attention-DP rank on its own: the replica's {' and '.join(shown)}")
    share = prof.seqs_per_stage(base["max_seqs"], cfg.pp)
    shared = cfg.pp > 1 and prof.seqs_shared_by_stages and base["max_seqs"]
    if shared:  # one scheduler for the pipeline's micro-batches: its cap bounds all pp in flight
        if base["max_seqs"] < cfg.pp:  # fewer sequences than micro-batches: stages idle, which a share cannot say
            raise UserError(f"max_seqs {base['max_seqs']} under {prof.label} with --pp {cfg.pp}: its one scheduler "
                            f"bounds all {cfg.pp} pipeline micro-batches together, so {cfg.pp - base['max_seqs']} of "
                            f"them would run empty, which the simulator does not model (it gives each micro-batch "
                            f"an equal share); use a max_seqs of at least {cfg.pp}")
        left = base["max_seqs"] - share * cfg.pp
        notes.append(f"{prof.label} schedules its {cfg.pp} pipeline micro-batches from one scheduler: max_seqs "
                     f"{base['max_seqs']} bounds them all, {share} in each"
                     + (f" ({left} of the cap unused: the simulator shares it equally)" if left else ""))
        base["max_seqs"] = share
    if base["round_tokens"] and base["round_tokens"] > base["token_budget"]:
        notes.append(f"round_tokens {base['round_tokens']} exceeds the token budget {base['token_budget']}: a step "
                     f"cannot hold one multiple of it, so steps are not rounded")
    return EngineConfig(**base), notes


def attn_dp_ranks(prof, cfg: RunConfig) -> int:
    """GPUs the engine ``prof`` spreads a replica's sequences over with attention data parallelism, as the run's
    Deployment will (``sim.deployment.attn_dp_gpus``); 1 for a model name that is not known yet (refused further
    on)."""
    if not prof.attn_dp or cfg.tp <= 1:  # no model to read
        return 1
    from blendsim.sim.deployment import attn_dp_gpus
    from blendsim.sim.models import get_model

    try:
        return attn_dp_gpus(get_model(cfg.model, cfg.dtype, cfg.weights, cfg.kv_dtype), cfg.tp, prof.attn_dp)
    except UserError:
        return 1


def overlap_what_if(mode, engine) -> list[str]:
    """A note where ``--mode overlap`` prices an engine that runs its operators one after another (a what-if):
    `simulate` and `cost` say the same."""
    if mode == "overlap" and engine.mode != "overlap" and engine.name != "ideal":
        return [f"--mode overlap: {engine.label} runs its operators one after another; this prices it with "
                f"NanoFlow-style overlap of compute-, memory- and network-bound operators (a what-if)"]
    return []


def _show(v, key: str = "") -> str:
    if key == "max_seqs" and v == 0:  # the sequence cap's 0 is none at all
        return "0 = no cap"
    return ("on" if v else "off") if isinstance(v, bool) else str(v)


@dataclass
class Prepared:
    """A run wired up to the point where replicas are built: what the simulator and the live device
    run (``blendsim.real_backend.live``) share."""

    trace: object  # the trace as run (offline: every arrival at 0)
    engine: EngineConfig
    deployment: object  # sim.deployment.Deployment
    cost_model: object  # sim.cost.CostModel
    tree: object  # sim.prefix_tree.PrefixTree
    num_blocks: int  # KV blocks per replica
    policy: object  # the prepared policies.base.Policy
    policy_ref: object = None  # policies.base.PolicyRef: how runs label the policy and where it came from
    notes: list = field(default_factory=list)  # scheduler settings the policy or engine changed (printed)
    tiers: object = None  # sim.kv_tiers.TierSpec of the host/disk KV tiers, or None (GPU only)
    cost_model_of: object = None  # Deployment -> CostModel (a pipeline stage's pricer is built with it)

    @property
    def route_order(self) -> np.ndarray:
        """The order requests are handed to the router: by arrival, then the policy's rank."""
        return np.lexsort((self.policy._rank, self.trace.arrival_s))


def calibrated_elsewhere(prof, hardware: str) -> list[str]:
    """A note when a ``blendsim calibrate engine`` profile prices a GPU other than the one it was fitted on: the
    engine's fitted loop applies, that GPU's efficiencies are the shipped ones."""
    if not getattr(prof, "params_file", ""):
        return []
    from blendsim.sim.engines import load_params

    params = load_params(prof.params_file)
    fitted_on = (params.get("profile") or {}).get("hardware")
    if not fitted_on or fitted_on == hardware:
        return []
    return [f"{prof.label}: calibrated on {fitted_on}, run on {hardware}: its fitted engine loop applies, "
            f"{efficiencies_carried(params, hardware)}"]


def fitted_for_arch(head: dict, arch: str) -> list[str]:
    """The kernel efficiencies a calibrated profile's header (``head``) says its fit moved for GPUs of ``arch`` (none
    where it kept the values it started from)."""
    return [] if head.get("kept_shipped") else sorted(
        n.split(".")[-1] for n in head.get("fitted") or [] if n.startswith(f"arch.{arch}."))


def efficiencies_carried(params: dict, hardware: str) -> str:
    """What a calibrated profile's ``params`` price on ``hardware`` besides its loop: the kernel efficiencies it fitted
    for that GPU's architecture, which apply there as on the GPU it was fitted on (efficiencies are looked up per
    architecture, blendsim.sim.efficiency), else none."""
    from blendsim.sim.hardware import get_hardware

    arch = get_hardware(hardware).arch
    own = fitted_for_arch(params.get("profile") or {}, arch)
    if own:
        return (f"and so do the kernel efficiencies it fitted for every {arch} GPU ({', '.join(own)}); "
                f"{hardware}'s others are the shipped ones")
    return f"{hardware}'s kernel efficiencies are the shipped ones"


def prepare_run(trace, cfg: RunConfig, deployment=None, cost_model=None) -> Prepared:
    """Check the trace fits the deployment, build the cost model and prefix tree, prepare the policy.

    ``deployment`` (a Deployment) and ``cost_model`` (deployment -> CostModel) replace the ones built from
    ``cfg``'s names (``blendsim fidelity``: a row's precision and fitted parameters)."""
    from blendsim.policies.registry import resolve_policy
    from blendsim.sim.build_cost import build_cost_model
    from blendsim.sim.deployment import Deployment
    from blendsim.sim.engines import DEFAULT_ENGINE, get_profile
    from blendsim.sim.hardware import get_hardware
    from blendsim.sim.models import get_model
    from blendsim.sim.policy import PolicyContext
    from blendsim.sim.prefix_tree import PrefixTree

    if cfg.offline:
        trace = trace.offline()
    if trace.n == 0:
        raise UserError("the trace has no requests")
    ref = resolve_policy(cfg.policy)
    policy_cls = ref.cls
    eng, notes = scheduler_settings(cfg, policy_cls)
    dep = deployment or Deployment(get_model(cfg.model, cfg.dtype, cfg.weights, cfg.kv_dtype),
                                   get_hardware(cfg.hardware), cfg.tp, ep=cfg.ep, pp=cfg.pp,
                                   expert_skew=cfg.expert_skew, kv_capacity_override=cfg.kv_capacity_override,
                                   **deployment_limits(eng, get_profile(cfg.engine or DEFAULT_ENGINE, {})))
    cost_model_of = cost_model or (lambda d: build_cost_model(d, cfg.mode, cfg.engine or DEFAULT_ENGINE, cfg.profile))
    cm = cost_model_of(dep)
    eng = running_from_pool(eng, cm.engine, dep, cfg, policy_cls)
    notes = notes + calibrated_elsewhere(cm.engine, dep.hardware.name) + server_note(cm.engine) + \
        inert_server_fields(cm.engine) + inert_serve(cm.engine) + newer_than_modelled(cm.engine) + \
        inert_attn_dp(cm.engine, dep) + inert_options(cfg, dep)
    notes += overlap_what_if(cfg.mode, cm.engine)
    tree = PrefixTree(trace)
    total = trace.input_len + trace.output_len
    if total.max() > dep.model.max_position_embeddings:
        i = int(np.argmax(total))
        raise UserError(
            f"request {trace.ids[i]} (row {i + 1}) needs a context of {int(total[i])} tokens (prompt "
            f"{int(trace.input_len[i])} + output {int(trace.output_len[i])}), beyond {dep.model.name}'s "
            f"{dep.model.max_position_embeddings}; use a longer-context model or its config.json, or drop or cut "
            f"such requests: blendsim workloads load FILE -f FORMAT --max-context {dep.model.max_position_embeddings} "
            "--long skip|truncate -o NEW.parquet (-f trace for a blendsim trace)"
        )
    B = eng.block_size
    blocks = dep.num_blocks(B) // dep.pp  # pipeline: each virtual engine its share (vLLM's virtual engines)
    need = -(-(trace.input_len + trace.output_len) // B)
    if need.max() > blocks:
        i = int(np.argmax(need))
        if int(total[i]) <= dep.kv_capacity_tokens:  # the tokens fit; whole blocks of this size do not
            raise UserError(
                f"--block-size {B}: request {trace.ids[i]} (row {i + 1}) needs {int(need[i])} KV block(s) of {B} "
                f"tokens for its {int(total[i])} tokens, more than a replica holds ({blocks} blocks, "
                f"{dep.kv_capacity_tokens} tokens of {dep.model.name} on {dep.hardware.name} x{dep.tp}); use a "
                f"smaller --block-size"
            )
        raise UserError(
            f"request {trace.ids[i]} (row {i + 1}) needs {int(need[i]) * B} KV tokens (prompt {int(trace.input_len[i])} "
            f"+ output {int(trace.output_len[i])}), more than a replica holds ({blocks * B} tokens of "
            f"{dep.model.name} on {dep.hardware.name} x{dep.tp}); use more GPUs per replica (--tp)"
        )
    del total, need  # two per-request columns, not kept while the policy prepares
    from blendsim.sim.kv_tiers import kv_load_mode, tier_spec

    tiers = tier_spec(dep, B, cfg.host_kv_gb, cfg.disk_kv_gb,
                      kv_load_mode(cfg.kv_load, cfg.engine or DEFAULT_ENGINE),
                      cfg.host_link_gbps, cfg.disk_read_gbps, cfg.disk_write_gbps, replicas=cfg.replicas)
    _freeze(tree)  # what a policy reads, read-only as the trace is: a write raises where the policy made it
    ctx = PolicyContext(trace=trace.readonly(), tree=tree, deployment=dep, cost_model=cm, engine=eng,
                        replicas=cfg.replicas * dep.pp,
                        seed=cfg.seed, options=dict(cfg.options), num_blocks=blocks, tiers=tiers)
    policy = policy_cls(ctx)
    policy.prepare()
    policy._finalize()
    return Prepared(trace, eng, dep, cm, tree, blocks, policy, ref, notes, tiers, cost_model_of)


def _freeze(tree) -> None:
    """The prefix tree's arrays read-only (the engine only reads them once built): a policy that writes to
    ``ctx.tree`` gets one line naming its own line instead of a run the engine trips over later."""
    for name in ("parent", "tokens", "start", "level", "req_node", "child_index", "child_offsets", "term_index",
                 "term_offsets"):
        a = getattr(tree, name, None)
        if isinstance(a, np.ndarray):
            a.flags.writeable = False


def running_from_pool(eng, prof, dep, cfg, policy_cls):
    """``eng`` with the engine's own cap on requests run at once where it follows from the KV pool
    (``EngineProfile.running_cap``: SGLang's request pool), unless the options or the policy set one. Under attention
    data parallelism each rank has its pool and its cap."""
    if not prof.running_from_pool or cfg.max_seqs is not None or "max_seqs" in policy_cls.engine_defaults:
        return eng
    ranks = max(dep.dp, 1)
    cap = prof.running_cap(dep.kv_capacity_tokens // ranks, dep.model.max_position_embeddings) * ranks
    return dataclasses.replace(eng, max_seqs=cap) if cap else eng


def server_note(prof) -> list[str]:
    """A note where an API server's own work beside the engine paces the run's steps (``EngineProfile.server_s``)."""
    if not prof.server_apart:
        return []
    cap = f"; at most {1 / prof.server_token_s:,.0f} output tokens/s per replica" if prof.server_token_s else ""
    return [f"{prof.label}: behind its API server, whose own work beside the engine -- "
            f"{prof.server_token_s * 1e6:.3g} us per streamed token, {prof.server_request_s * 1e3:.3g} ms per request "
            f"-- sets the pace of any step the engine would run faster{cap}"]


def newer_than_modelled(prof) -> list[str]:
    """A note where the engine key names a major release beyond every modelled one of its engine (``vllm@9``, a typo
    for ``vllm@0.9`` perhaps, or ``trtllm@2.0``): it is priced by the newest profile, as a release between two
    modelled ones is by the older, but nothing of that release's own is modelled. A later minor release of the newest
    one's series (``vllm@0.11`` by ``vllm@0.8``) is what that profile is for, and is not noted (simulate, cost)."""
    from blendsim.sim.engines import PROFILES, is_profile_file, parse_key, version_order

    key = prof.key or ""
    if not key:
        return []
    # a calibrated profile file: the release its header names
    name, version = (prof.name, prof.release) if is_profile_file(key) else parse_key(key)[:2]
    newest = PROFILES.get(name)
    if not version or newest is None or not newest.version or newest.version != prof.version \
            or version_order(version)[:1] <= version_order(newest.version)[:1]:
        return []
    return [f"engine {name}@{version}{f' ({key})' if is_profile_file(key) else ''} is a major release beyond every "
            f"modelled one of {name}: priced as {newest.name}@{newest.version}, the newest (blendsim engines lists "
            f"them)"]


def inert_server_fields(prof) -> list[str]:
    """A note where the engine key sets the API server's work for a run off the server (``serve=0``): it changes
    nothing (simulate, cost)."""
    from blendsim.sim.engines import is_profile_file, parse_key

    key = prof.key or ""
    if prof.serve or not key or is_profile_file(key):
        return []
    given = [k for k in parse_key(key).overrides if k.startswith("server_")]  # sim.engines.OVERRIDABLE's
    if not given:
        return []
    one = len(given) == 1
    return [f"{prof.label}: {' and '.join(given)} {'is' if one else 'are'} the API server's work and this run is "
            f"offline (serve=0): {'it changes' if one else 'they change'} nothing; add serve=1"]


def inert_serve(prof) -> list[str]:
    """A note where the engine key asks for its API server (``serve=1``) and the profile prices no work of one: the
    run is priced as an offline one, which the user should not have to find out by comparing (simulate, cost)."""
    if not prof.serve or prof.serve_priced:
        return []
    return [f"{prof.label}: serve=1 changes nothing: {prof.modelled} models no work of its API server (no server "
            f"in the engine's process, no served loop or server stage fitted), so this run is priced as an offline "
            f"one"]


def skew_note(expert_skew: float, model) -> list[str]:
    """A note where ``--expert-skew`` is given for a model with no routed experts (simulate, cost)."""
    if expert_skew and not model.is_moe:
        return [f"--expert-skew {expert_skew:g}: {model.name} has no routed experts; it changes nothing"]
    return []


def inert_attn_dp(prof, dep) -> list[str]:
    """A note where the engine key asks for attention data parallelism (``attn_dp=1``) but the deployment has nothing
    to split that way: a dense model (its attention and MLP split alike over TP; replicas are plain data parallelism) or
    one GPU per replica (simulate, cost, sweep)."""
    from blendsim.sim.engines import is_profile_file, parse_key

    key = getattr(prof, "key", "") or ""
    asked = bool(key) and not is_profile_file(key) and parse_key(key).overrides.get("attn_dp")
    if not asked or dep.dp > 1:  # a profile's own default (trtllm's) is not something the user asked for
        return []
    why = ("the model is dense (attention data parallelism pairs data-parallel attention with tensor- or "
           "expert-parallel experts; a dense model's TP replicas split attention and MLP alike)"
           if not dep.model.is_moe else "a replica is one GPU (TP 1)")
    if prof.reserve_from_settings or prof.attn_dp_reserve_gib:  # the flag's memory reserve is the server's, as given
        return [f"engine {prof.label}: attention data parallelism (attn_dp) splits nothing here: {why}; only the "
                f"memory the engine sets aside for it changes (a smaller KV fraction)"]
    return [f"engine {prof.label}: attention data parallelism (attn_dp) changes nothing here: {why}"]


def inert_options(cfg: RunConfig, dep) -> list[str]:
    """Notes for options this run accepts but that cannot change it: routing skew on a model with no routed experts,
    tier settings with no KV tier."""
    return skew_note(cfg.expert_skew, dep.model) + inert_tier_options(cfg)


def inert_tier_options(cfg: RunConfig) -> list[str]:
    """A note for KV-tier settings (load mode, link and drive speeds) given to a run with no tier they act on."""
    flags = (("--kv-load", cfg.kv_load), ("--host-link-gbps", cfg.host_link_gbps),
             ("--disk-read-gbps", cfg.disk_read_gbps), ("--disk-write-gbps", cfg.disk_write_gbps))
    if not (cfg.host_kv_gb or cfg.disk_kv_gb):
        lacking = "no KV tier (--host-kv-gb / --disk-kv-gb 0)"
    elif not cfg.disk_kv_gb:  # a host tier: only the disk's speeds are idle
        lacking, flags = "no disk tier (--disk-kv-gb 0)", flags[2:]
    else:
        return []
    notes = []
    given = [flag for flag, v in flags if v is not None]
    if given:
        notes.append(f"{', '.join(given)}: {lacking}; {'it changes' if len(given) == 1 else 'they change'} nothing")
    return notes


# A run of at least this many requests collects its live state's reference cycles (simpy processes <-> replicas)
# before the result tables are built, where a large run's memory would otherwise peak. A smaller run leaves them to
# the collector's own schedule: a full collection costs time in proportion to everything the process holds, and a
# process that runs many small simulations (plan, fidelity, a sweep worker) paid it on each (up to ~0.4 s a run).
GC_RUN_REQUESTS = 100_000


def _build_replicas(run: Prepared, cfg: RunConfig, rec, tick=None, spill_dir=None):
    """The run's replicas (a pipelined replica's virtual engines, each with its own scheduler and KV cache), the
    units that run their steps, the policy's router and the order requests are handed to it:
    ``(replicas, units, router, route_order)``."""
    from blendsim.sim.engine import Replica, SimExecutor, pipelined_units
    from blendsim.sim.kv_tiers import StageLinks, make_kv
    from blendsim.sim.pipeline import StagePricer

    trace, eng, dep, cm, policy = run.trace, run.engine, run.deployment, run.cost_model, run.policy
    # plain lists: the schedulers index these per admission and per step, and a list item reads 2-3x faster than
    # an array('q') item (measured: the array columns cost the 400,000-request dfs run about 5%)
    P, Dl, hints = int_list(trace.input_len), int_list(trace.output_len), int_list(trace.output_len_hint)
    replicas = []
    ff = eng.fast_forward and not cfg.record_schedule
    pricer = StagePricer(dep, run.cost_model_of) if dep.pp > 1 else None
    links = None
    for i in range(cfg.replicas * dep.pp):
        if run.tiers is not None and dep.pp > 1 and i % dep.pp == 0:
            links = StageLinks(run.tiers)  # a pipelined replica's stages' links, shared by its virtual engines
        kv = make_kv(run.tree, run.num_blocks, eng.block_size, eng.prefix_caching, eng.prefix_retain, run.tiers,
                     links)
        sched = policy.make_scheduler(i, kv=kv, cfg=eng, prompt_len=P, output_len=Dl, records=rec,
                                      record=cfg.record_schedule, output_hint=hints)
        replicas.append(Replica(i, sched, pricer or SimExecutor(cm), fast_forward=ff, progress=tick,
                                kv_load=run.tiers.load_mode if run.tiers else "stall", spill_dir=spill_dir))
    units = pipelined_units(replicas, dep.pp, pricer, ff)
    router = policy.make_router(replicas)
    return replicas, units, router, run.route_order


def offline_routes(trace, cfg: RunConfig, with_order: bool = False) -> tuple:
    """``(engine of each request, virtual engines per replica)`` of an offline run of ``trace`` under ``cfg``, without
    running a step: the router each engine's own scheduler and prefix cache sees a request from (a replica is its
    engines ``i // pp``). Every request of an offline run arrives at 0, so the run's arrival process
    (``sim.engine.Cluster``) hands all of them to the router, in ``route_order``, before any replica's first step;
    this does the same with the same replicas, router and order (``blendsim plan`` splits its work estimate so).
    ``with_order``: the hand-over order (``Prepared.route_order``) as a third item. The global generators are seeded as
    a run seeds them (:func:`seeded_global_rngs`), so a policy drawing from them ranks as in the run."""
    if not cfg.offline:
        raise ValueError("offline_routes: an offline run only (cfg.offline)")
    with seeded_global_rngs(cfg.seed):
        return _offline_routes(trace, cfg, with_order)


def _offline_routes(trace, cfg: RunConfig, with_order: bool) -> tuple:
    from blendsim.policies.base import Policy, RoundRobin, get_router

    run = prepare_run(trace, cfg)
    out = np.empty(run.trace.n, dtype=np.int64)
    policy = run.policy
    order = run.route_order
    if type(policy).make_router is Policy.make_router and get_router(policy.router) is RoundRobin:
        # the default router reads no replica: the i-th request handed over goes to engine i mod engines
        out[order] = np.arange(run.trace.n) % (cfg.replicas * run.deployment.pp)
    else:
        rec = RequestRecords(run.trace.n)
        replicas, _units, router, order = _build_replicas(run, cfg, rec)
        for req in order.tolist():  # as Cluster._arrival_process at t = 0
            i = router.route(req, 0.0)
            replicas[i].deliver(req, 0.0)
            out[req] = i
    return (out, run.deployment.pp, order) if with_order else (out, run.deployment.pp)


@contextlib.contextmanager
def seeded_global_rngs(seed: int):
    """Python's and numpy's global generators seeded from the run's seed while it runs, the caller's states given back
    after: a policy or scheduler that draws from ``random`` or ``np.random`` without a seed of its own (instead of
    ``self.ctx.seed``) gives the same run every time, and a caller's own random stream is not disturbed."""
    import random

    py, npy = random.getstate(), np.random.get_state()
    random.seed(int(seed))
    np.random.seed(int(seed) % 2**32)
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)


def run_simulation(trace, cfg: RunConfig, progress=None, spill_dir=None) -> RunResult:
    """Simulate ``trace`` under ``cfg``. ``progress(finished_requests)`` is called now and then, and at the end.

    ``spill_dir``: a folder where the step logs write their rows as the run goes (a temporary folder inside it,
    removed with the result), so a long run's memory does not grow with its steps; the result's ``steps`` are
    then read from there (``write_run`` streams them into steps.parquet). None: kept in memory. Python's and
    numpy's global generators are seeded from ``cfg.seed`` for the run (:func:`seeded_global_rngs`)."""
    with seeded_global_rngs(cfg.seed):
        return _run_simulation(trace, cfg, progress, spill_dir)


def _run_simulation(trace, cfg: RunConfig, progress, spill_dir) -> RunResult:
    from blendsim.sim.bounds import trace_work
    from blendsim.sim.density import Rates, bounds
    from blendsim.sim.engine import Cluster
    from blendsim.sim.kv_tiers import tier_notes, tier_settings_used, tier_summary
    from blendsim.sim.metrics import per_request_table, summarize

    run = prepare_run(trace, cfg)
    if cfg.record_schedule and run.tiers is not None:
        raise UserError("--record-schedule records a schedule for the replay, which has no host/disk KV tiers: "
                        "drop --host-kv-gb/--disk-kv-gb or --record-schedule")
    trace, eng, dep, cm, tree, blocks, policy = (run.trace, run.engine, run.deployment, run.cost_model, run.tree,
                                                  run.num_blocks, run.policy)
    B = eng.block_size
    bnd = bounds(trace.input_len, trace.output_len, tree.optimal_sharing_ratio(), Rates.of(dep, cm.kappa))
    # for summarize's T_o, made here: the tree is freed before the final tables
    work = trace_work(trace, tree, shared_decode=policy.reads_shared_prefix_once())

    rec = RequestRecords(trace.n)
    tick = (lambda: progress(rec.n_finished)) if progress else None
    replicas, units, router, route_order = _build_replicas(run, cfg, rec, tick, spill_dir)
    cluster = Cluster(replicas, router, trace.arrival_s, route_order, units)
    cluster.run()
    if progress is not None:  # the last report: every request finished
        progress(rec.n_finished)
    rec = rec.arrays(copy=False)
    if np.isnan(rec.finish_s).any():
        i = int(np.flatnonzero(np.isnan(rec.finish_s))[0])
        from blendsim.sim.engine import users_scheduler

        own = sorted({users_scheduler(r.scheduler) for r in replicas} - {""})
        if own:  # a user's scheduler that dropped a request (a requeue or take_candidate that loses it)
            raise UserError(f"request {trace.ids[i]} (row {i + 1}) never finished: the policy's scheduler {own[0]} lost "
                            f"it (a request handed to a scheduler stays in self.waiting until it is taken, and is put "
                            f"back by requeue() when preempted)")
        raise RuntimeError(f"simulation ended with request {i} unfinished (engine bug)")

    steps = [r.log.cols for r in replicas]
    kv_stats = {"total": blocks, "evicted": int(sum(r.scheduler.kv.evicted_blocks for r in replicas))}
    tiers = {"host_kv_gb": float(cfg.host_kv_gb or 0.0), "disk_kv_gb": float(cfg.disk_kv_gb or 0.0),
             **tier_settings_used(run.tiers, dep),
             **tier_summary([r.scheduler.kv for r in replicas], run.tiers,
                            sum(r.scheduler.hit_tokens for r in replicas), B, sum(r.load_stall_s for r in replicas),
                            dep.pp)}
    # the options given (--opt), as the policy read them: two runs of one policy that differ only there say why
    given = {k: policy.opt[k] for k in sorted(cfg.options) if k in getattr(policy, "opt", {})}
    own = policy.summary_extra()  # the policy's figures: beside the run's, never in place of them (below)
    extra = {**tiers, **run.policy_ref.summary(), **pipeline_summary(dep),
             **({"policy_options": given} if given else {})}
    schedule = schedule_table([r.scheduler for r in replicas]) if cfg.record_schedule else None
    # the run's live state (schedulers, KV caches, prefix tree, policy, the schedulers' per-request lists) is not
    # needed for the tables: free it before they are built, where a large run's memory would otherwise peak
    del replicas, units, router, cluster, policy, tree, tick
    run.policy = run.tree = None
    if trace.n >= GC_RUN_REQUESTS:  # the simpy processes and the replicas refer to each other
        gc.collect()
    per_req = per_request_table(trace, rec, steps)
    summary = summarize(trace=trace, rec=rec, steps_by_replica=steps, bounds=bnd, cfg=cfg, cost_model=cm,
                        engine_cfg=eng, kv_stats=kv_stats, per_req=per_req, extra=extra, work=work)
    clash = sorted(set(own) & (set(summary) | {"policy_options"}))  # policy_options: the given ones only
    if clash:  # a policy's summary_extra() may add figures, not replace the run's measured ones or its provenance
        raise UserError(f"policy {run.policy_ref.label}: summary_extra() returns {', '.join(map(repr, clash[:5]))}"
                        f"{' ...' if len(clash) > 5 else ''}, which the run's summary reports itself; name them "
                        f"otherwise (e.g. with the policy's name as a prefix)")
    summary.update(own)
    requests = {
        "id": _strs(trace.ids), "source": _strs(trace.source), "replica": rec.replica // dep.pp,
        "arrival_s": trace.arrival_s, "input_len": trace.input_len, "output_len": trace.output_len,
        "generated_tokens": rec.generated, "cached_tokens": rec.cached_tokens, "recomputed_tokens": rec.recomputed_tokens,
        "prefill_computed": rec.prefill_computed, "preemptions": rec.preemptions, "admit_s": rec.admit_s,
        "first_token_s": rec.first_token_s, "finish_s": rec.finish_s, **per_req,
    }
    if schedule is not None:
        schedule["_meta"] = {"block_size": B, "kv_capacity_blocks": blocks, "model": dep.model.name,
                             "policy": run.policy_ref.label, "dtype": dep.model.dtype, "tp": dep.tp}
    return RunResult(summary, steps, requests, schedule, run.notes + cm.notes() + dep.topology_notes()
                     + tier_notes(summary), trace)


def _strs(a: np.ndarray) -> np.ndarray:
    """``a.astype(str)`` where that differs from what the Parquet writer makes of ``a`` (``str`` of each value;
    a None), else ``a`` itself: a 10M-request trace's ids as a fixed-width copy would hold 0.3 GB more."""
    if a.dtype.kind == "T" or (a.dtype == object and not np.equal(a, None).any()):
        return a
    return a.astype(str)


def pipeline_summary(dep) -> dict:
    """summary.json fields of a pipeline-parallel or multi-node deployment, or of attention data parallelism (none for
    one stage on one node with attention split, so such runs' summaries are unchanged)."""
    adp = {"attn_dp_gpus": dep.dp} if dep.dp > 1 else {}
    if dep.pp == 1 and dep.nodes == 1:
        return adp
    return {"pp": dep.pp, "stage_layers": dep.stage_layers(), "nodes": dep.nodes,
            "tp_link": "network" if dep.tp_spans_nodes else "scale-up",
            "pp_links": ["network" if dep.pp_crosses(i) else "scale-up" for i in range(dep.pp - 1)],
            "virtual_engines_per_replica": dep.pp, **adp}


@functools.cache
def simulator_digest(worker: tuple) -> str:
    """A digest of what a simulation's figures depend on besides its inputs: the sources of the simulator, the
    policies and the trace code, with the shipped fitted parameters and presets beside them (sim/*.json), and of the
    run's set-up and the command's own (blendsim/runner.py, options.py, and ``worker``: the files that build a
    plan's or sweep's runs from its options, relative to the blendsim package). A plan or sweep folder made by
    another version is not resumed."""
    import hashlib

    import blendsim.policies
    import blendsim.sim
    import blendsim.workloads

    def tree(mod) -> tuple:
        root = Path(mod.__file__).parent
        return mod.__name__, root, sorted(p for p in root.rglob("*") if p.suffix in (".py", ".json", ".csv")
                                          and p.is_file() and "__pycache__" not in p.parts
                                          and p.name != "_compiled_manifest.json")

    top = Path(__file__).resolve().parent  # the blendsim package (this file's folder)
    h = hashlib.sha256()
    for name, root, files in [tree(m) for m in (blendsim.sim, blendsim.policies, blendsim.workloads)] + [
            ("blendsim", top, [top / "runner.py", top / "options.py", *(top / w for w in worker)])]:
        for f in files:
            h.update(f"{name}/{f.relative_to(root).as_posix()}\0".encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


# re-exported: the run-directory helpers are part of the runner's public surface
__all__ = ["Prepared", "RunConfig", "RunResult", "check_run_dir", "engine_config", "offline_routes", "prepare_run",
           "run_simulation", "schedule_table", "scheduler_settings", "simulator_digest", "write_run"]
