"""The answer of `blendsim plan`: its JSON object, the terminal table, and the HTML report with its figure."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path

from .search import front, recommend


def entry(p, deadline_s: float, budget, prices, n_requests: int, fidelity: dict, search) -> dict:
    """One deployment as the answer lists it (``search``: the :class:`Search` it came from, whose margins
    ``plan --margin`` set)."""
    c = p.cand
    e = dict(c.settings())
    price = prices.price_of(c.shape.hardware)
    e.update(
        makespan_s=p.makespan_s, cost_usd=p.cost_usd, usd_per_gpu_hour=price.usd_per_gpu_hour,
        billed_gpus=price.billed_gpus(c.gpus),
        meets_deadline=search.meets(p, deadline_s), deadline_margin=search.margin.get(c.key, 0.0),
        within_budget=budget is None or p.cost_usd <= budget,
        tokens_per_usd=p.tokens / p.cost_usd if p.cost_usd > 0 else None,
        throughput_tok_s_per_gpu=p.tokens / p.makespan_s / c.gpus,
        makespan_from=("full simulation" if p.full else
                       f"sample of {search.sample_requests:,} of {n_requests:,} requests, extrapolated"),
        fidelity=fidelity.get(f"{c.shape.engine}@{c.shape.hardware}", {}).get("summary", ""),
    )
    if p.estimate_s is not None:
        e["sampled_estimate_s"] = p.estimate_s
    return e


def expected_errors():
    """A function giving a planned deployment (its settings) the fidelity suite's leave-one-source-out error for
    its engine profile and split (``blendsim.sim.expected.of_engine``, without its line; None where the shipped
    table does not apply or the engine is not a fitted one), looked up once per engine and split."""
    from blendsim.sim.expected import load, of_engine

    table, seen = load(), {}

    def of(e: dict):
        key = (e["engine"], e["hardware"], e["tp"], e["pp"], e["ep"])
        if key not in seen:
            x = of_engine(*key, table) if table else None
            seen[key] = {k: v for k, v in x.items() if k != "line"} if x else None
        return seen[key]
    return of


def _front_of(answer: dict) -> str:
    """What the answer's Pareto front is taken over, in words (``pareto_of``)."""
    if answer.get("pareto_of") == "meeting":
        return "of the deployments that meet the deadline" + (" and budget" if answer.get("budget_usd") is not None
                                                              else "")
    return "of every simulated deployment (none meets the job)"


def _nothing_simulated(out) -> str:
    """Why no deployment has a makespan: the search space's deployments all pruned (most often: the model does not
    fit on the GPUs allowed), or every simulation failed."""
    if out.failures:
        return f"no deployment could be simulated: {len(out.failures)} simulation(s) failed (see failures)"
    why = ", ".join(f"{v} {k}" for k, v in sorted(out.pruned.items())) or "none tried"
    hint = ("; the model does not fit on the deployments the search allows: raise --max-gpus, --max-tp or "
            "--max-pp, add a GPU with more memory (--hardware), or store the weights in fewer bits (--weights fp8)"
            if "does not fit" in out.pruned else "")
    if "on a GPU its engine does not run on" in out.pruned:
        hint += "; TensorRT-LLM and NanoFlow run on NVIDIA GPUs only: add vllm or sglang to --engines"
    return f"no deployment could be simulated: every one of the {out.candidates} in the space was pruned ({why}){hint}"


def _margin_words(margin) -> str:
    """How ``plan --margin`` reads in the recommendation."""
    if margin is None:
        return ""
    if margin == "expected":
        return " with each deployment's expected error as margin"
    from blendsim.sim.expected import pct

    return f" with a {pct(margin)} margin on the makespan"


