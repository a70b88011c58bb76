"""The work a sweep hands to its workers: synthesise a workload's trace, simulate a cell.

Both are plain top-level functions, so a process pool and Ray can ship them. They never raise for
a failed cell: they return ``{"ok": False, "error": line, "user_error": bool}`` so a bad grid point
is reported with the others instead of tearing the sweep down. With ``sweep_dir`` (workers that
share the driver's disk) results are written in place; without it (Ray workers, possibly on other
machines) they come back as bytes and the driver writes them.

Nothing here imports pandas: a worker that simulates thousands of cells pays its start-up once
(``warm_up``) and never the quarter second pandas would add.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import traceback
from pathlib import Path


def warm_up(driver_pid: int | None = None) -> None:
    """Import what every task needs (process-pool initialiser). With ``driver_pid``, also watch the
    driver: a worker whose driver was killed exits within a second instead of finishing the sweep's
    queue alone (a killed driver's workers belong to the forkserver, not to it, and get no signal).

    Workers ignore SIGINT: a Ctrl-C reaches the whole process group, and the driver alone decides
    (it terminates its workers); a worker interrupted mid-task would print its own traceback."""
    from blendsim.sim.signals import worker_defaults

    worker_defaults()
    if driver_pid is not None:
        threading.Thread(target=_watch, args=(driver_pid,), daemon=True, name="driver-watch").start()
    import blendsim.policies.base  # noqa: F401
    import blendsim.runner  # noqa: F401
    import blendsim.workloads.recipes  # noqa: F401
    import blendsim.workloads.trace  # noqa: F401
    from blendsim.policies.registry import policy_names

    policy_names()  # imports every policy module once


def _watch(pid: int) -> None:
    while True:
        time.sleep(1.0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(1)
        except PermissionError:  # alive, someone else's: cannot happen for our own driver, keep waiting
            pass
        if _zombie(pid):  # dead but not yet reaped: its parent may be waiting for our inherited pipes to close
            os._exit(1)


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and waits for its parent to reap it (Linux's /proc; False elsewhere)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]  # the state follows the parenthesised command name


def synth_task(spec, workload, sweep_dir: str | None) -> dict:
    """Synthesise ``workload``'s trace. Returns its cache path (``sweep_dir`` given) or its bytes."""
    return _guarded(_synth, spec, workload, sweep_dir)


def cell_task(spec, cell, trace, sweep_dir: str | None) -> dict:
    """Simulate ``cell`` on ``trace``: a cached trace file's path, the file's bytes, or the result of
    :func:`synth_task` that made them (Ray passes it from its object store).

    With ``sweep_dir`` the run directory is installed there and the value is its summary; without,
    the value is ``{"summary": ..., "files": {name: bytes}}`` for the driver to install.
    """
    return _guarded(_cell, spec, cell, trace, sweep_dir)


def _synth(spec, workload, sweep_dir):
    from blendsim.workloads.recipes import get_recipe
    from blendsim.workloads.trace import write_trace

    trace = get_recipe(spec.recipe).make(**spec.recipe_kwargs(workload))
    if sweep_dir is not None:
        return str(write_trace(trace, Path(sweep_dir) / workload.trace_relpath()))
    with tempfile.TemporaryDirectory(prefix="blendsim-trace-") as tmp:
        return write_trace(trace, Path(tmp) / "trace.parquet").read_bytes()


def _cell(spec, cell, trace, sweep_dir):
    from blendsim.runner import run_simulation, write_run
    from blendsim.sweep import store
    from blendsim.workloads.trace import read_trace

    if isinstance(trace, dict):
        trace = trace["value"]
    w = cell.workload
    cfg = spec.run_config(cell.policy, w.model, w.hardware, w.seed if w.seed >= 0 else None)
    # the step log's rows go to disk as the run goes (a large cell's log would otherwise fill the worker's memory),
    # so the run is written before its scratch folder goes
    if sweep_dir is None:  # a remote worker: the run comes back as bytes
        with tempfile.TemporaryDirectory(prefix="blendsim-cell-") as tmp:
            if isinstance(trace, bytes):
                path = Path(tmp) / "trace.parquet"
                path.write_bytes(trace)
                trace = path
            result = run_simulation(read_trace(trace), cfg, spill_dir=tmp)
            run = write_run(result, Path(tmp) / "run")
            return {"summary": result.summary, "files": {p.name: p.read_bytes() for p in sorted(run.iterdir())}}
    # in the sweep folder: the cell works in a hidden staging folder beside its final run directory, so what a
    # killed sweep leaves (its spilled step log too) is the sweep's own, which the next run removes
    # (store.clean_stale), not a folder in the system's temporary directory
    stage = store.staging_dir(Path(sweep_dir), cell)
    try:
        result = run_simulation(read_trace(trace), cfg, spill_dir=stage)
        store.install_run(write_run(result, stage / "run"), Path(sweep_dir), cell)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return {"summary": result.summary}


def _guarded(fn, *args) -> dict:
    from blendsim.sim.errors import UserError

    t0, c0 = time.perf_counter(), time.process_time()
    try:
        out = {"ok": True, "value": fn(*args)}
    except UserError as e:
        out = {"ok": False, "error": str(e), "user_error": True}
        if e.__cause__ is not None:  # the user's own code failed (a policy): its traceback, for failures.json and --debug
            out["traceback"] = "".join(traceback.format_exception(e.__cause__))
    except Exception as e:  # a bug: keep the traceback for failures.json
        out = {"ok": False, "error": f"{type(e).__name__}: {e}".splitlines()[0], "user_error": False,
               "traceback": traceback.format_exc()}
    out.update(wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0)  # timings: never in results
    return out


__all__ = ["cell_task", "synth_task", "warm_up"]
