"""The report's tables: policies side by side per workload, and each policy across workloads.

Numbers are the run summaries' own (docs/DESIGN.md metrics); the only derived one is the speedup, a
run's throughput over the baseline policy's on the same workload and deployment. Offline workloads are
compared by throughput; online ones (arrival times) by latency. Averages over workloads pair each
policy with the baseline on the same workloads. The CSV keeps each row's cost model, mode, engine
and run directory; the page lists run directories in a footnote.
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from blendsim.sim.errors import UserError

# (column, header, format) of the side-by-side table; short headers, explained by LEGEND.
SIDE_BY_SIDE = [
    ("group", "workload", "s"), ("label", "policy", "s"), ("throughput_tok_s", "tok/s", ",.0f"),
    ("speedup", "speedup", ".3f×"), ("makespan_s", "makespan s", ",.1f"),
    ("prefix_sharing_ratio", "sharing", ".1%"), ("optimal_sharing_ratio", "s_o", ".1%"),
    ("sharing_frac_of_opt", "of s_o", ".1%"), ("frac_of_opt", "of T_o", ".1%"),
    ("frac_of_reference", "of ref.", ".1%"), ("recomputed_tokens", "recomp.", ",.0f"),
    ("preemptions", "preempt.", ",.0f"), ("host_hit_tokens", "host hits", ",.0f"),
    ("disk_hit_tokens", "disk hits", ",.0f"), ("kv_load_gb", "loaded GB", ",.1f"),
    ("kv_load_stall_s", "load stall s", ",.1f"),
]
# the latency table of online workloads (requests with arrival times); SLO columns when the trace has SLOs
LATENCY = [
    ("group", "workload", "s"), ("label", "policy", "s"),
    ("latency_mean_s", "lat. mean s", ",.3f"), ("latency_p50_s", "p50 s", ",.3f"), ("latency_p99_s", "p99 s", ",.3f"),
    ("ttft_mean_s", "TTFT s", ",.3f"), ("ttft_p99_s", "TTFT p99 s", ",.3f"), ("tbt_mean_s", "TBT ms", "ms"),
    ("slo_attainment", "SLO met", ".1%"), ("goodput_tok_s", "goodput", ",.0f"),
    ("throughput_tok_s", "tok/s", ",.0f"), ("makespan_s", "makespan s", ",.1f"),
    ("host_hit_tokens", "host hits", ",.0f"), ("disk_hit_tokens", "disk hits", ",.0f"),
    ("kv_load_gb", "loaded GB", ",.1f"), ("kv_load_stall_s", "load stall s", ",.1f"),
]
PROVENANCE = [("cost_model", "cost model", "s"), ("mode", "mode", "s"), ("engine", "engine", "s"),
              ("run_path", "run directory", "s")]
# what a run ran on, for the CSV: a table kept apart from its report still says what it measured
DEPLOYMENT = [("model", "model", "s"), ("hardware", "hardware", "s"), ("tp", "tp", "d"), ("pp", "pp", "d"),
              ("ep", "ep", "d"), ("replicas", "replicas", "d"), ("weights", "weights", "s"), ("kv_dtype", "kv dtype", "s"),
              ("deployment", "deployment", "s")]
# the scheduler settings a run took (its policy's declared ones over the engine's, or the options'): the CSV keeps
# them, and a report says where a comparison's policies ran on different ones (reports.render.settings_note)
SETTINGS = [("token_budget", "token budget", "d"), ("max_seqs", "max seqs", "d"), ("block_size", "block size", "d"),
            ("round_tokens", "rounding", "d"), ("mix", "mix", "s"), ("prefix_caching", "prefix caching", "s"),
            ("prefix_retain", "prefix kept", "s"), ("admission", "admission", "s"),
            ("reserve_ratio", "reserve ratio", "g"), ("kv_full", "KV full", "s"),
            ("gpu_memory_utilization", "GPU memory", "g")]
LEGEND = {
    "tok/s": "throughput, (input + output tokens) / makespan",
    "speedup": "throughput over the baseline's on the same workload",
    "makespan s": "time until the last request finishes",
    "sharing": "prefix sharing ratio achieved (BatchLLM Eq. 2)",
    "s_o": "the trace's optimal sharing ratio (DFS, unbounded cache)",
    "of s_o": "sharing / s_o (–: the trace shares no prefix)",
    "of T_o": "T_o / makespan; T_o: the run's lower bound on its own engine, mode and deployment (<= 100%)",
    "of ref.": "blended reference / makespan (an estimate, not a bound: may pass 100%)", "recomp.": "tokens recomputed after preemption (the prompt and what was generated before it)",
    "preempt.": "preemptions",
    "host hits": "prompt tokens loaded from the host-memory KV tier (--host-kv-gb)",
    "disk hits": "prompt tokens loaded from the disk KV tier (--disk-kv-gb)",
    "loaded GB": "KV bytes loaded back to the GPU from host/disk, in GB",
    "load stall s": "step time spent waiting for KV loads",
    "lat. mean s": "mean latency (finish - arrival)", "p50 s": "median latency", "p99 s": "99th percentile latency",
    "TTFT s": "mean time to first token", "TTFT p99 s": "99th percentile TTFT",
    "TBT ms": "mean time between tokens", "SLO met": "share of requests meeting all their SLOs",
    "goodput": "tokens of requests meeting their SLOs / makespan (tok/s)",
    "n": "workloads the row averages over (those where the policy and the baseline both ran)",
    "geo. mean": "geometric mean speedup over those workloads", "lowest": "lowest speedup", "highest": "highest speedup",
    "mean tok/s": "mean throughput over those workloads",
    "tok/s over seeds": "mean throughput over the seeds",
    "± 95% CI": "half-width of the 95% confidence interval of the mean throughput over the seeds (Student t)",
    "CI low": "95% confidence interval of the geometric-mean speedup over the seeds (t on log speedups)",
    "seeds": "seed replicates (sweep --seeds)",
    "mean of T_o": "mean of T_o / makespan", "mean of ref.": "mean of blended reference / makespan (not a bound)",
    "mean of s_o": "mean sharing / s_o",
}


def choose_baseline(runs: pd.DataFrame, baseline: str | None) -> str:
    """``baseline`` if some run has that policy; else dfs when present; else the first policy by name."""
    have = sorted(runs["policy"].astype(str).unique())
    if baseline is not None:
        if baseline not in have:
            raise UserError(f"--baseline {baseline!r}: no run of that policy; the runs have {', '.join(have)}")
        return baseline
    return "dfs" if "dfs" in have else have[0]


def baseline_reason(runs: pd.DataFrame, asked: str | None, chosen: str) -> str:
    """Why ``chosen`` is the baseline, in words (plain text)."""
    if asked is not None:
        return "given with --baseline"
    if chosen == "dfs":
        return "the default: prefix-tree depth-first order, the baseline BlendServe compares against"
    return "picked only because it comes first by name (no --baseline was given and no dfs run is present)"


def policy_order(runs: pd.DataFrame, baseline: str) -> list[str]:
    """Baseline first, then the other policies by name."""
    return [baseline] + sorted(set(runs["policy"].astype(str)) - {baseline})


def baseline_keys(df: pd.DataFrame, baseline: str) -> list[str]:
    """The columns that pair a run with the baseline run its speedup is over: the workload and deployment
    (``group``); with runs priced by several engines or cost models (``report --mixed``), the pricing too, so a
    speedup never crosses engines; and the input, where the baseline ran in several inputs on one of those (a sweep
    and its --engine-of twin)."""
    keys = ["group"]
    if "pricing" in df and df["pricing"].nunique() > 1:
        keys.append("pricing")
    b = df[df["policy"] == baseline]
    if "origin" in b and len(b) and b.groupby(keys)["origin"].nunique().max() > 1:
        keys.append("origin")
    return keys


def with_speedup(runs: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """``runs`` plus ``speedup`` over the baseline run paired with each (:func:`baseline_keys`; NaN when there is
    none, and for a baseline run no other run is paired with: a run over itself says nothing), sorted by
    deployment, grid point, workload and policy (baseline first)."""
    df = runs.copy()
    b = df[df["policy"] == baseline]
    # the baseline ran in several inputs on one workload (a sweep and its --engine-of twin): each run is over its own
    # input's baseline run; within one input, the run of the plain policy (not one given --opt) is the baseline
    keys = baseline_keys(df, baseline)
    base = {}
    for k, rows in b.groupby(keys, sort=False):
        k = k if isinstance(k, tuple) else (k,)  # one key: pandas gives a scalar or a 1-tuple by version
        plain = rows[rows["label"].astype(str).str.partition(" (")[0] == rows["label"].astype(str)]
        pick = plain if len(plain) else rows
        if len(pick) > 1:
            g = k[0]
            raise UserError(f"{baseline} ran more than once on {g} ({', '.join(map(str, pick['label']))}), so a "
                            f"speedup over it would depend on which is taken; report those runs apart, or pick "
                            f"another --baseline")
        base[k] = float(pick["throughput_tok_s"].iloc[0])
    at = [tuple(r) for r in df[keys].itertuples(index=False)]
    ref = [base.get(k, float("nan")) for k in at]
    df["speedup"] = df["throughput_tok_s"] / pd.Series(ref, index=df.index, dtype=float)
    alone = pd.Series(at, index=df.index).map(pd.Series(at).value_counts()) == 1  # the only run paired with it
    df.loc[alone & (df["policy"] == baseline), "speedup"] = float("nan")
    rank = {p: i for i, p in enumerate(policy_order(df, baseline))}
    df["_g"] = df["grid_density"].fillna(-1.0).astype(float)
    df["_s"] = df["grid_sharing"].fillna(-1.0).astype(float)
    df["_p"] = df["policy"].map(rank)
    return df.sort_values(["deployment", "_g", "_s", "group", "_p", "label"], kind="stable").drop(
        columns=["_g", "_s", "_p"]).reset_index(drop=True)


def is_online(df: pd.DataFrame) -> pd.Series:
    """Rows of online runs (requests with arrival times: summary ``offline`` false)."""
    if "offline" not in df:
        return pd.Series(False, index=df.index)
    return df["offline"].map(lambda v: v is False or v == 0 or str(v).lower() == "false")


def side_by_side(df: pd.DataFrame) -> pd.DataFrame:
    """Every column a table or the CSV shows, of ``with_speedup``'s rows (absent ones left out)."""
    cols = list(dict.fromkeys(c for c, _, _ in SIDE_BY_SIDE + LATENCY + DEPLOYMENT + PROVENANCE + SETTINGS
                              if c in df and df[c].notna().any()))
    out = df[cols].reset_index(drop=True)
    for c in ("tp", "pp", "ep", "replicas"):  # a summary names pp (and ep) only where it is not 1: 1 there, whole
        if c in out:
            out[c] = pd.to_numeric(out[c], errors="coerce").fillna(1).astype(int)
    return out


