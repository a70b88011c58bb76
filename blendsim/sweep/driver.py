"""Run a sweep: plan the missing cells, keep the backend busy, install results, assemble the table.

Each workload's trace is synthesised once (a task of its own) and cached in SWEEP_DIR; its policy
cells are submitted when the trace is there, and every cell reads the cached file, so a resumed
sweep simulates exactly what an uninterrupted one does. The driver keeps ``backend.capacity`` tasks
in flight and starts the next synthesis only when fewer cells than that are ready or coming, so
workers neither idle nor run far ahead on traces.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from blendsim.reports.sweep_results import assemble_results
from blendsim.sim.errors import UserError
from blendsim.sim.signals import uninterrupted
from blendsim.sweep import store
from blendsim.sweep.grid import Cell, SweepSpec
from blendsim.sweep.tasks import cell_task, synth_task


@dataclass
class SweepOutcome:
    """What a finished (or failed-in-part) sweep did."""

    sweep_dir: Path
    total: int  # cells in this command's grid
    skipped: int  # already finished before this command (resume)
    ran: int  # finished by this command
    failures: list = field(default_factory=list)  # {"cell": run_relpath, "error": line, ...}
    results: Path | None = None
    wall_s: float = 0.0
    task_wall_s: float = 0.0  # seconds workers spent in tasks (synthesis and cells, all workers)
    task_cpu_s: float = 0.0  # CPU seconds of those tasks
    write_error: str | None = None  # results.parquet (or failures.json) could not be written: why


def run_sweep(spec: SweepSpec, sweep_dir: str | Path, backend, resume: bool = True, progress=None) -> SweepOutcome:
    """Run every cell of ``spec`` not finished in ``sweep_dir`` on ``backend``; assemble results.parquet.

    ``progress(done, total)`` is called as cells finish (``done`` counts skipped cells too). On
    KeyboardInterrupt the backend is cancelled and the exception propagates; finished cells stay.
    """
    t0 = time.perf_counter()
    d = Path(sweep_dir)
    try:
        store.open_sweep_dir(d, spec, resume)
    except OSError as e:
        raise UserError(f"{d}: cannot write there ({e.strerror or e})") from None
    cells = spec.cells()
    shas = {p: store.policy_sha256(p) for p in dict.fromkeys(c.policy for c in cells)}  # each policy resolved once
    todo = [c for c in cells if not store.cell_done(d, c, shas)]
    out = SweepOutcome(d, len(cells), len(cells) - len(todo), 0)
    by_workload: dict = {}  # one synthesis per trace file (with --fixed-trace, workloads share one)
    first: dict = {}
    for c in todo:
        w = first.setdefault(c.workload.trace_relpath(), c.workload)
        by_workload.setdefault(w, []).append(c)
    ready: deque = deque()  # (cell, trace argument)
    to_synth: deque = deque()
    for w, cs in by_workload.items():
        path = d / w.trace_relpath()
        if path.exists():
            arg = backend.trace_arg(path)
            ready.extend((c, arg) for c in cs)
        else:
            to_synth.append(w)
    if progress:
        progress(out.skipped, out.total)
    sd = None if backend.ships else str(d)
    inflight: dict = {}  # handle -> ("synth", workload) | ("cell", cell)
    coming = 0  # cells of workloads being synthesised

    def fill() -> None:
        nonlocal coming
        while len(inflight) < backend.capacity and (ready or to_synth):
            if to_synth and (not ready or len(ready) + coming < backend.capacity):
                w = to_synth.popleft()
                inflight[backend.submit(synth_task, spec, w, sd)] = ("synth", w)
                coming += len(by_workload[w])
            else:
                c, arg = ready.popleft()
                inflight[backend.submit(cell_task, spec, c, arg, sd)] = ("cell", c)

    try:
        fill()
        while inflight:
            for handle, res in backend.wait():
                kind, obj = inflight.pop(handle)
                out.task_wall_s += res.get("wall_s", 0.0)
                out.task_cpu_s += res.get("cpu_s", 0.0)
                if kind == "synth":
                    coming -= len(by_workload[obj])
                    _synth_done(d, backend, handle, obj, res, by_workload[obj], ready, out)
                else:
                    _cell_done(d, obj, res, out)
                if progress:
                    progress(out.skipped + out.ran, out.total)
            fill()
    except BaseException:
        with uninterrupted():  # a second Ctrl-C must not break the clean-up into a traceback
            backend.close(cancel=True)
        raise
    backend.close()
    try:
        out.results = assemble_results(d)
    except OSError as e:  # e.g. the folder turned read-only mid-way: the cells are done, say so in one line
        out.write_error = f"{d / 'results.parquet'}: cannot write it ({e.strerror or e})"
        out.failures.append({"cell": "results.parquet", "stage": "results assembly", "error": out.write_error,
                             "user_error": True})
    try:
        _write_failures(d, out.failures)
    except (OSError, UserError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        out.write_error = out.write_error or f"{d / 'failures.json'}: cannot write it ({why})"
    out.wall_s = time.perf_counter() - t0
    return out


def _synth_done(d: Path, backend, handle, w, res: dict, cells: list[Cell], ready: deque, out: SweepOutcome) -> None:
    if not res["ok"]:
        for c in cells:
            out.failures.append(_failure(c, res, "trace synthesis"))
        return
    path = d / w.trace_relpath()
    if backend.ships:
        from blendsim.sim.io import atomic_path

        with atomic_path(path) as tmp:
            tmp.write_bytes(res["value"])
    ready.extend((c, backend.trace_arg(path, handle)) for c in cells)


def _cell_done(d: Path, cell: Cell, res: dict, out: SweepOutcome) -> None:
    if not res["ok"]:
        out.failures.append(_failure(cell, res, "simulation"))
        return
    if "files" in res["value"]:
        store.install_files(res["value"]["files"], d, cell)
    out.ran += 1


def _failure(cell: Cell, res: dict, stage: str) -> dict:
    f = {"cell": cell.run_relpath(), "stage": stage, "error": res["error"], "user_error": res["user_error"]}
    if "traceback" in res:
        f["traceback"] = res["traceback"]
    return f


def _write_failures(d: Path, failures: list) -> None:
    path = d / "failures.json"
    if not failures:
        path.unlink(missing_ok=True)
        return
    from blendsim.sim.io import write_json

    write_json(path, {"failures": sorted(failures, key=lambda f: f["cell"])})


def describe(outcome: SweepOutcome) -> str:
    """One line about a finished sweep."""
    o = outcome
    s = f"{o.ran} cell(s) simulated, {o.skipped} already done, {len(o.failures)} failed, of {o.total}"
    s += f" in {o.wall_s:.1f} s; results: {o.results}"
    return s


def failure_line(outcome: SweepOutcome) -> str:
    f = outcome.failures[0]
    return (f"{len(outcome.failures)} of {outcome.total} cells failed (see {outcome.sweep_dir / 'failures.json'}); "
            f"first: {f['cell']}: {f['stage']}: {f['error']}")


__all__ = ["SweepOutcome", "describe", "failure_line", "run_sweep"]
