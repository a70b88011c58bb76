"""SIGTERM ends a command the way Ctrl-C does (every layer may read it: the CLI, the sweep and plan drivers, the
policy loader).

By default SIGTERM (``kill PID``, a job scheduler's or container's stop) kills Python at once: no
``finally`` runs, so a sweep's or plan's worker pool is never shut down (its workers keep simulating
until they notice the driver gone) and the resource tracker warns of leaked semaphores.
:func:`terminate_as_interrupt` makes SIGTERM raise ``KeyboardInterrupt`` in the main thread instead, so
the one interrupt path every command already has (cancel the workers, keep what is finished, say how to
resume) serves both; :func:`interrupt_exit_code` then says 143 (128 + SIGTERM) rather than Ctrl-C's 130.

Worker processes forked from the driver inherit its Python handlers; :func:`worker_defaults` restores
what a worker wants (SIGINT ignored: the driver decides; SIGTERM fatal: a pool's ``terminate``).
"""

from __future__ import annotations

import contextlib
import signal
import threading

_received: list[int] = []  # the signals turned into an interrupt since the last terminate_as_interrupt


def _raise(signum, frame):  # noqa: ARG001 - the signal handler's signature
    _received.append(signum)
    raise KeyboardInterrupt


@contextlib.contextmanager
def _handling(signum: int, handler):
    """For the block, ``handler`` answers ``signum`` (main thread only: elsewhere a no-op, as Python
    lets only the main thread set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, old)


@contextlib.contextmanager
def terminate_as_interrupt():
    """For the block, SIGTERM raises ``KeyboardInterrupt`` (unless the parent had it ignored: that stays)."""
    _received.clear()
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        yield
        return
    with _handling(signal.SIGTERM, _raise):
        yield


@contextlib.contextmanager
def uninterrupted():
    """For the block, SIGINT and SIGTERM are ignored: a second Ctrl-C or kill must not break a clean-up (the
    workers' termination) into a traceback, or leave workers running."""
    with _handling(signal.SIGINT, signal.SIG_IGN), _handling(signal.SIGTERM, signal.SIG_IGN):
        yield


def terminated() -> bool:
    """Whether a SIGTERM interrupted the current command."""
    return signal.SIGTERM in _received


def interrupt_exit_code() -> int:
    """The exit code of an interrupted command: 143 after SIGTERM, else 130 (Ctrl-C)."""
    return 128 + signal.SIGTERM if terminated() else 130


def worker_defaults() -> None:
    """A worker process's signal handling (a pool initialiser): Ctrl-C reaches the whole process group
    and the driver alone decides, so SIGINT is ignored; SIGTERM ends the worker at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


__all__ = ["interrupt_exit_code", "terminate_as_interrupt", "terminated", "uninterrupted", "worker_defaults"]
