"""Write a report: index.html (self-contained), report.md, CSV tables and the figures as PNG.

``write_report(run_dirs, out_dir, baseline=None)`` is the entry point for other commands (the demo
ends with it); ``blendsim report`` calls it with its options. The report is built in a temporary
folder beside ``out_dir`` and renamed into place, so a failed report leaves no half page.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path

import pandas as pd

from blendsim.reports import figures as F
from blendsim.reports import steps as S
from blendsim.reports import tables as T
from blendsim.reports import validation as V
from blendsim.reports.inputs import load_inputs
from blendsim.sim.errors import UserError
from blendsim.sim.io import atomic_dir

MARKER = "index.html"


def write_report(run_dirs, out_dir, baseline: str | None = None, steps_workload: str | None = None,
                 steps_policies: list[str] | None = None, steps_x: str = "step", mixed: bool = False,
                 notes: list | None = None) -> Path:
    """Compare the runs in ``run_dirs`` (sweep, run or validation directories, or folders of runs) and
    write the report to ``out_dir``. ``baseline`` is the policy speedups are over (default dfs when
    present). Runs priced by different engines or cost models are refused unless ``mixed`` (then every
    row names its engine). Returns the path of the HTML page."""
    inputs = load_inputs([Path(p) for p in run_dirs])
    if notes is not None:  # the caller says them too (the command line, on stderr)
        notes += inputs.notes
    if len(inputs.runs):
        inputs.runs = one_pricing(inputs.runs, mixed)
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).exists())):
        raise UserError(f"{out}: exists and is not a blendsim report directory; choose another -o")
    sections: list[tuple[str, str, list]] = []  # (title, intro html, [html table | Figure])
    md_tables: dict[str, tuple] = {}  # title -> (table, spec, markdown text under it)
    csvs: dict[str, pd.DataFrame] = {}
    if len(inputs.runs):
        _run_sections(inputs.runs, baseline, steps_workload, steps_policies, sections, md_tables, csvs, steps_x,
                      notes)
    vrows, vfigs = [], []
    for k, (vdir, vfile) in enumerate(inputs.validations):
        t, rows = V.read_validation(vdir, vfile)
        vrows += rows
        vfigs += V.validation_figures(str(vdir), t, rows, str(k))
    if vrows:
        vt = pd.DataFrame(vrows)
        csvs["validation.csv"] = vt
        md_tables["Validation: predicted vs measured"] = (vt, V.TABLE, "")
        sections.append(("Validation: predicted vs measured step time", "<p>Error = predicted / measured - 1 "
                         "(positive: the simulator is pessimistic).</p>", [T.to_html(vt, V.TABLE), *vfigs]))
    if not sections:
        raise UserError("nothing to report: the inputs hold no finished runs")
    return _write(out, sections, md_tables, csvs, _provenance(inputs, markdown=True),
                  _provenance(inputs, markdown=False))


def one_pricing(runs: pd.DataFrame, mixed: bool) -> pd.DataFrame:
    """``runs`` with ``pricing`` (engine and cost model); runs of several are refused in one line unless
    ``mixed``, which labels every row with its engine instead."""
    runs = runs.copy()
    # the modelled profile that priced a run (and the key's own overrides): vllm@0.10 and vllm are one engine
    engine = runs["engine"].astype(str)
    if "engine_profile" in runs:
        prof = runs["engine_profile"].where(runs["engine_profile"].notna(), engine.str.partition(":")[0]).astype(str)
        if "engine_sha256" in runs:  # a calibrated file is the engine its content is, whatever its path: a file
            # re-calibrated between two runs prices them two ways, a copy elsewhere one way
            sha = runs["engine_sha256"]
            has = sha.notna() & (sha.astype(str) != "")
            path = prof.str.partition(" fitted in ")[2]
            older = set(path[~has & (path != "")])  # a path some run recorded before the digest was: by path alone
            has &= ~path.isin(older)
            base = prof.str.partition(" fitted in ")[0]
            first = {h: sorted(prof[has & (sha == h)].str.partition(" fitted in ")[2])[0] for h in set(sha[has])}
            prof = prof.where(~has, base + " fitted in " + sha.map(lambda h: f"{first.get(h, '')}, sha256 "
                                                                          f"{str(h)[:12]}"))
        over = engine.str.partition(":")[2]
        engine = prof + over.where(over == "", ":" + over)
    runs["pricing"] = "engine " + engine + ", " + runs["cost_model"].astype(str) + " cost model"
    # said as the runs asked for it where they all did one way (engine vllm@0.10:fixed_s=0.001, modelled by vllm@0.8)
    asked = runs["engine"].astype(str)
    for key, idx in runs.groupby("pricing").groups.items():
        keys = sorted(set(asked[idx]))
        prof = engine[idx[0]]
        if len(keys) == 1 and keys[0] != prof:
            runs.loc[idx, "pricing"] = key.replace(f"engine {prof},", f"engine {keys[0]} (modelled by "
                                                                        f"{prof.partition(':')[0]}),", 1)
    kinds = sorted(set(runs["pricing"]))
    if len(kinds) > 1:
        if not mixed:
            raise UserError(f"the runs were priced differently ({'; '.join(kinds)}), so their ranking would mix "
                            "pricing with scheduling; simulate them all with one --engine, or pass --mixed to "
                            "show them side by side with the engine in every row")
        tag = " [" + runs["engine"].astype(str) + "]"
        said = pd.Series([lab.endswith(t) for lab, t in zip(runs["label"].astype(str), tag, strict=True)],
                         index=runs.index)  # labelled by engine already (reports.inputs._label)
        runs.loc[~said, "label"] = runs.loc[~said, "label"].astype(str) + tag[~said]
    return runs


def write_simple_report(out_dir, title: str, intro: str, items: list, csvs: dict | None = None) -> Path:
    """Write a self-contained report (index.html, report.md, figures/, CSV files) from ready pieces, for
    commands with their own comparisons (e.g. a fidelity check).

    ``items`` holds, in page order, ``(heading, DataFrame, spec)`` tables (``spec``: ``(column, header,
    format)`` triples as in :mod:`blendsim.reports.tables`; an abbreviated header found in ``tables.LEGEND`` is
    explained under the table) and :class:`blendsim.reports.figures.Figure` records; ``csvs`` maps file names
    to tables written beside the page. ``intro`` is plain text. Returns the path of index.html."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).exists())):
        raise UserError(f"{out}: exists and is not a blendsim report directory; choose another -o")
    sections, md_tables = [], {}
    for it in items:
        if isinstance(it, F.Figure):
            sections.append((it.title, "", [it]))
            continue
        heading, df, spec = it
        spec = T.present(df, spec) or spec
        note = T.legend(spec) if any(h in T.LEGEND for _, h, _ in spec) else ""
        sections.append((heading, f"<p class=legend>{html.escape(note)}</p>" if note else "", [T.to_html(df, spec)]))
        md_tables[heading] = (df, spec, note + "\n" if note else "")
    return _write(out, sections, md_tables, dict(csvs or {}), intro, html.escape(intro), title)


