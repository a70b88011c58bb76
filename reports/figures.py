"""Figures over workloads: throughput with the optimal bound (BlendServe Fig. 7), prefix sharing
against its optimum (Fig. 9) and the speedup heatmap over the density x sharing grid (Fig. 11).

Each function takes ``with_speedup``'s table and returns :class:`Figure` records; nothing is shown
or saved here. Bars are drawn per deployment (model/hardware/mode), at most ``PER_FIGURE`` workloads
to a figure so a 65-workload grid stays legible.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402

PER_FIGURE = 13


@dataclass
class Figure:
    name: str  # file stem, unique in the report
    title: str
    caption: str
    fig: object  # matplotlib Figure


def colors(order: list[str]) -> dict[str, tuple]:
    """One colour per policy label, the same in every figure."""
    cmap = plt.get_cmap("tab10")
    return {p: cmap(i % 10) for i, p in enumerate(order)}


def _chunks(df: pd.DataFrame):
    """(deployment, workloads) chunks in the table's order."""
    for dep, g in df.groupby("deployment", sort=False):
        groups = list(dict.fromkeys(g["group"]))
        for i in range(0, len(groups), PER_FIGURE):
            yield dep, g[g["group"].isin(groups[i:i + PER_FIGURE])], i // PER_FIGURE


def _bars(ax, g: pd.DataFrame, order: list[str], col: dict, value: str, scale: float = 1.0) -> tuple[list, float]:
    groups = list(dict.fromkeys(g["group"]))
    labels = [p for p in order if p in set(g["label"])]
    width = 0.8 / max(len(labels), 1)
    for j, p in enumerate(labels):
        rows = g[g["label"] == p].set_index("group")
        vals = [rows[value].get(w, np.nan) * scale for w in groups]
        ax.bar(np.arange(len(groups)) - 0.4 + width * (j + 0.5), vals, width, label=p, color=col[p])
    ax.set_xticks(np.arange(len(groups)))
    ax.set_xticklabels([_short(w) for w in groups], rotation=30 if len(groups) > 4 else 0, ha="right" if len(groups) > 4 else "center")
    return groups, width


def _marks(ax, xs, ys, style: dict, label: str) -> None:
    for k, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if np.isfinite(y):
            ax.hlines(y, x - 0.45, x + 0.45, label=label if k == 0 else None, **style)


def _short(group: str) -> str:
    return group.split(" · ")[0]


def _bar_figure(fig, ax, name, heading, dep, part, ylabel, xlabel, title, caption) -> Figure:
    """Label, legend and grid of a per-workload bar chart, as a Figure."""
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return Figure(f"{name}-{_slug(dep)}-{part}", f"{heading} — {dep}" + (f" (part {part + 1})" if part else ""),
                  caption, fig)


def throughput_bars(df: pd.DataFrame, order: list[str]) -> list[Figure]:
    """Throughput of each policy per workload, with T_o's throughput and the practical optimum."""
    col, out = colors(order), []
    for dep, g, part in _chunks(df):
        fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * g["group"].nunique() + 2.5), 4.2))
        groups, _ = _bars(ax, g, order, col, "throughput_tok_s")
        first = g.drop_duplicates("group").set_index("group")
        tokens = first["input_tokens"] + first["output_tokens"]
        xs = np.arange(len(groups))
        _marks(ax, xs, [(tokens / first["t_opt_s"]).get(w, np.nan) for w in groups],
               {"colors": "black", "linewidths": 2}, "optimal (T_o)")
        _marks(ax, xs, [(tokens / first["t_opt_practical_s"]).get(w, np.nan) for w in groups],
               {"colors": "dimgray", "linestyles": "dashed", "linewidths": 1.5}, "practical optimum")
        out.append(_bar_figure(fig, ax, "throughput", "Throughput", dep, part, "throughput (tokens/s)",
                               "workload (d = compute density, s = optimal prefix sharing)",
                               f"Throughput per workload — {dep}",
                               "Bars: (input + output tokens) / makespan. Solid line: the same tokens over T_o = "
                               "max((1 - s_o) T_comp, T_mem); dashed: over the practical optimum of the cost model."))
    return out


