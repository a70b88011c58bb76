"""Engine configuration, the per-request runtime state (Seq), wait queues and per-request records."""

from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass

import numpy as np

from blendsim.sim.errors import UserError

MIX_MODES = ("decode-first", "prefill-first")
ADMISSION = ("reserve", "greedy")


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
        self.fin = -1  # decode clock of its last decode step; -1 when not decoding
        self.side = 0  # policy tag (e.g. BlendServe's left/right scanner)
        self.est = 0  # expected output tokens, frozen at admission (hint, or the replica's running mean)
        self.load = 0  # blocks of its hit that sit in host memory or on disk (loaded at admission)


class WaitQueue:
    """Waiting requests in ascending priority ``rank`` (ties: request index)."""

    def __init__(self, rank=None):
        self._rank = None if rank is None else np.asarray(rank).tolist()
        self._heap: list = []

    def push(self, req: int) -> None:
        r = req if self._rank is None else self._rank[req]
        heapq.heappush(self._heap, (r, req))

    def peek(self) -> int | None:
        return self._heap[0][1] if self._heap else None

    def pop(self) -> int:
        return heapq.heappop(self._heap)[1]

    def remove(self, req: int) -> None:
        r = req if self._rank is None else self._rank[req]
        self._heap.remove((r, req))
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self):
        """Waiting requests in priority order (sorts a copy: not for hot paths)."""
        return (req for _, req in sorted(self._heap))


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


__all__ = ["ADMISSION", "EngineConfig", "MIX_MODES", "RequestArrays", "RequestRecords", "Seq", "WaitQueue"]
