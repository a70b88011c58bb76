"""Kernel timing: warm-up, repetitions, median and spread, on CUDA (events) or CPU (perf_counter).

A :class:`Clock` times a zero-argument callable that runs one kernel (or one operator's few kernels).
On CUDA each repetition is bracketed by a pair of CUDA events recorded on the current stream; a short
GPU sleep queued before the start event lets the host enqueue the whole repetition ahead of the GPU,
so host launch latency does not leak into the measured kernel time, and the L2 cache is flushed
between repetitions so weights are read from memory as they are in a real forward pass (each layer's
weights are different). On CPU, torch operators are synchronous, so a clock read around the call is
exact; the thread count is pinned by the caller (:func:`pin_threads`). With one thread the operator
runs on the calling thread, and the clock is that thread's CPU time (``CLOCK_THREAD_CPUTIME_ID``):
on a dedicated core it equals wall time (``perf_counter``), and on a shared host it leaves out the
slices the OS gives other processes, which otherwise inflate every kernel longer than a slice (a few
ms) by up to 2x at random. With several threads, wall time (``perf_counter``) is used.

The number of repetitions adapts to the kernel: enough to fill ``budget_s`` (cheap kernels get many,
so their medians are stable), between ``min_reps`` and ``max_reps``.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds of one call: the median and the 10th/90th percentiles over ``reps`` repetitions."""

    median_s: float
    p10_s: float
    p90_s: float
    reps: int


def is_oom(exc: BaseException) -> bool:
    """True for an out-of-memory failure: CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError."""
    import torch

    oom_type = getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    if isinstance(exc, (RuntimeError, MemoryError)):
        msg = str(exc).lower()
        return isinstance(exc, MemoryError) or "out of memory" in msg or "not enough memory" in msg
    return False


def keep_freed_memory() -> bool:
    """Keep freed heap memory in the process (glibc ``mallopt``); True when applied.

    NOTE: glibc hands blocks above its mmap threshold back to the OS on free, so every CPU operator
    that allocates a >128 KB output page-faults fresh zeroed memory, which doubles some elementwise
    times and makes them erratic. CPU inference deployments run a caching allocator (jemalloc,
    tcmalloc) for this reason; this gives the profiling process the same steady state. CUDA has its
    own caching allocator and needs nothing.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        m_trim, m_mmap = -1, -3
        return bool(libc.mallopt(m_mmap, 32 * 2**20)) and bool(libc.mallopt(m_trim, 2**30))
    except (OSError, AttributeError):
        return False


def pin_threads(n: int) -> int:
    """Fix torch's intra-op thread count (CPU timing); returns the count in force."""
    import torch

    torch.set_num_threads(max(1, int(n)))
    return torch.get_num_threads()


def summarize(samples) -> Timing:
    """Median and 10th/90th percentiles of timing samples."""
    a = np.asarray(samples, dtype=float)
    return Timing(float(np.median(a)), float(np.percentile(a, 10)), float(np.percentile(a, 90)), int(a.size))


class Clock:
    """Times callables on one device."""

    def __init__(self, device: str, budget_s: float = 0.15, min_reps: int = 5, max_reps: int = 60,
                 warmup: int = 2, cpu_clock: str = "auto"):
        import torch

        self.device = device
        if cpu_clock == "auto":
            cpu_clock = "thread" if torch.get_num_threads() == 1 else "wall"
        self.cpu_clock = cpu_clock  # "thread" (thread CPU time) or "wall" (perf_counter)
        self.budget_s = budget_s
        self.min_reps = min_reps
        self.max_reps = max_reps
        self.warmup = warmup
        self.last_estimate_s = 0.0  # one call's time as estimated by the last reps_for
        self._cuda = device == "cuda"
        self._flush = None
        if self._cuda:
            # NOTE: twice the largest L2 of current GPUs (H100/H200: 50 MB; B200: 126 MB)
            self._flush = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")

    def time(self, fn) -> Timing:
        """Warm ``fn`` up, then time it; the repetition count fills the time budget."""
        return summarize(self.samples(fn, self.reps_for(fn)))

    def reps_for(self, fn, share: float = 1.0) -> int:
        """Warm ``fn`` up and choose its repetition count for ``share`` of the time budget."""
        self.sync()
        t0 = time.perf_counter()
        fn()  # the first call: allocations, kernel selection, cold caches
        self.sync()
        est = time.perf_counter() - t0
        for _ in range(self.warmup if est < 1e-3 else 1):
            t0 = time.perf_counter()
            fn()
            self.sync()
            est = min(est, time.perf_counter() - t0)
        est = max(est, 1e-7)
        self.last_estimate_s = est
        lo = max(2, round(self.min_reps * share))
        return int(min(max(lo, self.max_reps * share), max(lo, self.budget_s * share / est)))

    def samples(self, fn, reps: int, warmup: int = 0) -> list[float]:
        """``reps`` timings of one call of ``fn`` (seconds), after ``warmup`` untimed calls."""
        for _ in range(warmup):
            fn()
        gc_was = gc.isenabled()
        gc.disable()
        try:
            return self._cuda_reps(fn, reps) if self._cuda else self._cpu_reps(fn, reps)
        finally:
            if gc_was:
                gc.enable()

    def sync(self) -> None:
        if self._cuda:
            import torch

            torch.cuda.synchronize()

    # ---- internals ------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """How times are taken (recorded in the profile)."""
        if self._cuda:
            return "cuda events, L2 flushed between repetitions"
        return "thread CPU time (1 thread)" if self.cpu_clock == "thread" else "perf_counter wall time"

    def _cpu_reps(self, fn, reps: int) -> list[float]:
        out = []
        pc = time.thread_time if self.cpu_clock == "thread" else time.perf_counter
        for _ in range(reps):
            t0 = pc()
            fn()
            out.append(pc() - t0)
        return out

    def _cuda_reps(self, fn, reps: int) -> list[float]:
        import torch

        sleep = getattr(torch.cuda, "_sleep", None)
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for s, e in zip(starts, ends):
            self._flush.zero_()
            if sleep is not None:
                sleep(200_000)  # ~0.1 ms of GPU cycles: the host gets ahead of the GPU
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends)]


__all__ = ["Clock", "Timing", "is_oom", "keep_freed_memory", "pin_threads", "summarize"]