def _run_sections(runs, baseline, steps_workload, steps_policies, sections, md_tables, csvs,
                  steps_x: str = "step", notes: list | None = None) -> None:
    """The simulated runs' sections: the baseline, online workloads by latency, offline ones by
    throughput (tables, then figures), critical-path warnings, run directories. What a reader of the terminal
    must know too (baseline runs left without a speedup) is added to ``notes``."""
    base = T.choose_baseline(runs, baseline)
    df = T.with_speedup(runs, base)
    online = T.is_online(df)
    df.loc[online, "speedup"] = float("nan")  # online runs are compared by latency, not throughput
    order = list(dict.fromkeys(sorted(df["label"], key=lambda x: (x != base, x))))
    csvs["policies.csv"] = T.side_by_side(df)
    below = _reference_below_bound(df)
    if below.any():  # no estimate above a bound: "of ref." blank (summaries written since 1 Dec 2026 hold null)
        df.loc[below, "frac_of_reference"] = float("nan")
    policies = ", ".join(sorted(set(df["policy"].astype(str))))
    why = T.baseline_reason(runs, baseline, base)
    pricing = sorted(set(df["pricing"]))
    priced = (f"All runs are priced on one engine: {pricing[0]}. " if len(pricing) == 1 else
              f"Runs are priced by {len(pricing)} engines/cost models ({'; '.join(pricing)}; --mixed): each row "
              "names its engine, and a speedup is over the baseline run priced the same way (a ratio across engines "
              "would mix pricing with scheduling). ")
    same = "workload, deployment and engine" if len(pricing) > 1 else "workload and deployment"
    ref_note = (f"\"of ref.\" is left blank for {int(below.sum())} run(s) whose blended reference falls below their "
                "T_o: it prices the work as full blended steps and leaves out the longest request's own chain, so "
                "there it is no estimate of the makespan.") if below.any() else ""
    expect = " ".join(x for x in (settings_note(df), ref_note, _no_cache_note(df), _expected_note(df)) if x)
    intro = html.escape(priced) + (f"Speedups are over <b>{html.escape(base)}</b> (choose another with <code>--baseline POLICY</code>; "
             f"policies here: {html.escape(policies)}): {html.escape(why)}. A speedup is a run's throughput over "
             f"the baseline's on the same {same}.")
    md_intro = priced + (f"Speedups are over **{base}** (choose another with `--baseline POLICY`; policies here: {policies}): "
                f"{why}. A speedup is a run's throughput over the baseline's on the same {same}.")
    warn = _critical_notes(df)
    if online.any():
        on = df[online]
        spec = T.present(on, T.LATENCY)
        note = (f"{on['group'].nunique()} online workload(s): requests arrive over time, so the makespan follows "
                "the arrivals and throughput barely differs between policies; they are compared by latency. "
                "Offline bounds (T_o) do not apply and are left out.")
        if "slo_attainment" not in on or on["slo_attainment"].isna().all():
            note += " The traces have no SLOs: no SLO attainment or goodput."
        # what the offline section's intro says of every run, said here where no offline run follows
        lead = " ".join(x for x in (priced.strip(), settings_note(on)) if x) if online.all() else ""
        note = f"{lead} {note}" if lead else note
        sections.append(("Online workloads: latency", f"<p>{html.escape(note)}</p><p class=legend>"
                         f"{html.escape(T.legend(spec))}</p>", [T.to_html(on, spec), *F.latency_bars(on, order)]))
        md_tables["Online workloads: latency"] = (on, spec, f"{note}\n\n{T.legend(spec)}\n")
    off = df[~online]
    if len(off):
        summary, pair_notes = T.policy_summary(off, base)
        csvs["policy_summary.csv"] = summary
        sspec = T.present(summary, T.SUMMARY)
        n_w = off["group"].nunique()
        n_dep = off["deployment"].nunique() if "deployment" in off else 1
        lone = T.lone_baseline_note(off, base)
        if lone and notes is not None:  # the command line says it too (on stderr)
            notes.append(lone[0].lower() + lone[1:-1])
        if n_dep > 1:  # a row per deployment and policy (T.policy_summary): a workload counted once per deployment
            head = (f"{off['workload'].nunique()} offline workload(s) on {n_dep} deployments, a row per deployment "
                    f"and policy. Each row averages over the n workloads of its deployment on which the policy and "
                    f"{base} both ran")
        else:
            head = f"{n_w} offline workload(s). Each row averages over the n workloads on which the policy and {base} both ran"
        text = head + "".join(f"; {x}" for x in pair_notes) + "." + (f" {lone}" if lone else "")
        exp_html, exp_md = (f"<p>{html.escape(expect)}</p>", f"{expect}\n\n") if expect else ("", "")
        sections.append(("Policies across workloads", f"<p>{intro}</p>{exp_html}<p>{html.escape(text)}</p>"
                         f"<p class=legend>{html.escape(T.legend(sspec))}</p>{warn[0]}", [T.to_html(summary, sspec)]))
        md_tables["Policies across workloads"] = (summary, sspec,
                                                  f"{md_intro}\n\n{exp_md}{text}\n\n{T.legend(sspec)}\n{warn[1]}")
        side_spec = T.present(off, T.SIDE_BY_SIDE)
        sections.append(("Policies side by side", f"<p class=legend>{html.escape(T.legend(side_spec))} Run "
                         "directories are listed at the end.</p>", [T.to_html(off, side_spec)]))
        md_tables["Policies side by side"] = (off, side_spec, T.legend(side_spec) + "\n")
        spread = T.seed_spread(off)
        if len(spread):
            sspec2 = T.present(spread, T.SEEDS)
            note = (f"Each grid point ran {int(spread['seeds'].max())} seeds (sweep --seeds): a different trace "
                    "and policy seed each. The interval says how far a different seed could move the figure.")
            sections.append(("Seed spread: 95% confidence intervals", f"<p>{html.escape(note)}</p><p class=legend>"
                             f"{html.escape(T.legend(sspec2))}</p>", [T.to_html(spread, sspec2)]))
            md_tables["Seed spread: 95% confidence intervals"] = (spread, sspec2, f"{note}\n\n{T.legend(sspec2)}\n")
            csvs["seed_spread.csv"] = spread
        sections.append(("Throughput and the lower bound T_o", "", F.throughput_bars(off, order)))
        heat = F.speedup_heatmaps(off, base, order)
        if heat:
            sections.append(("Speedup over the density × sharing grid", "", heat))
    share = F.sharing_bars(df, order)
    if share:
        sections.append(("Prefix sharing vs optimal", "", share))
    else:
        sections.append(("Prefix sharing vs optimal", "<p>No workload here has any shared prompt prefix "
                         "(optimal sharing 0), so there is no sharing to compare.</p>", []))
    group = S.pick_workload(df, steps_workload)
    if all(Path(p, "steps.parquet").exists() for p in df.loc[df["group"] == group, "run_path"]):
        sections.append(("Compute vs memory time per step", "", S.step_figures(df, group, steps_policies, order, steps_x)))
    sections.append(("Run directories", "", [_run_dirs(df)]))
    md_tables["Run directories"] = (df, [("group", "workload", "s"), ("label", "policy", "s"),
                                         *T.present(df, T.PROVENANCE)], "")