def margin_note(answer: dict) -> str | None:
    """The error to expect of the recommended deployment's makespan, and a warning where it meets the deadline by
    less than that: published runs of its kind (``expected_error``) were off by that median |error|."""
    from blendsim.sim.expected import pct

    r, dl = answer.get("recommended"), answer["deadline_s"]
    x = (r or {}).get("expected_error")
    if not x or not r["meets_deadline"]:
        return None
    worst = r["makespan_s"] * (1 + x["loso_median"])
    said = (f"{pct(x['loso_median'])} median |error| over {x['n']} published runs {x['of']} (p90 "
            f"{pct(x['loso_p90'])})")
    s = x["loso_signed_median"]
    lean = (f"; such runs typically came out {pct(-s)} faster than predicted, so the run is more likely early"
            if s <= -0.05 else f"; such runs typically came out {pct(s)} slower than predicted" if s >= 0.05 else "")
    if worst <= dl:
        return (f"expected error of the recommended: {said}; {pct(x['loso_median'])} slower it still meets the "
                f"deadline ({_dur(worst)}){lean}")
    faster = (answer.get("pareto") or [r])[0]["makespan_s"] < r["makespan_s"]  # the front is fastest first
    act = ("take a larger --margin" if answer.get("deadline_margin") is not None else "allow a margin (--margin expected)")
    act += (" or take a faster deployment from the front" if faster
            else "; no faster deployment was found (a larger --max-gpus, other --hardware or --engines may give one)")
    return (f"warning: the recommended meets the {_dur(dl)} deadline by less than the error to expect: {said}; "
            f"{pct(x['loso_median'])} slower it takes {_dur(worst)}{lean}. {act[0].upper()}{act[1:]}")


def simulate_command(trace_path, model: str, e: dict, seed: int = 0) -> str:
    """The `blendsim simulate` line that re-runs a deployment (shell-quoted; the plan's seed where it is not 0)."""
    from shlex import quote

    from blendsim.sim.models import KV_DTYPES, WEIGHT_PRECISIONS

    t, first = "TRACE.parquet", ""
    if trace_path is not None:
        from blendsim.sim.io import plain_suffix

        suffix = plain_suffix(Path(trace_path))
        if suffix == ".jsonl":  # simulate reads Parquet: the JSONL file made into a trace first
            first = f"blendsim workloads load {quote(str(trace_path))} -f jsonl -o TRACE.parquet && "
        else:
            t = quote(str(trace_path))
    from blendsim.policy_spec import split_policy

    prec = ((f" --weights {e['weights']}" if e["weights"] in WEIGHT_PRECISIONS else "")
            + (f" --kv-dtype {e['kv_dtype']}" if e["kv_dtype"] in KV_DTYPES else ""))
    policy, opts = split_policy(str(e["policy"]))
    prec += "".join(f" --opt {quote(f'{k}={v}')}" for k, v in opts.items())
    return (f"{first}blendsim simulate {t} --model {quote(str(model))} --hardware {e['hardware']} --tp {e['tp']} "
            f"--pp {e['pp']} --ep {e['ep']} --replicas {e['replicas']} --engine {quote(str(e['engine']))} "
            f"--policy {quote(policy)}{prec}{f' --seed {seed}' if seed else ''} --offline -o RUN_DIR")


