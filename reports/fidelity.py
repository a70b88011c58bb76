"""The fidelity report: predicted vs published throughput (``blendsim fidelity -o DIR``).

Writes DIR/index.html (self-contained), report.md, fidelity.csv and figures/ (a predicted-vs-measured
scatter on log axes, |error| by engine and by hardware) with the report machinery of ``blendsim.reports.render``.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import numpy as np
import pandas as pd

from blendsim.reports import figures as F
from blendsim.reports import tables as T
from blendsim.reports.render import _page
from blendsim.sim.io import atomic_dir
from blendsim.sim.metrics import METRIC_UNITS as UNITS

SPEC = [("id", "id", "s"), ("engine", "engine", "s"), ("model", "model", "s"), ("hardware", "hardware", "s"),
        ("unit", "metric", "s"), ("predicted", "predicted", "tput"), ("measured", "measured", "tput"),
        ("error_pct", "error %", "+.1f"), ("bound", "bound by", "s"), ("status", "status", "s")]


def fidelity_frame(result: dict, rows: list, bounds: dict) -> pd.DataFrame:
    byid = {r.id: r for r in rows}
    recs = []
    for x in result["rows"]:
        r = byid[x["id"]]
        b = bounds.get(x["id"])
        top = max(b, key=b.get) if b else ""
        recs.append({"id": x["id"], "source": r.source, "engine": r.engine, "model": r.model,
                     "hardware": r.hardware, "metric": r.metric, "unit": UNITS.get(r.metric, r.metric),
                     "predicted": x["predicted"],
                     "measured": x["measured"], "error_pct": None if x["error"] is None else 100 * x["error"],
                     "bound": f"{top} {100 * b[top]:.0f}%" if b else "",
                     "status": x["status"] if x["status"] == "ok" else "skipped",
                     "reason": "" if x["status"] == "ok" else x["reason"]})
    return pd.DataFrame(recs)


def _scatter(df: pd.DataFrame) -> F.Figure:
    ok = df[df["predicted"].notna()]
    fig, ax = F.plt.subplots(figsize=(6.4, 5.6))
    engines = sorted(ok["engine"].unique())
    col = F.colors(engines)
    for e in engines:
        g = ok[ok["engine"] == e]
        ax.scatter(g["measured"], g["predicted"], s=18, color=col[e], label=e, alpha=0.8)
    lo = float(min(ok["measured"].min(), ok["predicted"].min())) * 0.8 if len(ok) else 1.0
    hi = float(max(ok["measured"].max(), ok["predicted"].max())) * 1.25 if len(ok) else 10.0
    xs = np.array([lo, hi])
    ax.plot(xs, xs, color="black", lw=1)
    for k in (0.8, 1.2):
        ax.plot(xs, k * xs, color="grey", lw=0.7, ls="--")
    ax.set(xscale="log", yscale="log", xlabel="measured (published)", ylabel="predicted (blendsim)",
           xlim=(lo, hi), ylim=(lo, hi))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return F.Figure("fidelity_scatter", "Predicted against measured throughput",
                    "Each point is one catalogue row, in its own metric (log axes); dashed lines: +-20%.", fig)


def _by(df: pd.DataFrame, key: str) -> F.Figure:
    ok = df[df["predicted"].notna()]
    groups = sorted(ok[key].unique())
    fig, ax = F.plt.subplots(figsize=(max(4.0, 0.9 * len(groups) + 2), 3.6))
    data = [ok[ok[key] == g]["error_pct"].to_numpy() for g in groups]
    if data:
        ax.boxplot(data, showfliers=True)
        ax.set_xticks(range(1, len(groups) + 1), groups, rotation=20, fontsize=8)
    ax.axhline(0, color="black", lw=0.8)
    ax.set(ylabel="error %", title=f"error by {key}")
    fig.tight_layout()
    return F.Figure(f"fidelity_error_by_{key}", f"Error by {key}", "predicted / measured - 1 per row.", fig)


REPORT_KIND = "blendsim fidelity report folder"
REPORT_FILES = ("index.html", "fidelity.csv")  # what makes a folder one (fidelity -o may replace)


def write_fidelity_report(result: dict, rows: list, bounds: dict, out) -> Path:
    out = Path(out)
    df = fidelity_frame(result, rows, bounds)
    figs = [_scatter(df), _by(df, "engine"), _by(df, "hardware")]
    summary = (f"{result['n_ok']} rows predicted, {result['n_skipped']} skipped; median |error| (predicted / "
               f"measured - 1, each row in its own metric: output or total tokens per second, or requests per "
               f"second, of the whole deployment) {_pct(result['median_abs_error'])}, p90 {_pct(result['p90_abs_error'])}.")
    for k, v in result.get("cv", {}).items():
        summary += f" {k.replace('_', '-')}: median {_pct(v['median_abs_error'])}, p90 {_pct(v['p90_abs_error'])}."
    with atomic_dir(out, REPORT_FILES, REPORT_KIND) as tmp:
        (tmp / "figures").mkdir()
        body = [f"<p>{html.escape(summary)}</p>"]
        md = ["# blendsim fidelity report\n", summary + "\n"]
        for it in figs:
            png = tmp / "figures" / f"{it.name}.png"
            it.fig.savefig(png, dpi=110, metadata={"Software": None})
            F.plt.close(it.fig)
            b64 = base64.b64encode(png.read_bytes()).decode()
            body.append(f'<figure><img alt="{html.escape(it.title)}" src="data:image/png;base64,{b64}">'
                        f"<figcaption><b>{html.escape(it.title)}.</b> {html.escape(it.caption)}</figcaption></figure>")
            md.append(f"### {it.title}\n\n![{it.title}](figures/{png.name})\n\n{it.caption}\n")
        body.append(f'<h2>Rows</h2><p class=legend>metric: what the source published (output or total tokens per second, or requests per second) of '
                    f'the whole deployment; predicted and measured are in it. A skipped row says why on the line '
                    f'below it.</p><div class="scroll">{_rows_html(df)}</div>')
        md.append(f"## Rows\n\n{T.to_markdown(df, SPEC + [('reason', 'reason', 's')])}")
        df.to_csv(tmp / "fidelity.csv", index=False)
        (tmp / "report.md").write_text("\n".join(md))
        intro = html.escape("Every catalogue row (a published throughput measurement, cited in its source column "
                            "and fidelity.csv) simulated by blendsim and compared with the published figure.")
        (tmp / "index.html").write_text(_page(intro, "\n".join(body), "blendsim fidelity report"))
    return out / "index.html"


def _rows_html(df: pd.DataFrame) -> str:
    """The rows table; a skipped row's reason on a full-width line under it (the table never outgrows the page)."""
    heads, rows = T._layout(df, SPEC)
    text = [f == "s" for c, _, f in SPEC if c in df]
    th = "".join(f"<th>{html.escape(h)}</th>" for h in heads)
    body = []
    for (_, r), cells in zip(df.iterrows(), rows, strict=True):
        body.append("<tr>" + "".join(f'<td class="t">{html.escape(v)}</td>' if t else f"<td>{html.escape(v)}</td>"
                                     for v, t in zip(cells, text, strict=True)) + "</tr>")
        if r.get("reason"):
            body.append(f'<tr class="reason"><td colspan="{len(heads)}">skipped: {html.escape(r["reason"])}</td></tr>')
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


__all__ = ["fidelity_frame", "write_fidelity_report"]
