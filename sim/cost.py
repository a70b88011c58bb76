"""The cost model: ``cost(features) -> StepCost``, sequential or overlapped, with an engine's overhead.

One step is priced in four parts, each written once here:

* the feature record: :class:`blendsim.sim.batch.BatchFeatures` (numbers, or arrays for many steps);
* :func:`price_parts`: features -> seconds of the compute-bound, memory-bound, other (small elementwise)
  and communication operators, summing an op timer's per-operator times (``blendsim.sim.timers``);
* :func:`combine_times`: the execution mode's rule joining the parts --

  * ``sequential`` -- compute + memory + other + communication, as vLLM and SGLang run a step;
  * ``overlap`` -- NanoFlow-style: compute-bound operators (GEMMs, prefill attention), memory-bound ones
    (decode attention, KV writes) and communication run concurrently. Compute- and memory-bound kernels
    share every SM, so the longer of the two takes the step plus an interference share ``kappa`` of the
    shorter; the collectives run on a few SMs of their own (:func:`net_share`), so they delay the step by
    that share of their time, or bound it when they are the longest; small elementwise operators stay serial;

* the engine's overhead rule, :meth:`blendsim.sim.engines.EngineProfile.overhead` (CPU scheduling,
  sampling, launches that real engines do not hide; ``ideal`` adds nothing).

:meth:`CostModel.cost`, :meth:`~CostModel.cost_many`, the fidelity re-pricer and the ``cost`` command
call :func:`price_parts` directly; the engine's hot path (:meth:`CostModel.step`, :meth:`~CostModel.decode_many`)
reads the token-count-only operators from tables that :func:`price_parts` filled once, and prices
attention from the timer's scalar closures (equal to :meth:`~CostModel.cost`, tested). Building a cost
model for an engine by name (its timer, efficiencies, CUDA-graph padding) is ``blendsim.sim.build_cost``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from blendsim.sim.batch import BatchFeatures, features_arrays
from blendsim.sim.deployment import Deployment
from blendsim.sim.engines import PROFILES, EngineProfile, graph_pad, graph_size
from blendsim.sim.errors import UserError
from blendsim.sim.ops import (
    FEATURE_OPS,
    OPS,
    Shapes,
    attn_coefs,
    dp_share,
    mla_absorb_counts,
    mla_up_counts,
    op_counts,
    window_decode,
)
from blendsim.sim.timers import OpTimer, RooflineTimer

MODES = ("sequential", "overlap")
PARTS = ("compute", "memory", "other", "comm")  # operator classes (sim.ops.OPS), in StepCost's order


@dataclass(frozen=True, slots=True)
class StepCost:
    """The price of one step, seconds."""

    time_s: float  # wall time of the step under the execution mode, engine overhead included
    compute_s: float  # compute-bound operators: GEMMs and prefill attention
    memory_s: float  # memory-bound operators: decode attention and KV writes
    other_s: float = 0.0  # small elementwise operators (norms, rotary, activation, embedding)
    comm_s: float = 0.0  # tensor-parallel all-reduce
    overhead_s: float = 0.0  # engine overhead (CPU scheduling and sampling not hidden by the GPU)
    server_s: float = 0.0  # the API server's work beside the engine for this step; time_s is at least this


def price_parts(timer: OpTimer, shapes: Shapes, f, counts: dict | None = None, skip=()) -> dict:
    """Seconds of a step's operators by class (``PARTS``), every layer included: numbers, or arrays when
    ``f``'s fields are arrays. ``counts`` (``op_counts(shapes, f)``) may be given when it is reused;
    operators in ``skip`` are left out."""
    counts = op_counts(shapes, f) if counts is None else counts
    acc = dict.fromkeys(PARTS, 0.0)
    for op, (flops, nbytes, kernels) in counts.items():
        if op in skip:
            continue
        cls = OPS[op][0]
        acc[cls] = acc[cls] + timer.op_time(op, flops, nbytes, kernels, f) * shapes.layers_of(op)
    return acc


# NanoFlow's collectives are MSCCL++ kernels launched on a few thread blocks of 1,024 threads each, beside the
# GEMM and decode-attention kernels that take every SM: per layer 16, 8, 8, 8, 32 and 16 blocks for its six
# all-gathers and all-reduces (efeslab/Nanoflow pipeline/src/pipeline.cu, the ``configRun(nblocks, 1024, ...)``
# of AG1_GEMV, AG_O1, AR_O2, AR_D1, AR1_D2, AR2_D2). Their mean, at most one SM each, over the GPU's SMs is the
# share of the GPU a running collective takes from the compute- and memory-bound kernels (:func:`net_share`).
NET_BLOCKS = (16 + 8 + 8 + 8 + 32 + 16) / 6


def net_share(hardware, kappa: float) -> float:
    """The share of ``hardware``'s SMs an overlapped collective occupies (``NET_BLOCKS`` of ``num_sms``, at most
    1); ``kappa`` where the preset gives no SM count."""
    n = getattr(hardware, "num_sms", 0)
    return min(1.0, NET_BLOCKS / n) if n > 0 else kappa


def combine_times(mode: str, kappa: float, c, m, o, comm, net: float):
    """A step's kernel time from its compute, memory, other and comm seconds (numbers or arrays): their sum in
    ``sequential`` mode. With operator overlap, compute and memory take the longer of the two plus ``kappa``
    of the shorter (they share the SMs); the collectives, on their own SMs, add ``net`` of their time
    (:func:`net_share`) or bound the step when longer; ``other`` runs serially."""
    if mode == "sequential":
        return c + m + o + comm
    if isinstance(c, float) and isinstance(m, float) and isinstance(comm, float):
        cm = max(c, m) + kappa * min(c, m) + net * comm  # the engine's per-step path: plain floats
        return (cm if cm > comm else comm) + o
    cm = np.maximum(c, m) + kappa * np.minimum(c, m) + net * comm
    return np.maximum(cm, comm) + o


class CostModel:
    """Prices steps of one deployment: an op timer's operator times, combined under an execution mode,
    plus an engine profile's overhead (``None``: ``ideal``). ``graph_sizes``: the CUDA-graph batch sizes a
    pure-decode step is padded to (ascending; () eager: ``EngineProfile.graph_sizes``).
    ``blendsim.sim.build_cost.build_cost_model`` builds the one an engine name selects (its regime's timer and its
    CUDA-graph sizes)."""

    def __init__(self, dep: Deployment, mode: str = "sequential", engine: EngineProfile | None = None,
                 timer: OpTimer | None = None, interference: float | None = None, graph_sizes: tuple = ()):
        if mode not in MODES:
            raise UserError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
        if engine is not None and not isinstance(engine, EngineProfile):
            raise TypeError("CostModel takes an EngineProfile (blendsim.sim.engines.get_profile); to build "
                            "an engine's cost model by name use blendsim.sim.build_cost.build_cost_model")
        self.dep = dep
        self.mode = mode
        self.engine = engine or PROFILES["ideal"]
        self.timer = timer or RooflineTimer(dep)
        self.kappa = dep.hardware.overlap_interference if interference is None else interference
        self.net = net_share(dep.hardware, self.kappa)  # overlapped collectives' share of the SMs
        self.layers = self.timer.shapes.layers  # a pipeline stage's own layers
        self.graph_sizes = tuple(int(x) for x in graph_sizes)
        self.graph_cap = self.graph_sizes[-1] if self.graph_sizes else 0  # the largest captured batch
        # each decode batch size up to the largest at its captured size, looked up per step (the per-step path)
        self._padded = [graph_size(n, self.graph_sizes) for n in range(self.graph_cap + 1)]
        self._shapes = self.timer.shapes
        self._server = self.engine.server_apart  # the per-step floor is tested once here, not per step
        self._mla = dep.model.is_mla
        self._tables_n = 0
        self._grow(4096)
        self._prefill_s, self._decode_s = self.timer.attn_scalars()

    # ---- public API -----------------------------------------------------------------------
    def set_engine(self, engine: EngineProfile) -> None:
        """Price with ``engine`` from now on (a pipeline's stages: the overhead on the first stage only, and no
        server stage on any, since the server gates the replica's batches)."""
        self.engine = engine
        self._server = engine.server_apart

    @property
    def timer_name(self) -> str:
        return self.timer.name

    def notes(self) -> list[str]:
        """Messages for the user (e.g. operators a profile lacks), each once."""
        return list(self.timer.notes())

    def breakdown(self, f: BatchFeatures) -> list[dict]:
        """Per operator: scope, class, FLOPs, bytes and seconds (layer ops: one layer), and ``layers``: how
        many times it runs in the step (the decoder layers it belongs to; 1 for model ops)."""
        f = self._graph_padded(f)
        s = self._shapes
        rows = []
        for op, (flops, nbytes, kernels) in op_counts(s, f).items():
            cls, scope = OPS[op]
            t = float(self.timer.op_time(op, flops, nbytes, kernels, f))
            rows.append({"op": op, "scope": scope, "class": cls, "flops": float(flops), "bytes": float(nbytes),
                         "time_s": t, "layers": s.layers_of(op)})
        return rows

    def cost(self, f: BatchFeatures) -> StepCost:
        """Price one step (exact, operator by operator)."""
        parts = price_parts(self.timer, self._shapes, self._graph_padded(f))
        c, m, o, comm = (float(parts[k]) for k in PARTS)
        ovh = float(self.engine.overhead(f.num_prefill_seqs + f.num_decode, f.num_tokens))
        srv = float(self.engine.server_s(f.num_logits, f.num_decode)) if self._server else 0.0
        t = combine_times(self.mode, self.kappa, c, m, o, comm, self.net) + ovh
        return StepCost(max(t, srv), c, m, o, comm, ovh, srv)

    def cost_many(self, f: BatchFeatures) -> dict[str, np.ndarray]:
        """Vectorised :meth:`cost`: ``f`` has BatchFeatures' fields as equal-length arrays
        (:func:`blendsim.sim.batch.features_arrays`)."""
        parts = price_parts(self.timer, self._shapes, self._graph_padded(f))
        c, m, o, comm = (np.asarray(parts[k], dtype=float) for k in PARTS)
        ovh = self.engine.overhead(np.asarray(f.num_prefill_seqs) + np.asarray(f.num_decode),
                                   np.asarray(f.num_tokens))
        t = combine_times(self.mode, self.kappa, c, m, o, comm, self.net)
        srv = (self.engine.server_s(np.asarray(f.num_logits), np.asarray(f.num_decode)) if self._server
               else 0.0) + 0 * c
        return {"time_s": np.maximum(t + ovh, srv), "compute_s": c, "memory_s": m,
                "other_s": o, "comm_s": comm, "overhead_s": ovh + 0 * c, "server_s": srv}

    def step(self, T: int, Tp: int, Np: int, pairs: int, pkv: int, D: int, Cd: int, N: int, chunks=None):
        """Fast path for the engine: ``(time_s, compute_s, memory_s)`` of one step.

        Token-count-only operators come from tables; attention is priced here. Equal to
        :meth:`cost` on the same features (tested). ``chunks`` (the Batch's prefill list) lets a
        calibrated model price each sequence's prefill attention call on its own.
        """
        T0, N0 = T, N
        if not Np and T <= self.graph_cap:  # CUDA-graph padding of a decode-only step
            T = N = self._padded[T]
        if T >= self._tables_n:
            self._grow(2 * T + 1)
        c = self._tc[T] + self._tl[N]
        m = self._tm[T]
        if Np:
            c += self._prefill_s(Tp, Np, pairs, pkv, chunks) * self.layers
            if self._mla:
                c += self._mla_time("kv_up_proj", BatchFeatures(num_prefill_seqs=Np, prefill_kv_tokens=pkv))
        if D:
            m += self._decode_s(D, Cd) * self.layers
            if self._mla:
                c += self._mla_time("attn_absorb", BatchFeatures(num_decode=D))
        t = combine_times(self.mode, self.kappa, c, m, self._to[T], self._tcomm[T], self.net) + \
            self.engine.overhead(Np + D, T0)
        if self._server:  # the API server's pace (EngineProfile.server_s)
            srv = self.engine.server_s(N0, D)
            if srv > t:
                t = srv
        return t, c, m

    def decode_many(self, D: int, Cd: np.ndarray):
        """Vectorised ``step`` for a run of pure-decode steps with ``D`` sequences (fast-forward)."""
        T = self._padded[D] if D <= self.graph_cap else D
        if T >= self._tables_n:
            self._grow(2 * T + 1)
        c = self._tc[T] + self._tl[T] + 0 * Cd
        if self._mla and D:
            c = c + self._mla_time("attn_absorb", BatchFeatures(num_decode=D))
        m = self._tm[T] + self._attn_decode(D, Cd)
        t = combine_times(self.mode, self.kappa, c, m, self._to[T], self._tcomm[T], self.net) + \
            self.engine.overhead(D, D)
        if self._server:
            t = np.maximum(t, self.engine.server_s(D, D))
        return t, c, m

    def unpadded(self) -> CostModel:
        """A shallow copy that prices every step at its own size, with no CUDA-graph padding (the bounds' tables:
        padding only raises a step's size)."""
        import copy

        plain = copy.copy(self)
        plain.graph_sizes, plain.graph_cap, plain._padded = (), 0, [0]
        return plain

    # ---- internals ------------------------------------------------------------------------
    def _graph_padded(self, f: BatchFeatures) -> BatchFeatures:
        """A decode-only step's rows at its CUDA-graph size, as :meth:`step` prices it."""
        if not self.graph_cap:
            return f
        dec = np.asarray(f.num_prefill_seqs) == 0
        pad = np.where(dec, graph_pad(np.asarray(f.num_decode), self.graph_sizes), np.asarray(f.num_tokens))
        logits = np.where(dec, pad, np.asarray(f.num_logits))
        if np.ndim(pad) == 0:
            return replace(f, num_tokens=int(pad), num_logits=int(logits))
        return replace(f, num_tokens=pad, num_logits=logits)

    def _mla_time(self, op: str, f: BatchFeatures) -> float:
        """All layers of one of MLA's feature-dependent GEMMs (prefill up-projection, decode absorption)."""
        dp = self._shapes.dp  # attention data parallelism: the busiest GPU's share (ops.dp_share)
        if op == "kv_up_proj":
            flops, nbytes, kernels = mla_up_counts(self._shapes, f.prefill_kv_tokens / dp, 1)
        else:
            r = dp_share(f.num_decode, dp) if dp > 1 else 1.0
            flops, nbytes, kernels = mla_absorb_counts(self._shapes, f.num_decode * r, 1)
        return float(self.timer.op_time(op, flops, nbytes, kernels, f)) * self.layers

    def _attn_decode(self, D, Cd):
        f = BatchFeatures(num_decode=D, decode_ctx_sum=Cd)
        _fp, _bq, _bkey, fd, bdk, bds = attn_coefs(self._shapes)
        if self._shapes.dp > 1:  # attention data parallelism: the busiest GPU's share of the sequences
            r = dp_share(D, self._shapes.dp)
            D, Cd = D * r, Cd * r
        keys = window_decode(self._shapes, D, Cd) + D
        flops = fd * keys
        nbytes = bdk * keys + bds * D
        t = self.timer.op_time("attn_decode", flops, nbytes, 1, f) * self.layers
        return float(t) if np.ndim(t) == 0 else t

    def _grow(self, n: int) -> None:
        """(Re)build the per-token-count tables up to ``n`` tokens: :func:`price_parts` of the operators
        that depend on the token count alone (the LM head, on the sampled rows, in a table of its own)."""
        T = np.arange(n)
        f = BatchFeatures(num_tokens=T, num_logits=T)
        counts = op_counts(self._shapes, f)
        acc = price_parts(self.timer, self._shapes, f, counts, skip=FEATURE_OPS + ("lm_head",))
        lm = self.timer.op_time("lm_head", *counts["lm_head"], f)
        self._tc, self._tm, self._to, self._tcomm = (np.asarray(acc[k] + 0 * T, dtype=float).tolist() for k in PARTS)
        self._tl = np.asarray(lm + 0 * T, dtype=float).tolist()
        self._tables_n = n


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



__all__ = ["MODES", "NET_BLOCKS", "PARTS", "CostModel", "StepCost", "combine_times", "features_arrays", "largest_fit",
           "net_share", "price_parts"]