def build_answer(out, *, trace_path, n_requests: int, model: str, deadline_s: float, budget, prices,
                 billing_hour: bool, seed: int, fidelity: bool = True, margin=None) -> dict:
    """The JSON object: ``pareto``, ``recommended``, ``candidates``, ``pruned`` and how the numbers were made
    (``margin``: ``plan --margin`` as given, a share or ``"expected"``; each deployment's own is in ``out``)."""
    from .trust import fidelity_of

    f = front(out, deadline_s, budget)
    rec = recommend(out, deadline_s, budget)
    pairs = {(p.cand.shape.engine, p.cand.shape.hardware) for p in f}
    fid = fidelity_of(pairs, model) if fidelity and pairs else {}
    expect = expected_errors() if fidelity else (lambda e: None)

    def mk(p):
        e = entry(p, deadline_s, budget, prices, n_requests, fid, out)
        e["simulate_command"] = simulate_command(trace_path, model, e, seed)
        e["expected_error"] = expect(e)
        return e

    recd = mk(rec) if rec is not None else None
    over_budget = None  # when only the budget fails: the cheapest deployment that meets the deadline
    if rec is None:
        say = _nothing_simulated(out)
    elif out.meets_any:
        say = (f"cheapest that meets the {_dur(deadline_s)} deadline" + _margin_words(margin)
               + (f" within {_usd(budget)}" if budget is not None else "")
               + f": {_label(recd)}, {_dur(rec.makespan_s)} for {_usd(rec.cost_usd)}")
    else:
        why = (f"the {_dur(deadline_s)} deadline" + _margin_words(margin)
               + (f" within the {_usd(budget)} budget" if budget is not None else ""))
        say = f"NO deployment in the search space meets {why}"
        fastest = f[0]
        budget_only = budget is not None and out.meets(rec, deadline_s)
        if budget_only:  # the budget alone fails: recommended is the cheapest that meets the deadline, the least over
            # the budget
            over_budget = {"deployment": recd, "over_budget_usd": rec.cost_usd - budget}
            say += (f"; recommended: the cheapest simulated one that meets the deadline{_margin_words(margin)}, "
                    f"{_label(recd)}: {_dur(rec.makespan_s)} for {_usd(rec.cost_usd)} "
                    f"({_usd(rec.cost_usd - budget)} over the budget)")
        if fastest is not rec:
            say += f"; the fastest is {_label(mk(fastest))}: {_dur(fastest.makespan_s)} for {_usd(fastest.cost_usd)}"
        elif budget_only:  # the one recommended is the fastest too: said once
            say += "; it is also the fastest"
        else:
            say += f"; recommended: the fastest, {_label(recd)}: {_dur(rec.makespan_s)} for {_usd(rec.cost_usd)}"
    checks = [{**c, "label": _label(out.points[c["deployment"]].cand.settings())} if c["deployment"] in out.points
              else c for c in out.checks]
    sampling = None
    if out.sample_requests is not None:
        sampling = {"sample_requests": out.sample_requests, "full_requests": n_requests, "seed": seed,
                    "checks": checks, "near_misses": out.near_misses, "tail_dominated": out.tail_dominated,
                    # deployments whose figures are the sample's, scaled (every other was simulated whole)
                    "extrapolated": sum(not p.full for p in out.points.values()),
                    "max_abs_error": max((abs(c["error"]) for c in checks), default=None)}
    answer = {
        "trace": str(trace_path) if trace_path is not None else None, "n_requests": n_requests, "model": model,
        "deadline_s": deadline_s, "deadline_margin": margin, "budget_usd": budget, "billing_hour": billing_hour,
        "prices": {"file": str(prices.path),
                   "used": {h: prices.prices[h].__dict__ for h in sorted({p.cand.shape.hardware for p in f})}},
        "candidates": out.candidates, "simulated": len(out.points), "pruned": dict(sorted(out.pruned.items())),
        "failures": out.failures, "pareto": [mk(p) for p in f], "recommended": recd, "recommendation": say,
        # the front is taken over the deployments that meet the deadline (and budget) where any does, else over all
        "pareto_of": "meeting" if out.meets_any else "all",
        "cheapest_meeting_deadline": over_budget,
        "sampling": sampling, "fidelity": fid,
        # every deployment simulated, cheapest first, not just the front: the runner-ups a user weighs by hand (the
        # best of another GPU or engine)
        "deployments": [{**p.cand.settings(), "label": _label(p.cand.settings()), "makespan_s": p.makespan_s,
                         "cost_usd": p.cost_usd, "meets_deadline": out.meets(p, deadline_s),
                         "within_budget": budget is None or p.cost_usd <= budget,
                         "makespan_from": "full simulation" if p.full else "sample, extrapolated"}
                        for p in sorted(out.points.values(), key=lambda p: (p.cost_usd, p.makespan_s, p.cand.key))],
    }
    answer["expected_error_note"] = margin_note(answer)
    return answer


def _label(e: dict) -> str:
    from blendsim.sim.deployment import split_label

    par = split_label(e["tp"], e["pp"], e["ep"])
    return (f"{e['replicas']} x {par} on {e['gpus']} {e['hardware']} ({e['engine']}, {e['policy']}, "
            f"{e['weights']}/{e['kv_dtype']})")


def _usd(x: float) -> str:
    """Dollars to the cent, or to three significant figures below $10 (a small job's deployments differ by less
    than a cent, and a table rounded to cents showed the recommended one as dearer than another)."""
    return f"${x:,.2f}" if x >= 9.995 else f"${x:#.3g}" if x >= 0.001 else f"${x:.2g}"