def present(df: pd.DataFrame, spec: list) -> list:
    """The part of ``spec`` whose columns ``df`` has with some value. With several deployments, the
    workload column is split into workload and deployment, so neither gets long."""
    out = [x for x in spec if x[0] in df and df[x[0]].notna().any()]
    if {"deployment", "workload", "group"} <= set(df) and (df["group"].astype(str) != df["workload"].astype(str)).any():
        out = [y for x in out for y in ([("workload", "workload", "s"), ("deployment", "deployment", "s")]
                                        if x[0] == "group" else [x])]
    return out


def policy_summary(side: pd.DataFrame, baseline: str) -> tuple[pd.DataFrame, list[str]]:
    """Each policy over the workloads where it and the baseline both ran (like with like): the number
    of those workloads, geometric-mean, lowest and highest speedup, mean fractions. The mean
    throughput is kept only when every row covers the same workloads. With several deployments (model, GPU,
    split, precision), a row per deployment and policy: a mean over deployments would describe none of them.
    Returns the table and notes."""
    if "deployment" not in side or side["deployment"].nunique() < 2:
        return _policy_summary(side, baseline)
    parts, notes = [], []
    for dep, g in side.groupby("deployment", sort=False):
        t, said = _policy_summary(g, baseline)
        parts.append(t.assign(deployment=dep))
        notes += [f"on {dep}, {x}" for x in said]
    return pd.concat(parts, ignore_index=True), notes


