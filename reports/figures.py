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


# Paul Tol's "muted" scheme (personal.sron.nl/~pault, "Colour schemes and templates", 2021): nine colours told
# apart under the common colour-vision deficiencies, unlike matplotlib's tab10 (whose green and red merge for a
# deuteranope). Each built-in policy keeps its colour in every report; other labels take the free ones in order.
PALETTE = ("#332288", "#117733", "#DDCC77", "#88CCEE", "#CC6677", "#AA4499", "#44AA99", "#999933", "#882255")
POLICY_COLOURS = {"dfs": 0, "blendserve": 1, "random": 2, "fcfs": 3, "batchllm": 4, "e2": 5, "accelgen": 6,
                  "sarathi": 7, "vllm": 8}
HATCHES = ("", "//", "..", "xx", "\\\\", "oo")  # past the palette: the colours again, each cycle with its own hatch


def _base_name(label: str) -> str:
    """The policy a label names: ``dfs`` of ``dfs (A)``, ``dfs [vllm]`` and ``dfs[router=contiguous]``."""
    return str(label).partition(" ")[0].partition("[")[0]


def _styles(order: list[str]) -> dict[str, tuple[str, str]]:
    """(colour, hatch) per label: a built-in policy's own colour where no earlier label of this figure set took it,
    else the next free colour; past the palette's nine, the colours again with a hatch."""
    taken: set[int] = set()
    slots: dict[str, int] = {}
    for p in order:  # the built-in policies first, so a user's label never takes one's colour
        k = POLICY_COLOURS.get(_base_name(p))
        if k is not None and k not in taken:
            slots[p] = k
            taken.add(k)
    nxt = 0
    for p in order:  # then the others, each the first index free (past the palette's: a colour again, hatched)
        if p in slots:
            continue
        while nxt in taken:
            nxt += 1
        slots[p] = nxt
        taken.add(nxt)
    n = len(PALETTE)
    return {p: (PALETTE[k % n], HATCHES[(k // n) % len(HATCHES)]) for p, k in slots.items()}


def colors(order: list[str]) -> dict[str, str]:
    """One colour per label, the same in every figure of a report and, for the built-in policies, in every report
    (:func:`_styles`; labels past nine share colours and differ by :func:`hatches`)."""
    return {p: c for p, (c, _) in _styles(order).items()}


def hatches(order: list[str]) -> dict[str, str]:
    """The hatch of each label's bars: none for the first nine, then one per cycle of the palette."""
    return {p: h for p, (_, h) in _styles(order).items()}


def _chunks(df: pd.DataFrame):
    """(deployment, workloads) chunks in the table's order."""
    for dep, g in df.groupby("deployment", sort=False):
        groups = list(dict.fromkeys(g["group"]))
        for i in range(0, len(groups), PER_FIGURE):
            yield dep, g[g["group"].isin(groups[i:i + PER_FIGURE])], i // PER_FIGURE


def _bars(ax, g: pd.DataFrame, order: list[str], col: dict, value: str, scale: float = 1.0) -> tuple[list, float]:
    groups = list(dict.fromkeys(g["group"]))
    labels = [p for p in order if p in set(g["label"])]
    hatch = hatches(order)
    width = 0.8 / max(len(labels), 1)
    for j, p in enumerate(labels):
        rows = g[g["label"] == p].set_index("group")
        vals = [rows[value].get(w, np.nan) * scale for w in groups]
        ax.bar(np.arange(len(groups)) - 0.4 + width * (j + 0.5), vals, width, label=p, color=col[p],
               hatch=hatch.get(p, "") or None, edgecolor="white" if hatch.get(p) else None, linewidth=0)
    ax.set_xticks(np.arange(len(groups)))
    ax.set_xticklabels([_short(w) for w in groups])
    ax.set_xlim(-0.6, len(groups) - 0.4)
    return groups, width


def tilt_if_crowded(ax, gap_px: float = 4.0) -> None:
    """Rotate the x tick labels (35°, then 60°, then upright) while two neighbours, as drawn, come closer
    than ``gap_px``."""
    fig = ax.figure
    for angle in (0, 35, 60, 90):
        if angle:
            for t in ax.get_xticklabels():
                t.set_rotation(angle)
                t.set_ha("right" if angle < 90 else "center")
                t.set_rotation_mode("anchor" if angle < 90 else "default")
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        boxes = sorted((t.get_window_extent(r) for t in ax.get_xticklabels() if t.get_text()), key=lambda b: b.x0)
        if all(b.x0 - a.x1 >= gap_px for a, b in zip(boxes, boxes[1:])):
            return


def _marks(ax, xs, ys, style: dict, label: str) -> None:
    for k, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if np.isfinite(y):
            ax.hlines(y, x - 0.45, x + 0.45, label=label if k == 0 else None, **style)


def _size(g: pd.DataFrame) -> tuple[float, float]:
    """Figure size of a bar chart: wider with more workloads, taller with more policies in the legend."""
    n, k = g["group"].nunique(), g["label"].nunique()
    return min(12.0, max(7.0, 0.75 * n * max(1.0, k / 4) + 3.5)), max(4.2, 0.22 * k + 2.6)


def _axis_note(g: pd.DataFrame) -> str:
    """The bar charts' x label: the d/s shorthand only where the workloads are grid cells that have them."""
    if "grid_density" in g and g["grid_density"].notna().any():
        return "workload (d = compute density, s = optimal prefix sharing)"
    return "workload"


def _short(group: str) -> str:
    return group.split(" · ")[0]


def _bar_figure(fig, ax, name, heading, dep, part, ylabel, xlabel, title, caption) -> Figure:
    """Label, legend and grid of a per-workload bar chart, as a Figure."""
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    ax.set_title(title, loc="left", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.grid(axis="y", alpha=0.3)
    tilt_if_crowded(ax)
    return Figure(f"{name}-{_slug(dep)}-{part}", f"{heading} — {dep}" + (f" (part {part + 1})" if part else ""),
                  caption, fig)


def throughput_bars(df: pd.DataFrame, order: list[str]) -> list[Figure]:
    """Throughput of each policy per workload; over each bar, its own run's ceiling (the tokens over that
    run's T_o, a true bound) and its blended reference (a marker, never a ceiling)."""
    col, out = colors(order), []
    for dep, g, part in _chunks(df):
        fig, ax = plt.subplots(figsize=_size(g), layout="constrained")
        groups, width = _bars(ax, g, order, col, "throughput_tok_s")
        labels = [p for p in order if p in set(g["label"])]
        has_ref, ref_shown = "t_reference_s" in g, False
        for j, p in enumerate(labels):
            rows = g[g["label"] == p].set_index("group")
            tokens = rows["input_tokens"] + rows["output_tokens"]
            xs = np.arange(len(groups)) - 0.4 + width * (j + 0.5)
            ceil = [(tokens / rows["t_opt_s"]).get(w, np.nan) for w in groups]
            first = j == 0
            ax.hlines(ceil, xs - width / 2, xs + width / 2, colors="black", linewidths=2,
                      label="its T_o (no schedule is faster)" if first else None)
            if has_ref:  # not where the reference is below T_o: it left out the longest request's chain
                t_ref = rows["t_reference_s"].where(rows["t_reference_s"] >= rows["t_opt_s"])
                ref = [(tokens / t_ref).get(w, np.nan) for w in groups]
                if not np.isnan(ref).all():  # a legend entry only for diamonds drawn
                    ax.plot(xs, ref, linestyle="none", marker="D", markersize=4, color="dimgray",
                            label="its blended reference (not a bound)" if not ref_shown else None)
                    ref_shown = True
        out.append(_bar_figure(fig, ax, "throughput", "Throughput", dep, part, "throughput (tokens/s)",
                               _axis_note(g), f"Throughput per workload — {dep}",
                               "Bars: (input + output tokens) / makespan. Black line over each bar: the same "
                               "tokens over that run's T_o, a lower bound on its makespan priced by its own cost "
                               "model, engine, mode, parallelism and precision (docs/DESIGN.md, \"Bounds that "
                               "bound\"), so no bar can pass it. Grey diamond: over the run's blended reference, "
                               "the work as perfectly blended full steps: an estimate a run may beat (left out where "
                               "it falls below T_o: it leaves out the longest request's own chain there)."))
    return out



def sharing_bars(df: pd.DataFrame, order: list[str]) -> list[Figure]:
    """Prefix sharing ratio achieved by each policy per workload, with the optimal s_o marked."""
    col, out = colors(order), []
    if not (df["optimal_sharing_ratio"].fillna(0) > 0).any() and not (df["prefix_sharing_ratio"].fillna(0) > 0).any():
        return out  # nothing shared anywhere: the caller says so in words
    for dep, g, part in _chunks(df):
        fig, ax = plt.subplots(figsize=_size(g), layout="constrained")
        groups, _ = _bars(ax, g, order, col, "prefix_sharing_ratio", 100.0)
        opt = g.drop_duplicates("group").set_index("group")["optimal_sharing_ratio"] * 100.0
        _marks(ax, np.arange(len(groups)), [opt.get(w, np.nan) for w in groups],
               {"colors": "black", "linewidths": 2}, "optimal s_o (DFS, unbounded cache)")
        top = float(np.nanmax(np.r_[g["prefix_sharing_ratio"].to_numpy(float), opt.to_numpy(float) / 100.0]))
        ax.set_ylim(0.0, max(100.0 * top * 1.12, 1.0))
        out.append(_bar_figure(fig, ax, "sharing", "Prefix sharing", dep, part, "prefix sharing ratio (%)", "workload",
                               f"Prefix sharing vs optimal — {dep}",
                               "s = 1 - (prefill tokens computed - recomputed) / prompt tokens (BatchLLM Eq. 2, "
                               "recomputation after preemption excluded); the line is the trace's optimal s_o."))
    return out


def speedup_heatmaps(df: pd.DataFrame, baseline: str, order: list[str]) -> list[Figure]:
    """Per deployment and non-baseline policy: speedup over the baseline on the density x sharing grid."""
    out = []
    grid = df.dropna(subset=["grid_density", "grid_sharing"])
    is_base = grid["policy"].astype(str) == baseline  # the baseline's runs (one per input: "dfs (A)"), each 1 by definition
    shown = grid[~is_base & np.isfinite(grid["speedup"].to_numpy(float))]
    # one colour scale for every heatmap of the report, so equal colours mean equal speedups
    span = max(float(np.max(np.abs(shown["speedup"].to_numpy(float) - 1.0))) if len(shown) else 0.0, 3 * NOISE)
    # grid points whose traces differ (two sweeps of one grid at other sizes: workload d0.9-s0.25 and d0.9-s0.25#2)
    # are other workloads: a heatmap each, never a mean over them; replicates of one workload (seeds) are averaged
    # geometrically, as speedups are
    grid = grid.assign(_tset=[str(w).partition("#")[2] for w in grid["workload"]] if "workload" in grid else "")
    for (dep, ts), g in grid.groupby(["deployment", "_tset"], sort=False):
        dens = sorted(g["grid_density"].unique())
        shar = sorted(g["grid_sharing"].unique())
        where = dep if not ts else f"{dep} · traces #{ts}"
        base_labels = set(g.loc[g["policy"].astype(str) == baseline, "label"])
        for p in order:
            if p == baseline or p in base_labels or p not in set(g["label"]):
                continue
            m = g[g["label"] == p].pivot_table(index="grid_density", columns="grid_sharing", values="speedup",
                                               aggfunc=lambda x: float(np.exp(np.mean(np.log(x)))))
            m = m.reindex(index=dens, columns=shar)
            out.append(_heatmap(m, p, baseline, where, span))
    return out


# Speedups within 1% of 1 are marked as no difference: a different seed of the same recipe moves a speedup
# about that much (blendserve recipe, 2,000 requests, rho 1.1, s 0.35, seeds 0-3: blendserve / dfs 0.997-1.021,
# random / dfs 1.009-1.024), and more for smaller traces.
NOISE = 0.01
LATENCY_FIGURES = 6  # online workloads drawn (the latency table has them all)


def _heatmap(m: pd.DataFrame, policy: str, baseline: str, dep: str, span: float) -> Figure:
    """One speedup grid. The colour scale is centred on 1 and spans ``span`` (the report's: all its
    heatmaps share it); cells within NOISE of 1 are hatched and their text is grey."""
    v = m.to_numpy(dtype=float)
    fig, ax = plt.subplots(figsize=(1.0 * v.shape[1] + 3.4, 0.45 * v.shape[0] + 2.0), layout="constrained")
    finite = v[np.isfinite(v)]
    # red (slower) to blue (faster): a diverging map colour-vision deficiencies keep apart, unlike red-green
    norm = TwoSlopeNorm(vcenter=1.0, vmin=1.0 - span, vmax=1.0 + span)
    im = ax.imshow(np.ma.masked_invalid(v), origin="lower", aspect="auto", cmap="RdBu", norm=norm)
    quiet, digits = 0, _digits(v)
    for (i, j), x in np.ndenumerate(v):
        tie = bool(np.isfinite(x) and abs(x - 1.0) < NOISE)
        quiet += tie
        if tie:
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="0.6", lw=0))
        dark = bool(np.isfinite(x) and abs(float(norm(x)) - 0.5) > 0.35)  # the map's deep ends: white text
        ax.text(j, i, "–" if not np.isfinite(x) else f"{x:.{digits}f}", ha="center", va="center", fontsize=8,
                color="0.45" if tie else "white" if dark else "black")
    ax.set_xticks(range(v.shape[1]))
    ax.set_xticklabels([f"{s:g}" for s in m.columns])
    ax.set_yticks(range(v.shape[0]))
    ax.set_yticklabels([f"{d:g}" for d in m.index])
    ax.set_xlabel("optimal prefix sharing ratio s (grid target)")
    ax.set_ylabel("compute density ρ (grid target)")
    ax.set_title(f"Speedup of {policy} over {baseline}\n{dep}", fontsize=10, loc="left")
    fig.colorbar(im, ax=ax, label="throughput ratio (×)")
    mean = float(np.exp(np.log(finite).mean())) if finite.size else float("nan")
    lo = finite.min() if finite.size else float("nan")
    hi = finite.max() if finite.size else float("nan")
    return Figure(f"heatmap-{_slug(policy)}-vs-{_slug(baseline)}-{_slug(dep)}", f"Speedup heatmap: {policy} vs {baseline} — {dep}",
                  f"Throughput of {policy} over {baseline} per grid point (geometric mean {mean:.3f}×, range "
                  f"{lo:.3f}–{hi:.3f}×). Colours are centred on 1 and span ±{100 * span:.0f}% in every heatmap of this report; hatched cells "
                  f"({quiet} of {finite.size}) are within ±{100 * NOISE:.0f}% of 1, about what a different seed of the "
                  f"same recipe moves a speedup, and count as no difference.", fig)


def _digits(v: np.ndarray) -> int:
    """Decimals that tell a heatmap's cells apart: 2, or 3 where every finite cell would read the same with 2."""
    finite = v[np.isfinite(v)]
    return 3 if finite.size > 1 and len({f"{x:.2f}" for x in finite}) == 1 and np.ptp(finite) > 0 else 2


# one shade per statistic, the same in both panels of a latency figure
LATENCY_SHADES = {"p50": 0.35, "mean": 0.6, "p99": 0.85}


def latency_bars(df: pd.DataFrame, order: list[str]) -> list[Figure]:
    """Per online workload: each policy's latency (p50, mean, p99) and TTFT (mean, p99), side by side."""
    out = []
    for g in list(dict.fromkeys(df["group"]))[:LATENCY_FIGURES]:
        rows = df[df["group"] == g].set_index("label")
        labels = [p for p in order if p in rows.index]
        fig, axes = plt.subplots(1, 2, figsize=(min(12.0, 5.0 + 0.9 * len(labels)), 3.8), layout="constrained")
        x = np.arange(len(labels))
        for ax, stats, name in ((axes[0], ("latency_p50_s", "latency_mean_s", "latency_p99_s"), "latency (s)"),
                                (axes[1], ("ttft_mean_s", "ttft_p99_s"), "time to first token (s)")):
            have = [c for c in stats if c in rows and rows[c].notna().any()]
            w = 0.8 / max(len(have), 1)
            for k, c in enumerate(have):
                stat = c.split("_")[1]
                ax.bar(x - 0.4 + w * (k + 0.5), rows.loc[labels, c].to_numpy(float), w, label=stat,
                       color=plt.get_cmap("Blues")(LATENCY_SHADES[stat]))
            ax.set_xticks(x)
            ax.set_xticklabels(labels)
            ax.set_ylabel(name)
            ax.grid(axis="y", alpha=0.3)
            top = np.nanmax(rows.loc[labels, have].to_numpy(float)) if have else np.nan
            if np.isfinite(top) and top > 0:
                ax.set_ylim(0.0, 1.3 * top)  # room for the legend above the bars
            ax.legend(fontsize=8, ncol=len(have) or 1, loc="upper left")
            tilt_if_crowded(ax)
        axes[0].set_title(f"Latency per policy — {g}", loc="left", fontsize=10)
        out.append(Figure(f"latency-{_slug(g)}", f"Latency per policy — {g}",
                          "Left: request latency (finish - arrival), median, mean and 99th percentile; right: time "
                          "to first token, mean and 99th percentile.", fig))
    return out


def _slug(s: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9.+-]+", "_", s).strip("_")


__all__ = ["PALETTE", "Figure", "colors", "hatches", "latency_bars", "sharing_bars", "speedup_heatmaps", "throughput_bars"]
