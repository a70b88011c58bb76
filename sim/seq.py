"""Engine configuration, the per-request runtime state (Seq), wait queues and per-request records."""

from __future__ import annotations

import contextlib
import heapq
import weakref
from array import array
from dataclasses import dataclass

import numpy as np

from blendsim.sim.errors import UserError

MIX_MODES = ("decode-first", "prefill-first")
ADMISSION = ("reserve", "greedy")
KV_FULL = ("preempt", "stall")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Batching knobs of one replica's engine."""

    token_budget: int = 2048  # new tokens per step (decodes + prefill chunks): Sarathi's chunk budget
    max_seqs: int = 0  # running sequences per replica; 0 = no cap (vLLM's default cap is 256)
    block_size: int = 16  # KV block (page) size in tokens; prefix hits are whole blocks
    round_tokens: int = 0  # trim each step's tokens to a multiple of this (NanoFlow: 128); 0 = off
    mix: str = "decode-first"  # decode-first: running decodes then prefill chunks in one step
    #                            prefill-first: a step with prefill work runs no decodes (vLLM v0)
    prefix_caching: bool = True  # reuse cached prefixes across requests
    prefix_retain: bool = True  # keep a prefix cached after its last user finishes (SGLang, vLLM: LRU);
    #                             False: only requests in memory together share (freed at once)
    gpu_memory_utilization: float = 0.90
    fast_forward: bool = True  # price runs of identical pure-decode steps in one vectorised call
    admission: str = "reserve"  # reserve: admit only if memory also covers the expected decode growth of
    #                             the running requests and the new one (SGLang/NanoFlow-style);
    #                             greedy: admit whenever the prompt chunk fits (vLLM v1), preempt later
    reserve_ratio: float = 1.0  # fraction of the expected remaining output tokens to reserve
    kv_full: str = "preempt"  # what a decode does when no KV block is free for its next token:
    #   preempt: the newest running request gives its KV back and is recomputed later, until the decodes
    #            fit (vLLM's rule);
    #   stall:   that decode skips the step (no token) while the others run, and resumes -- before other
    #            decodes -- once a block is free; when nothing at all can run, every running request is
    #            flushed and re-queued to recompute its prompt and output (DeepSpeed-MII 0.1)

    def __post_init__(self) -> None:
        if self.token_budget < 1:
            raise UserError(f"--token-budget must be >= 1, got {self.token_budget}")
        if self.max_seqs < 0:
            raise UserError(f"--max-seqs must be >= 0 (0 = no cap), got {self.max_seqs}")
        if self.block_size < 1:
            raise UserError(f"--block-size must be >= 1, got {self.block_size}")
        if self.round_tokens < 0:
            raise UserError("round_tokens must be >= 0")
        if self.mix not in MIX_MODES:
            raise UserError(f"mix must be one of {', '.join(MIX_MODES)}, got {self.mix!r}")
        if self.admission not in ADMISSION:
            raise UserError(f"admission must be one of {', '.join(ADMISSION)}, got {self.admission!r}")
        if not 0 <= self.reserve_ratio <= 4:
            raise UserError(f"reserve_ratio must be in [0, 4], got {self.reserve_ratio}")
        if self.kv_full not in KV_FULL:
            raise UserError(f"kv_full must be one of {', '.join(KV_FULL)}, got {self.kv_full!r}")


STALLED = -2  # Seq.fin of a decode that waits for a free KV block


class Seq:
    """A request while it holds KV on a replica (from admission to finish or preemption)."""

    __slots__ = ("req", "p", "d", "path", "target", "computed", "generated", "shared", "private", "lock_n",
                 "ins_i", "ins_j", "contig", "order", "hit", "tau0", "c0", "key", "fin", "side", "est", "load")

    def __init__(self, req: int, p: int, d: int, path: list, target: int, generated: int, order: int):
        self.req = req  # request index in the trace
        self.p = p  # prompt tokens
        self.d = d  # output tokens to generate in total
        self.path = path  # static prefix-tree nodes from the root's child to the prompt's end node
        self.target = target  # tokens that must be in KV before the next sample (p, or p + generated)
        self.computed = 0  # tokens of target in KV (cache hits included), advanced when scheduled
        self.generated = generated  # output tokens produced before this admission
        self.shared = 0  # blocks of this sequence held in the prefix cache
        self.private = 0  # blocks held privately (while prefilling; decode growth is aggregated)
        self.lock_n = 0  # path[:lock_n] are locked in the cache by this sequence
        self.ins_i = 0  # path index of the node holding its next prompt block
        self.ins_j = 0  # prompt blocks already accounted (hit, inserted or kept private)
        self.contig = True  # its blocks so far extend the cached prefix (else new ones stay private)
        self.order = order  # admission counter on the replica (newest = largest)
        self.hit = 0  # tokens served from the prefix cache at this admission
        self.tau0 = 0  # decode clock when it started decoding
        self.c0 = 0  # its context at that moment
        self.key = 0  # (c0 - tau0) mod block_size: which step phase allocates its new blocks
        self.fin = -1  # decode clock of its last decode step; -1 when not decoding; STALLED while its decode
        #                waits for a KV block (EngineConfig.kv_full = "stall")
        self.side = 0  # policy tag (e.g. BlendServe's left/right scanner)
        self.est = 0  # expected output tokens, frozen at admission (hint, or the replica's running mean)
        self.load = 0  # blocks of its hit that sit in host memory or on disk (loaded at admission)


