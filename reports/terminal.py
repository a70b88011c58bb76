"""Terminal output of the CLI, readable at 80 and at 120 columns.

* Tables have short headers; what a header means is said once in a legend under the table. Cells
  never wrap or get cut ("…"): the first column (a name) stays whole and numbers carry thousands
  separators.
* Prose wraps on word boundaries with a hanging indent, never mid-word.
* Online runs (requests with arrival times) lead with latency; their offline bounds are shown only as
  such. SLO figures appear only when the trace has SLOs.

Used by ``simulate`` (:func:`print_run_summary`), ``policies`` (:func:`print_policies`), ``workloads
stats`` (:func:`print_trace_stats`), the demo (:func:`print_demo_table`) and ``sweep``
(:func:`sweep_warnings`). Each takes an optional rich ``Console`` so tests can fix its width.
"""

from __future__ import annotations

import math
import typing
from pathlib import Path

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from blendsim.sim.engines import describe_engine
from blendsim.sim.metrics import critical_path_warning, format_throughput


def console(width: int | None = None, stderr: bool = False) -> Console:
    """A console for the CLI's stdout (or stderr): the terminal's width (80 when not a terminal, rich's default)."""
    return Console(width=width, stderr=stderr, highlight=False, soft_wrap=False)


def err_console() -> Console:
    """:func:`console` for stderr: warnings and notes, wrapped at the terminal's width."""
    return console(stderr=True)


class Paragraph:
    """Text wrapped on words at the console's width, every line indented by ``indent`` and none padded with spaces
    to the width (a log or a pipe keeps no trailing blanks, as rich's Padding would leave)."""

    def __init__(self, text: str, indent: int = 0, style: str = "") -> None:
        self.text, self.indent, self.style = text, indent, style

    def __rich_console__(self, console, options):
        for line in Text(self.text, style=self.style).wrap(console, max(options.max_width - self.indent, 20)):
            line.rstrip()
            out = Text(" " * self.indent) + line
            out.no_wrap = True
            yield out


def say(c: Console, text: str, indent: int = 2) -> None:
    """One paragraph, wrapped on words, continuation lines under its first word."""
    c.print(Paragraph(text, indent))


def table(title: str | None, columns: list[tuple[str, str]], rows: list[list[str]],
          legend: list[tuple[str, str]] | None = None) -> list:
    """A compact table (``columns``: (header, "left"|"right")) and its legend, as renderables.

    No cell wraps: the table is built to fit 80 columns by its headers being short; a legend entry
    (header, meaning) explains each abbreviation."""
    # the title above the table as a paragraph of the console's width (a table's own title wraps at the table's)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for i, (head, justify) in enumerate(columns):
        t.add_column(head, justify=justify, no_wrap=True if i == 0 or justify == "right" else False)
    for r in rows:
        t.add_row(*r)
    out: list = ([Paragraph(title, style="bold")] if title else []) + [t]
    if legend:
        out.append(Paragraph("; ".join(f"{h}: {m}" for h, m in legend) + "."))
    return out


def records(width: int, columns: list[tuple[str, str]], rows: list[tuple[str, list[str], str]],
            name_head: str = "") -> list[str]:
    """Lines of a table whose first column is a long name (an id, a source) that must stay whole.

    ``columns`` are the figure columns ((header, "left"|"right")), ``rows`` (name, figures, note). When
    names and figures fit ``width`` side by side, one line per row; otherwise the name gets a line of
    its own and the figures go on the next, indented. A note (a skip reason) goes under its row, wrapped
    on words. Nothing is cut: no "…" anywhere."""
    import textwrap

    w = [max([len(h)] + [len(r[1][i]) for r in rows]) for i, (h, _) in enumerate(columns)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(k) if j == "right" else c.ljust(k)
                         for c, k, (_, j) in zip(cells, w, columns, strict=True)).rstrip()

    figs = sum(w) + 2 * (len(w) - 1)
    nw = max([len(name_head)] + [len(r[0]) for r in rows])
    wide = nw + 2 + figs <= width
    # narrow: the name's header on a line of its own, as each name is, then the figures' headers
    out = ([] if wide or not name_head.strip() else [name_head.rstrip()])
    out.append((name_head.ljust(nw) + "  " if wide else "  ") + line([h for h, _ in columns]))
    out.append("-" * min(width, (nw + 2 if wide else 2) + figs))
    wrap = textwrap.TextWrapper(width=max(width, 20), initial_indent="    ", subsequent_indent="    ",
                                break_long_words=False, break_on_hyphens=False)
    for name, cells, note in rows:
        if wide:
            out.append((name.ljust(nw) + "  " + line(cells)).rstrip())
        else:
            out.extend(textwrap.wrap(name, width=max(width, 20), break_long_words=False, break_on_hyphens=True)
                       or [""])
            out.append("  " + line(cells))
        if note:
            out.extend(wrap.wrap(note))
    return out