def _reference_below_bound(df: pd.DataFrame) -> pd.Series:
    """:func:`reports.terminal.reference_below_bound` over a table's runs."""
    if not {"t_reference_s", "t_opt_s"} <= set(df):
        return pd.Series(False, index=df.index)
    return (df["t_reference_s"] < df["t_opt_s"]).fillna(False)


def settings_note(df: pd.DataFrame) -> str:
    """A sentence where the runs compared on one workload ran on different scheduler settings (each policy's
    declared settings over the engine's, or options): a speedup then mixes them with the order. Empty otherwise."""
    # a setting some runs do not record (summaries written before it was) is unknown there: not compared
    cols = [(c, h) for c, h, _ in T.SETTINGS if c in df and df[c].notna().all()]
    if not cols or "group" not in df:
        return ""
    key = [c for c, _ in cols]
    if all(len(g[key].astype(str).drop_duplicates()) == 1 for _, g in df.groupby("group")):
        return ""

    def value(col: str, v) -> str:
        if col == "max_seqs" and v == 0:
            return "no cap"
        return "on" if v is True else "off" if v is False else f"{int(v):,}" if isinstance(v, (int, float)) and \
            float(v).is_integer() else str(v)

    per = {}  # a settings tuple -> the policies that ran on it (over every workload)
    for label, g in df.groupby("label", sort=True):
        for row in g[key].drop_duplicates().itertuples(index=False):
            per.setdefault(tuple(row), []).append(str(label))
    differ = [i for i in range(len(key)) if len({t[i] for t in per}) > 1]
    which = "; ".join(", ".join(sorted(set(labels))) + ": " + ", ".join(f"{cols[i][1]} {value(cols[i][0], t[i])}" for i in differ)
                      for t, labels in per.items())
    return (f"The policies ran on different scheduler settings ({which}): each policy's declared settings over "
            "the engine's, so a speedup here mixes those settings with the order. For the order alone, give every "
            "policy one set (sweep --engine-of POLICY, or the same --token-budget / --block-size / --round-tokens / "
            "--admission options to each simulate).")


