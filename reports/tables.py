"""The report's tables: policies side by side per workload, and each policy across workloads.

Numbers are the run summaries' own (DESIGN.md metrics); the only derived one is the speedup, a run's
throughput over the baseline policy's on the same workload and deployment. Every row keeps the cost
model, mode, engine and run directory it came from.
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from sim.errors import UserError

# (column, header, format) of the side-by-side table; latency/SLO columns appear when present.
SIDE_BY_SIDE = [
    ("group", "workload", "s"), ("label", "policy", "s"), ("throughput_tok_s", "throughput (tok/s)", ",.0f"),
    ("speedup", "speedup", ".3f×"), ("makespan_s", "makespan (s)", ",.1f"),
    ("prefix_sharing_ratio", "prefix sharing", ".1%"), ("optimal_sharing_ratio", "optimal sharing", ".1%"),
    ("sharing_frac_of_opt", "sharing of optimal", ".1%"), ("frac_of_opt", "of T_o", ".1%"),
    ("frac_of_practical_opt", "of practical opt.", ".1%"), ("recomputed_tokens", "recomputed tok", ",.0f"),
    ("preemptions", "preemptions", ",.0f"),
]
LATENCY = [
    ("latency_mean_s", "latency mean (s)", ",.2f"), ("latency_p99_s", "latency p99 (s)", ",.2f"),
    ("ttft_mean_s", "TTFT mean (s)", ",.3f"), ("tbt_mean_s", "TBT mean (ms)", "ms"),
    ("slo_attainment", "SLO attainment", ".1%"), ("goodput_tok_s", "goodput (tok/s)", ",.0f"),
]
PROVENANCE = [("cost_model", "cost model", "s"), ("mode", "mode", "s"), ("engine", "engine", "s"),
              ("run_path", "run directory", "s")]


def choose_baseline(runs: pd.DataFrame, baseline: str | None) -> str:
    """``baseline`` if some run has that policy; else dfs when present; else the first policy by name."""
    have = sorted(runs["policy"].astype(str).unique())
    if baseline is not None:
        if baseline not in have:
            raise UserError(f"--baseline {baseline!r}: no run of that policy; the runs have {', '.join(have)}")
        return baseline
    return "dfs" if "dfs" in have else have[0]


def policy_order(runs: pd.DataFrame, baseline: str) -> list[str]:
    """Baseline first, then the other policies by name."""
    return [baseline] + sorted(set(runs["policy"].astype(str)) - {baseline})


def with_speedup(runs: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """``runs`` plus ``speedup`` over the baseline of each group (NaN when the group lacks it), sorted
    by deployment, grid point, workload and policy (baseline first)."""
    df = runs.copy()
    base = df[df["policy"] == baseline].drop_duplicates("group").set_index("group")["throughput_tok_s"]
    df["speedup"] = df["throughput_tok_s"] / df["group"].map(base)
    rank = {p: i for i, p in enumerate(policy_order(df, baseline))}
    df["_g"] = df["grid_density"].fillna(-1.0).astype(float)
    df["_s"] = df["grid_sharing"].fillna(-1.0).astype(float)
    df["_p"] = df["policy"].map(rank)
    return df.sort_values(["deployment", "_g", "_s", "group", "_p", "label"], kind="stable").drop(
        columns=["_g", "_s", "_p"]).reset_index(drop=True)


def side_by_side(df: pd.DataFrame) -> pd.DataFrame:
    """The table's columns of ``with_speedup``'s rows (latency columns only when some run has them)."""
    cols = [c for c, _, _ in SIDE_BY_SIDE + LATENCY + PROVENANCE if c in df and df[c].notna().any()]
    return df[cols].reset_index(drop=True)


def policy_summary(side: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Each policy across the workloads: geometric-mean, lowest and highest speedup, mean fractions."""
    rows = []
    labels = list(dict.fromkeys(side["label"]))
    for p in sorted(labels, key=lambda x: (x != baseline, x)):
        g = side[side["label"] == p]
        if g.empty:
            continue
        sp = g["speedup"].dropna()
        rows.append({
            "policy": p, "workloads": int(g["group"].nunique()), "throughput_tok_s": g["throughput_tok_s"].mean(),
            "speedup_geomean": float(np.exp(np.log(sp).mean())) if len(sp) else np.nan,
            "speedup_min": sp.min() if len(sp) else np.nan, "speedup_max": sp.max() if len(sp) else np.nan,
            "frac_of_opt": g["frac_of_opt"].mean(), "frac_of_practical_opt": g["frac_of_practical_opt"].mean(),
            "sharing_frac_of_opt": g["sharing_frac_of_opt"].mean(),
        })
    return pd.DataFrame(rows)


SUMMARY = [("policy", "policy", "s"), ("workloads", "workloads", ",.0f"),
           ("throughput_tok_s", "mean throughput (tok/s)", ",.0f"), ("speedup_geomean", "speedup (geo. mean)", ".3f×"),
           ("speedup_min", "lowest", ".3f×"), ("speedup_max", "highest", ".3f×"), ("frac_of_opt", "mean of T_o", ".1%"),
           ("frac_of_practical_opt", "mean of practical opt.", ".1%"),
           ("sharing_frac_of_opt", "mean sharing of optimal", ".1%")]


def fmt(value, spec: str) -> str:
    """A cell as text: ``s`` as is, ``ms`` seconds shown in ms, ``…×`` a ratio, else a format spec."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "–"
    if spec == "s":
        return str(value)
    if spec == "ms":
        return f"{1e3 * float(value):,.1f}"
    if spec.endswith("×"):
        return f"{float(value):{spec[:-1]}}×"
    return f"{float(value):{spec}}"


def _layout(df: pd.DataFrame, spec: list) -> tuple[list[str], list[list[str]]]:
    cols = [(c, h, f) for c, h, f in spec if c in df]
    return [h for _, h, _ in cols], [[fmt(r[c], f) for c, _, f in cols] for _, r in df.iterrows()]


def to_markdown(df: pd.DataFrame, spec: list) -> str:
    heads, rows = _layout(df, spec)
    esc = [[v.replace("|", "\\|") for v in r] for r in rows]
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" if i < 2 else "---:" for i in range(len(heads))) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in esc]) + "\n"


def to_html(df: pd.DataFrame, spec: list) -> str:
    heads, rows = _layout(df, spec)
    th = "".join(f"<th>{html.escape(h)}</th>" for h in heads)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


ALL_COLUMNS = SIDE_BY_SIDE + LATENCY + PROVENANCE

__all__ = ["ALL_COLUMNS", "SUMMARY", "choose_baseline", "fmt", "policy_order", "policy_summary", "side_by_side",
           "to_html", "with_speedup", "to_markdown"]
