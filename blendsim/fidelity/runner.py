"""Simulate a catalogue row once, keep its steps' features, price them under any parameters.

Offline rows release every request at t=0. With a scheduler that does not read the clock or the cost
model (the engines' own FCFS schedulers), which Batch runs at each step depends only on the queue and
KV state, not on how long steps take -- so a row's schedule is simulated once and its makespan under
parameters theta is ``max over replicas of sum(step_time(features; theta))``, vectorised (tested in
tests/test_fidelity.py). Policies whose plan reads the cost model (``Policy.reads_cost_model``: :func:`reads_cost_model`) are re-simulated
with the final parameters.

Runs of pure-decode steps (the engine's fast-forward) are kept as up to ``GROUPS`` weighted groups
each at its mean context: decode attention is linear in the context, so the sum is exact for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blendsim.sim.batch import FEATURE_FIELDS, prefill_sums
from blendsim.sim.errors import UserError

from .catalogue import Skip


def reads_cost_model(policy: str) -> bool:
    """Whether ``policy``'s plan reads step prices (its class says so): its schedule then depends on the
    parameters and is re-simulated with the final ones."""
    from blendsim.policies.registry import resolve_policy

    return bool(resolve_policy(policy or "fcfs").cls.reads_cost_model)

GROUPS = 8
FIELDS = FEATURE_FIELDS  # a recorded step: BatchFeatures' fields, in order


class _Recorder:
    """An executor that prices with the run's cost model and keeps each step's features."""

    def __init__(self, cm):
        self.cm = cm
        self.rows: list[tuple] = []  # (weight, *FIELDS)
        self.last = (0.0, 0.0)

    def run(self, b) -> float:
        tp, pairs, pkv = prefill_sums(b.prefill)
        D = b.num_decode
        self.rows.append((1.0, tp + D, tp, len(b.prefill), pairs, pkv, D, b.decode_ctx_sum, b.num_logits))
        t, comp, mem = self.cm.step(tp + D, tp, len(b.prefill), pairs, pkv, D, b.decode_ctx_sum, b.num_logits,
                                    b.prefill)
        self.last = (comp, mem)
        return t

    def run_decodes(self, D: int, ctx):
        for part in np.array_split(np.asarray(ctx, dtype=np.float64), min(GROUPS, len(ctx))):
            self.rows.append((float(len(part)), D, 0, 0, 0, 0, D, float(part.mean()), D))
        return self.cm.decode_many(D, ctx)


class _PipeRecorder(_Recorder):
    """A pipelined replica's pricer (``sim.pipeline.StagePricer``) that keeps each batch's features and how many
    of the replica's virtual engines had work when it started (``active``: how full the pipe was)."""

    def __init__(self, pricer):
        self.pricer = pricer
        self.stages = pricer.stages
        self.rows = []
        self.active = []
        self.group = None  # the PipelinedReplica, set once it is built

    def _active(self) -> int:
        g = self.group
        return sum(1 for v, ve in enumerate(g.ves) if g._run[v] is not None or ve.scheduler.has_work())

    def run(self, b):
        tp, pairs, pkv = prefill_sums(b.prefill)
        D = b.num_decode
        self.rows.append((1.0, tp + D, tp, len(b.prefill), pairs, pkv, D, b.decode_ctx_sum, b.num_logits))
        self.active.append(self._active())
        return self.pricer.run(b)

    def server_s(self, num_logits, num_decode):
        return self.pricer.server_s(num_logits, num_decode)

    def run_decodes(self, D: int, ctx):
        n0 = len(self.rows)
        for part in np.array_split(np.asarray(ctx, dtype=np.float64), min(GROUPS, len(ctx))):
            self.rows.append((float(len(part)), D, 0, 0, 0, 0, D, float(part.mean()), D))
        self.active.extend([self._active()] * (len(self.rows) - n0))
        return self.pricer.run_decodes(D, ctx)


@dataclass
class RowSchedule:
    """One simulated row: per replica, its steps' features as arrays (``weight`` = steps per entry)."""

    replicas: list  # [dict field -> np.ndarray]
    input_tokens: int
    output_tokens: int
    requests: int
    makespan_s: float  # as simulated (the parameters in force then)
    policy: str


def deployment_for(row, profile):
    """The row's Deployment: model and hardware presets (or config.json), precision, TP, KV fraction."""
    from blendsim.sim.deployment import Deployment
    from blendsim.sim.hardware import get_hardware
    from blendsim.sim.models import get_model

    from .catalogue import engine_settings

    model = row.model
    if not _is_preset(model) and (row.folder / model).exists():
        model = str(row.folder / model)
    spec = get_model(model)
    hw = get_hardware(row.hardware)
    spec = apply_precision(spec, hw, row.weights, row.kv_dtype)
    sched = engine_settings(row, profile, hw)
    util = sched.get("gpu_memory_utilization", 0.9)
    mt = sched.get("token_budget", 8192)
    seqs = profile.seqs_per_stage(min(sched.get("max_seqs", 1024) or 1024, 1024), row.pp)  # as simulate sizes it
    return Deployment(spec, hw, row.tp, ep=row.ep, pp=row.pp,  # ep on a dense model: refused, as simulate does
                      gpu_memory_utilization=util,
                      max_batched_tokens=mt,
                      max_seqs=seqs,
                      kv_of_free=profile.kv_of_free, static_fraction=profile.static_fraction,
                      attn_dp=profile.attn_dp)


def _is_preset(name: str) -> bool:
    from blendsim.sim.models import PRESETS

    return name in PRESETS