def _no_cache_note(df: pd.DataFrame) -> str:
    """A sentence where runs with prefix caching off meet a trace that shares prefixes: their T_o still counts the
    sharing (a bound for any schedule), so their "of T_o" shows the missing cache as much as the order."""
    if "prefix_caching" not in df or "optimal_sharing_ratio" not in df:
        return ""
    off = df["prefix_caching"].map(lambda v: v is False or str(v).lower() == "false") & (
        pd.to_numeric(df["optimal_sharing_ratio"], errors="coerce").fillna(0) > 0)
    if not off.any():
        return ""
    who = ", ".join(sorted(set(df.loc[off, "label"].astype(str))))
    return (f"{who} ran without prefix caching on traces that share prefixes: T_o counts the sharing any schedule "
            "with a cache could keep, so their fraction of T_o reflects the missing cache as well as the order.")


def _expected_note(df: pd.DataFrame) -> str:
    """The error to expect of the runs' absolute throughput (``blendsim.sim.expected``), once per engine profile and
    deployment; empty where none applies."""
    from blendsim.sim.expected import HEAD, of_summary

    keys = ["offline", "cost_model", "engine", "hardware", "tp", "pp", "ep"]
    found: dict = {}
    runs = df[[k for k in keys if k in df]]
    for r in runs.loc[runs.astype(str).drop_duplicates().index].to_dict("records"):  # one per engine and split
        s = {k: v for k, v in r.items() if not (isinstance(v, float) and math.isnan(v))}
        x = of_summary({**s, **{k: int(s.get(k) or 1) for k in ("tp", "pp", "ep")}}) if "hardware" in s else None
        if x:
            found.setdefault((x["profile"], x["deployment"]), x["line"][len(HEAD):])
    if not found:
        return ""
    pairs = sorted(found.items())
    many = len(pairs) > 1
    said = [f"{p} on {d}: {body}" if many else body for (p, d), body in pairs[:4]]
    more = f" (and {len(pairs) - 4} more engine and deployment pairs)" if len(pairs) > 4 else ""
    return ("Expected error of absolute throughput " + HEAD[len("expected error "):] + " | ".join(said) + more
            + ". Those are errors of single predictions against published runs; a speedup between policies on one "
            "engine and deployment is a ratio of two predictions that share most of it, and no published run "
            "measures it.")