def _policy_summary(side: pd.DataFrame, baseline: str) -> tuple[pd.DataFrame, list[str]]:
    rows, notes, cover = [], [], {}
    labels = list(dict.fromkeys(side["label"]))
    keys = baseline_keys(side, baseline)  # paired as the speedups are: on one engine in a --mixed report
    at = pd.Series([tuple(r) for r in side[keys].itertuples(index=False)], index=side.index)
    paired = at.isin(set(at[side["policy"] == baseline]))
    where = " on its engine" if "pricing" in keys else ""
    for p in sorted(labels, key=lambda x: (x != baseline, x)):
        g = side[(side["label"] == p) & paired]
        alone = side[(side["label"] == p) & ~paired]["group"].nunique()
        if alone:
            notes.append(f"{p} also ran on {alone} workload(s) without a {baseline} run{where}, left out of its row")
        cover[p] = frozenset(g["group"])
        sp = g["speedup"].dropna()
        rows.append({
            "policy": p, "n": int(g["group"].nunique()), "throughput_tok_s": g["throughput_tok_s"].mean(),
            "speedup_geomean": float(np.exp(np.log(sp).mean())) if len(sp) else np.nan,
            "speedup_min": sp.min() if len(sp) else np.nan, "speedup_max": sp.max() if len(sp) else np.nan,
            "frac_of_opt": g["frac_of_opt"].mean(), "frac_of_reference": g["frac_of_reference"].mean(),
            "sharing_frac_of_opt": g["sharing_frac_of_opt"].mean(),
        })
    # the ranking: fastest first (paired speedup over the baseline, i.e. throughput on the same workloads)
    out = pd.DataFrame(rows).sort_values("speedup_geomean", ascending=False, kind="stable", na_position="last")
    out = out.reset_index(drop=True)
    if len(set(cover.values())) > 1:
        out = out.drop(columns=["throughput_tok_s"])
        notes.append("the rows cover different workloads (column n), so no mean throughput is shown; "
                     "speedups are paired per workload")
    return out, notes