def path_lines(path, width: int, indent: int = 2) -> list[str]:
    """A file path on lines of at most ``width`` columns, broken after a "/" (whole folder names stay on
    one line; only a single name longer than the line is split)."""
    text, pad = str(path), " " * indent
    parts = [p + "/" for p in text.split("/")[:-1]] + [text.split("/")[-1]]
    lines, cur = [], ""
    room = max(width - indent, 10)
    for part in parts:
        if cur and len(cur) + len(part) > room:
            lines.append(cur)
            cur = ""
        while len(part) > room:  # one name longer than the line
            lines.append(part[:room])
            part = part[room:]
        cur += part
    lines.append(cur)
    return [pad + x for x in lines if x]


def show(c: Console, items: list) -> None:
    for it in items:
        c.print(it)


def num(v, spec: str = ",.0f") -> str:
    """A number as text ("–" when missing or not finite)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{v:{spec}}"


def pct(v, digits: int = 1) -> str:
    return "–" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{100 * v:.{digits}f}%"


def density_text(v) -> str:
    """A trace's compute density; None (summary.json's null) means no decode step reads KV: unbounded."""
    return "unbounded (no decode work)" if v is None or (isinstance(v, float) and math.isinf(v)) else num(v, ".3f")


def is_online(s: dict) -> bool:
    """A run whose requests arrive over time (summary.json's ``offline`` is false)."""
    v = s.get("offline")
    return isinstance(v, (bool, np.bool_)) and not v


# ---- simulate ------------------------------------------------------------------------------------------

def run_summary_lines(s: dict, cost: str | None = None) -> list[str]:
    """The paragraphs of ``simulate``'s summary (without the wrote-line); ``cost``: the line that prices the run."""
    from blendsim.sim.deployment import split_label

    par = split_label(s["tp"], s.get("pp"), s.get("ep"))
    per = (s.get("gpus") or s["tp"] * s["replicas"]) // max(1, s["replicas"])  # GPUs of one replica
    lines = [f"{s['policy']} on {s['model']} / {s['hardware']} x{per} ("
             + (f"{par}; " if par != f"TP{per}" else "") + f"{s['replicas']} replica(s), "
             f"{s['mode']} mode, engine {describe_engine(str(s['engine']), s.get('engine_profile'))}, {s['cost_model']} cost model)",
             f"{s['n_requests']:,} requests, {s['input_tokens']:,} input + {s['output_tokens']:,} output tokens, "
             f"{s['steps']:,} steps"]
    online = is_online(s)
    if online:
        lines.append(f"latency mean {s['latency_mean_s']:,.3f} s, p50 {s.get('latency_p50_s', math.nan):,.3f} s, "
                     f"p99 {s['latency_p99_s']:,.3f} s; TTFT mean {s['ttft_mean_s']:,.3f} s, p99 "
                     f"{s['ttft_p99_s']:,.3f} s; TBT mean {1e3 * s['tbt_mean_s']:,.1f} ms")
    if "slo_attainment" in s:
        kinds = ", ".join(f"{k.upper()} {pct(s[f'{k}_slo_attainment'])}" for k in ("ttft", "tbt", "jct")
                          if f"{k}_slo_attainment" in s)
        lines.append(f"SLO attainment {pct(s['slo_attainment'])}" + (f" ({kinds})" if kinds else "")
                     + f", goodput {format_throughput(s['goodput_tok_s'])} tok/s")
    if online:
        arr = f" (the last request arrives at {s['last_arrival_s']:,.2f} s)" if "last_arrival_s" in s else ""
        lines.append(f"makespan {s['makespan_s']:,.2f} s{arr}, throughput {s['throughput_tok_s']:,.0f} tok/s"
                     + _per_gpu(s))
        lines.append(f"offline bounds, for reference only (they assume every request is there at t=0): T_o "
                     f"{s['t_opt_s']:,.2f} s, blended reference {_ref(s):,.2f} s")
    else:
        ref = _ref(s)
        if reference_below_bound(s):
            said = (f"the blended reference, {ref:,.2f} s, is below it here: it prices the work as full blended "
                    f"steps and leaves out the longest request's own chain")
        else:
            said = (f"{pct(ref / s['makespan_s'] if s['makespan_s'] else 0.0)} of the blended reference, an estimate "
                    f"that runs may beat")
        crit = s.get("t_critical_s")
        if isinstance(crit, (int, float)) and crit > s.get("t_opt_s", math.inf) and s["makespan_s"]:
            # T_critical is a bound too (no schedule runs the longest request faster than alone): where it is the
            # larger, the run is nearer its best than "of T_o" alone says
            said += (f"; T_critical, the longest request alone, {crit:,.2f} s, is the larger bound here: "
                     f"{pct(crit / s['makespan_s'])} of it")
        lines.append(f"makespan {s['makespan_s']:,.2f} s, throughput {s['throughput_tok_s']:,.0f} tok/s"
                     + _per_gpu(s) + f", {pct(s['frac_of_opt'])} of T_o, the lower bound ({said})")
    if cost:  # what the run costs (blendsim.plan.prices.run_cost_line: reports does not read the price table)
        lines.append(cost)
    lines.append(f"prefix sharing {pct(s['prefix_sharing_ratio'], 2)} (optimal {pct(s['optimal_sharing_ratio'], 2)}), "
                 f"recomputed {s['recomputed_tokens']:,} tokens, {s['preemptions']:,} preemptions, "
                 f"compute density {density_text(s.get('compute_density'))}")
    exp = expected_error_line(s)
    if exp:
        lines.append(exp)
    if s.get("host_kv_gb") or s.get("disk_kv_gb"):  # KV tiers (issue 26)
        h = s["prefix_hit_tokens"]
        lines.append(f"KV tiers host {s['host_kv_gb']:g} GB / disk {s['disk_kv_gb']:g} GB: prefix hits gpu "
                     f"{h['gpu']:,} / host {h['host']:,} / disk {h['disk']:,} tokens, loaded "
                     f"{s['kv_load_bytes'] / 1e9:,.1f} GB, offloaded {s['kv_offload_bytes'] / 1e9:,.1f} GB, "
                     f"load stall {s['kv_load_stall_s']:,.2f} s"
                     + (f", busiest host link {s['host_link_busy_s']:,.2f} s" if s.get("host_link_busy_s") else "")
                     + (f", busiest drive {s['disk_busy_s']:,.2f} s" if s.get("disk_busy_s") else ""))
    if "latency_mean_s" in s and not online:  # offline runs with SLOs: latency after the throughput
        lines.append(f"latency mean {s['latency_mean_s']:,.3f} s, p99 {s['latency_p99_s']:,.3f} s; TTFT mean "
                     f"{s['ttft_mean_s']:,.3f} s; TBT mean {1e3 * s['tbt_mean_s']:,.1f} ms")
    return lines


def expected_error_line(s: dict) -> str | None:
    """What error the fidelity suite says to expect of an offline run (``blendsim.sim.expected``)."""
    from blendsim.sim.expected import of_summary

    x = of_summary(s)
    return x["line"] if x else None


def _per_gpu(s: dict) -> str:
    """Output tokens/s and throughput per GPU: the figures engines' benchmarks publish."""
    if "output_tok_s" not in s:
        return ""
    return (f" (output {s['output_tok_s']:,.0f} tok/s; per GPU of {s['gpus']}: {s['throughput_tok_s_per_gpu']:,.0f} "
            f"tok/s, output {s['output_tok_s_per_gpu']:,.0f} tok/s)")


def _ref(s: dict) -> float:
    """The blended reference of a run (``t_opt_practical_s`` in summaries written before issue 28)."""
    return float(s.get("t_reference_s", s.get("t_opt_practical_s", 0.0)))


def reference_below_bound(s: dict) -> bool:
    """Whether a run's blended reference is shorter than its T_o, a lower bound: the trace's longest request sets
    T_o and the reference leaves its chain out, so there the reference estimates nothing."""
    return _ref(s) < float(s.get("t_opt_s") or 0.0)


def print_run_summary(s: dict, out: Path | None = None, c: Console | None = None, cost: str | None = None) -> None:
    """``simulate``'s summary: what ran, then latency (online) or throughput (offline), then sharing."""
    c = c or console()
    lines = run_summary_lines(s, cost)
    c.print(Paragraph(lines[0], style="bold"))
    for line in lines[1:]:
        say(c, line, 2)
    warn = critical_path_warning(s)
    if warn:
        say(c, f"warning: {warn}", 2)
    if out is not None:
        say(c, f"wrote {out}/", 2)


# ---- policies ------------------------------------------------------------------------------------------

def print_policies(name: str | None = None, c: Console | None = None) -> None:
    """``blendsim policies``: every policy in one line each; with ``name``, that policy's options."""
    from blendsim.policies.registry import get_policy, policy_names

    c = c or console()
    if name is None:
        rows = [[n, get_policy(n).description] for n in policy_names()]
        show(c, table("Scheduling policies", [("policy", "left"), ("what it does", "left")], rows))
        say(c, "Options of one policy, their defaults and sources: blendsim policies NAME. Set one with "
               "--opt key=value on simulate, or as NAME[key=value,...] in sweep's and plan's --policies (validate "
               "runs each policy on its defaults).", 0)
        return
    from blendsim.policies.base import option_records
    from blendsim.policies.registry import resolve_policy

    cls = resolve_policy(name).cls  # as simulate takes it: a name, an entry point, path/to/file.py[:ClassName]
    c.print(Paragraph(f"{name}: {cls.description or '(no description)'}", style="bold"))
    if cls.paper:
        say(c, f"source: {cls.paper}", 2)
    eng = ", ".join(f"{k}={v}" for k, v in cls.engine_defaults.items())
    say(c, "scheduler: " + _own_scheduler(cls) + (f"{eng} (over the engine's)" if eng else "the engine's defaults")
        + ("; turns prefix caching on" if cls.needs_prefix_caching else "")
        + f"; router: {_own_router(cls)}", 2)
    if not cls.options:
        say(c, "options: none", 2)
        return
    say(c, f"options ({len(cls.options)}; set with --opt key=value, true/false for switches):", 2)
    for k, o in option_records(cls).items():
        c.print(Paragraph(f"{k} = {_default(o.default)}", 2, style="bold"))
        say(c, o.meaning, 6)
        if o.choices or o.lo is not None or o.hi is not None:
            say(c, "accepts: " + (", ".join(map(str, o.choices)) if o.choices else
                                  f"{_default(o.lo) if o.lo is not None else '-inf'} .. "
                                  f"{_default(o.hi) if o.hi is not None else 'inf'}"), 6)
        say(c, f"source: {o.source or '–'}", 6)
    say(c, "Sources: the paper's section or algorithm; the public code's behaviour where it differs (offered as "
           "an option); ours where the paper is silent.", 0)


def _own_scheduler(cls) -> str:
    """How a policy's scheduler differs from the engine's default one (``blendsim policies NAME``), as a prefix."""
    from blendsim.policies.base import Policy
    from blendsim.sim.scheduler import Scheduler

    if cls.scheduler_cls is not Scheduler:
        return f"its own, {cls.scheduler_cls.__qualname__} (scheduler_cls), with "
    if cls.make_scheduler is not Policy.make_scheduler:
        try:  # the class make_scheduler says it returns, where it says so
            ret = typing.get_type_hints(cls.make_scheduler).get("return")
        except Exception:  # an annotation that does not resolve: none
            ret = None
        if isinstance(ret, type) and issubclass(ret, Scheduler) and ret is not Scheduler:
            return f"its own, {ret.__qualname__} (make_scheduler), with "
        return "its own (make_scheduler), with "
    return ""


def _own_router(cls) -> str:
    from blendsim.policies.base import Policy

    if cls.make_router is not Policy.make_router and cls.router == Policy.router:
        return "its own (make_router)"
    return cls.router


def _default(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return str(v)


# ---- workloads stats -----------------------------------------------------------------------------------

STAT_LABELS = {
    "requests": ("requests", ",d"), "input_tokens": ("input tokens", ",d"), "output_tokens": ("output tokens", ",d"),
    "mean_input_len": ("mean input length", ",.1f"), "mean_output_len": ("mean output length", ",.1f"),
    "has_arrivals": ("arrival times", "yn"), "has_slos": ("SLOs", "yn"),
    "optimal_sharing_ratio": ("optimal prefix sharing s_o", "%"), "compute_density": ("compute density rho", ".3f"),
    "t_comp_s": ("T_comp (s)", ",.2f"), "t_mem_s": ("T_mem (s)", ",.2f"), "t_opt_s": ("T_o (s)", ",.2f"),
}


def print_trace_stats(stats: dict, title: str, c: Console | None = None) -> None:
    """``workloads stats``: labelled statistics with units, sources as a list, the bounds' deployment."""
    c = c or console()
    rows = []
    for k, (label, spec) in STAT_LABELS.items():
        if k not in stats:
            continue
        v = stats[k]
        if spec == "yn":
            text = "yes" if v else "no"
        elif spec == "%":
            text = pct(v, 2)
        elif v is None or (isinstance(v, float) and not math.isfinite(v)):
            text = "unbounded (no decode work)" if k == "compute_density" else "–"
        else:
            text = f"{v:{spec}}"
        rows.append([label, text])
    src = stats.get("sources")
    if isinstance(src, dict) and src:
        rows.append(["sources", ", ".join(f"{k or '(none)'}: {v:,}" for k, v in src.items())])
    show(c, table(title, [("statistic", "left"), ("value", "right")], rows))
    if "model" in stats:
        say(c, f"rho, T_comp, T_mem and T_o are for {stats['model']} on {stats['hardware']} (change with --model, "
               "--hardware, --tp); this T_o = max((1 - s_o) T_comp, T_mem) on one replica is the paper's, at roofline "
               "rates: a run reports its own T_o, priced by its engine and mode.", 0)


# ---- demo ----------------------------------------------------------------------------------------------

DEMO_LEGEND = [("tok/s", "throughput, (input + output tokens) / makespan"), ("vs B", "speedup over baseline B"),
               ("time s", "makespan"), ("shared", "prefix sharing ratio achieved"),
               ("of s_o", "of the optimal sharing ratio"), ("of ref", "of the blended reference's throughput (an estimate, not a bound)"),
               ("preempt", "preemptions")]


def print_demo_table(summaries: dict, baseline: str = "dfs", c: Console | None = None,
                     setting: str = "") -> None:
    """The demo's policies side by side, fitting 80 columns."""
    c = c or console()
    base = summaries.get(baseline)
    cols = [("policy", "left"), ("tok/s", "right"), (f"vs {baseline}", "right"), ("time s", "right"),
            ("shared", "right"), ("of s_o", "right"), ("of ref", "right"), ("preempt", "right")]
    rows, blank = [], 0
    for p, s in summaries.items():
        sp = s["throughput_tok_s"] / base["throughput_tok_s"] if base else math.nan
        below = reference_below_bound(s)  # no estimate there, as the reports say
        blank += below
        ref = "–" if below else pct(_ref(s) / s["makespan_s"] if s.get("makespan_s") else 0.0)
        rows.append([p, num(s["throughput_tok_s"]), num(sp, ".3f") + "×", num(s["makespan_s"], ",.1f"),
                     pct(s["prefix_sharing_ratio"]), pct(s["sharing_frac_of_opt"]), ref, num(s["preemptions"], ",d")])
    legend = [(f"vs {baseline}" if h == "vs B" else h, m.replace("baseline B", baseline)) for h, m in DEMO_LEGEND]
    if blank:
        legend = [(h, m + "; –: below the run's T_o, so no estimate (it leaves out the longest request's chain)"
                   if h == "of ref" else m) for h, m in legend]
    title = "policies side by side" + (f" ({setting})" if setting else "")
    need = sum(max([len(h)] + [len(r[i]) for r in rows]) for i, (h, _) in enumerate(cols)) + 3 * (len(cols) - 1)
    if c.width >= need:
        show(c, table(title, cols, rows, legend))
    else:  # a narrow terminal: each policy's figures on a line of their own, never cut to "…"
        say(c, title, 0)
        for line in records(c.width, cols[1:], [(r[0], r[1:], "") for r in rows], name_head="policy"):
            c.print(line, soft_wrap=True, highlight=False, markup=False)
        say(c, "; ".join(f"{h}: {m}" for h, m in legend), 0)
    w = critical_path_lines(list(summaries.items()))
    if w:
        say(c, f"warning: {w}", 0)


def critical_path_lines(runs: list[tuple[str, dict]]) -> str | None:
    """One warning for the runs (label, summary) whose makespan their critical path dominates."""
    hits = [(p, s) for p, s in runs if critical_path_warning(s)]
    if not hits:
        return None
    if len(hits) == 1:
        return f"{hits[0][0]}: {critical_path_warning(hits[0][1])}"
    shares = [s["t_critical_s"] / s["makespan_s"] for _, s in hits]
    lo, hi = (f"{v:,.1f}" for v in (min(s["t_critical_s"] for _, s in hits), max(s["t_critical_s"] for _, s in hits)))
    crit = f"{lo} s" if lo == hi else f"{lo}-{hi} s"  # a range over the runs, not a ratio
    slo, shi = (f"{100 * v:.0f}" for v in (min(shares), max(shares)))
    share = f"{slo}%" if slo == shi else f"{slo}-{shi}%"  # one figure where the range rounds to one
    names = ", ".join(p for p, _ in hits[:4]) + (f", ... ({len(hits) - 4} more)" if len(hits) > 4 else "")
    return (f"{len(hits)} of {len(runs)} runs ({names}) have a makespan dominated by the "
            f"critical path: the longest request alone takes {crit} (T_critical), "
            f"{share} of the makespan, so their throughputs measure that "
            "request's tail more than the schedule; use a larger trace (BlendServe used 40,000 requests)")


# ---- sweep ---------------------------------------------------------------------------------------------

def sweep_warnings(sweep_dir: str | Path) -> list[str]:
    """The warning lines about the sweep's finished cells (none when no critical path dominates). A cell is named
    by its workload and policy, and by its model and hardware (and engine) where the grid has more than one."""
    from blendsim.reports.sweep_results import collect_rows

    rows = collect_rows(sweep_dir)

    def varies(k: str) -> bool:
        return len({str(r.get(k)) for r in rows}) > 1

    keys = (["model", "hardware"] if varies("model") or varies("hardware") else []) + \
        (["engine"] if varies("engine") else [])

    def name(r: dict) -> str:
        where = "/".join(str(r.get(k, "?")) for k in keys)
        return f"{r.get('workload', '?')}/{r.get('policy', '?')}" + (f" on {where}" if where else "")

    w = critical_path_lines([(name(r), r) for r in rows])
    return [w] if w else []


__all__ = ["console", "err_console", "print_demo_table", "print_policies", "print_run_summary", "print_trace_stats",
           "run_summary_lines", "say", "sweep_warnings", "table"]
