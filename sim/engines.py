"""Engine profiles as data: what a serving engine does besides the kernels the cost model prices.

A profile holds an engine's scheduler defaults (token budget, sequence cap, chunked prefill or
prefill-first, KV memory fraction, block size, prefix cache, admission), its per-step overhead (CPU
scheduling, sampling and launches the GPU waits for), its CUDA-graph capture sizes (a pure-decode step
runs at the next captured batch size: padded rows cost GEMM time), its execution mode (operator overlap
only where the engine overlaps) and the name of its kernel-efficiency regime (``blendsim.sim.efficiency``).

``--engine NAME`` selects one everywhere; a policy keeps its own ordering on any engine. The fixed numbers
are cited below; the few fitted ones (the trtllm overhead, the hardware efficiencies) are read from
``sim/engine_params.json``, written by ``blendsim fidelity --refit``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from blendsim.sim.errors import UserError

PARAMS_FILE = Path(__file__).with_name("engine_params.json")


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One serving engine."""

    name: str
    # scheduler defaults (sim.seq.EngineConfig fields; a policy's own defaults and the CLI override them)
    scheduler: dict = field(default_factory=dict)
    # per-step overhead: fixed + per sequence + per token (seconds); fitted values replace these
    fixed_s: float = 0.0
    per_seq_s: float = 0.0
    per_token_s: float = 0.0
    # largest CUDA-graph batch; decode-only steps up to it are padded to the next capture size; 0 = eager
    cuda_graph_max: int = 0
    mode: str = "sequential"  # sequential | overlap (NanoFlow-style operator overlap)
    regime: str = "default"  # kernel-efficiency regime: the key of its fitted efficiencies
    fitted: tuple = ()  # overhead fields fitted from the catalogue (the rest are cited constants)
    tuned_by: str = ""  # "trtllm-bench": batch and token limits from the dataset (trtllm_bench_settings)
    source: str = ""

    def graph_size(self, n: int) -> int:
        """The captured batch size a decode-only step of ``n`` sequences runs at."""
        return graph_pad(n, self.cuda_graph_max)

    def with_params(self, values: dict) -> EngineProfile:
        keep = {k: float(v) for k, v in values.items() if k in ("fixed_s", "per_seq_s", "per_token_s")}
        return replace(self, **keep)