def lone_baseline_note(side: pd.DataFrame, baseline: str) -> str:
    """A sentence for the offline baseline runs left without a speedup (:func:`with_speedup`: no other policy ran
    beside them), or "". In a --mixed report it adds why no ratio across engines stands in for it."""
    if "speedup" not in side:
        return ""
    n = int((side["speedup"].isna() & (side["policy"] == baseline)).sum())
    if not n:
        return ""
    mixed = "pricing" in side and side["pricing"].nunique() > 1
    text = (f"No speedup is shown for {n} {baseline} run(s) with no other policy beside them on the same "
            f"{'engine, ' if mixed else ''}workload and deployment: a run over itself is 1 by definition")
    if mixed:
        text += "; a ratio across engines would mix pricing with scheduling, so compare their tok/s"
    return text + "."


def seed_spread(side: pd.DataFrame) -> pd.DataFrame:
    """Per grid point, deployment and policy over the seed replicates of a sweep --seeds N: the mean
    throughput with its 95% confidence interval (Student t over the seeds) and the geometric-mean speedup
    with its interval (t on the log speedups). Empty without replicates."""
    from scipy import stats

    if "grid_seed" not in side or side["grid_seed"].isna().all():
        return pd.DataFrame()
    rows = []
    keys = ["grid_point", "deployment", "label"]
    for (pt, dep, lab), g in side.dropna(subset=["grid_seed"]).groupby(keys, sort=False):
        n = len(g)
        tput = g["throughput_tok_s"].to_numpy(float)
        t = float(stats.t.ppf(0.975, n - 1)) if n > 1 else float("nan")
        half = t * tput.std(ddof=1) / np.sqrt(n) if n > 1 else float("nan")
        sp = np.log(g["speedup"].to_numpy(float))
        sp = sp[np.isfinite(sp)]
        m = sp.mean() if len(sp) else float("nan")
        h = t * sp.std(ddof=1) / np.sqrt(len(sp)) if len(sp) > 1 else float("nan")
        rows.append({"grid_point": pt, "deployment": dep, "label": lab, "seeds": n, "throughput_tok_s": tput.mean(),
                     "throughput_ci": half, "speedup": float(np.exp(m)), "speedup_lo": float(np.exp(m - h)),
                     "speedup_hi": float(np.exp(m + h))})
    return pd.DataFrame(rows)