def sharing_bars(df: pd.DataFrame, order: list[str]) -> list[Figure]:
    """Prefix sharing ratio achieved by each policy per workload, with the optimal s_o marked."""
    col, out = colors(order), []
    for dep, g, part in _chunks(df):
        fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * g["group"].nunique() + 2.5), 4.0))
        groups, _ = _bars(ax, g, order, col, "prefix_sharing_ratio", 100.0)
        opt = g.drop_duplicates("group").set_index("group")["optimal_sharing_ratio"] * 100.0
        _marks(ax, np.arange(len(groups)), [opt.get(w, np.nan) for w in groups],
               {"colors": "black", "linewidths": 2}, "optimal s_o (DFS, unbounded cache)")
        out.append(_bar_figure(fig, ax, "sharing", "Prefix sharing", dep, part, "prefix sharing ratio (%)", "workload",
                               f"Prefix sharing vs optimal — {dep}",
                               "s = 1 - (prefill tokens computed - recomputed) / prompt tokens (BatchLLM Eq. 2, "
                               "recomputation after preemption excluded); the line is the trace's optimal s_o."))
    return out


def speedup_heatmaps(df: pd.DataFrame, baseline: str, order: list[str]) -> list[Figure]:
    """Per deployment and non-baseline policy: speedup over the baseline on the density x sharing grid."""
    out = []
    grid = df.dropna(subset=["grid_density", "grid_sharing"])
    for dep, g in grid.groupby("deployment", sort=False):
        dens = sorted(g["grid_density"].unique())
        shar = sorted(g["grid_sharing"].unique())
        for p in order:
            if p == baseline or p not in set(g["label"]):
                continue
            m = g[g["label"] == p].pivot_table(index="grid_density", columns="grid_sharing", values="speedup")
            m = m.reindex(index=dens, columns=shar)
            out.append(_heatmap(m, p, baseline, dep))
    return out


def _heatmap(m: pd.DataFrame, policy: str, baseline: str, dep: str) -> Figure:
    v = m.to_numpy(dtype=float)
    fig, ax = plt.subplots(figsize=(1.1 * v.shape[1] + 2.8, 0.42 * v.shape[0] + 1.8))
    finite = v[np.isfinite(v)]
    span = max(float(np.max(np.abs(finite - 1.0))) if finite.size else 0.0, 0.01)
    im = ax.imshow(np.ma.masked_invalid(v), origin="lower", aspect="auto", cmap="RdYlGn",
                   norm=TwoSlopeNorm(vcenter=1.0, vmin=1.0 - span, vmax=1.0 + span))
    for (i, j), x in np.ndenumerate(v):
        ax.text(j, i, "–" if not np.isfinite(x) else f"{x:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(v.shape[1]))
    ax.set_xticklabels([f"{s:g}" for s in m.columns])
    ax.set_yticks(range(v.shape[0]))
    ax.set_yticklabels([f"{d:g}" for d in m.index])
    ax.set_xlabel("optimal prefix sharing ratio s (grid target)")
    ax.set_ylabel("compute density ρ (grid target)")
    ax.set_title(f"Speedup of {policy} over {baseline}\n{dep}", fontsize=10)
    fig.colorbar(im, ax=ax, label=f"throughput {policy} / {baseline} (×)")
    fig.tight_layout()
    mean = float(np.exp(np.log(finite).mean())) if finite.size else float("nan")
    return Figure(f"heatmap-{_slug(policy)}-vs-{_slug(baseline)}-{_slug(dep)}", f"Speedup heatmap: {policy} vs {baseline} — {dep}",
                  f"Throughput ratio per grid point (geometric mean {mean:.3f}×, range "
                  f"{finite.min() if finite.size else float('nan'):.3f}–{finite.max() if finite.size else float('nan'):.3f}×).", fig)


def _slug(s: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9.+-]+", "_", s).strip("_")


__all__ = ["Figure", "colors", "sharing_bars", "speedup_heatmaps", "throughput_bars"]