def _dur(s: float) -> str:
    """A duration to three significant figures in its unit: a deadline of 66 s and a makespan of 70 s read 1.1 min
    and 1.17 min, not both 1.1 min, and one under a second is not 0 s. The unit is chosen after rounding (59.99 s is
    1 min, not 60 s), and a figure of 1,000 or more is written whole (2,000 d, not 2e+03 d)."""
    s = float(f"{s:.3g}")
    for unit, size, at in (("d", 86400, 86400 * 2), ("h", 3600, 3600), ("min", 60, 60)):
        if s >= at:
            x = float(f"{s / size:.3g}")
            return f"{x:,.0f} {unit}" if x >= 1000 else f"{x:.3g} {unit}"
    return f"{s:.3g} s"


def _expected_cell(x: dict | None) -> str:
    """A deployment's expected error in the front's table: the median, its runs and which group they are."""
    from blendsim.sim.expected import SCOPE_WORDS, pct

    if not x:
        return "-"
    other = "; no run of this engine" if not x.get("profile_runs") else ""
    return f"{pct(x['loso_median'])} ({x['n']} runs: {SCOPE_WORDS[x['scope']]}{other})"


def rows(answer: dict) -> list[dict]:
    """The table of the front (terminal and HTML)."""
    from blendsim.sim.deployment import split_label

    out = []
    for e in answer["pareto"]:
        rec = answer["recommended"] is not None and e["simulate_command"] == answer["recommended"]["simulate_command"]
        x = e.get("expected_error")
        out.append({"": "*" if rec else "", "GPUs": f"{e['gpus']} {e['hardware']}",
                    "split": split_label(e["tp"], e["pp"], e["ep"]), "replicas": str(e["replicas"]),
                    "engine": e["engine"], "policy": e["policy"], "precision": f"{e['weights']}/{e['kv_dtype']}",
                    "makespan": _dur(e["makespan_s"]), "cost": _usd(e['cost_usd']),
                    "tok/$": f"{e['tokens_per_usd']:,.0f}" if e["tokens_per_usd"] else "-",
                    "tok/s/GPU": f"{e['throughput_tok_s_per_gpu']:,.0f}",
                    "deadline": "met" if e["meets_deadline"] else "missed",
                    "from": "full" if e["makespan_from"] == "full simulation" else "sample",
                    "expected |error|": _expected_cell(x)})
    return out


def notes(answer: dict) -> list[str]:
    """Lines under the table: pruning, the sampled-vs-full check, fidelity."""
    lines = [f"{answer['candidates']} deployment(s) in the space, {answer['simulated']} simulated; pruned: "
             + (", ".join(f"{v} {k}" for k, v in answer["pruned"].items()) or "none")]
    used = answer.get("prices", {}).get("used") or {}
    if used:
        each = "; ".join(f"{h} ${p['usd_per_gpu_hour']:g} per GPU-hour ({p['kind'] or 'your price'}"
                         f"{', ' + p['date'] if p['date'] else ''}"
                         f"{', billed by whole ' + str(p['gpus_per_instance']) + '-GPU instances' if p.get('gpus_per_instance', 1) > 1 else ''})"
                         for h, p in used.items())
        pro_rata = [h for h, p in used.items() if p.get("gpus_per_instance", 1) == 1]
        lines.append(f"prices: {each}" + (
            f"; {', '.join(pro_rata)} billed per GPU, pro rata (where a provider rents only whole instances, a "
            f"gpus_per_instance column in --prices bills them whole); sources in --json and the report"
            if pro_rata else "; sources in --json and the report"))
    for m in answer.get("merged_engines") or []:
        lines.append(f"--engines: {m['engine']} prices exactly as {m['as']} does (one profile, the same settings): "
                     f"simulated once, as {m['as']}")
    s = answer["sampling"]
    if s is not None:
        if s["checks"]:
            errs = ", ".join(f"{c.get('label', c['deployment'])}: {100 * c['error']:+.1f}%" for c in s["checks"])
            near = s.get("near_misses", 0)
            which = "the recommended and its neighbours on the front" + (
                f", and {near} whose estimate missed the deadline or the recommended's cost by less than the sampling "
                f"error" if near else "")
            lines.append(f"sampled: {s['sample_requests']:,} of {s['full_requests']:,} requests (seed {s['seed']}); "
                         f"sampled-vs-full makespan error on {len(s['checks'])} full run(s) ({which}): {errs}")
        elif s.get("extrapolated", 1):
            lines.append(f"sampled: {s['sample_requests']:,} of {s['full_requests']:,} requests; no full run checked "
                         f"the extrapolation")
        else:
            lines.append(f"sampled: {s['sample_requests']:,} of {s['full_requests']:,} requests; no figure is "
                         f"extrapolated: every deployment was simulated on the whole trace")
        if s.get("tail_dominated"):
            lines.append(f"simulated whole: {s['tail_dominated']} deployment(s) whose sample's makespan was mostly its "
                         f"longest request's (T_critical), which no scaling of the sample predicts")
    for _key, f in sorted(answer["fidelity"].items()):
        lines.append(f"fidelity of {f['engine']} on {f['hardware']}: {f['summary']}")
    if answer.get("expected_error_note"):
        lines.append(answer["expected_error_note"])
    for f in answer["failures"][:3]:
        lines.append(f"failed: {f['deployment']}: {f['error']}")
    return lines


