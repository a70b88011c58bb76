"""The cost model: ``cost(features) -> StepCost``, roofline or calibrated, sequential or overlapped.

Operator times come from an *op timer*: :class:`RooflineTimer` (FLOPs and bytes against the device's
peaks times measured efficiencies, GEMM rows padded to the kernel tile, plus a launch overhead per
kernel) or ``blendsim.sim.profile.ProfileTimer`` (polynomials fitted to kernels profiled on a real device, with
the roofline for anything the profile lacks). The execution mode combines them:

* ``sequential`` — compute + memory + other + communication, as vLLM and SGLang run a step;
* ``overlap`` — NanoFlow-style: compute-bound operators (GEMMs, prefill attention), memory-bound ones
  (decode attention, KV writes) and communication run concurrently, so the step takes the longest of
  the three plus an interference share ``kappa`` of the rest; small elementwise operators stay serial.

An engine-overhead term (CPU scheduling, sampling, launches that real engines do not hide) is added
per step; ``ideal`` adds nothing. The engine's hot path calls :meth:`CostModel.step`, which reads the
token-count-only operators from tables built once from the same formulas.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from blendsim.sim.batch import BatchFeatures
from blendsim.sim.deployment import Deployment
from blendsim.sim.engines import graph_size
from blendsim.sim.errors import UserError
from blendsim.sim.ops import (
    ALL_GEMM_OPS,
    FEATURE_OPS,
    LOWP_GEMMS,
    MOE_OPS,
    OPS,
    Shapes,
    attn_coefs,
    gemm_m,
    mla_absorb_counts,
    mla_up_counts,
    op_counts,
)

MODES = ("sequential", "overlap")


@dataclass(frozen=True, slots=True)
class StepCost:
    """The price of one step, seconds."""

    time_s: float  # wall time of the step under the execution mode, engine overhead included
    compute_s: float  # compute-bound operators: GEMMs and prefill attention
    memory_s: float  # memory-bound operators: decode attention and KV writes
    other_s: float = 0.0  # small elementwise operators (norms, rotary, activation, embedding)
    comm_s: float = 0.0  # tensor-parallel all-reduce
    overhead_s: float = 0.0  # engine overhead (CPU scheduling and sampling not hidden by the GPU)


# ---- engine overhead ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class EngineOverhead:
    """Per-step time a real engine adds on top of its kernels: fixed + per sequence + per token."""

    name: str
    fixed_s: float = 0.0
    per_seq_s: float = 0.0
    per_token_s: float = 0.0
    source: str = ""

    def __call__(self, num_seqs, num_tokens):
        return self.fixed_s + self.per_seq_s * num_seqs + self.per_token_s * num_tokens


# NOTE: each preset is the per-step time an engine adds on top of the kernels the op timer prices:
# CPU work the GPU waits for (scheduling, input preparation, output processing, inter-process hops)
# plus GPU sampling, which no operator in sim/ops.py covers (about 1 us per sequence on an A100: two
# or three passes over a 128K-entry float32 logit row, 0.5 MB, at ~1.6 TB/s). They model engines,
# never policies: they were fixed from the measurements cited here, not fitted to any scheduling result.
ENGINES: dict[str, EngineOverhead] = {
    e.name: e
    for e in [
        EngineOverhead("ideal", source="pure kernel time, no engine overhead"),
        # vLLM V1 (the default engine since 0.8) with synchronous scheduling (async scheduling came
        # later as an opt-in flag, vLLM PR #19970).
        # Start from V0 as Vidur measured it on A100 (microsoft/vidur data/profiling/a100/
        # cpu_overheads.csv, Llama-2-7B TP1, medians at batch 8 -> 64): schedule 0.165 -> 0.952 ms,
        # prepare_inputs 0.293 -> 1.163, sampler 0.888 -> 1.370, process_model_outputs 0.624 -> 4.108,
        # ray_comm 0.156 -> 0.455; in sum 2.13 -> 8.05 ms = 1.28 ms + 106 us/seq (the "vllm-v0" preset;
        # vLLM issue #6801 independently reports ~20 ms between steps at batch 200: 1.28 + 21.1 = 22.4).
        # 0.6's async output processing hides process_model_outputs (62 us/seq): 1.15 ms + 44 us/seq.
        # The V1 blog (2025-01-27) reports up to 1.7x the throughput of V0 without multi-step, for
        # Llama-3.1-8B with ShareGPT (taken as one H100), from CPU-overhead cuts alone. At vLLM's
        # default 256 sequences and ShareGPT's ~290-token mean context (202 in + 179 out / 2) the decode
        # roofline of llama-3-8b on h100-80gb is 12.0 ms, so V0 takes 12.0 + 1.15 + 0.044 x 256 = 24.3 ms
        # and V1 24.3 / 1.7 = 14.3 ms: 2.3 ms of overhead at 256 sequences = 0.8 ms + 6 us/seq (the
        # fixed part keeps GPU sampling launch, the host sync and the EngineCore-worker hop; V1's
        # update_from_output alone costs 0.29 ms at batch 256, ~1.1 us/seq, vLLM PR #46112). Input
        # preparation is numpy over a persistent batch: ~20 ns per token (ten passes at ~2 ns each).
        EngineOverhead("vllm", fixed_s=0.8e-3, per_seq_s=6e-6, per_token_s=0.02e-6,
                       source="vLLM V1 blog 2025-01-27 (1.7x over V0) applied to Vidur's A100 V0 CPU "
                              "overheads; vLLM PR #46112"),
        # vLLM V0 (<= 0.5.x, the vLLM of mid-2024 baselines such as NanoFlow's): fully
        # synchronous, so every CPU stage above is exposed: 1.28 ms + 106 us/seq (Vidur, as above).
        # The 2024-09-05 vLLM blog found the same regime on Llama-3-8B/H100 with v0.5.3: scheduling and
        # input preparation 29% of the time against 38% of GPU execution (overhead = 0.76 x GPU time).
        # Prompt inputs were built with Python lists, three appends per token: ~0.1 us per token.
        EngineOverhead("vllm-v0", fixed_s=1.28e-3, per_seq_s=106e-6, per_token_s=0.1e-6,
                       source="microsoft/vidur data/profiling/a100/cpu_overheads.csv (Llama-2-7B TP1); "
                              "vLLM blog 2024-09-05; vLLM issue #6801"),
        # SGLang >= 0.4 runs its scheduler one batch ahead of the GPU ("zero-overhead" overlapped
        # scheduler, SGLang v0.4 blog 2024-12-04: +10% throughput, i.e. the CPU share it removed was
        # ~9% of a step; its Nsight trace of five decode batches shows no GPU idle time). What stays
        # on the critical path is GPU sampling (~1 us/seq, see the NOTE above) and a small per-step
        # synchronisation and attention-plan gap (the blog notes a minor one with FlashInfer): 0.15 ms.
        EngineOverhead("sglang", fixed_s=0.15e-3, per_seq_s=1e-6, per_token_s=0.0,
                       source="SGLang v0.4 blog 2024-12-04 (overlapped scheduler)"),
        # NanoFlow forms batch i+1 on the CPU while the GPU runs batch i and detects EOS one iteration
        # late (NanoFlow, OSDI'25, sec. 4.2), so no CPU stage is exposed; left: GPU sampling (~1 us/seq)
        # and one device-to-host token copy and event wait per iteration (~50 us). Its nano-batch
        # splitting cost is GPU time, carried by the overlap mode's interference term, not here; the
        # extra decode step per request from late EOS detection is a scheduling effect (< 1% at the
        # >100-token mean outputs NanoFlow serves) for the scheduler to model, not a per-step cost.
        EngineOverhead("nanoflow", fixed_s=0.05e-3, per_seq_s=1e-6, per_token_s=0.0,
                       source="NanoFlow OSDI'25 sec. 4.2 (asynchronous scheduling)"),
    ]
}


def get_engine(name: str) -> EngineOverhead:
    """A preset by name, or the user's own measurements as ``fixed_s=A,per_seq_s=B,per_token_s=C`` (any
    subset, seconds; e.g. from timing an engine's step minus its kernels), optionally after a preset's
    name and a colon to start from it: ``vllm:fixed_s=0.002``."""
    base, _, spec = name.rpartition(":") if ":" in name else ("", "", name)
    if "=" not in spec:
        base, spec = name, ""
    try:
        eng = ENGINES[base or "ideal"]
    except KeyError:
        from blendsim.sim.engines import is_profile

        if spec and is_profile(base):  # e.g. trtllm:fixed_s=...: a profile's overheads are its own (or fitted)
            raise UserError(f"--engine {name!r}: {base} is an engine profile, whose overheads take no overrides "
                            f"(its fitted ones: blendsim fidelity --params); overrides start from one of "
                            f"{', '.join(ENGINES)}, e.g. vllm:fixed_s=0.002") from None
        raise UserError(f"unknown engine {base!r}; choose one of {', '.join(ENGINES)}, or give "
                        "fixed_s=...,per_seq_s=...,per_token_s=...") from None
    if not spec:
        return eng
    values = {}
    for part in spec.split(","):
        key, _, val = part.partition("=")
        key = key.strip()
        if key not in ("fixed_s", "per_seq_s", "per_token_s"):
            raise UserError(f"engine {name!r}: unknown field {key!r}; use fixed_s, per_seq_s, per_token_s")
        try:
            values[key] = float(val)
        except ValueError:
            raise UserError(f"engine {name!r}: {key} must be a number of seconds, got {val!r}") from None
        if not (values[key] >= 0 and values[key] < float("inf")):
            raise UserError(f"engine {name!r}: {key} must be a finite number >= 0, got {val!r}")
    return replace(eng, name=name, source=f"user-given ({name})", **values)


# ---- op timers ----------------------------------------------------------------------------
class RooflineTimer:
    """Operator time = max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth) + launches."""

    name = "roofline"

    def __init__(self, dep: Deployment):
        self.dep = dep
        hw, m = dep.hardware, dep.model
        self.shapes = Shapes.of(dep)
        peak = hw.flops_for(m.dtype)
        self.gemm_rate = peak * hw.compute_efficiency  # 16-bit GEMMs (LM head, routers) and decode attention
        # GEMMs with weights in the ``weights`` precision run at its tensor-core peak where the device has one:
        # this ratio to the 16-bit rate (1 for 16-bit weights), so timers that rescale gemm_rate keep it
        self.lowp_ratio = hw.flops_for(m.weights) / peak
        self.attn_rate = peak * hw.attention_compute_efficiency
        self.bw = hw.mem_bandwidth * hw.memory_efficiency
        self.ew_bw = hw.mem_bandwidth * hw.elementwise_efficiency
        self.launch = hw.kernel_launch_s
        self.tile = max(1, hw.gemm_tile_m)
        self.blend = hw.gemm_roofline_blend
        self.link_bw = hw.link_bandwidth
        self.link_lat = hw.link_latency_s

    def op_time(self, op: str, flops, nbytes, kernels, f):
        """Seconds of ``op`` (one layer for layer ops), numbers or arrays."""
        launch = kernels * self.launch
        if op in ALL_GEMM_OPS:
            m = np.asarray(gemm_m(op, f, self.shapes))
            tile = np.where(m <= 64, min(64, self.tile), self.tile)  # small-M kernels use 64-row tiles
            pad = np.where(m > 0, -(-m // tile) * tile / np.maximum(m, 1), 0.0)
            tc = flops * pad / (self.gemm_rate * self.lowp_ratio if op in LOWP_GEMMS else self.gemm_rate)
            tm = nbytes / self.bw
            if self.blend:
                # NOTE: a p-norm instead of max(): near the ridge neither bound is reached (see hardware.py)
                return (tc ** self.blend + tm ** self.blend) ** (1.0 / self.blend) + launch
            return np.maximum(tc, tm) + launch
        if op == "attn_prefill":
            return np.maximum(flops / self.attn_rate, nbytes / self.bw) + launch
        if op == "attn_decode":
            return np.maximum(flops / self.gemm_rate, nbytes / self.bw) + launch
        if op == "allreduce":
            if self.shapes.tp == 1 or self.link_bw <= 0:
                return 0.0 * nbytes
            t = self.shapes.tp
            return kernels * self.link_lat + 2 * (t - 1) / t * nbytes / self.link_bw
        if op == "a2a":
            # dispatch and combine: every GPU sends and receives its share at once over its links
            if self.link_bw <= 0:
                return 0.0 * nbytes
            return kernels * self.link_lat + nbytes / self.link_bw
        return nbytes / self.ew_bw + launch

    def attn_scalars(self):
        """Closures pricing one layer's prefill and decode attention from scalars (engine hot path)."""
        fp, bq, bkey, fd, bdk, bds = attn_coefs(self.shapes)
        ar, gr, bw, la = self.attn_rate, self.gemm_rate, self.bw, self.launch

        def prefill(Tp, Np, pairs, pkv, chunks=None):
            a = fp * pairs / ar
            m = (bq * Tp + bkey * pkv) / bw
            return (a if a > m else m) + la

        def decode(D, Cd):
            keys = Cd + D
            a = fd * keys / gr
            m = (bdk * keys + bds * D) / bw
            return (a if a > m else m) + la

        return prefill, decode

    def notes(self) -> list[str]:
        return []


