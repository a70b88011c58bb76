"""Write a report: index.html (self-contained), report.md, CSV tables and the figures as PNG.

``write_report(run_dirs, out_dir, baseline=None)`` is the entry point for other commands (the demo
ends with it); ``blendsim report`` calls it with its options. The report is built in a temporary
folder beside ``out_dir`` and renamed into place, so a failed report leaves no half page.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from reports import figures as F
from reports import steps as S
from reports import tables as T
from reports import validation as V
from reports.inputs import load_inputs
from sim.errors import UserError
from sim.io import atomic_dir

MARKER = "index.html"


def write_report(run_dirs, out_dir, baseline: str | None = None, steps_workload: str | None = None,
                 steps_policies: list[str] | None = None) -> Path:
    """Compare the runs in ``run_dirs`` (sweep, run or validation directories, or folders of runs) and
    write the report to ``out_dir``. ``baseline`` is the policy speedups are over (default dfs when
    present). Returns the path of the HTML page."""
    inputs = load_inputs([Path(p) for p in run_dirs])
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).exists())):
        raise UserError(f"{out}: exists and is not a blendsim report directory; choose another -o")
    sections: list[tuple[str, str, list]] = []  # (title, intro html, [html table | Figure])
    md_tables: dict[str, tuple] = {}
    csvs: dict[str, pd.DataFrame] = {}
    if len(inputs.runs):
        base = T.choose_baseline(inputs.runs, baseline)
        df = T.with_speedup(inputs.runs, base)
        order = list(dict.fromkeys(sorted(df["label"], key=lambda x: (x != base, x))))
        side, summary = T.side_by_side(df), T.policy_summary(df, base)
        csvs["policies.csv"], csvs["policy_summary.csv"] = side, summary
        md_tables["Policies across workloads"] = (summary, T.SUMMARY)
        md_tables["Policies side by side"] = (side, T.ALL_COLUMNS)
        sections.append(("Policies across workloads", f"<p>Speedups are throughput over <b>{html.escape(base)}</b> on "
                         "the same workload and deployment.</p>", [T.to_html(summary, T.SUMMARY)]))
        sections.append(("Policies side by side", "", [T.to_html(side, T.ALL_COLUMNS)]))
        sections.append(("Throughput and the optimal bound", "", F.throughput_bars(df, order)))
        heat = F.speedup_heatmaps(df, base, order)
        if heat:
            sections.append(("Speedup over the density × sharing grid", "", heat))
        sections.append(("Prefix sharing vs optimal", "", F.sharing_bars(df, order)))
        group = S.pick_workload(df, steps_workload)
        if all(Path(p, "steps.parquet").exists() for p in df.loc[df["group"] == group, "run_path"]):
            sections.append(("Compute vs memory time per step", "", S.step_figures(df, group, steps_policies, order)))
    vrows, vfigs = [], []
    for k, (vdir, vfile) in enumerate(inputs.validations):
        t, rows = V.read_validation(vdir, vfile)
        vrows += rows
        vfigs += V.validation_figures(str(vdir), t, rows, str(k))
    if vrows:
        vt = pd.DataFrame(vrows)
        csvs["validation.csv"] = vt
        md_tables["Validation: predicted vs measured"] = (vt, V.TABLE)
        sections.append(("Validation: predicted vs measured step time", "<p>Error = predicted / measured - 1 "
                         "(positive: the simulator is pessimistic).</p>", [T.to_html(vt, V.TABLE), *vfigs]))
    if not sections:
        raise UserError("nothing to report: the inputs hold no finished runs")
    return _write(out, inputs, sections, md_tables, csvs)


def _write(out: Path, inputs, sections, md_tables, csvs) -> Path:
    with atomic_dir(out) as tmp:
        (tmp / "figures").mkdir()
        body, md = [], [f"# blendsim report\n\n{_provenance(inputs, markdown=True)}\n"]
        for name, (df, spec) in md_tables.items():
            md.append(f"## {name}\n\n{T.to_markdown(df, spec)}")
        for title, intro, items in sections:
            body.append(f"<h2>{html.escape(title)}</h2>{intro}")
            for it in items:
                if isinstance(it, str):
                    body.append(f'<div class="scroll">{it}</div>')
                    continue
                png = tmp / "figures" / f"{it.name}.png"
                it.fig.savefig(png, dpi=110, metadata={"Software": None})
                F.plt.close(it.fig)
                b64 = base64.b64encode(png.read_bytes()).decode()
                body.append(f'<figure><img alt="{html.escape(it.title)}" src="data:image/png;base64,{b64}">'
                            f"<figcaption><b>{html.escape(it.title)}.</b> {html.escape(it.caption)}</figcaption></figure>")
                md.append(f"### {it.title}\n\n![{it.title}](figures/{png.name})\n\n{it.caption}\n")
        for name, df in csvs.items():
            df.to_csv(tmp / name, index=False)
        (tmp / "report.md").write_text("\n".join(md))
        (tmp / MARKER).write_text(_page(_provenance(inputs, markdown=False), "\n".join(body)))
    return out / MARKER


def _provenance(inputs, markdown: bool) -> str:
    """Where the numbers come from: the directories read and the cost models behind them."""
    src = ", ".join(f"{p} ({k})" for p, k in inputs.sources)
    text = f"Inputs: {src}."
    r = inputs.runs
    if len(r):
        how = sorted({f"{a} cost model, {b} mode" for a, b in zip(r["cost_model"], r["mode"], strict=True)})
        text += (f" {len(r)} simulated run(s), {r['group'].nunique()} workload(s); {'; '.join(how)}; engine "
                 f"overhead: {', '.join(sorted(set(r['engine'].astype(str))))}. Every table row names its run "
                 "directory; metric definitions are DESIGN.md's.")
    return text if markdown else html.escape(text)


CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}
td:first-child,td:nth-child(2),th{text-align:left}th{background:#f3f3f3;position:sticky;top:0}
.scroll{max-height:520px;overflow:auto;margin-bottom:1em}figure{margin:1em 0}img{max-width:100%}
figcaption{font-size:13px;color:#444}"""


def _page(provenance: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>blendsim report</title>'
            f"<style>{CSS}</style></head><body><h1>blendsim report</h1><p>{provenance}</p>\n{body}\n</body></html>\n")


__all__ = ["write_report"]