def print_answer(answer: dict) -> None:

    from rich.console import Console

    from blendsim.reports.terminal import records

    c = Console()  # the terminal's width; piped, COLUMNS or 80, as every command wraps (the re-run line stays whole)
    r = rows(answer)
    if r:  # each deployment named whole, its figures beside it or, on a narrow terminal, under it: nothing cut
        figures = [("makespan", "right"), ("cost", "right"), ("tok/$", "right"), ("tok/s/GPU", "right"),
                   ("deadline", "left"), ("from", "left")]
        c.print(f"Pareto front (makespan vs cost) {_front_of(answer)}; * recommended", highlight=False)
        for line in records(c.width, figures, [
                (f"{x['']:1} {x['replicas']} x {x['split']} on {x['GPUs']} {x['engine']} {x['policy']} "
                 f"{x['precision']}", [x[h] for h, _ in figures], "") for x in r], name_head="  deployment"):
            c.print(line, soft_wrap=True, highlight=False, markup=False)
    c.print(answer["recommendation"], highlight=False, markup=False)  # wrapped on words at the terminal's width
    if answer["recommended"] is not None:  # one line, to copy whole
        c.print(f"re-run: {answer['recommended']['simulate_command']}", soft_wrap=True, highlight=False, markup=False)
    for line in notes(answer):
        c.print(line, highlight=False, markup=False)


