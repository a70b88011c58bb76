"""Validation directories (``blendsim validate``): predicted vs measured step time, per policy.

The directory's ``summary.json`` has ``"kind": "blendsim.validation"``; its per-step table
(``steps.parquet``) has ``step``, ``predicted_s`` and ``measured_s`` (the cost model's time and the
device's, seconds) and, when several policies were replayed, ``policy``. Error is
``predicted / measured - 1`` (positive: the simulator is pessimistic), as ``blendsim.real_backend.compare``
defines it; the statistics here are recomputed from the steps drawn, so figure and table agree.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from blendsim.reports.figures import Figure, colors, plt
from blendsim.sim.errors import UserError

# (column, header, format) of the validation table
TABLE = [("validation_dir", "validation directory", "s"), ("policy", "policy", "s"), ("steps", "steps", ",.0f"),
         ("median_abs_err", "median |err|", ".1%"), ("p90_abs_err", "p90 |err|", ".1%"), ("mean_err", "mean err", "+.1%"),
         ("total_err", "summed-time err", "+.1%"), ("throughput_err", "throughput err", "+.1%"),
         ("model", "model", "s"), ("hardware", "hardware preset", "s"), ("mode", "mode", "s"), ("status", "status", "s")]
SUMMARY_KEYS = ("model", "hardware", "dtype", "mode", "status", "attention_backend", "repeats")


def read_validation(vdir: Path, vfile: Path) -> tuple[pd.DataFrame, list[dict]]:
    """The usable steps (a ``policy`` column added when absent) and one statistics row per policy."""
    t = pd.read_parquet(vfile)
    if "policy" not in t:
        t["policy"] = "(run)"
    for c in ("predicted_s", "measured_s"):
        t[c] = pd.to_numeric(t[c], errors="coerce")
    t = t[np.isfinite(t["predicted_s"]) & np.isfinite(t["measured_s"]) & (t["measured_s"] > 0)]
    if t.empty:
        raise UserError(f"{vfile}: no step with both a predicted and a positive measured time")
    summary = _summary(vdir / "summary.json")
    rows = []
    for p, g in t.groupby("policy", sort=True):
        e = (g["predicted_s"] / g["measured_s"] - 1.0).to_numpy()
        row = {"validation_dir": str(vdir), "policy": p, "steps": len(g),
               "median_abs_err": float(np.median(np.abs(e))), "p90_abs_err": float(np.percentile(np.abs(e), 90)),
               "mean_err": float(e.mean()), "predicted_total_s": float(g["predicted_s"].sum()),
               "measured_total_s": float(g["measured_s"].sum())}
        row["total_err"] = row["predicted_total_s"] / row["measured_total_s"] - 1.0
        e2e = summary.get("policies", {}).get(p, {}).get("end_to_end", {}) if isinstance(summary.get("policies"), dict) else {}
        if "throughput_err" in e2e:
            row["throughput_err"] = e2e["throughput_err"]
        row.update({k: summary[k] for k in SUMMARY_KEYS if isinstance(summary.get(k), (str, int, float))})
        rows.append(row)
    return t, rows


def validation_figures(name: str, t: pd.DataFrame, rows: list[dict], slug: str) -> list[Figure]:
    """Scatter of predicted against measured step time (log axes when they span a decade) and the
    histogram of the per-step error, one colour per policy."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10.5, 4.4), layout="constrained")
    pols = list(dict.fromkeys(t["policy"]))
    col = colors(pols)
    for p in pols:
        g = t[t["policy"] == p]
        a.scatter(g["measured_s"] * 1e3, g["predicted_s"] * 1e3, s=8, alpha=0.6, lw=0, color=col[p], label=p)
        err = np.clip((g["predicted_s"] / g["measured_s"] - 1.0).to_numpy() * 100.0, -100, 100)
        b.hist(err, bins=np.linspace(-100, 100, 81), alpha=0.55, color=col[p], label=p)
    v = np.r_[t["predicted_s"].to_numpy(), t["measured_s"].to_numpy()] * 1e3
    lo, hi = float(v.min()), float(v.max())
    a.plot([lo, hi], [lo, hi], color="black", lw=1, label="predicted = measured")
    if lo > 0 and hi / lo > 10:
        a.set_xscale("log")
        a.set_yscale("log")
    a.set_xlabel("measured step time (ms)")
    a.set_ylabel("predicted step time (ms)")
    a.set_title(f"{len(t):,} steps", fontsize=9)
    a.legend(fontsize=8)
    a.grid(alpha=0.3)
    b.axvline(0, color="black", lw=1)
    b.set_xlabel("step time error: predicted / measured - 1 (%, clipped to ±100)")
    b.set_ylabel("steps")
    b.set_title("\n".join(f"{r['policy']}: median |err| {100 * r['median_abs_err']:.1f}%" for r in rows[:4])
                + (f"\n(+{len(rows) - 4} more)" if len(rows) > 4 else ""), fontsize=9)
    b.legend(fontsize=8)
    b.grid(alpha=0.3)
    fig.suptitle(f"Validation — {name}", fontsize=10)
    tot = "; ".join(f"{r['policy']}: predicted {r['predicted_total_s']:.3g} s vs measured {r['measured_total_s']:.3g} s "
                    f"({100 * r['total_err']:+.1f}%)" for r in rows)
    return [Figure(f"validation-{slug}", f"Validation: predicted vs measured step time — {name}",
                   f"The cost model's time for each replayed step against the device's. Summed: {tot}.", fig)]


def _summary(path: Path) -> dict:
    try:
        s = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return s if isinstance(s, dict) else {}


__all__ = ["TABLE", "read_validation", "validation_figures"]
