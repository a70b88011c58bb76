"""Engine profiles as data: what a serving engine does besides the kernels the cost model prices.

A profile holds an engine's scheduler defaults (token budget, sequence cap, chunked prefill or
prefill-first, KV memory fraction, block size, prefix cache, admission), its per-step overhead (CPU
scheduling, sampling and launches the GPU waits for), its CUDA-graph capture sizes (a pure-decode step
runs at the next captured batch size: padded rows cost GEMM time), its execution mode (operator overlap
only where the engine overlaps) and the name of its kernel-efficiency regime (``blendsim.sim.efficiency``).

This module is the only place an engine is defined (``ideal``, pure kernel time, is a profile too).
``--engine KEY`` selects one everywhere, where KEY is ``NAME[@VERSION][:field=value,...]``
(:func:`parse_key`): ``NAME`` alone is the newest registered version of that engine, and the fields after
the colon (:data:`OVERRIDABLE`) override *that profile's* values and nothing else; ``field=value,...``
with no name starts from ``ideal``. Profiles are registered under ``(name, version)`` (:func:`register`);
today every engine has one, unversioned (``version`` ""). A policy keeps its own ordering on any engine.
The fixed numbers are cited below; the fitted ones (the per-step loops of trtllm, vllm@0.5, vllm@0.6, vllm@0.8 --
offline and, under ``vllm@0.8:serve``, behind its API server -- and sglang@0.3, each from a cited prior, and the
hardware efficiencies) are read from ``sim/engine_params.json``, written by ``blendsim fidelity --refit``.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from blendsim.sim.errors import UserError

PARAMS_FILE = Path(__file__).with_name("engine_params.json")


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One serving engine."""

    name: str
    version: str = ""  # "" = unversioned; NAME@VERSION selects one, NAME the newest
    # scheduler defaults (sim.seq.EngineConfig fields; a policy's own defaults and the CLI override them)
    scheduler: dict = field(default_factory=dict)
    # per-step overhead: fixed + per sequence + per token (seconds); fitted values replace these
    fixed_s: float = 0.0
    per_seq_s: float = 0.0
    per_token_s: float = 0.0
    # largest CUDA-graph batch; decode-only steps up to it are padded to the next capture size; 0 = eager
    cuda_graph_max: int = 0
    # the batch sizes the engine captures, where they are not the default shape (default_graph_sizes: 1, 2, 4,
    # multiples of 8 up to 256, then of 256), cut at cuda_graph_max; () the default shape
    cuda_graph_sizes: tuple = ()
    # its largest CUDA-graph batch by device memory and TP, over cuda_graph_max: ((device memory below this many GiB,
    # largest batch at TP < 4, at TP >= 4), ...) by ascending memory, the first the device is below applies (SGLang
    # 0.5.3+); () none
    graph_max_by_memory: tuple = ()
    # its captured sizes are cut at the run's largest decode batch, min(max batch size, max tokens), which is captured
    # too where a listed size was above it (TensorRT-LLM's PyTorch backend: model_engine.py
    # _filter_cuda_graph_batch_sizes, with padding on)
    graph_pad_to_limit: bool = False
    mode: str = "sequential"  # sequential | overlap (NanoFlow-style operator overlap)
    # kernel-efficiency regime: the key of its fitted efficiencies (sim.efficiency); None = the plain
    # roofline at the hardware preset's efficiencies
    regime: str | None = "default"
    fitted: tuple = ()  # overhead fields fitted from the catalogue (the rest are cited constants)
    tuned_by: str = ""  # "trtllm-bench": batch and token limits from the dataset (trtllm_bench_settings)
    source: str = ""
    # how a prefix load from a host/disk KV tier (sim.kv_tiers) meets the step: "overlap" (it runs
    # alongside the step's compute: layer-by-layer prefetch), "stall" (the step waits for it) or "async" (the
    # loading request waits out of the steps, the others run on); cited per profile in KV_LOAD_SOURCES
    kv_load: str = "stall"
    key: str = ""  # the key it was selected by when that adds a version or overrides (see label)
    release: str = ""  # the release it was asked for (``vllm@0.8.2``: 0.8.2; a calibrated file's header's); "" none
    params_file: str = ""  # a `blendsim calibrate engine` profile: its fitted parameters price this engine
    # where its fitted overhead lives in params["engine"]: "" = its own NAME@VERSION (each version's CPU loop is
    # its own); a name shared by versions whose loop is one (trtllm's C++ executor)
    fit_as: str = ""
    # its KV fraction (scheduler "gpu_memory_utilization") is of the memory the weights and activations leave
    # (TensorRT-LLM's free_gpu_memory_fraction) rather than of the device (vLLM, SGLang)
    kv_of_free: bool = False
    # scheduler settings the engine picks by device and entry point, over ``scheduler``: keys "large" (a GPU of
    # >= 70 GiB that is not an A100) or "small", then "-offline" (a Python LLM object / offline benchmark) or
    # "-serve" (the OpenAI-compatible server); see scheduler_for
    by_device: dict = field(default_factory=dict)
    # its KV fraction by tensor-parallel degree, over ``scheduler``: ((smallest TP, fraction), ...) by ascending TP, the
    # last entry whose TP the deployment's reaches applies (SGLang lowers mem_fraction_static as TP grows); () none
    memory_by_tp: tuple = ()
    # its KV fraction is of weights and KV pool alone, activations and CUDA graphs live in the rest (SGLang's
    # mem_fraction_static; see Deployment.static_fraction)
    static_fraction: bool = False
    # its KV fraction from the memory it leaves for activations and CUDA graphs, over ``memory_by_tp``: ((device memory
    # below this many GiB, GiB left, GiB more per GPU of the replica), ...) by ascending memory, the first that the
    # device is below applies: fraction = (memory - left - per GPU x TP x PP) / memory (SGLang 0.5); () none
    memory_reserve: tuple = ()
    attn_dp_reserve_gib: float = 0.0  # GiB more it leaves with attention data parallelism
    # its KV fraction from the memory it reserves for activations and CUDA graphs as SGLang 0.5.3 computes it
    # (sglang_053_reserve_gib), over memory_reserve: False none
    reserve_from_settings: bool = False
    # the most requests it runs at once, from its KV pool: min(KV tokens // 2, clamp(KV tokens / context length x
    # 512, low, high)) (SGLang's request-to-token pool, max_num_reqs in model_runner.py, and max_running_requests =
    # min(max_total_num_tokens // 2, the pool) in its TP worker): (low, high); () none (its max_seqs as given)
    running_from_pool: tuple = ()
    # its token budget by device memory, over ``scheduler``: ((from this many GiB up, budget), ...) by ascending memory,
    # the last that the device reaches applies (SGLang 0.5's chunked prefill on the largest GPUs); () none
    budget_by_memory: tuple = ()
    # the entry point: False = the engine's offline API (a Python LLM object, an offline benchmark), True = behind
    # its OpenAI-compatible API server (``--engine NAME:serve=1``; a catalogue row whose command runs the server)
    serve: bool = False
    # behind its API server, the server's per-step work (formatting and streaming each sequence's new token,
    # request handling) as a multiple of the engine loop's overhead, where the two share one process and so
    # run one after the other (vLLM <= 0.5); 0 where the server runs apart and overlaps the engine
    api_share: float = 0.0
    # behind its API server, a loop fitted apart from the offline one (``overhead_key`` NAME@VERSION:serve): the
    # server runs in a process of its own (vLLM >= 0.5.4, PR #6883; SGLang's tokenizer manager) and its per-request
    # and per-token work -- request handling, detokenising, streaming -- comes on the step in ways one offline loop
    # cannot carry, so the served rows fit their own and an offline run keeps the loop its own rows (or its prior)
    # give; the prior is the same
    served_loop: bool = False
    # whether the catalogue fit frees the offline loop too (with ``served_loop``); False: an offline run keeps the
    # cited prior and only the served loop is fitted -- where the offline rows cannot tell the loop from a kernel
    # rate (V1: its offline rows are all ROCm's MI300X runs, see the vllm@0.8 profile). ``calibrate engine`` frees
    # both on a user's own runs
    fit_offline: bool = True
    # the first release with an opt-in asynchronous scheduler (``--engine NAME@VERSION:async_scheduling=1``; a
    # catalogue row whose command passes ``--async-scheduling``): "" = none. With it the scheduler prepares step
    # n + 1 while the GPU runs step n, so the loop leaves only ASYNC_RESIDUAL on the step (see there)
    async_since: str = ""
    async_scheduling: bool = False
    # attention data parallelism for MoE models (``--engine NAME:attn_dp=1``; a catalogue row whose command passes
    # SGLang's --enable-dp-attention or TensorRT-LLM's enable_attention_dp): each GPU of the TP group runs whole
    # attention over its own sequences and keeps their KV whole, the experts run over every GPU's tokens
    # (Deployment.attn_dp, within each pipeline stage; a dense model or TP 1 keeps attention split)
    attn_dp: bool = False
    # with attention data parallelism, whether the scheduler limits (token budget, sequence cap) are each rank's
    # rather than the replica's: TensorRT-LLM runs an executor with its own scheduler on every attention-DP rank, each
    # under max_batch_size / max_num_tokens (what trtllm-bench sizes, per rank); SGLang divides its server-wide
    # --chunked-prefill-size and --max-running-requests among the DP ranks (sgl-project/sglang
    # python/sglang/srt/server_args.py, the data-parallelism handling: chunked_prefill_size // dp_size under
    # --enable-dp-attention), so its limits stay the replica's. A run multiplies per-rank limits by the ranks
    # (runner.attn_dp_ranks)
    limits_per_rank: bool = False
    # with pipeline parallelism, whether one scheduler keeps the pp micro-batches in flight under one sequence cap (a
    # run gives each virtual engine max_seqs / pp): vLLM V1's EngineCore schedules every batch of its batch queue
    # (max_concurrent_batches = the PP size) from one Scheduler, whose running list never exceeds max_num_seqs and
    # which skips a request already in flight ("No new tokens to schedule. This may happen when PP>1",
    # vllm/v1/core/sched/scheduler.py at v0.8.4, and v1/engine/core.py step_with_batch_queue). vLLM V0 builds one
    # Scheduler per virtual engine, each with the whole max_num_seqs (vllm/engine/llm_engine.py at v0.5.3), and
    # TensorRT-LLM sizes each micro-batch by max_batch_size: their caps stay per virtual engine
    seqs_shared_by_stages: bool = False
    # with attention data parallelism, what the reserve admission's ratio is multiplied by: SGLang scales its
    # schedule_conservativeness by 0.3 under --enable-dp-attention (server_args.py, the data-parallelism handling), and
    # its scheduler's first new_token_ratio is 0.7 x schedule_conservativeness (managers/scheduler.py,
    # init_new_token_ratio; 0.7 is global_config's default_init_new_token_ratio): 0.21 instead of 0.7
    attn_dp_reserve_scale: float = 1.0
    # the first release whose attention data parallelism is modelled ("" = any): an older one asked for it is
    # refused in one line, and a catalogue row of it runs with attention split (see the sglang@0.4 profile)
    attn_dp_since: str = ""
    # the token budget follows the stated context length: vLLM V0 without chunked prefill takes max(max_model_len,
    # 2048) tokens a step (vllm/config.py SchedulerConfig.__post_init__, v0.5.3 through the 0.7 releases; chunked
    # prefill turns itself on only above 32,768 tokens of context: vllm/engine/arg_utils.py create_engine_config, with
    # no platform check through 0.6 -- ROCm is left out from the 0.7 releases, arg_utils.py's is_rocm() test). The
    # scheduler's 8,192 above is Llama-3's context; a catalogue row that states
    # --max-model-len (up to 32,768) gets its own (blendsim.fidelity.catalogue.engine_settings)
    budget_from_context: bool = False
    # behind its API server, work the server does in processes of its own, beside the engine, for each output token
    # it streams and each request it takes in (Triton's pre- and post-processing models and HTTP frontend in front of
    # TensorRT-LLM): the engine does not wait for it step by step, but over a run the server cannot fall behind, so
    # a step lasts at least its tokens' and requests' share of that work (``server_s``; the steady state of a
    # pipeline, whose slower stage sets the pace -- it does not let the server catch up during a slow step, so it
    # charges more than a queue would where slow and fast steps alternate). 0: none beside the engine (an offline
    # run, or a server priced in the loop)
    server_token_s: float = 0.0
    server_request_s: float = 0.0
    server_fitted: tuple = ()  # server fields fitted from the catalogue's served rows (under ``server_key``)
    # the engine's own tensor-parallel all-reduce kernel: ((largest TP degree, largest message in bytes per GPU),
    # ...) by ascending TP -- a message up to the limit of the first entry whose degree >= the deployment's runs in
    # it (priced at the link), a larger one, or any above the last degree, in NCCL (priced by the hardware's
    # measured NCCL curve where it has one); () always NCCL; None not modelled (every all-reduce at the link).
    # Set per engine name from CUSTOM_ALLREDUCE below, where each is cited
    custom_allreduce: tuple | None = None
    # the kernel family of its prompt (prefill) attention where that family caps what the fitted attention efficiency
    # may reach on some GPUs (PREFILL_ATTN_CAPS, cited there): "fa2" for FlashAttention-2-style kernels; "" none
    prefill_attention: str = ""

    def prefill_attn_cap(self, arch: str) -> float | None:
        """The largest share of the 16-bit tensor-core peak its prefill attention kernel reaches on GPUs of ``arch``
        (:data:`PREFILL_ATTN_CAPS`), or None where nothing caps the fitted efficiency."""
        return PREFILL_ATTN_CAPS.get((self.prefill_attention, arch)) if self.prefill_attention else None

    def seqs_per_stage(self, max_seqs: int, pp: int) -> int:
        """Each virtual engine's sequence cap on ``pp`` pipeline stages: the engine's whole cap, or its share where one
        scheduler bounds every micro-batch in flight (``seqs_shared_by_stages``; 0, no cap, stays 0)."""
        return max(1, max_seqs // pp) if pp > 1 and self.seqs_shared_by_stages and max_seqs else max_seqs

    def custom_allreduce_max(self, tp: int) -> float:
        """The largest all-reduce message (bytes per GPU) the engine runs in its own kernel at TP degree ``tp``: 0 where
        NCCL carries every message, infinite where the engine's all-reduce is not modelled."""
        if self.custom_allreduce is None:
            return math.inf
        for max_tp, limit in self.custom_allreduce:
            if tp <= max_tp:
                return float(limit)
        return 0.0

    def scheduler_for(self, hardware, serve: bool = False, tp: int = 1, pp: int = 1) -> dict:
        """Its scheduler settings on ``hardware`` (a HardwareSpec) for a replica of ``tp`` x ``pp`` GPUs, offline or
        behind its API server (``serve``, or the profile's own ``serve``)."""
        serve = serve or self.serve
        out = dict(self.scheduler)
        for min_tp, fraction in self.memory_by_tp:
            if tp >= min_tp:
                out["gpu_memory_utilization"] = fraction
        if self.memory_reserve:
            gib = hardware.memory_bytes / 2**30
            _, left, per_gpu = next((r for r in self.memory_reserve if gib < r[0]), self.memory_reserve[-1])
            left += per_gpu * tp * pp + (self.attn_dp_reserve_gib if self.attn_dp else 0.0)
            out["gpu_memory_utilization"] = round(min(max((gib - left) / gib, 0.05), 1.0), 3)
        for min_gib, budget in self.budget_by_memory:
            if hardware.memory_bytes >= min_gib * 2**30:
                out["token_budget"] = budget
        if self.reserve_from_settings:
            gib = hardware.memory_bytes / 2**30
            left = sglang_053_reserve_gib(gib, tp, pp, tp if self.attn_dp else 0, out["token_budget"],
                                          self.graph_max_for(hardware, tp))
            out["gpu_memory_utilization"] = round(min(max((gib - left) / gib, 0.05), 1.0), 3)
        if not self.by_device:
            return out
        large = hardware.memory_bytes >= 70 * 2**30 and "a100" not in hardware.name.lower()
        key = f"{'large' if large else 'small'}-{'serve' if serve else 'offline'}"
        return {**out, **self.by_device.get(key, {})}

    @property
    def overhead_key(self) -> str:
        """The key of its fitted overhead in ``params["engine"]``: its own (or the one it shares), with ``:serve``
        behind its API server where the served loop is fitted apart (``served_loop``)."""
        return f"{self.offline_key}:serve" if self.serve and self.served_loop else self.offline_key

    @property
    def server_key(self) -> str:
        """The key of its fitted server stage in ``params["engine"]``: the version's own (``trtllm@0.8:server``), as
        the server in front of an engine differs between its releases even where the engine loop is shared."""
        return f"{self.name}@{self.version}:server" if self.version else f"{self.name}:server"

    @property
    def server_apart(self) -> bool:
        """Whether a server stage beside the engine paces its steps (behind its API server, with server work)."""
        return self.serve and (self.server_token_s > 0 or self.server_request_s > 0)

    @property
    def serve_priced(self) -> bool:
        """Whether running behind its API server (``serve``) changes anything it prices: a server in the engine's
        process (``api_share``), a served loop fitted apart, a server stage beside the engine, or scheduler limits
        of its served entry point."""
        return bool(self.api_share or self.served_loop or self.server_token_s > 0 or self.server_request_s > 0
                    or any(k.endswith("-serve") for k in self.by_device))

    def server_s(self, num_logits, num_decode):
        """The server's share of work for a step (numbers or arrays): ``server_token_s`` per token the step samples
        (``num_logits``: each decode's next token, each finished prompt's first) and ``server_request_s`` per
        request whose prompt it finishes (``num_logits - num_decode``: each request once, however many chunks its
        prompt took); 0 off the server."""
        if not self.server_apart:
            return 0.0 * num_logits
        return self.server_token_s * num_logits + self.server_request_s * (num_logits - num_decode)

    @property
    def offline_key(self) -> str:
        """The key of its offline loop in ``params["engine"]``."""
        return self.fit_as or (f"{self.name}@{self.version}" if self.version else self.name)

    @property
    def label(self) -> str:
        """How runs and reports name it: the key that selected it when it named a version or overrides
        (``vllm:fixed_s=0.002``, ``vllm-v0@0.5``), else the name."""
        return self.key or self.name

    @property
    def modelled(self) -> str:
        """The modelled profile that prices it, ``NAME@VERSION`` (or NAME where it has no versions); for a calibrated
        profile, that and the file it was fitted into, by its absolute path (``my.json`` and ``./my.json`` are one
        engine)."""
        base = f"{self.name}@{self.version}" if self.version else self.name
        return f"{base} fitted in {self.params_file}" if self.params_file else base

    @property
    def described(self) -> str:
        """Its label, and the modelled profile behind it where the label does not name it (:func:`describe_engine`)."""
        return describe_engine(self.label, self.modelled)

    @property
    def overhead_scale(self) -> float:
        """What the engine loop's overhead is multiplied by: 1, or 1 + ``api_share`` behind an API server that
        shares the engine's process."""
        return 1.0 + self.api_share if self.serve else 1.0

    def overhead(self, num_seqs, num_tokens):
        """Per-step engine overhead, seconds (numbers or arrays): the one overhead rule of the cost model (the
        engine's per-step path calls it, so the served scale is inlined rather than read through the property)."""
        t = self.fixed_s + self.per_seq_s * num_seqs + self.per_token_s * num_tokens
        return t * (1.0 + self.api_share) if self.serve else t

    def running_cap(self, kv_tokens: int, context_len: int) -> int:
        """The most requests it runs at once with a KV pool of ``kv_tokens`` for a model of ``context_len`` tokens
        (``running_from_pool``); 0 where the profile sets none."""
        if not self.running_from_pool or kv_tokens <= 0:
            return 0
        lo, hi = self.running_from_pool
        pool = min(max(int(kv_tokens / max(context_len, 1) * 512), lo), hi)
        return max(1, min(int(kv_tokens) // 2, pool))

    def graph_max_for(self, hardware=None, tp: int = 1) -> int:
        """Its largest CUDA-graph batch on ``hardware`` (a HardwareSpec; None: the profile's own) at TP ``tp``."""
        if hardware is None or not self.graph_max_by_memory or not self.cuda_graph_max:
            return self.cuda_graph_max
        gib = hardware.memory_bytes / 2**30
        _, small, large = next((r for r in self.graph_max_by_memory if gib < r[0]), self.graph_max_by_memory[-1])
        return small if tp < 4 else large

    def graph_sizes(self, hardware=None, tp: int = 1) -> tuple:
        """The batch sizes a decode-only step is padded to (ascending; () eager): the engine's own list or the
        default shape, up to its largest graph batch (which an override may raise: captured too)."""
        cap = self.graph_max_for(hardware, tp)
        if cap <= 0:
            return ()
        base = [x for x in (self.cuda_graph_sizes or default_graph_sizes(cap)) if x <= cap]
        return tuple(sorted(set(base) | {cap}))

    def graph_sizes_for(self, dep) -> tuple:
        """:meth:`graph_sizes` for a Deployment: its GPU and TP degree, and, where the engine cuts its list at the run's
        largest decode batch (``graph_pad_to_limit``), the deployment's step limits."""
        sizes = self.graph_sizes(dep.hardware, dep.tp)
        limit = min(int(dep.max_seqs), int(dep.max_batched_tokens))
        if not (self.graph_pad_to_limit and sizes and 0 < limit < sizes[-1]):
            return sizes
        return tuple(x for x in sizes if x < limit) + (limit,)

    def graph_size(self, n: int, hardware=None, tp: int = 1) -> int:
        """The captured batch size a decode-only step of ``n`` sequences runs at."""
        return graph_size(n, self.graph_sizes(hardware, tp))

    def fitted_overhead(self, params: dict) -> dict:
        """Its fitted overhead in a params dict: under its own key, else under its name (an older file or a
        ``blendsim calibrate engine`` profile of the name), else none; none with the asynchronous scheduler on
        (its residual replaces the loop). Behind its API server, with its fitted server stage (``server_key``)."""
        eng = params.get("engine", {})
        # the server stage's entry names its fields without the "server_" prefix (token_s, request_s)
        server = {f"server_{k}": v for k, v in eng.get(self.server_key, {}).items()
                  if f"server_{k}" in self.server_fitted} if self.serve else {}
        if self.async_scheduling:
            return server
        return {**self.fitted_loop(params), **server}

    def fitted_loop(self, params: dict) -> dict:
        """Its fitted loop alone (no server stage): under its own key, its offline loop's, or its name's; {} if none."""
        eng = params.get("engine", {})
        return eng.get(self.overhead_key) or eng.get(self.offline_key) or eng.get(self.name) or {}

    def with_params(self, values: dict) -> EngineProfile:
        keep = {k: float(v) for k, v in values.items() if k in ("fixed_s", "per_seq_s", "per_token_s")
                or k in self.server_fitted}
        return replace(self, **keep)


# fields ``--engine NAME:field=value`` may override: (type, meaning)
OVERRIDABLE: dict[str, tuple[type, str]] = {
    "fixed_s": (float, "per-step overhead, seconds"),
    "per_seq_s": (float, "per-step overhead per sequence, seconds"),
    "per_token_s": (float, "per-step overhead per token, seconds"),
    "cuda_graph_max": (int, "largest CUDA-graph decode batch (0: eager)"),
    "serve": (int, "1: behind the engine's OpenAI-compatible API server (its batch limits there and, for vLLM <= 0.5, "
                   "the server's CPU work in the engine's process); 0: the offline entry point"),
    "server_token_s": (float, "behind its API server (serve=1): the server's own work per streamed output token, "
                              "seconds, in processes beside the engine (a step lasts at least its share)"),
    "server_request_s": (float, "behind its API server (serve=1): the server's own work per request taken in, "
                                "seconds, beside the engine"),
    "async_scheduling": (int, "1: the engine's opt-in asynchronous scheduler (vLLM >= 0.10's --async-scheduling): "
                              "the loop runs one step ahead of the GPU and only its residual stays on the step"),
    "attn_dp": (int, "1: attention data-parallel over the TP group for MoE models (SGLang's --enable-dp-attention, "
                     "TensorRT-LLM's enable_attention_dp): each GPU runs whole attention over its own sequences and "
                     "keeps their KV whole; 0: attention split over the TP group"),
}


# the most an override of an engine's CPU work may say, seconds: past these no engine's loop or server runs (a
# whole step of CPU work over 10 s, a second per sequence or token, a minute per request), and a value there is
# a unit slip (microseconds written as seconds) that would give a run of absurd length or none at all
MAX_OVERRIDE_S = {"fixed_s": 10.0, "per_seq_s": 1.0, "per_token_s": 1.0, "server_token_s": 1.0,
                  "server_request_s": 60.0}
# the largest CUDA-graph decode batch an override may give: eight times TensorRT-LLM's largest captured size (8,192,
# _TRTLLM_GRAPHS); the cost model lists every padded size up to it, so 10^8 took minutes and gigabytes
MAX_GRAPH_BATCH = 65_536


class EngineKey(NamedTuple):
    """A parsed ``--engine`` value: ``NAME[@VERSION][:field=value,...]``."""

    name: str
    version: str  # "" = the newest registered
    overrides: dict


_VERSION = re.compile(r"[vV]?(\d+(?:\.\d+)*)(?:[.\-_]?(?:post|rc|dev|a|b|alpha|beta)\d*)*")


def release(version: str) -> str | None:
    """The release numbers of a version as an engine's tags and packages write it (``v0.6`` -> ``0.6``,
    ``0.5.5.post1`` -> ``0.5.5``, ``0.5.3rc0`` -> ``0.5.3``); None when ``version`` is no version number."""
    m = _VERSION.fullmatch(str(version).strip())
    return m.group(1) if m else None


def parse_key(text: str) -> EngineKey:
    """Split ``NAME[@VERSION][:field=value,...]`` (or bare ``field=value,...``, from ``ideal``) and check the
    overrides' names and values; unknown names are left to :func:`get_profile`."""
    text = str(text).strip()
    head, sep, spec = text.partition(":")
    if sep and not head.strip():
        raise UserError(f"engine {text!r}: no engine name before ':' (like vllm@0.6:serve=1, or "
                        f"ideal:fixed_s=1e-3); engines: {', '.join(PROFILES)}")
    if not sep and "=" in head:  # fixed_s=...,per_seq_s=...: the user's own overhead, from ideal
        head, spec = "", head
    name, at, version = head.partition("@")
    if at and not name.strip():
        raise UserError(f"engine {text!r}: no engine name before '@' (like vllm@0.6); versioned engines: "
                        f"{modelled_versions()}")
    name = name.strip().lower() or "ideal"  # engine names are lower-case: vLLM@0.6 is vllm@0.6
    if at:
        rel = release(version)
        if rel is None:
            raise UserError(f"engine {text!r}: {version.strip()!r} is not a version number (like 0.6, 0.5.3 or "
                            f"v0.6; a pre- or post-release suffix counts as its release)")
        version = rel
    values: dict = {}
    for part in (spec.split(",") if spec.strip() else []):
        k, eq, val = part.partition("=")
        k = k.strip()
        if k not in OVERRIDABLE:
            raise UserError(f"engine {text!r}: unknown field {k!r}; use {', '.join(OVERRIDABLE)}")
        if k in values:
            raise UserError(f"engine {text!r}: {k} is given twice")
        kind = OVERRIDABLE[k][0]
        try:  # Python's int() and float() read '1_0' as 10: a typo there is refused, not taken for ten
            v = kind(val.strip()) if eq and "_" not in val else None
        except ValueError:
            v = None
        if v is None:
            what = "a number of seconds" if kind is float else "a whole number"
            raise UserError(f"engine {text!r}: {k} must be {what}, got {val!r}")
        if not (v >= 0 and math.isfinite(v)):
            raise UserError(f"engine {text!r}: {k} must be a finite number >= 0, got {val!r}")
        if v > MAX_OVERRIDE_S.get(k, math.inf):
            raise UserError(f"engine {text!r}: {k} = {val.strip()} s is over {MAX_OVERRIDE_S[k]:g} s, more CPU work "
                            f"than any engine's (the value is in seconds: 50 us is 50e-6)")
        if k == "cuda_graph_max" and v > MAX_GRAPH_BATCH:
            raise UserError(f"engine {text!r}: cuda_graph_max {v:,} is over {MAX_GRAPH_BATCH:,} sequences, more than "
                            f"any engine captures (TensorRT-LLM's largest graph: 8,192); 0 runs every step eagerly")
        if k == "serve":
            if v not in (0, 1):
                raise UserError(f"engine {text!r}: serve must be 0 (offline) or 1 (behind the API server), got {val!r}")
            v = bool(v)
        if k in ("async_scheduling", "attn_dp"):
            if v not in (0, 1):
                raise UserError(f"engine {text!r}: {k} must be 0 (off) or 1 (on), got {val!r}")
            v = bool(v)
        values[k] = v
    return EngineKey(name, version.strip(), values)


def versions_of(name: str) -> list[str]:
    """The modelled versions of engine ``name``, oldest first ([] for an engine without versions)."""
    return sorted((v for n, v in VERSIONS if n == name and v), key=version_order)


def modelled_versions() -> str:
    """Every modelled ``NAME@VERSION``, oldest first per engine (for error messages and help)."""
    return ", ".join(f"{n}@{v}" for n, v in sorted((nv for nv in VERSIONS if nv[1]),
                                                   key=lambda nv: (nv[0], version_order(nv[1]))))


def sglang_053_reserve_gib(gib: float, tp: int, pp: int, dp: int, chunk: int, graph_max: int) -> float:
    """The memory SGLang 0.5.3 leaves outside mem_fraction_static, GiB (sgl-project/sglang v0.5.3
    python/sglang/srt/server_args.py, the mem_fraction_static default): 512 MiB of constant metadata, 1.5 MiB per
    token of the chunked-prefill size (at least 2,048) for a large prefill's activations, 2 MiB per request of the
    largest CUDA-graph batch, 1 GiB per eight GPUs of the replica (TP x PP); with attention data parallelism over
    ``dp`` ranks (0: none) 3 MiB more per graph request and rank, and 1.5 more where the graph batch is over 300;
    at least 10 GiB on a device of more than 60 GiB."""
    mib = 512 + max(chunk, 2048) * 1.5 + graph_max * 2 + tp * pp / 8 * 1024
    if dp:
        mib += graph_max * dp * 3 + (graph_max * dp * 1.5 if graph_max > 300 else 0.0)
    if gib > 60:
        mib = max(mib, 10 * 1024)
    return mib / 1024


def default_graph_sizes(cap: int) -> tuple:
    """The default shape of a capture list up to ``cap``: 1, 2, 4, multiples of 8 up to 256, then multiples of 256
    (vLLM V0's list, vllm@v0.5.3 worker/model_runner.py _BATCH_SIZES_TO_CAPTURE, and SGLang 0.2-0.4's,
    model_runner.py, up to their caps; the multiples of 256 above are ours, for an override above 256)."""
    small = [x for x in (1, 2, 4, *range(8, 257, 8)) if x <= cap]
    return tuple(sorted(set(small) | {x for x in range(512, cap + 1, 256)} | ({cap} if cap > 0 else set())))


def graph_size(n: int, sizes) -> int:
    """One decode batch of ``n`` sequences at its CUDA-graph capture size: the smallest of ``sizes`` (ascending,
    as :meth:`EngineProfile.graph_sizes` gives them) that holds it; above the largest, or with none, it runs
    eagerly (unpadded). Plain integers: the engine's per-step path calls it."""
    if not sizes or n <= 0 or n > sizes[-1]:
        return n
    return sizes[bisect.bisect_left(sizes, n)]


def graph_pad(n, sizes):
    """:func:`graph_size` over an array of batch sizes (vectorised pricing), or one size."""
    import numpy as np

    a = np.asarray(n)
    if not sizes:
        return int(a) if np.ndim(a) == 0 else a
    table = np.asarray(sizes, dtype=np.int64)
    idx = np.minimum(np.searchsorted(table, a), len(table) - 1)
    out = np.where((a > table[-1]) | (a <= 0), a, table[idx])
    return int(out) if np.ndim(out) == 0 else out


def trtllm_bench_settings(dep, isl: float, osl: float, pp: int = 1, fraction: float = 0.95) -> tuple[int, int]:
    """``(max_batch_size, max_num_tokens)`` as ``trtllm-bench`` picks them for a dataset of mean input and
    output length ``isl``/``osl`` (TensorRT-LLM ``tensorrt_llm/bench/build/tuning.py``, Apache-2.0: the KV
    left after the weights, at ``fraction``, holds ``n`` requests of isl + osl tokens; batch = min(n, 4096)
    rounded up to 32/128/256 steps with a floor of 64; tokens = batch x (1 + isl/osl), at most 32768, rounded
    up to 256/512/1024 steps with a floor of 2048)."""
    import math

    m = dep.model
    gpus = dep.tp * pp
    kv_token = m.kv_bytes_per_token * max(1, dep.tp // m.num_kv_heads)  # as the tool sizes it, attention DP or not
    free = dep.hardware.memory_bytes * gpus - m.weight_bytes
    n = max(fraction * free / (kv_token * max(isl + osl, 1.0)), 1.0)
    bs = min(n, 4096) / pp
    tok = min(bs * (1 + isl / max(osl, 1.0)), 32768)
    if bs < 256:
        max_bs = max(64, 32 * math.ceil(bs / 32))
    elif bs < 1024:
        max_bs = 128 * math.ceil(bs / 128)
    else:
        max_bs = 256 * math.ceil(bs / 256)
    step = 256 if tok < 4096 else 512 if tok < 8192 else 1024
    return int(max_bs), int(max(2048, step * math.ceil(tok / step)))


_CITED_VLLM = ("vLLM V1 blog 2025-01-27 (1.7x over V0) applied to V0's loop as derived from the vLLM blog of "
               "2024-09-05 (_V0_LOOP); the loop behind its API server and the server stage fitted by blendsim fidelity "
               "(vllm@0.8:serve, vllm@0.8:server), the offline loop kept at that prior")

# vLLM V0's synchronous per-step loop (schedule, prepare inputs, sample, process outputs), the prior every Python
# engine loop below is derived from. The vLLM blog of 2024-09-05 ("Performance Diagnosis") profiled v0.5.3 with
# Llama 3 8B on one H100: the HTTP API server took 33% of the time, scheduling with input and output handling 29%,
# GPU execution 38%. Taken at the 256 sequences its ShareGPT run keeps in flight (500 prompts at once,
# max_num_seqs 256; mean context ~290 tokens), where the plain roofline prices the decode step at 13.3 ms
# (`blendsim cost -m llama-3-8b --hardware h100-80gb --decode-seqs 256 --context 290`), the loop is
# 29/38 x 13.3 = 10.2 ms per step (the plain roofline's step is shorter than the GPU's real one, so this loop is
# on the low side). The split between a fixed and a per-sequence part is not published: 1 ms fixed
# (ours: the step's tensor setup, graph launch and host sync) and (10.2 - 1.0) / 256 = 36 us per sequence. It is a
# prior only: the loops of vllm@0.5, vllm@0.6, vllm@0.8 and sglang@0.3 are fitted to the catalogue's rows of that
# version (``fitted``), starting from it.
_V0_LOOP = (1.0e-3, 36e-6)

# What a scheduler that runs one step ahead of the GPU leaves on each step: a per-step synchronisation and
# attention-plan gap and GPU sampling, (fixed, per sequence) -- the figures sglang@0.4 carries for SGLang's
# overlapped scheduler (SGLang v0.4 blog 2024-12-04: its Nsight trace of five decode batches shows no GPU idle
# time). vLLM's --async-scheduling (vllm-project/vllm PR #19970, first released in v0.10.0) overlaps V1's
# scheduler and output handling with the forward pass the same way; no measurement of its own residual is
# published, so it takes SGLang's. Not fitted: no catalogue row with it runs a preset model yet.
ASYNC_RESIDUAL = (0.15e-3, 1e-6)
_FIT_LOOP = ("fixed_s", "per_seq_s")

_V0_SCHED = {"token_budget": 8192, "max_seqs": 256, "block_size": 16, "mix": "prefill-first",
             "prefix_caching": False, "gpu_memory_utilization": 0.90, "admission": "greedy"}
# vLLM 0.5.x (V0, synchronous): vllm@v0.5.3 vllm/engine/arg_utils.py EngineArgs (block_size 16,
# gpu_memory_utilization 0.90, max_num_seqs 256, enable_prefix_caching False); vllm/core/scheduler.py
# _schedule_default (prefill-first: no decode in a step with a prefill; recompute preemption);
# vllm/worker/model_runner.py _BATCH_SIZES_TO_CAPTURE (1, 2, 4, 8..256: decode-only graphs up to
# 256). max_num_batched_tokens is max(max_model_len, 2048) with chunked prefill off (vllm/config.py
# SchedulerConfig): 8192 here, Llama-3's context (longer-context models pack more prompt tokens per
# step in the real engine). Overhead: the V0 loop (_V0_LOOP), fitted to the catalogue's vLLM 0.5 rows
# (vllm-v0@0.5 in _BUILTIN runs this profile under its older name and shares the fit).
# Behind its OpenAI server vLLM <= 0.5.3 ran the HTTP server in the engine's process, so the two competed for the GIL
# and the server's work -- request handling, formatting and streaming each sequence's token -- came on top of the
# engine loop (vLLM blog 2024-09-05, "Performance Diagnosis", of v0.5.3: for Llama 3 8B on one H100 the HTTP API
# server took 33% of the time, scheduling and input/output handling 29%, GPU execution 38%): priced as 33/29 of the
# loop's overhead per step (``api_share``, with ``serve``). vllm-project/vllm PR #6883 ("Multiprocessing for OpenAI
# Server with zeromq") moved the server to its own process; it is first in v0.5.4 (vllm@v0.5.4
# vllm/entrypoints/openai/api_server.py build_async_engine_client: the engine runs in an RPC server process unless
# --disable-frontend-multiprocessing), which the vLLM blog's v0.6.0-against-v0.5.3 comparison counts among 0.6.0's
# gains. 0.5.4 and 0.5.5 are still priced with the in-process share: the engine's process there pickles every
# step's outputs for the zeromq hop, a cost no source gives. A vllm@0.5.4 profile without the share (api_share 0)
# was tried on 29 Nov 2026 against the 20 vLLM 0.5.4 runs of validation.csv, out of the fit: median |error| 19.7%
# -> 21.7%, p90 36.7% -> 86.7% (the runs on 2-8 A100s +70% to +100% too fast); not kept.
# Prefill attention kernels that reach less of a GPU than the fitted attention efficiency (``attn_eff``, fitted with
# TensorRT-LLM's context FMHA and FlashAttention-3-class kernels on Hopper and Blackwell): FlashAttention-2 has no
# Hopper path (no wgmma, TMA or warp specialisation) and "achieves only 35% utilization on the H100 GPU", where
# FlashAttention-3 reaches up to 740 TFLOP/s, 75% (Shah et al., FlashAttention-3, arXiv 2407.08608, abstract). The
# engines that ran FlashAttention-2-style prefill on Hopper: vLLM 0.5-0.6 (the vllm-flash-attn 2.x package, 2.6.1 in
# the 0.5.4-0.5.5 releases; vLLM's FlashAttention-3 build came in 2025, after these profiles' releases) and SGLang
# 0.2-0.3 (FlashInfer 0.1, whose prefill kernels are FlashAttention-2-style; FlashInfer 0.2 brought its SM90 template
# in December 2024, with SGLang 0.4). On Ampere FlashAttention-2 is the kernel the fitted efficiency already
# describes (up to 73% of an A100: Dao, FlashAttention-2, 2023), so nothing caps it there. Not modelled: the 0.4.0
# releases still on FlashInfer 0.1, a 0.7 release built with FlashAttention-3. The cap is on prompt attention only;
# decode attention is bound by KV reads (``attn_mem_eff``).
PREFILL_ATTN_CAPS: dict[tuple[str, str], float] = {("fa2", "hopper"): 0.35}
PREFILL_ATTN_SOURCE = "Shah et al., FlashAttention-3, arXiv 2407.08608, abstract"

# vLLM V0 (0.5-0.7) has no data-parallel attention: it came with V1's data-parallel deployment (a DP rank per
# attention, experts split over all of them; vLLM docs "Data Parallel Deployment"), and is modelled from the first
# V1 profile's release. A V0 release asked for it (``vllm@0.6:attn_dp=1``) is refused in one line.
VLLM_ATTN_DP_SINCE = "0.8"
_VLLM_05 = EngineProfile(
    "vllm", version="0.5", scheduler=dict(_V0_SCHED),
    fixed_s=_V0_LOOP[0], per_seq_s=_V0_LOOP[1], per_token_s=0.1e-6, cuda_graph_max=256, regime="cuda-graph",
    api_share=33 / 29, fitted=_FIT_LOOP, budget_from_context=True, attn_dp_since=VLLM_ATTN_DP_SINCE,
    prefill_attention="fa2",
    source="vllm@v0.5.3 arg_utils.py, core/scheduler.py, worker/model_runner.py; vLLM blog 2024-09-05; loop "
           "fitted by blendsim fidelity")
# vLLM 0.6.x as its release blog and the published 0.6 benchmarks ran it: async output processing on
# (vllm@v0.6.0 config.py verify_async_output_proc) and --num-scheduler-steps 10 (multi-step: one
# schedule and input preparation per ten decode steps, vllm@v0.6.0 engine/arg_utils.py); scheduler as
# 0.5. Prior: the V0 loop (_V0_LOOP) over ten steps plus 0.15 ms per step of synchronisation that no overlap
# hides, the figure SGLang's overlapped loop keeps (sglang@0.4); fitted to the catalogue's vLLM 0.6 rows. Without
# multi-step (0.6's default num_scheduler_steps 1) the loop runs every step, less the output processing that
# async output processing hides: --engine 'vllm@0.6:fixed_s=1e-3,per_seq_s=36e-6' (the prior without multi-step,
# an upper bound under that prior).
_VLLM_06 = EngineProfile(
    "vllm", version="0.6", scheduler=dict(_V0_SCHED),
    fixed_s=_V0_LOOP[0] / 10 + 0.15e-3, per_seq_s=_V0_LOOP[1] / 10, per_token_s=0.1e-6, cuda_graph_max=256,
    regime="cuda-graph", fitted=_FIT_LOOP, budget_from_context=True, attn_dp_since=VLLM_ATTN_DP_SINCE,
    prefill_attention="fa2",
    source="vllm@v0.6.0 config.py, engine/arg_utils.py; vLLM blog 2024-09-05 (multi-step, "
           "async output processing); loop fitted by blendsim fidelity")

# TensorRT-LLM's PyTorch backend as trtllm-bench ran it on the perf-overview pages of v0.20 and ~v1.0: CUDA graphs
# with padding over the batch sizes their llm_options.yml lists (docs/source/performance/perf-overview.md,
# cuda_graph_config enable_padding true, batch_sizes 1, 2, 4, ..., 128, 256, 384, 512, 1024, 2048, 4096, 8192; the v0.20
# page's file has the same list under cuda_graph_batch_sizes): a decode batch of 600 runs at 1,024. The sizes above the
# run's max batch size (what trtllm-bench derives from the dataset) give way to that size (graph_pad_to_limit).
_TRTLLM_GRAPHS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 8192)
# TensorRT-LLM as trtllm-bench runs it (1.0; 0.13 and 0.19 are copies of it): _BUILTIN below cites each value
_TRTLLM_BENCH = EngineProfile(
    "trtllm", version="1.0",
    scheduler={"token_budget": 8192, "max_seqs": 8192, "block_size": 32, "mix": "decode-first",
               "prefix_caching": False, "gpu_memory_utilization": 0.95, "admission": "reserve", "reserve_ratio": 1.0},
    fixed_s=0.5e-3, per_seq_s=2e-6, cuda_graph_max=8192, cuda_graph_sizes=_TRTLLM_GRAPHS, graph_pad_to_limit=True,
    regime="trtllm", tuned_by="trtllm-bench",
    fitted=("fixed_s", "per_seq_s"), fit_as="trtllm", kv_of_free=True, attn_dp=True, limits_per_rank=True,
    source="NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md (trtllm-bench settings; MoE models with "
           "enable_attention_dp); overhead fitted by blendsim fidelity")
# Its MoE runs: the same page's llm_options.yml "For MoE models" adds ``enable_attention_dp: true`` (printed indented
# under cuda_graph_config; TensorRT-LLM's LlmArgs has it at the top level, where the dense models' file has none) with
# ``--ep $ep_size``: attention data-parallel over the TP group (attn_dp). ``trtllm:attn_dp=0`` prices them with
# attention split instead.

# SGLang's attention data parallelism (--enable-dp-attention, first in v0.4.0 for DeepSeek's MLA) as modelled
# (Deployment.attn_dp) from v0.4.4: sgl-project/sglang PR #4390 ("Improve DP attention", merged 2025-03-13) reworked it
# (CUDA-graph padding per rank instead of to the global batch, TP != DP), and the DeepSeek-V3 tracking issue #2591
# (opened 2024-12-26, the v0.4.1 days) lists what came after 0.4.1: CUDA graphs and torch.compile for the model, tuned
# FP8 GEMMs, fused-MoE configs tuned for H200. The catalogue's two v0.4.1 runs with it (DataCrunch's 8 x H200,
# sglang benchmark/benchmark_dsv3) measure a third of what attention DP predicts -- median inter-token latencies of
# 100-500 ms -- and within +10% / +44% of attention split, which is how they are priced. From 0.4.4 the flag needs
# --dp (the same PR: "Now you need to explicitly specify --dp and --tp"; a data-parallel size of 1 turns it off), so
# GPUStack's v0.5.3 runs that pass --enable-dp-attention without --dp run split too (catalogue.attention_dp).
SGLANG_ATTN_DP_SINCE = "0.4.4"

# NOTE: each profile's overhead is the per-step time the engine adds on top of the kernels the op timer
# prices: CPU work the GPU waits for (scheduling, input preparation, output processing, inter-process hops)
# plus GPU sampling, which no operator in sim/ops.py covers (about 1 us per sequence on an A100: two or
# three passes over a 128K-entry float32 logit row, 0.5 MB, at ~1.6 TB/s). They model engines, never
# policies: they were fixed from the measurements cited here (or fitted to the fidelity catalogue where
# ``fitted`` says so), not fitted to any scheduling result.
# SGLang (0.3-0.4): prefill-first steps with chunked prefill of 8,192 tokens (--chunked-prefill-size; v0.4.0
# server_args.py sets it on GPUs of 25 GB and more), token-granular radix cache, reserve-style admission
# (new_token_ratio), CUDA graphs up to 160 -- larger decode batches run eagerly; at most min(KV // 2, the request
# pool: KV tokens / context length x 512 clamped to 2,048-4,096) requests at once (model_runner.py max_num_reqs,
# tp_worker.py max_running_requests; 0.3 clamps to 2,048-5,120). Overhead: SGLang >= 0.4 runs its scheduler one
# batch ahead of the GPU ("zero-overhead" overlapped scheduler, SGLang v0.4 blog 2024-12-04: +10%
# throughput, i.e. the CPU share it removed was ~9% of a step; its Nsight trace of five decode
# batches shows no GPU idle time). What stays on the critical path is GPU sampling (~1 us/seq, see
# the NOTE above) and a small per-step synchronisation and attention-plan gap: 0.15 ms. KV fraction: its
# mem_fraction_static when none is given (srt/server_args.py __post_init__, "depends on the tensor parallelism size"),
# 0.88 at TP1 and then from each TP up as memory_by_tp lists it (0.3 had 0.83 at TP8); of the memory free at start,
# weights and KV pool together (static_fraction).
_SGLANG_04 = EngineProfile(
    "sglang", version="0.4",
    scheduler={"token_budget": 8192, "max_seqs": 4096, "block_size": 1, "mix": "prefill-first", "prefix_caching": True,
               "gpu_memory_utilization": 0.88, "admission": "reserve", "reserve_ratio": 0.7},
    fixed_s=0.15e-3, per_seq_s=1e-6, cuda_graph_max=160, regime="cuda-graph",
    memory_by_tp=((2, 0.87), (4, 0.85), (8, 0.81), (16, 0.79)), static_fraction=True, running_from_pool=(2048, 4096),
    attn_dp_since=SGLANG_ATTN_DP_SINCE, attn_dp_reserve_scale=0.3,
    source="SGLang v0.4 blog 2024-12-04 (overlapped scheduler); sglang server_args defaults")

# vLLM V1's CUDA-graph batch sizes (0.8-0.10): 1, 2, 4, then every multiple of 8 up to 512 (vllm@v0.8.0 config.py
# CompilationConfig cudagraph_capture_sizes, [1, 2, 4] + [8 * i for i in range(1, 1025)] cut at the largest;
# vllm@v0.10.0 config.py caps it at min(2 x max_num_seqs, 512)); a batch between two runs at the next
# (VllmConfig.pad_for_cudagraph). V0's list stops at 256 and so has the default shape.
_V1_GRAPHS = (1, 2, 4, *range(8, 513, 8))

_BUILTIN = [
        # No engine: pure kernel time at the hardware preset's efficiencies (the plain roofline), no per-step
        # overhead, no CUDA-graph padding; the scheduler's own defaults (sim.seq.EngineConfig).
        EngineProfile("ideal", regime=None, source="pure kernel time, no engine overhead"),
        # TensorRT-LLM as trtllm-bench runs it (perf-overview.md): inflight batching with context and
        # generation requests in one step under max_num_tokens, batch up to max_batch_size (8192 and 8192
        # by default; trtllm-bench sets both from the dataset: trtllm_bench_settings), CUDA graphs padded up
        # to the batch, KV fraction 0.95 (0.90 where 0.95 did not fit); no prefix reuse
        # across the random-token prompts. Admission: the capacity scheduler's default policy
        # GUARANTEED_NO_EVICT admits a request only when the KV of its whole prompt and max_tokens fits
        # besides what the running ones will still need -- "reserve" admission with each request's
        # max_tokens as its output hint, never a preemption. Overhead: fitted (the rows are its only
        # measurements), bounded by 0..5 ms fixed and 0..20 us per sequence.
        _TRTLLM_BENCH,
        # vLLM V1 (default since 0.8): 8192-token chunked prefill, 256 sequences, 16-token blocks, prefix
        # cache, greedy admission with recompute-preemption, CUDA graphs up to 512. Synchronous scheduling
        # (async scheduling came later as an opt-in flag, vLLM PR #19970). Overhead prior: the V1 blog
        # (2025-01-27) reports up to 1.7x the throughput of V0 without multi-step, for Llama-3.1-8B with ShareGPT
        # (taken as one H100), from CPU-overhead cuts alone. At 256 sequences and ShareGPT's ~290-token mean
        # context the plain roofline prices the decode step at 13.3 ms; V0 adds its loop (_V0_LOOP: 10.2 ms; the
        # share async output processing hides is not published and taken as none), 23.5 ms, so V1 takes
        # 23.5 / 1.7 = 13.8 ms: 0.5 ms of overhead at 256 sequences, split (ours) as 0.2 ms fixed -- GPU sampling
        # launch, the host sync and the EngineCore-worker hop -- and 1.2 us per sequence of output bookkeeping.
        # Fitted to the catalogue's V1 rows behind the API server (GPUStack's, on A100, H100 and H200); offline runs
        # keep this prior: the only offline V1 rows are ROCm's eight MI300X runs at 1,500-3,200 sequences, which
        # cannot tell V1's loop from MI300X's paged-attention rate, and fitted there (29 Nov 2026, with Azure's
        # MI300X V0 runs fixing that rate at 0.51) the loop went from 1.5 to 15.7 us per sequence -- 16 ms a step at
        # the 1,024 sequences V1 runs offline on an H100, for every offline V1 prediction on every GPU.
        # Input preparation is numpy over a persistent batch: ~20 ns per token (ten passes at ~2 ns each).
        # Batch limits by device and entry point (vllm/engine/arg_utils.py, from 0.8.5/0.9: PR #17073 gave GPUs of
        # >= 70 GiB 1024 sequences and 16384 tokens offline / 8192 behind the API server, PR #17885 took the A100
        # back out; other GPUs 256 sequences and 8192 / 2048 tokens): the 0.9+ rule, which 0.10 and 0.11 keep
        # (0.8.0-0.8.4 differ: 1024 sequences everywhere, then 256 but on H100/H200, PR #16158).
        # Behind its API server (serve=1) the server is a process of its own (V1's AsyncLLM front end beside the
        # EngineCore process, vLLM V1 blog 2025-01-27): it renders the chat template, tokenizes and checks each
        # request, and detokenizes and streams every output token, beside the engine's loop. One such process is
        # what `vllm serve` starts (more only with --api-server-count, vllm-project/vllm PR #17546, "API-server
        # scaleout", added because one process can fall behind the engine). Priced as Triton's stage in front of
        # TensorRT-LLM 0.8 is (server_token_s, server_request_s): it adds no time to a step but sets a pace the
        # engine cannot outrun. No per-token figure is published; the prior is Triton's (ours: 100 us per token,
        # 5 ms per request), fitted to the catalogue's served V1 rows (GPUStack's). What shows it: GPUStack's
        # Qwen3-14B on one H100 has a median time to first token of 21.9 s under vLLM 0.11 against 8.8 s under
        # SGLang 0.5.5 on the same 1,000 ShareGPT requests, and its 1,000 128-token requests take 22.7 s, where the
        # GPU work is a few seconds.
        EngineProfile("vllm", version="0.8", scheduler={"token_budget": 8192, "max_seqs": 256, "block_size": 16,
                                         "mix": "decode-first", "prefix_caching": True,
                                         "gpu_memory_utilization": 0.90, "admission": "greedy"},
                      fixed_s=0.2e-3, per_seq_s=1.2e-6, per_token_s=0.02e-6, cuda_graph_max=512,
                      cuda_graph_sizes=_V1_GRAPHS,
                      regime="cuda-graph", fitted=_FIT_LOOP, served_loop=True, fit_offline=False, async_since="0.10",
                      server_token_s=100e-6, server_request_s=5e-3,
                      server_fitted=("server_token_s", "server_request_s"), seqs_shared_by_stages=True,
                      source=_CITED_VLLM + "; vllm PRs #17073, #17885 (batch limits by device)",
                      by_device={"large-offline": {"token_budget": 16384, "max_seqs": 1024},
                                 "large-serve": {"token_budget": 8192, "max_seqs": 1024},
                                 "small-serve": {"token_budget": 2048}}),
        # vLLM V0 0.6: prefill-first steps (no chunked prefill by default), 256 sequences; 0.6's multi-step
        # scheduling (--num-scheduler-steps 10) amortises the per-step CPU work over ten steps: the prior is the
        # V0 loop (_V0_LOOP) over ten; the loop is vllm@0.6's, fitted.
        replace(_VLLM_06, name="vllm-v0", fit_as="vllm@0.6",
                source="vLLM 0.6 release blog 2024-09-05 (multi-step scheduling); loop fitted by blendsim fidelity"),
        # vLLM V0 <= 0.5.x (the vLLM of mid-2024 baselines such as NanoFlow's): fully synchronous, so every
        # CPU stage is exposed: the V0 loop (_V0_LOOP, from the 2024-09-05 vLLM blog's profile of v0.5.3:
        # scheduling and input/output handling 29% of the time against 38% of GPU execution), fitted to the
        # catalogue's vLLM 0.5 rows (vllm@0.5's). Prompt inputs were built with Python lists, three appends
        # per token: ~0.1 us per token. Scheduler as 0.6 (prefill-first, 256 sequences, no prefix cache).
        replace(_VLLM_05, name="vllm-v0", fit_as="vllm@0.5",
                source="vLLM blog 2024-09-05; loop fitted by blendsim fidelity"),
        _SGLANG_04,
        # NanoFlow (OSDI'25): dense batch of 1024 tokens in multiples of 128 (sec. 4), operator overlap of
        # nano-batches, asynchronous scheduling (sec. 4.2); BlendServe's engine (App. A.2). Overhead: batch
        # i+1 is formed on the CPU while the GPU runs batch i and EOS is detected one iteration late, so no
        # CPU stage is exposed; left: GPU sampling (~1 us/seq) and one device-to-host token copy and event
        # wait per iteration (~50 us). Nano-batch splitting is GPU time, carried by the overlap mode's
        # interference term; the extra decode step per request from late EOS detection (< 1% at >100-token
        # mean outputs) is a scheduling effect, not a per-step cost.
        EngineProfile("nanoflow", scheduler={"token_budget": 1024, "round_tokens": 128, "block_size": 1,
                                             "mix": "decode-first", "prefix_caching": True,
                                             "gpu_memory_utilization": 0.90, "admission": "reserve"},
                      fixed_s=0.05e-3, per_seq_s=1e-6, mode="overlap", regime="nanoflow",
                      source="NanoFlow OSDI'25 sec. 4 and 4.2; BlendServe ASPLOS'26 App. A.2"),
]

# SGLang 0.3.x: the scheduler loop is synchronous (sglang@v0.3.0 srt/managers/tp_worker.py: sampled ids
# copied to the CPU inside forward_decode_batch, scheduling between GPU steps); the overlap scheduler
# arrived as an option in 0.3.4 and became the default in 0.3.6 (sglang@v0.3.6 srt/server_args.py).
# Defaults (sglang@v0.3.0 server_args.py): chunked_prefill_size 8192, radix cache on, CUDA graphs for
# decode batches up to 160 (model_runner.py init_cuda_graphs), mem_fraction_static 0.88 at TP1 (0.87 TP2,
# 0.85 TP4, 0.83 TP8, 0.79 TP16; of weights and KV pool together: static_fraction), prefill-first steps;
# admission reserves new_token_ratio (0.7 at start) of the running requests' remaining outputs (global_config.py). No per-step CPU figure is published: the
# exposed loop (schedule, batch tensors, token copy and bookkeeping, detokenization in its own
# process) starts from vLLM V1's synchronous EngineCore loop, which has the same stages and the same
# process split (prior 0.2 ms + 1.2 us/seq, vllm@0.8 above), and is fitted to the catalogue's SGLang 0.3 rows.
# SGLang 0.2 has a loop of its own since 30 Nov 2026 (below).
_SGLANG_03 = EngineProfile(
    "sglang", version="0.3",
    scheduler={"token_budget": 8192, "max_seqs": 4096, "block_size": 1, "mix": "prefill-first", "prefix_caching": True,
               "gpu_memory_utilization": 0.88, "admission": "reserve", "reserve_ratio": 0.7},
    fixed_s=0.2e-3, per_seq_s=1.2e-6, cuda_graph_max=160, regime="cuda-graph", fitted=_FIT_LOOP,
    memory_by_tp=((2, 0.87), (4, 0.85), (8, 0.83), (16, 0.79)), static_fraction=True, running_from_pool=(2048, 5120),
    attn_dp_since=SGLANG_ATTN_DP_SINCE, attn_dp_reserve_scale=0.3, prefill_attention="fa2",
    source="sglang@v0.3.0 server_args.py, srt/managers/tp_worker.py, global_config.py; loop fitted by blendsim "
           "fidelity")

# ---- versions of the same engines (issue 24): NAME@VERSION selects one; a release between two modelled ones
# behaves like the older (resolve_version). Constants are cited to the engines' source at the release tag
# (vllm@vX / sglang@vX: the PyPI sdists of that release), their docs and blogs; where no per-step figure is
# published the analogy used is said.
_VERSIONED = [
        _VLLM_05,
        _VLLM_06,
        # SGLang 0.2.x (the SGLang v0.2 blog of 2024-07-25): a synchronous loop of its own (the detokenizer in its own
        # process), with 0.2's defaults (sglang@v0.2.0 srt/server_args.py, srt/managers/controller/tp_worker.py,
        # model_runner.py): no chunked prefill -- a prefill batch takes whole prompts up to max_prefill_tokens =
        # 16384 tokens; max_running_requests = min(half the KV pool's tokens, the request pool: KV tokens / context
        # length x 512, at least 2,048 and with no upper clamp; tp_worker.py and model_runner.py ReqToTokenPool) --
        # 27,000 for Llama-3-8B on an A100, 2,047 for a 128K-context model; CUDA graphs for decode batches 1, 2, 4,
        # 8, ..., 128 (eager above); mem_fraction_static 0.89 at TP1, 0.88 at TP2, 0.86 at TP4, 0.84 at TP8, 0.80 at
        # TP16 (server_args.py __post_init__; 29 Nov 2026 to 30 Nov TP 2-4 were taken as TP1's); radix
        # cache on (schedule_heuristic lpm, fcfs without it); new_token_ratio 0.7 at start (global_config.py).
        # Decodes run ten steps in a row when no prefill batch can be formed (num_continue_decode_steps), which is
        # what prefill-first does here. Its loop is fitted on its own rows (the SGLang v0.2 blog's 20), from vLLM V0's
        # prior (_V0_LOOP: a synchronous Python scheduler walking every running request's objects each step, as
        # 0.2's tp_worker does): shared with 0.3 (26 Nov 2026 to 30 Nov), the pair sat at 0.3's per-sequence bound
        # of 20 us and 0.2's rows came out +2% to +51% too fast; on its own, from this prior, it fits at about
        # 1.4 ms + 62 us a sequence and the catalogue's LOSO went 10.1% -> 9.2% (docs/fidelity-notes.md, "SGLang
        # 0.2's own loop"). An earlier split (26 Nov, from 0.3's prior, bound 20 us) had both loops at that bound.
        replace(_SGLANG_03, version="0.2", scheduler={**_SGLANG_03.scheduler, "token_budget": 16384,
                                                     "gpu_memory_utilization": 0.89},
                memory_by_tp=((2, 0.88), (4, 0.86), (8, 0.84), (16, 0.80)), running_from_pool=(2048, math.inf),
                cuda_graph_max=128, fixed_s=_V0_LOOP[0], per_seq_s=_V0_LOOP[1],
                source="sglang@v0.2.0 srt/server_args.py, srt/managers/controller/tp_worker.py, "
                       "model_runner.py, global_config.py; loop fitted by blendsim fidelity from vLLM V0's prior"),
        _SGLANG_03,
        # SGLang 0.5: the 0.4 profile's mechanics (overlapped scheduler, chunked prefill, radix cache, reserve
        # admission; its loop is 0.4's cited one) with the KV fraction 0.5's server_args derives from the device
        # instead of TP alone (ServerArgs.__post_init__ of the 0.5 series, "mem_fraction_static = (model weights + KV
        # cache pool) / GPU memory capacity", release not pinned here): it leaves 9.5 GiB + 0.5 GiB per GPU of the
        # replica (TP x PP) on a device under 90 GiB (H100, A100), 12 + 0.5 under 160 GiB (H20, H200), 32 GiB above
        # (B200, MI300X), 2.8 + 0.1 under 35 GiB, and 4 GiB more with --enable-dp-attention; chunked prefill 2,048
        # tokens under 35 GiB, 8,192 under 160 GiB, 16,384 above. Its CUDA graphs (sglang v0.5.1 model_executor/cuda_graph_runner.py get_batch_sizes_to_capture):
        # 1, 2, 4, 8, 16, ..., 160 in steps of 8, up to 256 on a device of more than 90 GiB (H200, H20), then 272 to
        # 512 in steps of 16 above 160,000 MiB (B200, MI300X); at most min(KV // 2, the request pool clamped to
        # 2,048-4,096) requests at once (model_runner.py max_num_reqs, as 0.4).
        replace(_SGLANG_04, version="0.5", memory_by_tp=(),
                memory_reserve=((35, 2.8, 0.1), (90, 9.5, 0.5), (160, 12.0, 0.5), (math.inf, 32.0, 0.0)),
                attn_dp_reserve_gib=4.0, budget_by_memory=((0, 2048), (35, 8192), (160, 16384)),
                cuda_graph_max=512, graph_max_by_memory=((90, 160, 160), (156.25, 256, 256), (math.inf, 512, 512)),
                cuda_graph_sizes=(1, 2, 4, 8, *range(16, 257, 8), *range(272, 513, 16)),
                source="sglang server_args.py of 0.5.0-0.5.2 (mem_fraction_static from reserved memory), v0.5.1 "
                       "cuda_graph_runner.py; otherwise as sglang@0.4"),
        # SGLang 0.5.3 and later (the catalogue's GPUStack runs are 0.5.3 and 0.5.5.post1): the KV fraction from the
        # memory its own settings need (sgl-project/sglang v0.5.3 python/sglang/srt/server_args.py, the
        # mem_fraction_static and GPU-memory defaults; sglang_053_reserve_gib): chunked prefill 2,048 tokens under
        # 35 GiB, 4,096 under 60, 8,192 under 160, 16,384 above; the largest CUDA-graph batch 8 under 20 GiB, 16 /
        # 80 (TP < 4 / TP >= 4) under 35, 32 / 160 under 60, 256 / 512 under 160 (H100, A100, H200), 512 above;
        # graphs for 1, 2, 4, 8, 12, 16 to 256 in steps of 8, 272 to 496 in steps of 16, then 512 up in steps of
        # 32 (_generate_cuda_graph_batch_sizes); the request pool as 0.4 (model_runner.py max_num_reqs).
        replace(_SGLANG_04, version="0.5.3", memory_by_tp=(), reserve_from_settings=True,
                budget_by_memory=((0, 2048), (35, 4096), (60, 8192), (160, 16384)),
                cuda_graph_max=512,
                graph_max_by_memory=((20, 8, 8), (35, 16, 80), (60, 32, 160), (160, 256, 512), (math.inf, 512, 512)),
                cuda_graph_sizes=(1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, 8193, 32)),
                source="sglang v0.5.3 server_args.py (mem_fraction_static from the reserved memory of its chunked "
                       "prefill, CUDA graphs and parallel size), model_runner.py; otherwise as sglang@0.4"),
        # TensorRT-LLM 0.13 as its perf-overview page ran it (trtllm-bench on a built TRT engine, in-flight
        # batching under max_num_tokens / max_batch_size that trtllm-bench derives from the dataset,
        # GUARANTEED_NO_EVICT): the mechanics of trtllm@1.0 above, whose fitted overhead it shares (the 0.13
        # table's A100/H100/L40S rows are in the catalogue).
        # No CUDA graphs: that trtllm-bench ran a built engine through the C++ executor with an ExecutorConfig of
        # scheduler, KV-cache and parallel settings only (tensorrt_llm/bench/run/dataclasses.py RuntimeConfig
        # get_config, the bench of the 0.12-0.13 releases), so the runtime's CUDA-graph mode
        # (ExtendedRuntimePerfKnobConfig cuda_graph_mode) stays at its default, off: decode batches run unpadded.
        replace(_TRTLLM_BENCH, version="0.13", attn_dp=False, cuda_graph_max=0, cuda_graph_sizes=(),
                source="NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md (v0.13.0 table), "
                       "tensorrt_llm/bench/run/dataclasses.py (no CUDA graphs); overhead fitted by blendsim fidelity"),
        # TensorRT-LLM 0.19-0.21: trtllm-bench on the PyTorch backend (no engine build), as the perf-overview page of
        # v0.20 ran it ("Starting with v0.19, testing was performed using the PyTorch backend"; its llm_options.yml pads
        # CUDA graphs over batch sizes 1-8192, KV fraction 0.95 where it fit): the mechanics of trtllm@1.0 above,
        # whose fitted overhead it shares.
        replace(_TRTLLM_BENCH, version="0.19", attn_dp=False,
                source="NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md (v0.20 version: PyTorch "
                       "backend since v0.19, llm_options.yml); overhead fitted by blendsim fidelity"),
        # TensorRT-LLM 0.8 (early 2024; NanoFlow's baseline): the C++ GptManager runtime, in-flight batching,
        # KV fraction 0.9 of free memory (kvCacheConfig.freeGpuMemoryFraction), no block reuse, chunked context
        # off and enableTrtOverlap off by default (docs/source/batch_manager.md of that era); whole prompts
        # are batched with the generation requests under the engine's build-time max_num_tokens (modelled as
        # the 8192-token budget; a prompt longer than it is chunked here, the real engine needs a larger
        # build), no CUDA graphs (not verified from the 0.8 source), GUARANTEED_NO_EVICT admission. Loop in
        # C++ with GPU sampling: the fitted trtllm overhead.
        # Behind its server (serve=1): Triton Inference Server with the TensorRT-LLM backend, how TensorRT-LLM was
        # served before trtllm-serve (NVIDIA/TensorRT-LLM tensorrtllm_backend, all_models/inflight_batcher_llm: an
        # ensemble of a Python preprocessing model that tokenizes each request, the tensorrt_llm model that runs the
        # engine, a Python postprocessing model that detokenizes each streamed response, and Triton's HTTP frontend
        # that sends it). That work runs in the server's own processes beside the engine's loop, so it adds no time
        # to a step but sets a pace the engine cannot outrun (server_token_s, server_request_s). No per-token figure
        # is published; the prior (ours) is 100 us per streamed token and 5 ms per request, fitted to the
        # catalogue's Triton-served rows. What shows it: in both published Triton-served sets (vLLM blog 2024-09-05,
        # SGLang blog 2024-07-25) TensorRT-LLM on H100 levels off at 5,000-6,600 output tok/s whatever the model
        # -- Llama-3-8B on one H100 and Llama-3-70B on eight alike -- while the GPU time of the two differs twofold.
        EngineProfile("trtllm", version="0.8", scheduler={"token_budget": 8192, "max_seqs": 2048, "block_size": 64,
                                                          "mix": "decode-first", "prefix_caching": False,
                                                          "gpu_memory_utilization": 0.90, "admission": "reserve",
                                                          "reserve_ratio": 1.0},
                      fixed_s=0.5e-3, per_seq_s=2e-6, cuda_graph_max=0, regime="trtllm", fitted=("fixed_s", "per_seq_s"),
                      fit_as="trtllm", kv_of_free=True, server_token_s=100e-6, server_request_s=5e-3,
                      server_fitted=("server_token_s", "server_request_s"),
                      source="NVIDIA/TensorRT-LLM docs/source/batch_manager.md (0.7-0.9 era); NanoFlow README "
                             "(v0.8.0 baseline); served: Triton's tensorrtllm_backend inflight_batcher_llm ensemble, "
                             "server stage fitted by blendsim fidelity"),
        # DeepSpeed-FastGen (DeepSpeed-MII 0.1-0.2, inference v2): Dynamic SplitFuse -- decodes first, then
        # prompt chunks filling a fixed budget of max_ragged_batch_size = 768 tokens per forward, at most
        # max_ragged_sequence_count = 512 sequences (deepspeed/inference/v2/ragged/manager_configs.py;
        # DeepSpeed-MII@v0.2.3 mii/batching/ragged_batching.py schedule_requests); a prompt is admitted only when
        # the KV of the whole prompt can be reserved (greedy on the prompt, recompute of the last request when
        # stuck); KV blocks of 64 tokens for head size 128 (blocked_flash.py get_kv_block_size); the KV takes
        # all memory but 1 GB after the weights (MemoryConfig RESERVE 1e9: 0.98 of an 80 GB GPU); no CUDA
        # graphs (RaggedInferenceEngineConfig has none); no prefix cache. The loop is synchronous Python with a
        # blocking device-to-host copy each step (ragged_batching.py generate): no published per-step figure.
        # Fixed part as vLLM V0's synchronous loop (_V0_LOOP: 1 ms). Per sequence, counted in MII
        # v0.1.1's step (ours, not measured): its top-p filter loops over the batch's rows (logit_processors.py,
        # ~:46-60: about three eager PyTorch ops and one mask-indexing sync per row) and a request's GPU stop
        # flag is read back about four times a step (ragged_batching.py done_tokens, ~:297-301, read at ~:220,
        # :403, :405, :269), so five blocking one-value reads at ~15 us (copy launch, stream sync, Python) and
        # three ops at ~10 us: 105 us; plus vLLM V0's whole per-sequence loop (_V0_LOOP: 36 us; schedule, input
        # bookkeeping, sampling and outputs -- taken whole, so the sampling that the top-p count above covers is
        # partly counted twice: an upper-side figure) and MII's per-sequence put / insert_sequence / postprocess
        # (~15 us): 156 us. MII v0.2.0 (PR #377,
        # 2024-01-18) vectorised the top-p filter and kept the stop flags on the CPU.
        # When the KV is full (kv_full = "stall"): DeepSpeed-MII v0.1.1 (2023-11-10) ragged_batching.py
        # _do_schedule_requests (~lines 504-553) passes over a decode that finds no free KV block for its next
        # token while the other decodes go on, and schedule_requests (~:577-582, with reset_request_status
        # ~:604-619, added 2023-11-09) flushes every request when nothing at all could be scheduled ("Deadlock
        # detected"), re-queuing each as a new prompt of its prompt plus generated tokens. Admission reserves
        # KV for the prompt only, none for max_new_tokens, so when outputs outgrow prompts (500-token prompts)
        # the decodes fill the KV, stall and end in flushes.
        EngineProfile("deepspeed-fastgen", version="0.1",
                      scheduler={"token_budget": 768, "max_seqs": 512, "block_size": 64, "mix": "decode-first",
                                 "prefix_caching": False, "gpu_memory_utilization": 0.98, "admission": "greedy",
                                 "kv_full": "stall"},
                      fixed_s=_V0_LOOP[0], per_seq_s=105e-6 + _V0_LOOP[1] + 15e-6, per_token_s=0.1e-6, cuda_graph_max=0,
                      regime="cuda-graph",
                      source="microsoft/DeepSpeed inference/v2 ragged/manager_configs.py, blocked_flash.py; "
                             "DeepSpeed-MII v0.1.1 and v0.2.3 mii/batching/ragged_batching.py; DeepSpeed-FastGen blog 2023-11"),
]

# The engine every run is priced on when none is given (--engine): pure kernel time at the hardware
# preset's efficiencies, no engine overhead. Every policy of a comparison runs on one engine.
DEFAULT_ENGINE = "ideal"

# every registered profile by (name, version), and the newest version of each name
VERSIONS: dict[tuple[str, str], EngineProfile] = {}
PROFILES: dict[str, EngineProfile] = {}


def version_order(v: str) -> tuple:
    """A version's release numbers as a tuple to compare (suffixes such as .post1 or rc0 ignored)."""
    rel = release(v) if v else None
    return tuple(int(p) for p in rel.split(".")) if rel else ()


def register(profile: EngineProfile) -> EngineProfile:
    """Add a profile under ``(name, version)``; ``NAME`` alone then means the newest version."""
    key = (profile.name, profile.version)
    if key in VERSIONS:
        raise ValueError(f"engine {profile.label} is registered twice")
    VERSIONS[key] = profile
    cur = PROFILES.get(profile.name)
    if cur is None or version_order(profile.version) > version_order(cur.version):
        PROFILES[profile.name] = profile
    return profile


# Where each engine's kv_load (how a load from a lower KV tier meets the step) comes from; set by engine
# name, so every modelled version of an engine shares it (vLLM's native offloading arrived in 0.11):
KV_LOAD_SOURCES = {
    "trtllm": "stall: NVIDIA/TensorRT-LLM docs/source/features/kvcache.md -- an offloaded block is first copied "
              "back into GPU memory when reused (onboarding before the step; no layer-wise overlap documented)",
    "vllm": "async: vLLM KV offloading connector (0.11+; docs 'KV Offloading Usage Guide', blog 2026-01-08) -- "
            "DMA transfers run asynchronously alongside model computation; V1's scheduler allocates the loading "
            "request's blocks, puts it in WAITING_FOR_REMOTE_KVS and schedules the others, and takes it up again "
            "at the first step after its transfer is reported finished (vllm/v1/core/sched/scheduler.py, "
            "load_kv_async, _update_waiting_for_remote_kv; v0.9.2)",
    "vllm-v0": "stall: no native offloading before vLLM 0.11; LMCache's connector defaults to use_layerwise=False "
               "(lmcache/v1/config.py), a blocking retrieve before the step",
    "sglang": "overlap: SGLang HiCache (docs/advanced_features/hicache_design.md) loads layer N+1's KV while "
              "computing layer N",
    "nanoflow": "stall: ours -- NanoFlow has no KV offloading; the conservative choice",
    "deepspeed-fastgen": "stall: ours -- DeepSpeed-FastGen (DeepSpeed-MII) has no KV offloading; the conservative choice",
    "ideal": "stall: ours -- kernel time only, no engine to overlap a transfer with the step",
}
_KV_LOAD = {"trtllm": "stall", "vllm": "async", "vllm-v0": "stall", "sglang": "overlap", "nanoflow": "stall"}
# The first release with the overlapped reload KV_LOAD_SOURCES names: NAME@VERSION older than it stalls, whichever
# profile prices it (vllm@0.10 is priced by the 0.8 profile but predates vLLM's own offloading connector, 0.11;
# before it only LMCache's connector reloads, and its retrieve is not layer-wise by default)
# SGLang's hierarchical cache (HiCache) came with sgl-project/sglang PR #2693 and its parts (#2771, #2804), merged
# in January 2025, after every 0.3 release: sglang@0.3 stalls; the 0.4 release that first carried it is not
# pinned here, so every 0.4 overlaps
KV_LOAD_SINCE = {"vllm": "0.11", "sglang": "0.4"}

# The tensor-parallel all-reduce each engine runs (EngineProfile.custom_allreduce), set by engine name: every
# modelled version of an engine has the same rule. The one-shot/two-shot kernels read the peers' buffers over
# NVLink (peer-to-peer), with a latency of a few steps where NCCL's ring takes 2(t - 1); each engine hands NCCL what
# its kernel's registered buffer cannot hold.
CUSTOM_ALLREDUCE_SOURCES = {
    "vllm": "custom all-reduce up to 8 MiB per GPU at TP 2, 4, 6 and 8 on fully NVLink-connected GPUs, NCCL above: vllm@v0.5.2 "
            "vllm/distributed/device_communicators/custom_all_reduce.py (CustomAllreduce max_size=8192 * 1024, "
            "_SUPPORTED_WORLD_SIZES, full_nvlink check) and csrc/custom_all_reduce.cu should_custom_ar "
            "(inp_size <= max_size); not modelled: later releases' all-reduce through PyTorch symmetric memory on "
            "Hopper and Blackwell (VLLM_ALLREDUCE_USE_SYMM_MEM), priced here as NCCL",
    "vllm-v0": "vLLM's (above): the V0 engines of 0.5-0.6 carry the same kernel and limit",
    "sglang": "vLLM's custom all-reduce, the same 8 MiB limit: SGLang 0.2-0.3 run vLLM's distributed layer, 0.4+ "
              "carry its copy (sglang srt/distributed/device_communicators/custom_all_reduce.py)",
    "trtllm": "custom all-reduce plugin up to its workspace, 16,000,000 bytes at TP <= 2 and 8,000,000 above, NCCL "
              "above it: NVIDIA/TensorRT-LLM tensorrt_llm/plugin/plugin.py "
              "CustomAllReduceHelper.max_workspace_size_auto (cpp/tensorrt_llm/common/customAllReduceUtils.h "
              "getMaxRequiredWorkspaceSize, kept in sync)",
    "deepspeed-fastgen": "NCCL for every message: DeepSpeed inference v2 model implementations all-reduce with "
                         "deepspeed.comm dist.all_reduce (torch.distributed, NCCL), e.g. "
                         "deepspeed/inference/v2/model_implementations/llama_v2/llama_v2_model.py",
    "nanoflow": "not modelled: every all-reduce at the link price",
    "ideal": "not modelled: every all-reduce at the link price",
}
_VLLM_AR = tuple((t, 8 * 2**20 if t % 2 == 0 else 0) for t in range(2, 9))  # TP 2, 4, 6, 8: its world sizes
CUSTOM_ALLREDUCE: dict[str, tuple | None] = {
    "vllm": _VLLM_AR, "vllm-v0": _VLLM_AR, "sglang": _VLLM_AR,
    "trtllm": ((2, 16_000_000), (8, 8_000_000)), "deepspeed-fastgen": (),
}

# The GPU makers an engine runs on, where that is not every preset's: TensorRT-LLM builds TensorRT engines, which run
# on NVIDIA GPUs only (NVIDIA/TensorRT-LLM README: "optimize inference on NVIDIA GPUs"), and NanoFlow's kernels are
# CUDA ones (efeslab/Nanoflow README: CUTLASS GEMMs, FlashInfer attention, MSCCL++ collectives). vLLM and SGLang
# have ROCm builds (the catalogue's MI300X rows); ``ideal`` and calibrated files run anywhere their name's engine does.
ENGINE_VENDORS: dict[str, tuple] = {"trtllm": ("nvidia",), "nanoflow": ("nvidia",)}
# a preset's maker by its architecture (blendsim.sim.hardware.ARCH): every architecture not named is NVIDIA's; the
# ``cpu`` preset is a stand-in to calibrate (``blendsim calibrate --device cpu``) that every engine's tests run on
ARCH_VENDOR = {"cdna3": "amd", "cpu": None}


def hardware_unsupported(prof: EngineProfile, hw) -> str:
    """Why engine ``prof`` cannot run on the hardware preset ``hw`` (a HardwareSpec), or "" where it can."""
    makers, maker = ENGINE_VENDORS.get(prof.name), ARCH_VENDOR.get(hw.arch, "nvidia")
    if makers is None or maker is None or maker in makers:
        return ""
    return f"{prof.name} runs on {' and '.join(_MAKER_NAMES[m] for m in makers)} GPUs only"


_MAKER_NAMES = {"nvidia": "NVIDIA", "amd": "AMD"}


def require_hardware(prof: EngineProfile, hw) -> None:
    """One line where a deployment's GPU meets an engine that does not run on it."""
    why = hardware_unsupported(prof, hw)
    if why:
        others = sorted(n for n in ("vllm", "sglang") if n not in ENGINE_VENDORS)
        raise UserError(f"engine {prof.label} on {hw.name}: {why}; choose another engine or GPU ({' or '.join(others)} "
                        f"run on every GPU preset)")


for _p in (*_BUILTIN, *_VERSIONED):
    register(replace(_p, kv_load=_KV_LOAD.get(_p.name, _p.kv_load),
                     custom_allreduce=CUSTOM_ALLREDUCE.get(_p.name, _p.custom_allreduce)))


# Pipeline parallelism (``--pp`` > 1) as each engine's releases run it, and why a profile cannot price it where it
# cannot (``pipeline_unmodelled``). TensorRT-LLM has split a model into pipeline stages since its first public
# release (v0.5.0, October 2023: its README's feature list, "Tensor Parallelism" and "Pipeline Parallelism"; every
# modelled version carries it). vLLM: the V0 engine from 0.5.1 (vllm/config.py at v0.5.0 raises "Pipeline parallelism
# is not supported yet"), and only behind its API server -- the offline engine's step raises "Pipeline parallelism is
# only supported through AsyncLLMEngine" (vllm/engine/llm_engine.py, v0.5.1 to v0.6.x) -- each stage's batch under a
# scheduler of its own (virtual engines, as blendsim runs a pipe); 0.6 turns its asynchronous output processing off
# under pipeline parallelism (vllm/config.py at v0.6.0, ModelConfig), and the vllm@0.6 loop is fitted with it on. The V1
# engine took pipeline stages from 0.8.4 (vllm/engine/arg_utils.py at v0.8.4, _is_v1_supported_oracle: with the Ray
# executor; 0.8.0-0.8.3 fall back to the V0 engine for them, arg_utils.py at v0.8.2; read in ROCm/vllm's
# v0.8.2+rocm and v0.8.4+rocm tags). SGLang runs pipeline stages (--pp-size, sgl-project/sglang PR #5724, 2025) with
# its overlapped scheduler off and micro-batches through an event loop of its own (python/sglang/srt/server_args.py:
# pp_size > 1 sets disable_overlap_schedule), which no sglang profile models. DeepSpeed-FastGen splits a model by
# tensor parallelism only (microsoft/DeepSpeed-MII mii/config.py, v0.1.1 to v0.3.1: ModelConfig has tensor_parallel
# and no pipeline degree), and so does NanoFlow (efeslab/Nanoflow pipeline/config_all: every GPU of gpu_num runs all
# run_layer layers; its "pipeline" is the nano-batch overlap within a device).
PIPELINE_V0_SINCE = "0.5.1"
PIPELINE_V1_SINCE = "0.8.4"
_NO_PIPELINE = {
    "deepspeed-fastgen": "DeepSpeed-FastGen splits a model by tensor parallelism only (DeepSpeed-MII's ModelConfig has "
                         "tensor_parallel and no pipeline degree)",
    "nanoflow": "NanoFlow splits a model over its GPUs by tensor parallelism only (every GPU runs every layer; its "
                "pipeline is the nano-batch overlap within a device)",
    "sglang": "SGLang runs pipeline stages with its overlapped scheduler off and micro-batches through an event loop "
              "of its own (server_args.py: pp_size > 1 sets disable_overlap_schedule), which no sglang profile models",
}


def _before(version: str, since: str) -> bool:
    """Whether ``version`` is older than ``since``; a version written to fewer places is compared on those (``0.8``
    may be 0.8.4 or later and is not older than 0.8.4)."""
    have, first = version_order(version), version_order(since)
    return bool(have) and have < first[:len(have)]


def pipeline_unmodelled(prof: EngineProfile) -> str:
    """Why ``prof`` cannot price a replica split into pipeline stages ("" where it can): the engine, or the release
    it was asked at, runs none, or runs them in a way its profile does not model (see PIPELINE_V0_SINCE)."""
    name = prof.name.removesuffix("-v0")
    if name in _NO_PIPELINE:
        return _NO_PIPELINE[name]
    if name != "vllm" or not prof.version:
        return ""
    asked = prof.release or prof.version  # the release asked for (vllm@0.8.2; a calibrated file's), else its own
    if version_order(prof.version) >= (0, 8):  # the V1 engine
        if _before(asked, PIPELINE_V1_SINCE):
            return (f"vLLM {asked} runs pipeline stages on its V0 engine (V1 takes them from {PIPELINE_V1_SINCE}); "
                    f"price them with vllm@{PIPELINE_V1_SINCE} or later, or vllm@0.5:serve=1 (V0)")
        return ""
    if _before(asked, PIPELINE_V0_SINCE):
        return f"pipeline parallelism arrived in vLLM {PIPELINE_V0_SINCE}"
    if version_order(prof.version) >= (0, 6):
        return ("vLLM 0.6 turns its asynchronous output processing off under pipeline parallelism and the "
                f"{prof.modelled} loop is fitted with it on; price such a run with vllm@0.5:serve=1 (V0's "
                f"synchronous loop) or vllm@{PIPELINE_V1_SINCE} or later (V1)")
    if not prof.serve:
        how = ("calibrate it on runs behind the server" if prof.params_file else
               f"add serve=1 ({prof.name}@{asked}:serve=1)")
        return f"vLLM V0 runs pipeline stages only behind its API server (its offline engine refuses them); {how}"
    return ""


def require_pipeline(prof: EngineProfile, pp: int) -> None:
    """One line where a deployment of ``pp`` pipeline stages meets an engine that cannot run or price them."""
    if pp > 1:
        why = pipeline_unmodelled(prof)
        if why:
            raise UserError(f"engine {prof.label} with --pp {pp}: {why}")


def attn_dp_modelled(prof: EngineProfile, version: str) -> bool:
    """Whether attention data parallelism is modelled for ``prof`` at release ``version`` ("" = its newest). A version
    written to fewer places than the first modelled release is compared on those places (``0.4`` may be 0.4.4 or later
    and is not refused; ``0.3`` is)."""
    if not (prof.attn_dp_since and version):
        return True
    have, since = version_order(version), version_order(prof.attn_dp_since)
    return have >= since[:len(have)] if len(have) < len(since) else have >= since


def _async(prof: EngineProfile, k: EngineKey, text: str) -> EngineProfile:
    """``prof`` with its opt-in asynchronous scheduler on: the loop's residual (:data:`ASYNC_RESIDUAL`) in place of
    its loop, where the requested release has one (the key's own fixed_s / per_seq_s still win)."""
    if not prof.async_since:
        raise UserError(f"engine {text!r}: {prof.modelled} has no opt-in asynchronous scheduler to turn on"
                        + (" (its overlapped scheduler is always on)" if prof.name == "sglang" else ""))
    if k.version and version_order(k.version) < version_order(prof.async_since):
        raise UserError(f"engine {text!r}: {prof.name}'s --async-scheduling arrived in {prof.async_since} "
                        f"({prof.name}@{k.version} predates it)")
    return replace(prof, fixed_s=ASYNC_RESIDUAL[0], per_seq_s=ASYNC_RESIDUAL[1], fitted=())


def resolve_version(name: str, version: str) -> EngineProfile | None:
    """The profile of ``name`` that models ``version``: that version if registered, else the newest registered
    one older than it (a release between two modelled ones behaves like the older until the newer's
    change); None when ``version`` predates them all."""
    exact = VERSIONS.get((name, version))
    if exact is not None:
        return exact
    want = release_key(version)
    older = [(v, p) for (n, v), p in VERSIONS.items() if n == name and v and release_key(v) <= want]
    return max(older, key=lambda vp: release_key(vp[0]))[1] if older else None


def release_key(v: str) -> tuple:
    """:func:`version_order` with the missing places as zeros, to order releases: ``1`` is ``1.0`` (and ``1.0.0``),
    which a plain tuple puts before ``1.0``."""
    t = version_order(v)
    return t + (0,) * (4 - len(t)) if len(t) < 4 else t


def next_release(name: str, version: str) -> str:
    """The next modelled release of ``name`` after ``version`` ("" for the newest or an unversioned engine)."""
    newer = [v for n, v in VERSIONS if n == name and v and version and release_key(v) > release_key(version)]
    return min(newer, key=release_key) if newer else ""


def releases(name: str, version: str) -> str:
    """The releases ``name@version`` prices: from its version up to the next modelled one of the name (a release
    between two modelled ones behaves like the older, :func:`resolve_version`); "every release" for an unversioned
    engine."""
    if not version:
        return "every release (no versions modelled)"
    newer = next_release(name, version)
    return f"{version} up to {newer} (not included)" if newer else f"{version} and later"


def sizes_text(sizes, most: int = 20, head: int = 8, tail: int = 4) -> str:
    """CUDA-graph batch sizes for a reader: all of them up to ``most``, else the first ``head``, the last ``tail`` and
    the count."""
    if len(sizes) <= most:
        return ", ".join(map(str, sizes))
    return f"{', '.join(map(str, sizes[:head]))}, ... {', '.join(map(str, sizes[-tail:]))} ({len(sizes)} sizes)"


# the scheduler fields a profile's table column and `blendsim engines NAME` show, and the profile rules that set them
_SHOWN_OPEN = {"token_budget": ("budget_by_memory", "tuned_by", "budget_from_context"),
               "max_seqs": ("running_from_pool", "tuned_by"), "block_size": (), "prefix_caching": ()}


def scheduler_left_open(prof: EngineProfile) -> dict:
    """The scheduler fields this profile leaves to blendsim's own defaults (``EngineConfig``): neither its
    ``scheduler`` nor a per-GPU or per-memory rule sets them (``ideal`` sets none)."""
    from blendsim.sim.seq import EngineConfig

    by_device = {k for v in prof.by_device.values() for k in v}
    cfg = EngineConfig()
    return {k: getattr(cfg, k) for k, rules in _SHOWN_OPEN.items()
            if k not in prof.scheduler and k not in by_device and not any(getattr(prof, r) for r in rules)}


def describe_profile(prof: EngineProfile, params: dict | None = None) -> dict:
    """Everything a reader needs to know of one engine profile, in the order ``blendsim engines NAME`` prints it:
    what it models and whence, its scheduler defaults, its per-step CPU loop (fitted values where the parameters
    file has them, else the cited prior), its server stage, its kernels' regime and its cited mechanics (CUDA
    graphs, all-reduce, KV reload). Units in the keys' suffixes (``_s`` seconds, ``_bytes`` bytes)."""
    if prof.params_file:  # a calibrated profile: its own file fitted it
        params = load_params(prof.params_file)
    params = load_params() if params is None else params
    where = prof.params_file or "the shipped parameters file"
    fitted = {k: v for k, v in prof.fitted_overhead(params).items() if k in prof.fitted or k in prof.server_fitted}
    base = f"{prof.name}@{prof.version}" if prof.version else prof.name
    newest = PROFILES.get(prof.name)
    is_newest = newest is not None and newest.version == prof.version and not prof.params_file
    d: dict = {"engine": prof.modelled, "releases": releases(prof.name, prof.version),
               "selected_by": base + (f" or {prof.name}" if is_newest and prof.version else ""),
               "asked_as": prof.label, "source": prof.source}
    for k, v in prof.scheduler.items():
        d[f"scheduler.{k}"] = v
    for k, v in sorted(prof.by_device.items()):  # "large" is a GPU of 70 GiB or more that is not an A100
        size, _, entry = k.partition("-")
        d[f"scheduler.{size}_gpu_{entry}"] = ", ".join(f"{a}={b}" for a, b in v.items())
    if prof.by_device:
        d["large_gpu"] = "a GPU of 70 GiB or more that is not an A100 (the engine's own rule); small: any other"
    if prof.memory_by_tp:
        d["kv_fraction_by_tp"] = ", ".join(f"TP>={t}: {f}" for t, f in prof.memory_by_tp)
    if prof.memory_reserve:
        d["kv_memory_left"] = ", ".join(f"{'under ' + format(g, 'g') + ' GiB' if math.isfinite(g) else 'larger'}: "
                                        f"{left:g} GiB + {per:g} GiB per GPU" for g, left, per in prof.memory_reserve)
    if prof.budget_by_memory:
        d["token_budget_by_memory"] = ", ".join(f">={g:g} GiB: {b}" for g, b in prof.budget_by_memory)
    if prof.reserve_from_settings:
        d["kv_memory_left"] = ("as SGLang 0.5.3 reserves it: 0.5 GiB + 1.5 MiB per chunked-prefill token + 2 MiB per "
                               "CUDA-graph request + 1 GiB per 8 GPUs (+ attention DP's), at least 10 GiB above 60 GiB")
    if prof.running_from_pool:
        lo, hi = prof.running_from_pool
        d["max_running"] = (f"min(KV tokens / 2, KV tokens / context length x 512 clamped to {lo:g}.."
                            f"{'no limit' if math.isinf(hi) else format(hi, 'g')}), over scheduler.max_seqs")
    d["kv_fraction_of"] = ("free memory after weights and activations" if prof.kv_of_free else
                           "weights and KV pool (static fraction)" if prof.static_fraction else "device memory")
    if prof.budget_from_context:
        d["token_budget_from_context"] = True
    if prof.tuned_by:
        d["limits_tuned_by"] = prof.tuned_by
    open_ = scheduler_left_open(prof)
    if open_:
        d["scheduler_left_open"] = (", ".join(f"{k}={v}" for k, v in open_.items())
                                    + " (blendsim's defaults, where neither the profile nor a policy or option sets them)")
    d["mode"] = prof.mode
    d["fixed_s"], d["per_seq_s"], d["per_token_s"] = prof.fixed_s, prof.per_seq_s, prof.per_token_s
    loop = [k for k in ("fixed_s", "per_seq_s", "per_token_s") if k in fitted]
    d["loop"] = (f"fitted: {', '.join(loop)} ({where}, key {prof.overhead_key})" if loop else
                 "opt-in asynchronous scheduler: the residual left on the step" if prof.async_scheduling else
                 "cited prior (not fitted)" if prof.fitted else "cited (not fitted)")
    if prof.api_share:
        d["api_share"] = prof.api_share
    if prof.server_token_s or prof.server_request_s:
        # the server stage's fitted values whether or not this key serves (they price its serve=1 runs)
        served = {k: v for k, v in replace(prof, serve=True).fitted_overhead(params).items() if k in prof.server_fitted}
        d["server_token_s"] = served.get("server_token_s", prof.server_token_s)
        d["server_request_s"] = served.get("server_request_s", prof.server_request_s)
        d["server"] = ("behind its API server (serve=1) only; " +
                       (f"fitted ({where}, key {prof.server_key})" if served else "cited prior"))
    d["serve"] = prof.serve
    if prof.async_since:
        d["async_scheduling"] = f"opt-in from {prof.async_since} (:async_scheduling=1); on: {prof.async_scheduling}"
    d["cuda_graph_max"] = prof.cuda_graph_max
    if prof.graph_max_by_memory:
        d["cuda_graph_max_by_memory"] = ", ".join(
            f"{'under ' + format(g, 'g') + ' GiB' if math.isfinite(g) else 'larger'}: "
            f"{a if a == b else f'{a} (TP < 4) / {b}'}" for g, a, b in prof.graph_max_by_memory)
    if prof.graph_pad_to_limit:
        d["cuda_graph_limit"] = "sizes above the run's largest decode batch, min(max batch, max tokens), give way to it"
    if prof.cuda_graph_sizes:
        d["cuda_graph_sizes"] = sizes_text([x for x in prof.cuda_graph_sizes if x <= max(prof.cuda_graph_max, 1)])
    d["kernel_regime"] = prof.regime or "plain roofline at the hardware preset's efficiencies"
    if prof.attn_dp or prof.attn_dp_since:
        d["attention_dp"] = (("on" if prof.attn_dp else f"off unless asked ({prof.name}:attn_dp=1)")
                             + (f"; modelled from {prof.attn_dp_since}" if prof.attn_dp_since else "")
                             + ("; limits per rank" if prof.limits_per_rank else ""))
    d["all_reduce"] = CUSTOM_ALLREDUCE_SOURCES.get(prof.name, "not modelled: every all-reduce at the link price")
    why = pipeline_unmodelled(prof)
    d["pipeline_stages"] = (f"refused (--pp > 1): {why}" if why else
                            f"modelled from {PIPELINE_V1_SINCE}" if prof.name == "vllm" and version_order(prof.version) >= (0, 8) else
                            "modelled (--pp)")
    if prof.prefill_attention:
        caps = ", ".join(f"{100 * cap:.0f}% of the 16-bit peak on {arch}"
                         for (kernel, arch), cap in sorted(PREFILL_ATTN_CAPS.items()) if kernel == prof.prefill_attention)
        d["prefill_attention"] = (f"{prof.prefill_attention}: prompt attention at most {caps or 'the fitted efficiency'}"
                                  f" ({PREFILL_ATTN_SOURCE})")
    d["kv_load"] = prof.kv_load
    cited = KV_LOAD_SOURCES.get(prof.name, "")
    since = KV_LOAD_SINCE.get(prof.name)
    if since and prof.kv_load == "stall" and not cited.startswith("stall"):  # a release before the overlapped reload
        cited = f"stall: a release before {prof.name} {since}, the first whose reload does not block the step ({cited})"
    d["kv_load_source"] = cited
    return d


def profile_names() -> list[str]:
    return list(PROFILES)


def is_profile(name: str | None) -> bool:
    """Whether ``name`` selects a registered engine (a key with a version or overrides counts)."""
    if not name:
        return False
    if is_profile_file(name):
        return Path(name).exists()
    try:
        k = parse_key(name)
    except UserError:
        return False
    return resolve_version(k.name, k.version) is not None if k.version else k.name in PROFILES


def load_params(path: str | Path | None = None) -> dict:
    """The fitted parameters (``{}`` when the file is absent), every field checked (sim.paramfile)."""
    from blendsim.sim.io import read_json
    from blendsim.sim.paramfile import check_params

    p = Path(path) if path else PARAMS_FILE
    if not p.exists():
        return {}
    regimes = sorted({v.regime for v in VERSIONS.values() if v.regime} | {"default"})
    return check_params(read_json(p, "fitted engine parameters file"), str(p), overhead_keys(), regimes)


def overhead_keys() -> list[str]:
    """What ``params["engine"]`` may be keyed by: a profile's name, or the key of a version's own fitted
    overhead (``vllm@0.6``)."""
    keys = {p.overhead_key for p in VERSIONS.values()} | {f"{p.offline_key}:serve" for p in VERSIONS.values()
                                                          if p.served_loop} | \
        {p.server_key for p in VERSIONS.values() if p.server_fitted}
    return [*PROFILES, *sorted(keys - set(PROFILES))]


PROFILE_KIND = "blendsim-engine-profile"


def is_profile_file(key) -> bool:
    """Whether an ``--engine`` value names a profile file (``blendsim calibrate engine -o FILE.json``)."""
    return isinstance(key, (str, Path)) and str(key).strip().lower().endswith(".json")


def profile_file_digest(path) -> str | None:
    """The SHA-256 of a calibrated profile file's bytes (None where it cannot be read): what identifies the engine it
    prices, whatever the path (a re-calibrated file is another engine, a copy the same one)."""
    import hashlib

    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _from_file(path: str) -> EngineProfile:
    """The engine a ``blendsim calibrate engine`` file was fitted for, with its fitted overhead; the file's
    other parameters (the GPU's efficiencies) price it (``params_file``, read by the cost model)."""
    p = Path(path)
    if not p.exists():
        raise UserError(f"--engine {path}: no such profile file")
    params = load_params(p)
    head = params.get("profile") if isinstance(params, dict) else None
    if not isinstance(head, dict) or head.get("kind") != PROFILE_KIND or not isinstance(head.get("engine"), str):
        raise UserError(f"--engine {path}: not an engine profile (no 'profile' header with kind {PROFILE_KIND!r}; "
                        f"write one with blendsim calibrate engine)")
    name, version = head["engine"].strip().lower(), head.get("version")
    if name not in PROFILES or name == DEFAULT_ENGINE:  # a name only: never options, a file or the empty string
        raise UserError(f"{path}: field profile.engine: {head['engine']!r} is not a modelled engine name "
                        f"({', '.join(n for n in PROFILES if n != DEFAULT_ENGINE)})")
    if version is not None and not isinstance(version, str):  # JSON 0.10 is the number 0.1
        raise UserError(f"{path}: field profile.version: {version!r} must be a string such as \"0.10\"")
    base = name + (f"@{version}" if version else "")
    if ":" in base or "," in base:
        raise UserError(f"{path}: field profile.engine / profile.version: {base!r} carries overrides; a profile "
                        f"names NAME[@VERSION] only (write it again with blendsim calibrate engine)")
    try:
        prof = get_profile(base, params)
    except UserError as e:  # a known engine name: its version is at fault
        field = "profile.version" if head.get("version") and head["engine"].strip().lower() in PROFILES else \
            "profile.engine"
        raise UserError(f"{path}: field {field}: {e}") from None
    hw = head.get("hardware")
    if hw is not None:
        from blendsim.sim.hardware import PRESETS

        if not isinstance(hw, str) or hw not in PRESETS:
            raise UserError(f"{path}: field profile.hardware: {hw!r} is not a hardware preset ({', '.join(PRESETS)})")
    own = params.get("engine", {})
    fitted = head.get("fitted")
    mine = [f for f in fitted if isinstance(f, str) and f.startswith("engine.")] if isinstance(fitted, list) else []
    if prof.fitted and mine and not any(f.startswith(f"engine.{prof.overhead_key}.") for f in mine):
        # the header says which loop the file fitted; a header naming another release would price this one with
        # the shipped loop of the release it names and leave the file's own fit unread
        keys = sorted({f[len("engine."):].rpartition(".")[0] for f in mine})
        raise UserError(f"{path}: field profile.version: {base} is priced under {prof.overhead_key}, but the file "
                        f"fitted {', '.join(keys)}; name the release it was fitted for")
    moved = ([k for k in own if k.partition(":")[0].partition("@")[0] == prof.name
              and k not in load_params().get("engine", {})] if prof.fitted and prof.overhead_key not in own else [])
    if moved:
        # a loop of this engine under a key the shipped file does not fit, and none under the profile's own: the
        # fitted loop was put under another release's key, and the profile's own would silently be its prior
        raise UserError(f"{path}: field engine: holds a loop under {', '.join(moved)} but none under "
                        f"{prof.overhead_key}, the release its profile header names ({base}); put the fitted loop "
                        f"under that key")
    how = (f"values kept by blendsim calibrate engine from {head.get('started_from') or 'the shipped parameters'} "
           f"(the fit on its runs was no better) ({path})" if head.get("kept_shipped")
           else f"fitted by blendsim calibrate engine ({path})")
    return replace(prof, key=str(path), params_file=str(p.resolve()), release=str(head.get("version") or ""),
                   source=f"{prof.source}; {how}")


def modelled_profile(key: str, params: dict | None = None) -> str | None:
    """The modelled profile (``NAME@VERSION``) an engine key or a catalogue row's ``engine@version`` resolves to;
    None when it names none."""
    try:
        return get_profile(key, {} if params is None else params).modelled
    except UserError:
        return None


def describe_engine(label: str, modelled: str | None) -> str:
    """An engine's label, and the modelled profile behind it where the label does not name that one (``vllm@0.7.2
    (modelled by vllm@0.6)``, ``vllm (modelled by vllm@0.8)``)."""
    return label if not modelled or label.partition(":")[0] == modelled else f"{label} (modelled by {modelled})"


def get_profile(key: str | EngineProfile | None = None, params: dict | None = None) -> EngineProfile:
    """The engine ``key`` selects (``NAME[@VERSION][:field=value,...]``, :func:`parse_key`; None: ``ideal``)
    with its fitted overhead applied (``params``: a loaded params file) and then the key's overrides. A
    profile passes through unchanged."""
    if isinstance(key, EngineProfile):
        return key
    text = "ideal" if key is None else str(key).strip()
    if is_profile_file(text):
        return _from_file(text)
    if re.search(r"\.json:", text, re.I):  # FILE.json:field=value (the file's path may hold ':' itself)
        raise UserError(f"engine {text!r}: a calibrated profile file takes no overrides; use the file alone, or "
                        f"NAME@VERSION:field=value,...")
    k = parse_key(text)
    prof = resolve_version(k.name, k.version) if k.version else PROFILES.get(k.name)
    if prof is None:
        if k.name in PROFILES:
            have = ", ".join(f"{k.name}@{v}" for v in versions_of(k.name))
            if not have:
                raise UserError(f"engine {text!r}: {k.name} has no modelled versions; use {k.name}")
            raise UserError(f"engine {text!r}: version {k.version} is older than every modelled version of "
                            f"{k.name} ({have})")
        raise UserError(f"unknown engine {k.name!r}; choose one of {', '.join(PROFILES)} (versions: "
                        f"{modelled_versions()}; optionally NAME:field=value,... with fields "
                        f"{', '.join(OVERRIDABLE)}), or a profile .json from blendsim calibrate engine (each profile: "
                        f"blendsim engines)")
    params = load_params() if params is None else params
    if "serve" in k.overrides:  # the entry point picks the fitted loop (served_loop)
        prof = replace(prof, serve=bool(k.overrides["serve"]))
    fitted = prof.fitted_overhead(params)
    if fitted:
        prof = prof.with_params(fitted)
    since = KV_LOAD_SINCE.get(prof.name)
    if since and k.version and prof.kv_load != "stall" and version_order(k.version) < version_order(since):
        prof = replace(prof, kv_load="stall")  # a release before the engine's own overlapped reload
    if k.overrides.get("async_scheduling"):
        prof = _async(prof, k, text)
    asked = k.version or prof.version  # NAME alone: the release its profile prices
    if k.overrides.get("attn_dp") and not attn_dp_modelled(prof, asked):
        raise UserError(f"engine {text!r}: {prof.name}'s attention data parallelism is modelled from "
                        f"{prof.attn_dp_since} ({prof.name}@{asked} predates it; its runs are priced with "
                        f"attention split: drop attn_dp)")
    if "cuda_graph_max" in k.overrides:  # the user's own largest graph batch, on every device
        prof = replace(prof, graph_max_by_memory=())
    if k.overrides or k.version:
        prof = replace(prof, **k.overrides, key=text, release=k.version)
        if k.overrides:
            prof = replace(prof, source=f"{prof.source}; user-given {', '.join(f'{a}={b}' for a, b in k.overrides.items())}")
    return prof


__all__ = ["ASYNC_RESIDUAL", "CUSTOM_ALLREDUCE", "CUSTOM_ALLREDUCE_SOURCES", "DEFAULT_ENGINE", "EngineKey",
           "EngineProfile", "KV_LOAD_SINCE", "KV_LOAD_SOURCES", "MAX_GRAPH_BATCH", "MAX_OVERRIDE_S", "OVERRIDABLE", "PARAMS_FILE",
           "PIPELINE_V0_SINCE", "PIPELINE_V1_SINCE", "PROFILES", "PROFILE_KIND", "SGLANG_ATTN_DP_SINCE", "VERSIONS",
           "attn_dp_modelled", "default_graph_sizes", "describe_profile", "get_profile", "graph_pad", "graph_size",
           "is_profile", "is_profile_file", "load_params", "modelled_versions", "next_release", "overhead_keys",
           "parse_key", "hardware_unsupported", "profile_file_digest", "pipeline_unmodelled", "require_hardware", "profile_names", "register", "releases", "require_pipeline",
           "resolve_version", "sglang_053_reserve_gib", "sizes_text", "trtllm_bench_settings", "version_order", "versions_of"]