def graph_size(n: int, cap: int) -> int:
    """One decode batch of ``n`` sequences at its CUDA-graph capture size: 1, 2, 4, 8 and multiples of 8 up
    to 256, then multiples of 256 (vLLM's and TensorRT-LLM's default lists have this shape); ``n`` above
    ``cap`` runs eagerly (unpadded). Plain integers: the engine's per-step path calls it."""
    if n > cap or n <= 0 or cap <= 0:
        return n
    if n <= 256:
        return 1 if n <= 1 else 2 if n <= 2 else 4 if n <= 4 else min(-(-n // 8) * 8, cap)
    return min(-(-n // 256) * 256, cap)


def graph_pad(n, cap: int):
    """:func:`graph_size` over an array of batch sizes (vectorised pricing), or one size."""
    import numpy as np

    a = np.asarray(n)
    small = np.where(a <= 1, 1, np.where(a <= 2, 2, np.where(a <= 4, 4, -(-a // 8) * 8)))
    big = -(-a // 256) * 256
    out = np.where(a <= 256, small, big)
    out = np.where((a > cap) | (a <= 0) | (cap <= 0), a, np.minimum(out, max(cap, 1)))
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
    kv_token = m.kv_bytes_per_token * max(1, dep.tp // m.num_kv_heads)
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


_CITED_VLLM = ("vLLM V1 blog 2025-01-27 (1.7x over V0) applied to Vidur's A100 V0 CPU overheads "
               "(microsoft/vidur data/profiling/a100/cpu_overheads.csv); vLLM PR #46112")

PROFILES: dict[str, EngineProfile] = {
    p.name: p
    for p in [
        # TensorRT-LLM as trtllm-bench runs it (perf-overview.md): inflight batching with context and
        # generation requests in one step under max_num_tokens, batch up to max_batch_size (8192 and 8192
        # by default; trtllm-bench sets both from the dataset: trtllm_bench_settings), CUDA graphs padded up
        # to the batch, KV fraction 0.95 (0.90 where 0.95 did not fit); no prefix reuse
        # across the random-token prompts. Admission: the capacity scheduler's default policy
        # GUARANTEED_NO_EVICT admits a request only when the KV of its whole prompt and max_tokens fits
        # besides what the running ones will still need -- "reserve" admission with each request's
        # max_tokens as its output hint, never a preemption. Overhead: fitted (the rows are its only
        # measurements), bounded by 0..5 ms fixed and 0..20 us per sequence.
        EngineProfile("trtllm", scheduler={"token_budget": 8192, "max_seqs": 8192, "block_size": 32,
                                           "mix": "decode-first", "prefix_caching": False,
                                           "gpu_memory_utilization": 0.95, "admission": "reserve",
                                           "reserve_ratio": 1.0},
                      fixed_s=0.5e-3, per_seq_s=2e-6, cuda_graph_max=8192, regime="trtllm", tuned_by="trtllm-bench",
                      fitted=("fixed_s", "per_seq_s"),
                      source="NVIDIA/TensorRT-LLM docs/source/performance/perf-overview.md (trtllm-bench "
                             "settings); overhead fitted by blendsim fidelity"),
        # vLLM V1 (default since 0.8): 8192-token chunked prefill, 256 sequences, 16-token blocks, prefix
        # cache, greedy admission with recompute-preemption, CUDA graphs up to 512; overhead as sim.cost.
        EngineProfile("vllm", scheduler={"token_budget": 8192, "max_seqs": 256, "block_size": 16,
                                         "mix": "decode-first", "prefix_caching": True,
                                         "gpu_memory_utilization": 0.90, "admission": "greedy"},
                      fixed_s=0.8e-3, per_seq_s=6e-6, per_token_s=0.02e-6, cuda_graph_max=512,
                      regime="cuda-graph", source=_CITED_VLLM),
        # vLLM V0 (<= 0.6): prefill-first steps (no chunked prefill by default), 256 sequences, overhead as
        # sim.cost's vllm-v0 (Vidur's A100 CPU profile); 0.6's multi-step scheduling (--num-scheduler-steps
        # 10) amortises the per-step CPU work over ten steps: the per-sequence share drops tenfold.
        EngineProfile("vllm-v0", scheduler={"token_budget": 8192, "max_seqs": 256, "block_size": 16,
                                            "mix": "prefill-first", "prefix_caching": False,
                                            "gpu_memory_utilization": 0.90, "admission": "greedy"},
                      fixed_s=1.28e-3 / 10 + 0.15e-3, per_seq_s=106e-6 / 10, per_token_s=0.1e-6,
                      cuda_graph_max=256, regime="cuda-graph",
                      source="microsoft/vidur cpu_overheads.csv (V0 on A100); vLLM 0.6 release blog "
                             "2024-09-05 (multi-step scheduling)"),
        # SGLang (0.3-0.4): prefill-first steps with a 16384-token prefill budget (--chunked-prefill-size
        # 8192 in 0.3), token-granular radix cache, reserve-style admission (new_token_ratio), CUDA graphs up
        # to 160 (0.3) -- larger decode batches run eagerly; overhead as sim.cost's sglang.
        EngineProfile("sglang", scheduler={"token_budget": 8192, "max_seqs": 4096, "block_size": 1,
                                           "mix": "prefill-first", "prefix_caching": True,
                                           "gpu_memory_utilization": 0.88, "admission": "reserve",
                                           "reserve_ratio": 0.7},
                      fixed_s=0.15e-3, per_seq_s=1e-6, cuda_graph_max=160, regime="cuda-graph",
                      source="SGLang v0.4 blog 2024-12-04 (overlapped scheduler); sglang server_args defaults"),
        # NanoFlow (OSDI'25): dense batch of 1024 tokens in multiples of 128 (sec. 4), operator overlap of
        # nano-batches, asynchronous scheduling (sec. 4.2); BlendServe's engine (App. A.2).
        EngineProfile("nanoflow", scheduler={"token_budget": 1024, "round_tokens": 128, "block_size": 1,
                                             "mix": "decode-first", "prefix_caching": True,
                                             "gpu_memory_utilization": 0.90, "admission": "reserve"},
                      fixed_s=0.05e-3, per_seq_s=1e-6, mode="overlap", regime="nanoflow",
                      source="NanoFlow OSDI'25 sec. 4 and 4.2; BlendServe ASPLOS'26 App. A.2"),
    ]
}


def profile_names() -> list[str]:
    return list(PROFILES)


def is_profile(name: str | None) -> bool:
    return bool(name) and name in PROFILES


def load_params(path: str | Path | None = None) -> dict:
    """The fitted parameters (``{}`` when the file is absent), every field checked (sim.paramfile)."""
    from blendsim.sim.io import read_json
    from blendsim.sim.paramfile import check_params

    p = Path(path) if path else PARAMS_FILE
    if not p.exists():
        return {}
    return check_params(read_json(p, "fitted engine parameters file"), str(p))


def get_profile(name: str, params: dict | None = None) -> EngineProfile:
    """Profile ``name`` with its fitted overhead applied (``params``: a loaded params file)."""
    try:
        prof = PROFILES[name]
    except KeyError:
        raise UserError(f"unknown engine {name!r}; profiles: {', '.join(PROFILES)}") from None
    params = load_params() if params is None else params
    fitted = params.get("engine", {}).get(name)
    return prof.with_params(fitted) if fitted else prof


__all__ = ["EngineProfile", "PARAMS_FILE", "PROFILES", "get_profile", "graph_pad", "is_profile", "load_params",
           "profile_names", "trtllm_bench_settings"]