def plot(answer: dict, points: list, path: Path) -> Path:
    """makespan vs cost of every simulated deployment: colour by GPU, marker by engine and policy, the deadline
    as a line, the front joined, the recommended ringed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hws = sorted({p.cand.shape.hardware for p in points})
    kinds = sorted({(p.cand.shape.engine, p.cand.shape.policy) for p in points})  # what a marker tells apart
    marks = "os^Dv<>Px*hH8pd"
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    for i, hw in enumerate(hws):
        for j, (eng, pol) in enumerate(kinds):
            pts = [p for p in points if p.cand.shape.hardware == hw and (p.cand.shape.engine, p.cand.shape.policy)
                   == (eng, pol)]
            if pts:
                ax.scatter([p.makespan_s / 3600 for p in pts], [p.cost_usd for p in pts], s=22, alpha=0.75,
                           color=colours(i % 10), marker=marks[j % len(marks)],
                           label=f"{hw}, {eng}, {pol}" if len({e for e, _ in kinds}) > 1 else f"{hw}, {pol}")
    f = answer["pareto"]
    if f:
        ax.plot([e["makespan_s"] / 3600 for e in f], [e["cost_usd"] for e in f], color="black", lw=1,
                label="Pareto front")
    ax.axvline(answer["deadline_s"] / 3600, color="red", ls="--", lw=1, label="deadline")
    m = answer.get("deadline_margin")
    if isinstance(m, float) and m > 0:  # one margin for all: the makespan a deployment must beat
        ax.axvline(answer["deadline_s"] / (1 + m) / 3600, color="red", ls=":", lw=1, label="deadline less the margin")
    rec = answer["recommended"]
    if rec is not None:
        ax.scatter([rec["makespan_s"] / 3600], [rec["cost_usd"]], s=160, facecolors="none", edgecolors="red",
                   lw=1.5, label="recommended")
    ax.set_xlabel("makespan (hours)")
    ax.set_ylabel("cost (USD)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_ticks(ax.xaxis, ax.get_xlim(), lambda v: f"{v:g}")
    top = ax.get_ylim()[1]  # dollars alone on an axis that reaches $50, cents below it, two figures under a dollar
    _plain_log_ticks(ax.yaxis, ax.get_ylim(),
                     lambda v: f"${v:,.0f}" if top >= 50 else f"${v:,.2f}" if top >= 1 else f"${v:.2g}")
    ax.set_title(f"{answer['model']}, {answer['n_requests']:,} requests: every simulated deployment", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
    return path


def _plain_log_ticks(axis, lims, text) -> None:
    """Plain numbers on a log axis (matplotlib writes 2x10^0): on a range under a decade, evenly spaced round
    values (a log axis has at most one decade tick there); on a wider one, the decades and 2, 3 and 5 of each, and
    over more than two decades the decades alone labelled (their 2, 3 and 5 would overlap)."""
    import math

    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullLocator

    lo, hi = lims
    label = FuncFormatter(lambda v, _: text(v))
    if lo > 0 and hi / lo < 10:
        axis.set_major_locator(MaxNLocator(nbins=6))
        axis.set_major_formatter(label)
        axis.set_minor_locator(NullLocator())
        return
    subs = (2, 3, 5)
    axis.set_major_formatter(label)
    axis.set_minor_locator(LogLocator(subs=subs))

    wide = lo > 0 and hi / lo > 100

    def minor(v, _):
        mantissa = v / 10 ** math.floor(math.log10(v) + 1e-9) if v > 0 else 0
        return text(v) if not wide and any(abs(mantissa - m) < 1e-6 for m in subs) else ""

    axis.set_minor_formatter(FuncFormatter(minor))


def write_report(answer: dict, points: list, folder: Path) -> Path:
    """``folder/report.html`` (the figure embedded, as every report embeds its figures, and ``pareto.png`` beside it) and
    ``folder/plan_answer.json``."""
    from blendsim.sim.io import write_json

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    plot(answer, points, folder / "pareto.png")
    write_json(folder / "plan_answer.json", _finite(answer))
    r = rows(answer)
    head = "".join(f"<th>{html.escape(k)}</th>" for k in (r[0] if r else {}))
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in x.values()) + "</tr>" for x in r)
    notes_html = "".join(f"<li>{html.escape(n)}</li>" for n in notes(answer))
    rec = answer["recommended"]
    rerun = f"<p>Re-run it: <code>{html.escape(rec['simulate_command'])}</code></p>" if rec else ""
    doc = f"""<!doctype html><html><head><meta charset="utf-8"><title>blendsim plan</title>
<style>body{{font-family:sans-serif;max-width:1300px;margin:1em auto}}td,th{{padding:2px 8px;text-align:right;white-space:nowrap}}td:last-child{{white-space:normal}}
table{{border-collapse:collapse}}tr:nth-child(even){{background:#f3f3f3}}</style></head><body>
<h1>blendsim plan: {html.escape(answer['model'])}, {answer['n_requests']:,} requests, deadline {_dur(answer['deadline_s'])}{html.escape(_margin_words(answer.get('deadline_margin')))}</h1>
<p><b>{html.escape(answer['recommendation'])}</b></p>{rerun}
<img src="data:image/png;base64,{base64.b64encode((folder / 'pareto.png').read_bytes()).decode()}" alt="makespan vs cost of every simulated deployment">
<h2>Pareto front {html.escape(_front_of(answer))}</h2><table><tr>{head}</tr>{body}</table>
<ul>{notes_html}</ul>
<p>Cost = GPUs x makespan x price per GPU-hour ({html.escape(answer['prices']['file'])}); prices used:
{html.escape('; '.join(f"{h} ${p['usd_per_gpu_hour']}/GPU-h ({p['kind'] or 'user price'}, {p['source'] or 'no source'}, {p['date'] or 'no date'}{', billed by whole ' + str(p.get('gpus_per_instance', 1)) + '-GPU instances' if p.get('gpus_per_instance', 1) > 1 else ', billed per GPU, pro rata'})" for h, p in answer['prices']['used'].items()))}.</p>
</body></html>
"""
    path = folder / "report.html"
    path.write_text(doc)
    return path


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


__all__ = ["build_answer", "plot", "print_answer", "rows", "write_report"]
