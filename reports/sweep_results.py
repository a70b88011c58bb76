"""SWEEP_DIR/results.parquet: one row per finished cell, assembled from the run directories alone.

Columns: the cell's identity (``workload``, ``model``, ``hardware``, ``grid_density``,
``grid_sharing``, ``policy``, ``run_dir`` relative to SWEEP_DIR), then every summary.json key in
sorted order, with ``trace_for``: the model/hardware the cell's trace was synthesised for. Rows are sorted by (model, hardware, grid_density, grid_sharing, policy, run_dir), and nothing in
the table depends on when or in which order cells finished, so any sweep of the same cells — whatever
``--jobs``, backend or interruptions — writes the same bytes. Written without pandas.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ID_COLUMNS = ("workload", "model", "hardware", "grid_density", "grid_sharing", "policy", "run_dir")
RESULTS = "results.parquet"


def collect_rows(sweep_dir: str | Path) -> list[dict]:
    """Identity + summary of every finished cell under ``sweep_dir/runs`` (sorted)."""
    root = Path(sweep_dir) / "runs"
    rows = []
    for cell_json in root.glob("*/*/*/*/cell.json") if root.exists() else ():
        if any(p.startswith(".") for p in cell_json.relative_to(root).parts):
            continue
        try:
            label = json.loads(cell_json.read_text())
            summary = json.loads((cell_json.parent / "summary.json").read_text())
        except (OSError, ValueError):
            continue  # not a finished cell
        if not isinstance(summary, dict) or not isinstance(label, dict) or "throughput_tok_s" not in summary:
            continue
        rows.append({**summary, **{k: label[k] for k in (*ID_COLUMNS, "trace_for", "grid_point", "grid_seed") if k in label}})
    # the run folder last: seed replicates of one grid point tie on the rest, and a folder's listing order is the
    # filesystem's, not the cells'
    rows.sort(key=lambda r: (r["model"], r["hardware"], r["grid_density"], r["grid_sharing"], r["policy"], r["run_dir"]))
    return rows


def assemble_results(sweep_dir: str | Path) -> Path:
    """Write ``sweep_dir/results.parquet`` (atomically) from the finished cells; return its path."""
    import pyarrow.parquet as pq

    from blendsim.sim.io import atomic_path

    d = Path(sweep_dir)
    table = results_table(collect_rows(d))
    marker = d / "sweep.json"
    if marker.exists():
        settings = json.loads(marker.read_text()).get("settings", {})
        table = table.replace_schema_metadata({b"blendsim.sweep_settings": json.dumps(settings, sort_keys=True).encode()})
    with atomic_path(d / RESULTS) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return d / RESULTS


def results_table(rows: list[dict]):
    """An Arrow table of ``rows``: identity columns first, then the other keys sorted."""
    from blendsim.sim import columns as col

    keys = list(ID_COLUMNS) + sorted({k for r in rows for k in r} - set(ID_COLUMNS))
    return col.table({k: _column([r.get(k) for r in rows]) for k in keys})


def _column(values: list):
    """One column as an Arrow array; missing values are nulls; non-scalars become JSON text."""
    from blendsim.sim import columns as col

    missing = np.array([v is None for v in values], dtype=bool)
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return col.to_arrow(np.array([bool(v) for v in _fill(values, False)]), mask=missing)
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return col.to_arrow(np.array(_fill(values, 0), dtype=np.int64), mask=missing)
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return col.to_arrow(np.array(_fill(values, 0.0), dtype=np.float64), mask=missing)
    if all(isinstance(v, str) for v in present):
        return col.strings(_fill(values, ""), mask=missing)
    text = [v if isinstance(v, str) else json.dumps(v, sort_keys=True) for v in _fill(values, "")]
    return col.strings(text, mask=missing)


def _fill(values: list, fill) -> list:
    return [fill if v is None else v for v in values]


__all__ = ["ID_COLUMNS", "RESULTS", "assemble_results", "collect_rows", "results_table"]