def int_list(a) -> list:
    """``a.tolist()`` (a Python list, as fast to index as any) whose equal values share one int object: a
    list of n distinct-object ints costs ~40 bytes an item, this 8 plus one object per distinct value (prompt and
    output lengths of 10M requests: 0.6 GB less). Values span at most ``len(a)``: a lookup table of them is
    indexed, else ``tolist``."""
    a = np.asarray(a)
    if a.size == 0 or a.dtype.kind not in "iu":
        return a.tolist()
    lo, hi = int(a.min()), int(a.max())
    if hi - lo >= len(a):
        return a.tolist()
    table = np.empty(hi - lo + 1, dtype=object)
    table[:] = range(lo, hi + 1)
    return table[a - lo if lo else a].tolist()


class WaitQueue:
    """Waiting requests in ascending priority ``rank`` (ties: request index).

    The heap holds plain ints: a request's position in the order of (rank, index), not a (rank, index)
    tuple, so a waiting request costs ~40 bytes instead of ~100 (10M requests queued at t=0: 0.4 GB, not
    1 GB) and compares faster; the order is the same. The positions are computed once per rank array and
    shared by the replicas' queues.
    """

    def __init__(self, rank=None):
        self._rank = None if rank is None else np.asarray(rank)
        self._pos, self._req = (None, None) if rank is None else _positions(self._rank)
        self._heap: list = []

    def push(self, req: int) -> None:
        heapq.heappush(self._heap, req if self._pos is None else self._pos[req])

    def peek(self) -> int | None:
        if not self._heap:
            return None
        k = self._heap[0]
        return k if self._req is None else self._req[k]

    def pop(self) -> int:
        k = heapq.heappop(self._heap)
        return k if self._req is None else self._req[k]

    def remove(self, req: int) -> None:
        self._heap.remove(req if self._pos is None else self._pos[req])
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self):
        """Waiting requests in priority order (sorts a copy: not for hot paths)."""
        keys = sorted(self._heap)
        return iter(keys) if self._req is None else (self._req[k] for k in keys)


_POSITIONS: dict = {}  # id(rank array) -> (weak reference to it, positions, requests by position)


def _positions(rank: np.ndarray) -> tuple[array, array]:
    """(position of each request in the order of (rank, request index), the request at each position), as
    int64 arrays: one pair per rank array (every replica's queue gets the policy's)."""
    hit = _POSITIONS.get(id(rank))
    if hit is not None and hit[0]() is rank:
        return hit[1], hit[2]
    order = np.argsort(rank, kind="stable")  # stable: equal ranks by request index, as (rank, index) tuples
    pos = np.empty(len(order), dtype=np.int64)
    pos[order] = np.arange(len(order), dtype=np.int64)
    out = array("q"), array("q")
    out[0].frombytes(pos.tobytes())
    out[1].frombytes(order.astype(np.int64).tobytes())
    key = id(rank)
    with contextlib.suppress(TypeError):  # not weak-referenceable: no sharing
        _POSITIONS[key] = (weakref.ref(rank, lambda _r, k=key: _POSITIONS.pop(k, None)), *out)
    return out


class RequestRecords:
    """Per-request outcomes, filled as events happen, in typed ``array.array`` columns (float64 and int64):
    scalar updates in the hot path as cheap as a list's, 8 bytes a value instead of a boxed number (14
    columns: 112 bytes a request, not ~500); :meth:`arrays` gives numpy copies for the metrics."""

    # preempted_s: when a preemption cut the request's token stream (NaN once a token follows)
    FLOAT = ("routed_s", "admit_s", "first_token_s", "finish_s", "preempted_s", "resume_gap_s")
    INT = ("replica", "first_token_step", "finish_step", "cached_tokens", "recomputed_tokens",
           "prefill_computed", "preemptions", "generated")

    def __init__(self, n: int):
        self.n = n
        self.n_finished = 0
        nan = array("d", [float("nan")]) * n
        for f in self.FLOAT:
            setattr(self, f, array("d", nan))  # seconds: handed to a replica, first scheduled, ...
        self.resume_gap_s = array("d", bytes(8 * n))  # longest wait between two tokens caused by a preemption
        for f in ("replica", "first_token_step", "finish_step"):
            setattr(self, f, array("q", [-1]) * n)
        for f in ("cached_tokens", "recomputed_tokens", "prefill_computed", "preemptions", "generated"):
            setattr(self, f, array("q", bytes(8 * n)))

    def arrays(self, copy: bool = True) -> RequestArrays:
        """Numpy columns: copies, or with ``copy=False`` views of the columns (no memory: the runner's
        final tables at 10M requests; the columns cannot grow while a view exists)."""
        get = np.array if copy else np.frombuffer
        return RequestArrays(**{f: get(getattr(self, f), dtype=np.float64) for f in self.FLOAT},
                             **{f: get(getattr(self, f), dtype=np.int64) for f in self.INT})


@dataclass(frozen=True)
class RequestArrays:
    """Numpy snapshot of :class:`RequestRecords`."""

    routed_s: np.ndarray
    admit_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    preempted_s: np.ndarray
    resume_gap_s: np.ndarray
    replica: np.ndarray
    first_token_step: np.ndarray
    finish_step: np.ndarray
    cached_tokens: np.ndarray
    recomputed_tokens: np.ndarray
    prefill_computed: np.ndarray
    preemptions: np.ndarray
    generated: np.ndarray


__all__ = ["ADMISSION", "EngineConfig", "KV_FULL", "MIX_MODES", "RequestArrays", "RequestRecords", "STALLED", "Seq", "WaitQueue", "int_list"]
