"""Figures over steps: compute vs memory time per step through a run (BlendServe Fig. 10).

Runs have up to hundreds of thousands of steps; they are cut into ``BINS`` equal spans of steps and
each span drawn as its mean, with the 10-90th percentile band, so fluctuation stays visible without
plotting every point.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from blendsim.reports.figures import Figure, colors, plt
from blendsim.sim.errors import UserError

BINS = 400


def pick_workload(df: pd.DataFrame, wanted: str | None) -> str:
    """The group whose steps are drawn: ``wanted`` (a group or workload name), else the middle one of
    the table (the grid's centre for a sweep)."""
    groups = list(dict.fromkeys(df["group"]))
    if wanted is None:
        return groups[len(groups) // 2]
    hits = [g for g in groups if g == wanted or g.split(" · ")[0] == wanted]
    if not hits:
        raise UserError(f"--steps-workload {wanted!r}: no such workload; there are {', '.join(groups[:8])}"
                        + (" ..." if len(groups) > 8 else ""))
    return hits[0]


def binned(values: np.ndarray, bins: int = BINS) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(bin centre, mean, 10th, 90th percentile) over ``bins`` equal spans of the array's index."""
    n = len(values)
    edges = np.unique(np.linspace(0, n, min(bins, n) + 1).astype(np.int64))
    centre = (edges[:-1] + edges[1:] - 1) / 2.0
    size = np.diff(edges)
    mean = np.add.reduceat(values, edges[:-1]) / size
    # percentiles of every bin at once (numpy's linear method): sort within bins, interpolate by rank
    within = values[np.lexsort((values, np.repeat(np.arange(len(size)), size)))]

    def pct(q: float) -> np.ndarray:
        pos = edges[:-1] + q * (size - 1)
        a = np.floor(pos).astype(np.int64)
        b = np.minimum(a + 1, edges[1:] - 1)
        return within[a] + (pos - a) * (within[b] - within[a])

    return centre, mean, pct(0.1), pct(0.9)


def read_steps(run_path: str, columns=("replica", "compute_s", "memory_s")) -> dict[str, np.ndarray]:
    import pyarrow.parquet as pq

    from blendsim.sim import columns as col

    path = f"{run_path}/steps.parquet"
    try:
        f = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001
        raise UserError(f"{path}: unreadable step table ({str(e).splitlines()[0]})") from None
    import pyarrow as pa

    schema = f.schema_arrow
    for c in columns:
        if c not in schema.names:
            raise UserError(f"{path}: field {c!r} is missing (a step table from blendsim simulate has "
                            f"{', '.join(columns)})")
        typ = schema.field(c).type
        if not (pa.types.is_integer(typ) or pa.types.is_floating(typ)):
            raise UserError(f"{path}: field {c!r} is {typ}, expected numbers")
    try:
        t = f.read(columns=list(columns))
    except Exception as e:  # noqa: BLE001
        raise UserError(f"{path}: unreadable step table ({str(e).splitlines()[0]})") from None
    return {c: col.to_numpy(t.column(c)) for c in columns}


def step_figures(df: pd.DataFrame, group: str, policies: list[str] | None, order: list[str],
                 x_axis: str = "step") -> list[Figure]:
    """Compute and memory time per step for ``policies`` (default: all) on ``group``; replica 0; against the
    step index or (``x_axis="time"``) the step's end time."""
    g = df[df["group"] == group]
    labels = [p for p in order if p in set(g["label"])]
    if policies:
        unknown = [p for p in policies if p not in labels]
        if unknown:
            raise UserError(f"--steps-policies: {', '.join(unknown)} not run on {group}; there are {', '.join(labels)}")
        labels = [p for p in labels if p in policies]
    col = colors(["compute", "memory"])
    fig, axes = plt.subplots(len(labels), 1, figsize=(9, 1.9 * len(labels) + 1.2), sharey=True, squeeze=False,
                             layout="constrained")
    notes = []
    for ax, p in zip(axes[:, 0], labels, strict=True):
        row = g[g["label"] == p].iloc[0]
        s = read_steps(row["run_path"], ("replica", "compute_s", "memory_s", "t_end_s") if x_axis == "time"
                       else ("replica", "compute_s", "memory_s"))
        mine = s["replica"] == 0
        for name, key, ops in (("compute", "compute_s", "GEMMs, prefill attention"),
                               ("memory", "memory_s", "decode attention, KV writes")):
            x, mean, lo, hi = binned(s[key][mine] * 1e3)
            if x_axis == "time":  # the same bins, placed at their steps' mean end time
                x = binned(s["t_end_s"][mine])[1]
            ax.plot(x, mean, color=col[name], lw=1.2, label=f"{name}-bound operators ({ops}): bin mean")
            ax.fill_between(x, lo, hi, color=col[name], alpha=0.2, lw=0, label=f"{name}: 10-90th percentile")
        n = int(mine.sum())
        notes.append(f"{p}: {n:,} steps" + (f" (replica 0 of {int(s['replica'].max()) + 1})" if s["replica"].max() > 0 else ""))
        ax.set_title(f"{p} — {n:,} steps, makespan {row['makespan_s']:,.1f} s", fontsize=9, loc="left")
        ax.set_ylabel("time per step (ms)")
        ax.grid(alpha=0.3)
    handles, names = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, names, fontsize=7, ncol=2, loc="outside lower center")
    axes[0, 0].set_ylim(bottom=0)
    axes[-1, 0].set_xlabel("step" if x_axis == "step" else "time (s, end of step)")
    fig.suptitle(f"Compute vs memory time per step — {group}", fontsize=10)
    return [Figure("steps", f"Per-step compute vs memory time — {group}" + (" (over time)" if x_axis == "time" else ""),
                   f"Time of the cost model's compute-bound and memory-bound operators in each step (the "
                   f"step's compute_s and memory_s). Steps cut into {BINS} equal spans: line = mean, band = "
                   f"10-90th percentile. " + "; ".join(notes)
                   + ". Balanced policies keep both lines level; one side idling shows as a gap.", fig)]


__all__ = ["BINS", "binned", "pick_workload", "read_steps", "step_figures"]