def apply_precision(spec, hw, weights: str, kv_dtype: str):
    """The model at the row's weight and KV precision (Skip when the cost model has no such precision)."""
    try:
        return spec.with_precision(weights or None, kv_dtype or None)
    except UserError as e:
        raise Skip(str(e)) from None


def simulate_row(row, trace, params: dict | None = None) -> RowSchedule:
    """Simulate ``row`` on ``trace`` under its engine profile and record every step's features."""
    from blendsim.runner import RunConfig, prepare_run
    from blendsim.sim.build_cost import build_cost_model
    from blendsim.sim.engine import Cluster, PipelinedReplica, Replica
    from blendsim.sim.engines import get_profile, trtllm_bench_settings
    from blendsim.sim.kv_tiers import make_kv
    from blendsim.sim.pipeline import StagePricer
    from blendsim.sim.seq import RequestRecords

    from .catalogue import build_dataset, client_concurrency, engine_flags, engine_settings, row_engine_key

    key = row_engine_key(row)  # the row's engine at its version (NAME alone: the newest modelled), at its entry point
    prof = get_profile(key, params)
    dep = deployment_for(row, prof)
    if not row.workload.startswith("synth:") and (trace.output_len_hint < 0).all():
        # benchmark clients pass each request's output length as its max_tokens (ignore_eos): an engine
        # that reserves memory for max_tokens (trtllm's GUARANTEED_NO_EVICT) knows it
        trace = trace.take(np.arange(trace.n))
        trace.output_len_hint = trace.output_len.copy()
    limits = {}
    if prof.tuned_by == "trtllm-bench":  # the benchmark tool sizes batch and step from the dataset
        # (the one the engine was built from where the row says so: one engine run on several datasets)
        built = build_dataset(row)
        isl, osl = built or (float(trace.input_len.mean()), float(trace.output_len.mean()))
        bs, tok = trtllm_bench_settings(dep, isl, osl, row.pp, prof.scheduler.get("gpu_memory_utilization", 0.95))
        # limits the row's command states (--max_batch_size / --max_num_tokens) replace the tool's own, as
        # trtllm-bench takes the user's over its heuristic (tensorrt_llm/bench/benchmark/utils/general.py get_settings)
        stated = engine_flags(row)
        bs, tok = stated.get("max_seqs", bs), stated.get("token_budget", tok)
        # each attention-DP rank runs its own executor under these limits (the tool sizes them without attention DP)
        limits = {"max_seqs": bs * dep.dp, "token_budget": tok * dep.dp}
        cap = client_concurrency(row)  # a client's cap on requests in flight (--max-concurrency / --concurrency)
        if cap is not None:
            limits["max_seqs"] = min(limits["max_seqs"], cap)
    else:  # the engine's limits on this device and entry point, and the flags the row's command sets
        limits = {k: v for k, v in engine_settings(row, prof, dep.hardware).items()
                  if k in ("token_budget", "max_seqs", "gpu_memory_utilization", "prefix_caching")}
    cfg = RunConfig(policy=row.policy or "fcfs", model=dep.model.name, hardware=dep.hardware.name, tp=row.tp,
                    pp=row.pp, replicas=row.replicas, mode=prof.mode, engine=key, offline=True,
                    host_kv_gb=row.host_kv_gb, disk_kv_gb=row.disk_kv_gb, **limits)
    run = prepare_run(trace, cfg, deployment=dep,
                      cost_model=lambda d: build_cost_model(d, prof.mode, prof, params=params))
    rec = RequestRecords(run.trace.n)
    P, Dl = run.trace.input_len.tolist(), run.trace.output_len.tolist()
    hints = run.trace.output_len_hint.tolist()
    replicas, recorders = [], []
    pp = dep.pp
    for i in range(cfg.replicas * pp):
        kv = make_kv(run.tree, run.num_blocks, run.engine.block_size, run.engine.prefix_caching,
                     run.engine.prefix_retain, run.tiers)
        sched = run.policy.make_scheduler(i, kv=kv, cfg=run.engine, prompt_len=P, output_len=Dl, records=rec,
                                          record=False, output_hint=hints)
        if pp == 1:
            r = _Recorder(run.cost_model)
            recorders.append(r)
        else:  # one recorder per pipelined replica, over its virtual engines' batches in the order they start
            if i % pp == 0:
                recorders.append(_PipeRecorder(StagePricer(dep, run.cost_model_of)))
            r = recorders[-1]
        replicas.append(Replica(i, sched, r, fast_forward=run.engine.fast_forward,
                                kv_load=run.tiers.load_mode if run.tiers else "stall"))
    units = None
    if pp > 1:
        units = [PipelinedReplica(g, replicas[g * pp:(g + 1) * pp], r, run.engine.fast_forward)
                 for g, r in enumerate(recorders)]
        for u in units:
            u.pricer.group = u
    route = run.route_order
    makespan = Cluster(replicas, run.policy.make_router(replicas), run.trace.arrival_s, route, units).run()
    reps = []
    for r in recorders:
        a = np.asarray(r.rows, dtype=np.float64).reshape(-1, 1 + len(FIELDS))
        reps.append({"weight": a[:, 0], **{f: a[:, 1 + j] for j, f in enumerate(FIELDS)}})
        if pp > 1:
            reps[-1]["active"] = np.asarray(r.active, dtype=np.float64)
    return RowSchedule(reps, int(run.trace.input_len.sum()), int(run.trace.output_len.sum()), run.trace.n,
                       float(makespan), cfg.policy)


__all__ = ["reads_cost_model", "FIELDS", "RowSchedule", "apply_precision", "deployment_for", "simulate_row"]