def _critical_notes(df: pd.DataFrame) -> tuple[str, str]:
    """(html, markdown) warning about runs whose makespan their critical path dominates, or ("", "")."""
    from blendsim.reports.terminal import critical_path_lines

    w = critical_path_lines([(f"{r['label']} on {r['group']}", r.to_dict()) for _, r in df.iterrows()])
    if not w:
        return "", ""
    # the line as it is: it starts with a policy or a count, whose case is its own (dfs, path/to/mine.py:Mine)
    text = f"Warning: {w}." + (" Speedups between these runs say little about the schedules." if len(df) > 1 else "")
    return f'<p class="warn">{html.escape(text)}</p>', f"\n**{text}**\n"


def _run_dirs(df: pd.DataFrame) -> str:
    """The run directory of each table row, as a collapsible footnote."""
    items = "".join(f"<li>{html.escape(str(r['group']))} · {html.escape(str(r['label']))}: "
                    f"<code>{html.escape(str(r['run_path']))}</code> ({html.escape(str(r.get('cost_model', '')))} "
                    f"cost model, {html.escape(str(r.get('mode', '')))} mode, engine "
                    f"{html.escape(str(r.get('engine', '')))})</li>" for _, r in df.iterrows())
    return f"<details><summary>{len(df)} run directories</summary><ul class=dirs>{items}</ul></details>"


def _write(out: Path, sections, md_tables, csvs, md_head: str, html_head: str,
           page_title: str = "blendsim report") -> Path:
    with atomic_dir(out, MARKER, "blendsim report directory") as tmp:
        (tmp / "figures").mkdir()
        body, md = [], [f"# {page_title}\n\n{md_head}\n"]
        last = "Run directories"  # listed at the end, as the page says: after the figures' sections
        for name, (df, spec, text) in md_tables.items():
            if name != last:
                md.append(f"## {name}\n\n{text}\n{T.to_markdown(df, spec)}")
        for title, intro, items in sections:
            body.append(f"<h2>{html.escape(title)}</h2>{intro}")
            if any(not isinstance(it, str) for it in items) and title not in md_tables:
                md.append(f"## {title}\n")  # the figures' own section, not under the last table's heading
            for it in items:
                if isinstance(it, str):
                    body.append(f'<div class="scroll">{it}</div>' if it.startswith("<table") else it)
                    continue
                png = tmp / "figures" / f"{it.name}.png"
                it.fig.savefig(png, dpi=110, metadata={"Software": None}, bbox_inches="tight", pad_inches=0.1)
                F.plt.close(it.fig)
                b64 = base64.b64encode(png.read_bytes()).decode()
                body.append(f'<figure><img alt="{html.escape(it.title)}" src="data:image/png;base64,{b64}">'
                            f"<figcaption><b>{html.escape(it.title)}.</b> {html.escape(it.caption)}</figcaption></figure>")
                md.append(f"### {it.title}\n\n![{it.title}](figures/{png.name})\n\n{it.caption}\n")
        if last in md_tables:
            df, spec, text = md_tables[last]
            md.append(f"## {last}\n\n{text}\n{T.to_markdown(df, spec)}")
        for name, df in csvs.items():
            df.to_csv(tmp / name, index=False)
        (tmp / "report.md").write_text("\n".join(md))
        (tmp / MARKER).write_text(_page(html_head, "\n".join(body), page_title))
    return out / MARKER


