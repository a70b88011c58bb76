"""The work `blendsim plan` hands to its workers: simulate one deployment on a trace (a sample or the whole).

A plain top-level function, so the sweep backends (a local process pool, Ray) can ship it; like the
sweep's tasks it never raises for a failed deployment (``blendsim.sweep.tasks``' guard turns errors into
``{"ok": False, ...}``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path


def simulate_task(model: str, policy: str, options: dict, seed: int, trace) -> dict:
    """Simulate ``trace`` (a trace file's path, or its bytes from a Ray worker's object store) under
    ``policy`` on ``model`` with ``options`` (``blendsim.simulate``'s names). The value is the few figures the
    planner keeps."""
    from blendsim.sweep.tasks import _guarded

    return _guarded(_simulate, model, policy, options, seed, trace)


def _simulate(model, policy, options, seed, trace):
    from blendsim.runner import RunConfig, run_simulation
    from blendsim.workloads.trace import read_trace

    if isinstance(trace, dict):
        trace = trace["value"]
    with tempfile.TemporaryDirectory(prefix="blendsim-plan-") as tmp:
        if isinstance(trace, bytes):
            path = Path(tmp) / "trace.parquet"
            path.write_bytes(trace)
            trace = path
        t = read_trace(trace)
    cfg = RunConfig(policy=policy, model=model, seed=seed, **options)
    s = run_simulation(t, cfg).summary
    return {k: s[k] for k in ("makespan_s", "throughput_tok_s", "n_requests", "input_tokens", "output_tokens",
                              "t_critical_s", "prefix_sharing_ratio") if k in s}


__all__ = ["simulate_task"]
