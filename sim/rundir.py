"""A run directory: summary.json, steps.parquet, requests.parquet (and schedule.parquet).

The on-disk form of one simulation (or of one policy's simulation inside a validation folder); the
runner that produces a :class:`RunResult` lives in the application layer (``blendsim.runner``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from blendsim.sim.errors import UserError
from blendsim.sim.io import atomic_dir, check_output_dir

RUN_DIR_KIND = "blendsim run directory"
RUN_DIR_MARKER = "summary.json"  # what makes a folder a run directory (one -o may replace)


@dataclass
class RunResult:
    summary: dict
    steps: list  # per replica: {column: list}
    requests: dict  # column -> array
    schedule: dict | None  # column -> list, when recorded
    notes: list
    trace: object = None


def schedule_table(schedulers) -> dict:
    """The recorded schedule of every replica, in order: one row per event (see Scheduler.events)."""
    cols = ("replica", "step", "kind", "request", "a", "b", "c")
    rows = [(s.replica, *e) for s in schedulers for e in s.events]
    return {c: [r[i] for r in rows] for i, c in enumerate(cols)}


def json_safe(obj):
    """``obj`` with every non-finite float (inf, NaN) replaced by None, so it is valid JSON: a figure
    that does not exist for a run (e.g. the compute density of a trace whose outputs are all one
    token long, which reads no KV: Comp / 0) is ``null`` in summary.json, never ``Infinity``."""
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.generic):  # numpy scalars as the Python numbers summary.json holds
        obj = obj.item()
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else None
    return obj


# ---- run directory -----------------------------------------------------------------------
def run_dir_name(label: str) -> str:
    """A folder name for a run labelled ``label`` (a policy name, or a ``path/to/file.py:Class`` spec:
    never a path that leaves the parent folder)."""
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", str(label)).strip("._") or "_"


def check_distinct_run_dirs(policies, flag: str = "--policies") -> None:
    """Refuse two policies whose run folders (:func:`run_dir_name`) would be one: one's result would be lost.
    The same file and class written two ways (./mine.py:Mine, mine.py:Mine) is one policy given twice."""
    from blendsim.sim.errors import UserError

    def same(a: str, b: str) -> bool:
        (fa, _, ca), (fb, _, cb) = a.rpartition(":"), b.rpartition(":")
        return bool(fa and fb) and ca == cb and Path(fa).resolve() == Path(fb).resolve()

    folders: dict = {}
    for p in policies:
        other = folders.setdefault(run_dir_name(p), p)
        if other != p:
            if same(other, p):
                raise UserError(f"{flag} {other} and {p} are one policy given twice")
            raise UserError(f"{flag} {other} and {p} would share the run folder {run_dir_name(p)!r}; rename one "
                            f"(a file, or a class in it)")


def check_run_dir(run_dir: str | Path, trace_sha256: str | None = None, force: bool = False, inputs=(),
                  trace_object: bool = False) -> Path:
    """Refuse to overwrite a folder that holds something other than an earlier run (or the current folder,
    one above it, or one holding an ``inputs`` file: sim.io.check_output_dir); with ``trace_sha256`` (the new
    run's trace file digest, recorded in summary.json), also an earlier run of another trace — or of an
    unrecorded one — unless ``force``; with ``trace_object`` (the new run's trace is a Python Trace, which no digest
    identifies), an earlier run of a trace file unless ``force``."""
    d = check_output_dir(run_dir, RUN_DIR_KIND, RUN_DIR_MARKER, inputs)
    if (trace_sha256 is not None or trace_object) and not force and (d / "summary.json").exists():
        import json

        try:
            old = json.loads((d / "summary.json").read_text()).get("trace_sha256")
        except (OSError, ValueError, AttributeError):
            old = None
        if trace_object:
            if old:
                raise UserError(f"{d}: holds a run of a trace file (sha256 {old[:12]}...) and this run's trace is a "
                                f"Trace object; choose another folder, or replace it (--force; force=True from Python)")
        elif old != trace_sha256:
            which = "another trace" if old else "a trace it does not record"
            raise UserError(f"{d}: holds a run of {which}; choose another folder, or replace it (--force; force=True "
                            f"from Python)")
    return d


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes (what identifies the trace a run was made from)."""
    import hashlib

    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    return h.hexdigest()


def write_run(result: RunResult, run_dir: str | Path) -> Path:
    """Write summary.json, steps.parquet, requests.parquet (and schedule.parquet) atomically: into a
    temporary folder that replaces ``run_dir`` only once everything is written."""
    import pyarrow.parquet as pq

    from blendsim.sim.io import write_json

    d = check_run_dir(run_dir)
    with atomic_dir(d, RUN_DIR_MARKER, RUN_DIR_KIND) as tmp:
        write_json(tmp / "summary.json", json_safe(result.summary))
        write_steps(result, tmp / "steps.parquet")
        pq.write_table(requests_table(result), tmp / "requests.parquet", compression="zstd")
        if result.schedule is not None:
            pq.write_table(schedule_arrow(result), tmp / "schedule.parquet", compression="zstd")
    return d


def steps_table(result: RunResult):
    """steps.parquet's Arrow table: one row per step of every replica (``replica``, ``step`` first)."""
    from blendsim.sim import columns as col

    cols = {"replica": [], "step": []}
    for rep, c in enumerate(result.steps):
        n = len(c["dt_s"])
        cols["replica"].append(np.full(n, rep, dtype=np.int32))
        cols["step"].append(np.arange(n, dtype=np.int64))
        for k, v in c.items():
            cols.setdefault(k, []).append(np.asarray(v))
    return col.table({k: np.concatenate(v) for k, v in cols.items()})


STEP_ROW_GROUP = 1024 * 1024  # pyarrow's default largest row group (pq.write_table's row_group_size=None)


def write_steps(result: RunResult, path: Path) -> None:
    """steps.parquet: :func:`steps_table` written at once, or, when a replica's log was spilled to disk
    (``run_simulation(spill_dir=...)``), the same table a row group at a time, read from the spilled columns (row
    groups of :data:`STEP_ROW_GROUP` rows, as ``pq.write_table`` cuts them: the same file)."""
    import pyarrow.parquet as pq

    from blendsim.sim import columns as col

    if not any(hasattr(c, "rows") for c in result.steps):
        pq.write_table(steps_table(result), path, compression="zstd")
        return
    pieces: list = []  # (replica, columns, first row, last row) of the row group being gathered
    held = 0
    writer = None

    def flush():
        nonlocal writer, pieces, held
        cols: dict = {"replica": [], "step": []}
        for rep, c, a, b in pieces:
            cols["replica"].append(np.full(b - a, rep, dtype=np.int32))
            cols["step"].append(np.arange(a, b, dtype=np.int64))
            for k in c:
                cols.setdefault(k, []).append(c.rows(k, a, b) if hasattr(c, "rows") else np.asarray(c[k])[a:b])
        tab = col.table({k: np.concatenate(v) for k, v in cols.items()})
        if writer is None:
            writer = pq.ParquetWriter(path, tab.schema, compression="zstd")
        writer.write_table(tab)
        pieces, held = [], 0

    try:
        for rep, c in enumerate(result.steps):
            n = int(c.n) if hasattr(c, "n") else len(c["dt_s"])
            a = 0
            while a < n:
                b = min(n, a + STEP_ROW_GROUP - held)
                pieces.append((rep, c, a, b))
                held += b - a
                a = b
                if held == STEP_ROW_GROUP:
                    flush()
        if held or writer is None:
            flush()
    finally:
        if writer is not None:
            writer.close()


def requests_table(result: RunResult):
    """requests.parquet's Arrow table: one row per request, in trace order."""
    from blendsim.sim import columns as col

    return col.table({k: np.asarray(v) for k, v in result.requests.items()})


def schedule_arrow(result: RunResult):
    """schedule.parquet's Arrow table (its ``_meta`` as schema metadata), or None when not recorded."""
    from blendsim.sim import columns as col

    if result.schedule is None:
        return None
    meta = result.schedule["_meta"]
    tab = col.table({k: np.asarray(v) for k, v in result.schedule.items() if k != "_meta"})
    return tab.replace_schema_metadata({f"blendsim.{k}": str(v) for k, v in meta.items()})


__all__ = ["RunResult", "STEP_ROW_GROUP", "check_distinct_run_dirs", "check_run_dir", "file_sha256", "json_safe", "requests_table", "run_dir_name",
           "schedule_arrow", "schedule_table", "steps_table", "write_run", "write_steps"]