# ---- the cost model -----------------------------------------------------------------------
class CostModel:
    """Prices steps of one deployment under an execution mode and an engine-overhead style."""

    def __init__(self, dep: Deployment, mode: str = "sequential", engine: str = "ideal", timer=None,
                 interference: float | None = None):
        if mode not in MODES:
            raise UserError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
        self.dep = dep
        self.mode = mode
        self.engine = get_engine(engine) if isinstance(engine, str) else engine
        self.timer = timer or RooflineTimer(dep)
        self.kappa = dep.hardware.overlap_interference if interference is None else interference
        self.layers = dep.model.num_layers
        self.graph_cap = 0  # HOOK (sim.engines): pure-decode steps run at CUDA-graph sizes up to this
        self._mla = dep.model.is_mla
        self._tables_n = 0
        self._grow(4096)
        self._prefill_s, self._decode_s = self.timer.attn_scalars()

    # ---- public API -----------------------------------------------------------------------
    @property
    def timer_name(self) -> str:
        return self.timer.name

    def notes(self) -> list[str]:
        """Messages for the user (e.g. operators a profile lacks), each once."""
        out = list(self.timer.notes())
        prof = getattr(self.timer, "profile", None)
        if prof is not None:
            s = self._shapes
            own = [op for op in OPS if s.applies(op) and op not in prof.ops
                   and (op in ("kv_up_proj", "attn_absorb") or op in MOE_OPS)]
            if own:
                out.append(f"profile {prof.path or ''} has no MoE/MLA operators: using the roofline for "
                           f"{', '.join(own)}")
        return out

    def breakdown(self, f: BatchFeatures) -> list[dict]:
        """Per operator: scope, class, FLOPs, bytes and seconds (layer ops: one layer), and ``layers``: how
        many times it runs in the step (the decoder layers it belongs to; 1 for model ops)."""
        f = self._graph_padded(f)
        s = self.timer.shapes if hasattr(self.timer, "shapes") else Shapes.of(self.dep)
        counts = op_counts(s, f)
        rows = []
        for op, (flops, nbytes, kernels) in counts.items():
            if not s.applies(op):
                continue
            cls, scope = OPS[op]
            t = float(self.timer.op_time(op, flops, nbytes, kernels, f))
            rows.append({"op": op, "scope": scope, "class": cls, "flops": float(flops), "bytes": float(nbytes),
                         "time_s": t, "layers": s.layers_of(op)})
        return rows

    def cost(self, f: BatchFeatures) -> StepCost:
        """Price one step (exact, through the per-operator breakdown)."""
        c = m = o = comm = 0.0
        for r in self.breakdown(f):
            t = r["time_s"] * r["layers"]
            if r["class"] == "compute":
                c += t
            elif r["class"] == "memory":
                m += t
            elif r["class"] == "comm":
                comm += t
            else:
                o += t
        ovh = float(self.engine(f.num_prefill_seqs + f.num_decode, f.num_tokens))
        return StepCost(self._combine(c, m, o, comm) + ovh, c, m, o, comm, ovh)

    def cost_many(self, f) -> dict[str, np.ndarray]:
        """Vectorised pricing: ``f`` has BatchFeatures' fields as equal-length arrays."""
        f = self._graph_padded(f)
        shapes = Shapes.of(self.dep)
        counts = op_counts(shapes, f)
        acc = {"compute": 0.0, "memory": 0.0, "other": 0.0, "comm": 0.0}
        for op, (flops, nbytes, kernels) in counts.items():
            cls, scope = OPS[op]
            t = self.timer.op_time(op, flops, nbytes, kernels, f)
            acc[cls] = acc[cls] + t * shapes.layers_of(op)
        c, m, o, comm = (np.asarray(acc[k], dtype=float) for k in ("compute", "memory", "other", "comm"))
        ovh = self.engine(np.asarray(f.num_prefill_seqs) + np.asarray(f.num_decode), np.asarray(f.num_tokens))
        return {"time_s": self._combine_arr(c, m, o, comm) + ovh, "compute_s": c, "memory_s": m,
                "other_s": o, "comm_s": comm, "overhead_s": ovh + 0 * c}

    def step(self, T: int, Tp: int, Np: int, pairs: int, pkv: int, D: int, Cd: int, N: int, chunks=None):
        """Fast path for the engine: ``(time_s, compute_s, memory_s)`` of one step.

        Token-count-only operators come from tables; attention is priced here. Equal to
        :meth:`cost` on the same features (tested). ``chunks`` (the Batch's prefill list) lets a
        calibrated model price each sequence's prefill attention call on its own.
        """
        T0 = T
        if self.graph_cap and not Np:  # HOOK (sim.engines): CUDA-graph padding of a decode-only step
            T = N = graph_size(T, self.graph_cap)
        if T >= self._tables_n:
            self._grow(2 * T + 1)
        c = self._tc[T] + self._tl[N]
        m = self._tm[T]
        o = self._to[T]
        comm = self._tcomm[T]
        if Np:
            c += self._prefill_s(Tp, Np, pairs, pkv, chunks) * self.layers
            if self._mla:
                c += self._mla_time("kv_up_proj", _Feat(num_prefill_seqs=Np, prefill_kv_tokens=pkv))
        if D:
            m += self._decode_s(D, Cd) * self.layers
            if self._mla:
                c += self._mla_time("attn_absorb", _Feat(num_decode=D))
        ovh = self.engine.fixed_s + self.engine.per_seq_s * (Np + D) + self.engine.per_token_s * T0
        if self.mode == "sequential":
            return c + m + o + comm + ovh, c, m
        hi = c if c > m else m
        if comm > hi:
            hi = comm
        return hi + self.kappa * (c + m + comm - hi) + o + ovh, c, m

    def decode_many(self, D: int, Cd: np.ndarray):
        """Vectorised ``step`` for a run of pure-decode steps with ``D`` sequences (fast-forward)."""
        T = graph_size(D, self.graph_cap) if self.graph_cap else D  # HOOK (sim.engines)
        if T >= self._tables_n:
            self._grow(2 * T + 1)
        c = self._tc[T] + self._tl[T] + 0 * Cd
        if self._mla and D:
            c = c + self._mla_time("attn_absorb", _Feat(num_decode=D))
        m = self._tm[T] + self._attn_decode(D, Cd)
        o = self._to[T]
        comm = self._tcomm[T]
        ovh = self.engine.fixed_s + self.engine.per_seq_s * D + self.engine.per_token_s * D
        return self._combine_arr(c, m, o, comm) + ovh, c, m

    # ---- internals ------------------------------------------------------------------------
    def _graph_padded(self, f):
        """HOOK (sim.engines): a decode-only step's rows at its CUDA-graph size, as :meth:`step` prices it."""
        if not self.graph_cap:
            return f
        from blendsim.sim.engines import graph_pad

        dec = np.asarray(f.num_prefill_seqs) == 0
        pad = np.where(dec, graph_pad(np.asarray(f.num_decode), self.graph_cap), np.asarray(f.num_tokens))
        logits = np.where(dec, pad, np.asarray(f.num_logits))
        if np.ndim(pad) == 0:
            return replace(f, num_tokens=int(pad), num_logits=int(logits)) if isinstance(f, BatchFeatures) \
                else _Feat(**{**{k: getattr(f, k) for k in _Feat.__slots__}, "num_tokens": int(pad),
                              "num_logits": int(logits)})
        return _Feat(**{**{k: getattr(f, k) for k in _Feat.__slots__}, "num_tokens": pad, "num_logits": logits})

    def _combine(self, c, m, o, comm):
        if self.mode == "sequential":
            return c + m + o + comm
        hi = max(c, m, comm)
        return hi + self.kappa * (c + m + comm - hi) + o

    def _combine_arr(self, c, m, o, comm):
        return combine_times(self.mode, self.kappa, c, m, o, comm)

    def _mla_time(self, op: str, f) -> float:
        """All layers of one of MLA's feature-dependent GEMMs (prefill up-projection, decode absorption)."""
        if op == "kv_up_proj":
            flops, nbytes, kernels = mla_up_counts(self._shapes, f.prefill_kv_tokens, 1)
        else:
            flops, nbytes, kernels = mla_absorb_counts(self._shapes, f.num_decode, 1)
        return float(self.timer.op_time(op, flops, nbytes, kernels, f)) * self.layers

    def _attn_decode(self, D, Cd):
        f = _Feat(num_decode=D, decode_ctx_sum=Cd)
        _fp, _bq, _bkey, fd, bdk, bds = attn_coefs(self._shapes)
        keys = Cd + D
        flops = fd * keys
        nbytes = bdk * keys + bds * D
        t = self.timer.op_time("attn_decode", flops, nbytes, 1, f) * self.layers
        return float(t) if np.ndim(t) == 0 else t

    def _grow(self, n: int) -> None:
        """(Re)build the per-token-count tables up to ``n`` tokens."""
        self._shapes = Shapes.of(self.dep)
        T = np.arange(n)
        f = _Feat(num_tokens=T, num_logits=T)
        counts = op_counts(self._shapes, f)
        acc = {"compute": 0.0, "memory": 0.0, "other": 0.0, "comm": 0.0}
        lm = 0.0
        for op, (flops, nbytes, kernels) in counts.items():
            if op in FEATURE_OPS:
                continue
            cls, scope = OPS[op]
            t = np.asarray(self.timer.op_time(op, flops, nbytes, kernels, f), dtype=float) + 0 * T
            if op == "lm_head":
                lm = t
                continue
            acc[cls] = acc[cls] + t * self._shapes.layers_of(op)
        self._tc = np.asarray(acc["compute"] + 0 * T, dtype=float).tolist()
        self._tm = np.asarray(acc["memory"] + 0 * T, dtype=float).tolist()
        self._to = np.asarray(acc["other"] + 0 * T, dtype=float).tolist()
        self._tcomm = np.asarray(acc["comm"] + 0 * T, dtype=float).tolist()
        self._tl = np.asarray(lm + 0 * T, dtype=float).tolist()
        self._tables_n = n


