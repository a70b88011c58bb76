"""Timing one whole process for the benchmarks: wall seconds, peak RSS and CPU seconds as the kernel counts them."""

from __future__ import annotations

import os
import sys
import time


def timed(cmd: list[str]) -> tuple[float, float, float]:
    """Wall seconds, peak RSS (MB) and CPU seconds (user + system) of one run of ``cmd`` (stdout discarded);
    exits with a one-line message if the command fails. The command may write its bytecode caches, as an installed
    tool does: under PYTHONDONTWRITEBYTECODE every module edited since its cache was written compiles from source on
    every run (about 0.3 s of blendsim's start-up after an edit), which is not the tool's speed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.execvpe(cmd[0], cmd, env)
    _, status, usage = os.wait4(pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        sys.exit(f"command failed ({status}): {' '.join(cmd)}")
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime
