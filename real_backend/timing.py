"""Timing one step's forward, and optionally each operator inside it, on CUDA or CPU.

On CUDA a step is bracketed by two CUDA events on the current stream (GPU time from the first kernel
to the last, host launch gaps included when the host falls behind — as an engine without CUDA graphs
experiences them); the host's enqueue time is kept beside it so launch-bound steps can be recognised.
On CPU torch operators run synchronously, so a clock read around the forward is exact. With one torch
thread the forward runs on the calling thread and the clock is that thread's CPU time
(``time.thread_time``), as the calibration's (``blendsim.calibrate.timing``): on a dedicated core it equals wall
time, and on a shared host it leaves out the slices the OS gives other processes. With several threads
it is wall time (``perf_counter``).

Per-operator timing wraps each operator of the forward in ``ops(name)``: CUDA events per operator
(summed after one synchronisation) or ``perf_counter`` on CPU. It costs a little, so it runs on a
sample of steps, in a second execution of the step (re-running a step is idempotent: it writes the same
K/V into the same slots and reads the same context).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

import torch


class _NullOps:
    """``ops(name)`` that times nothing (the measured forward)."""

    _ctx = contextlib.nullcontext()

    def __call__(self, name: str):
        return self._ctx

    def result(self) -> dict:
        return {}


NULL_OPS = _NullOps()


class _CpuOps:
    def __init__(self, clock):
        self._t = defaultdict(float)
        self._clock = clock

    @contextlib.contextmanager
    def __call__(self, name: str):
        t0 = self._clock()
        try:
            yield
        finally:
            self._t[name] += self._clock() - t0

    def result(self) -> dict:
        return dict(self._t)


class _CudaOps:
    def __init__(self):
        self._ev: list = []

    @contextlib.contextmanager
    def __call__(self, name: str):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        try:
            yield
        finally:
            e.record()
            self._ev.append((name, s, e))

    def result(self) -> dict:
        torch.cuda.synchronize()
        out: dict = defaultdict(float)
        for name, s, e in self._ev:
            out[name] += s.elapsed_time(e) * 1e-3
        return dict(out)


class Clock:
    """Times zero-argument callables on one device."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    @property
    def name(self) -> str:
        """How times are taken (recorded in the summary)."""
        if self.cuda:
            return "cuda events"
        return "thread CPU time (1 thread)" if torch.get_num_threads() == 1 else "perf_counter wall time"

    def time(self, fn):
        """``(result, device_seconds, host_seconds)`` of one call of ``fn``."""
        if not self.cuda:
            pc = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
            t0 = pc()
            r = fn()
            dt = pc() - t0
            return r, dt, dt
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        t0 = time.perf_counter()
        r = fn()
        host = time.perf_counter() - t0
        e.record()
        e.synchronize()
        return r, s.elapsed_time(e) * 1e-3, host

    def ops(self):
        """A fresh per-operator timer: ``with ops(name): ...``, then ``ops.result() -> {name: seconds}``."""
        if self.cuda:
            return _CudaOps()
        return _CpuOps(time.thread_time if torch.get_num_threads() == 1 else time.perf_counter)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def steady_cpu() -> bool:
    """Put the CPU process in the state calibration measures in (``blendsim.calibrate.timing``): freed heap memory
    is kept (glibc ``mallopt``, as a caching allocator would) and denormals flush to zero. True when the
    allocator setting applied.

    NOTE: without it every operator output above glibc's mmap threshold page-faults fresh memory,
    which doubles some elementwise times and makes them erratic.
    """
    import ctypes
    import ctypes.util

    torch.set_flush_denormal(True)
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim, m_mmap = -1, -3
        return bool(libc.mallopt(m_mmap, 32 * 2**20)) and bool(libc.mallopt(m_trim, 2**30))
    except (OSError, AttributeError):
        return False


def pin_threads(n: int | None) -> int:
    """Fix torch's CPU thread count when ``n`` is given; returns the count in force."""
    if n:
        torch.set_num_threads(max(1, int(n)))
    return torch.get_num_threads()


__all__ = ["Clock", "NULL_OPS", "pin_threads", "steady_cpu"]