def _provenance(inputs, markdown: bool) -> str:
    """Where the numbers come from: the directories read and the cost models behind them."""
    src = ", ".join(f"{p} ({k})" for p, k in inputs.sources)
    text = f"Inputs: {src}."
    r = inputs.runs
    if len(r):
        how = sorted({f"{a} cost model, {b} mode" for a, b in zip(r["cost_model"], r["mode"], strict=True)})
        deps = list(dict.fromkeys(r["deployment"].astype(str))) if "deployment" in r else []
        on = (f" on {deps[0]}" if len(deps) == 1 else f" on {len(deps)} deployments ({'; '.join(deps[:4])}"
              f"{f'; and {len(deps) - 4} more' if len(deps) > 4 else ''})") if deps else ""
        n_w = r["workload"].nunique() if "workload" in r else r["group"].nunique()
        text += (f" {len(r)} simulated run(s), {n_w} workload(s){on} (model/GPU/mode, then TP, PP, EP, replicas "
                 f"and weight/KV precision); {'; '.join(how)}; engine: "
                 f"{', '.join(sorted(set(r['engine'].astype(str))))}. Run directories are listed at the end.")
        text += _trace_note(r)
    for note in inputs.notes:
        text += f" Note: {note}."
    # the repository's own file, named, not linked: a file:// link breaks as soon as the report moves
    where = "docs/DESIGN.md (sections Metrics and Bounds that bound) in the blendsim repository"
    if markdown:
        return f"{text} Metric definitions: {where}."
    return f"{html.escape(text)} Metric definitions: {html.escape(where)}."


def _trace_note(r: pd.DataFrame) -> str:
    """Whether models and hardware ran one trace per workload (sweep --fixed-trace) or each its own."""
    if "trace_for" not in r or r["trace_for"].isna().all():
        return ""
    deps = r["model"].astype(str) + "/" + r["hardware"].astype(str)
    if deps.nunique() < 2:
        return ""
    per = r.groupby("workload")["trace_for"].nunique()
    if (per == 1).all():
        src = ", ".join(sorted(set(r["trace_for"].dropna().astype(str))))
        return (f" Every model and hardware ran the same trace per workload (synthesised for {src}: "
                "sweep --fixed-trace), so a model comparison compares one job.")
    return (" Each model and hardware ran its own trace per workload (sweep --trace-per-model: synthesised to "
            "hit the grid's density on each), so the jobs differ between models.")


CSS = """body{font-family:system-ui,sans-serif;max-width:1280px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right;
white-space:nowrap}td.t,th{text-align:left}td.t{white-space:normal;overflow-wrap:break-word}
th{white-space:normal}tr.reason td{text-align:left;white-space:normal;color:#555;border-top:none}th{background:#f3f3f3;position:sticky;top:0}
.scroll{max-height:520px;overflow:auto;margin-bottom:1em;max-width:100%}figure{margin:1em 0}img{max-width:100%}
figcaption{font-size:13px;color:#444}.legend{font-size:12px;color:#555}.warn{background:#fff4e0;padding:4px 8px;
border-left:4px solid #e69a00}ul.dirs{font-size:12px}code{font-size:12px}"""


def _page(provenance: str, body: str, title: str = "blendsim report") -> str:
    t = html.escape(title)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{t}</title>'
            f"<style>{CSS}</style></head><body><h1>{t}</h1><p>{provenance}</p>\n{body}\n</body></html>\n")


__all__ = ["write_report", "write_simple_report"]