SEEDS = [("grid_point", "grid point", "s"), ("deployment", "deployment", "s"), ("label", "policy", "s"),
         ("seeds", "seeds", ",.0f"), ("throughput_tok_s", "tok/s over seeds", ",.0f"), ("throughput_ci", "± 95% CI", ",.0f"),
         ("speedup", "speedup", ".3f×"), ("speedup_lo", "CI low", ".3f×"), ("speedup_hi", "CI high", ".3f×")]


SUMMARY = [("deployment", "deployment", "s"), ("policy", "policy", "s"), ("n", "n", ",.0f"),
           ("speedup_geomean", "geo. mean", ".3f×"), ("speedup_min", "lowest", ".3f×"), ("speedup_max", "highest", ".3f×"),
           ("throughput_tok_s", "mean tok/s", ",.0f"), ("frac_of_opt", "mean of T_o", ".1%"),
           ("frac_of_reference", "mean of ref.", ".1%"), ("sharing_frac_of_opt", "mean of s_o", ".1%")]


def legend(spec: list) -> str:
    """'header: meaning; ...' for the abbreviated headers of ``spec``."""
    return "; ".join(f"{h}: {LEGEND[h]}" for _, h, _ in spec if h in LEGEND) + "."


def fmt(value, spec: str) -> str:
    """A cell as text: ``s`` as is, ``ms`` seconds shown in ms, ``…×`` a ratio, else a format spec."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "–"
    if spec == "s":
        return str(value)
    if spec == "ms":
        return f"{1e3 * float(value):,.1f}"
    if spec == "tput":  # a throughput in any metric's unit (blendsim.sim.metrics.format_throughput)
        from blendsim.sim.metrics import format_throughput

        return format_throughput(float(value))
    if spec.endswith("×"):
        return f"{float(value):{spec[:-1]}}×"
    return f"{float(value):{spec}}"


def _layout(df: pd.DataFrame, spec: list) -> tuple[list[str], list[list[str]]]:
    cols = [(c, h, f) for c, h, f in spec if c in df]
    return [h for _, h, _ in cols], [[fmt(r[c], f) for c, _, f in cols] for _, r in df.iterrows()]


def to_markdown(df: pd.DataFrame, spec: list) -> str:
    heads, rows = _layout(df, spec)
    esc = [[v.replace("|", "\\|") for v in r] for r in rows]
    heads = [h.replace("|", "\\|") for h in heads]
    text = [f == "s" for c, _, f in spec if c in df]  # text columns left, numbers right (as the HTML aligns them)
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" if t else "---:" for t in text) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in esc]) + "\n"


def to_html(df: pd.DataFrame, spec: list) -> str:
    heads, rows = _layout(df, spec)
    th = "".join(f'<th title="{html.escape(LEGEND.get(h, h))}">{html.escape(h)}</th>' for h in heads)
    text = [f == "s" for c, _, f in spec if c in df]
    body = "".join("<tr>" + "".join(f'<td class="t">{html.escape(v)}</td>' if t else f"<td>{html.escape(v)}</td>"
                                    for v, t in zip(r, text, strict=True)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


__all__ = ["DEPLOYMENT", "LATENCY", "LEGEND", "PROVENANCE", "SIDE_BY_SIDE", "SUMMARY", "baseline_keys", "baseline_reason",
           "choose_baseline", "fmt", "is_online", "legend", "lone_baseline_note", "policy_order", "policy_summary",
           "present", "side_by_side", "to_html", "to_markdown", "with_speedup"]