class _Feat:
    """BatchFeatures-shaped holder whose fields default to 0 (numbers or arrays)."""

    __slots__ = ("num_tokens", "num_prefill_tokens", "num_prefill_seqs", "attn_pairs", "prefill_kv_tokens",
                 "num_decode", "decode_ctx_sum", "num_logits")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k, 0))


def features_arrays(**arrays) -> _Feat:
    """Arrays named like BatchFeatures' fields, for :meth:`CostModel.cost_many`."""
    return _Feat(**{k: np.asarray(v) for k, v in arrays.items()})


def build_cost_model(dep: Deployment, mode: str = "sequential", engine: str = "ideal", profile=None) -> CostModel:
    """The roofline model, or the calibrated one when a profile (path or Profile) is given."""
    from blendsim.sim.engines import is_profile

    if isinstance(engine, str) and is_profile(engine):  # HOOK (sim.efficiency): an engine profile
        from blendsim.sim.efficiency import profile_cost_model

        return profile_cost_model(dep, mode, engine, profile)
    if profile is None:
        return CostModel(dep, mode, engine)
    from blendsim.sim.profile import ProfileTimer, load_profile

    prof = load_profile(profile) if not hasattr(profile, "ops") else profile
    m = dep.model
    for what, v in (("--weights", m.weights), ("--kv-dtype", m.kv_dtype)):
        if v != m.dtype:  # a profile measures one dtype throughout
            raise UserError(f"{prof.path or 'profile'}: measured in {prof.dtype}, but the run uses {what} {v}; "
                            f"calibrate with that precision or drop {what}")
    timer = ProfileTimer(prof, dep)
    return CostModel(dep, mode, engine, timer=timer, interference=prof.interference)


def largest_fit(time_of, limit: float, cap: int) -> int:
    """Largest n in [0, cap] with ``time_of(n) <= limit`` (``time_of`` non-decreasing; never called at
    0); 0 if none. Binary search: the forward size that fits a time, the KV a step can read in time."""
    if cap <= 0 or time_of(1) > limit:
        return 0
    if time_of(cap) <= limit:
        return cap
    lo, hi = 1, cap
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if time_of(mid) <= limit:
            lo = mid
        else:
            hi = mid
    return lo


def combine_times(mode: str, kappa: float, c, m, o, comm):
    """A step's kernel time from its compute, memory, other and comm seconds (arrays or scalars):
    their sum in ``sequential`` mode; with operator overlap the longest of compute, memory and comm plus
    ``kappa`` of the rest (interference), plus ``other``."""
    if mode == "sequential":
        return c + m + o + comm
    hi = np.maximum(np.maximum(c, m), comm)
    return hi + kappa * (c + m + comm - hi) + o


__all__ = ["ENGINES", "MODES", "CostModel", "combine_times", "EngineOverhead", "RooflineTimer", "StepCost", "build_cost_model",
           "features_arrays", "get_engine", "largest_fit"]

