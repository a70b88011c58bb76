"""``blendsim fidelity``: predicted against published throughput, per row and per group."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def fidelity_cmd(
    catalogue: list[Path] = typer.Argument(None, help="Catalogue CSV(s) (default: the shipped, cited catalogue); "
                                                      "several are read as one (ids must stay unique)."),
    out: Path = typer.Option(None, "-o", "--out", help="Write a report (table, scatter, error by engine) here."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON: rows, median/p90 |error|, counts."),
    params_only: bool = typer.Option(False, "--params", help="Print every fitted constant with its bounds and "
                                                              "exit."),
    refit: bool = typer.Option(False, "--refit", help="Fit the parameters on this catalogue (least squares) "
                                                      "and predict with them; with --save, ship them."),
    save: Path = typer.Option(None, "--save", help="With --refit: write the fitted parameters to this JSON "
                                                   "(sim/engine_params.json is what a fresh install uses)."),
    params_file: Path = typer.Option(None, "--params-file", help="Parameters JSON to predict with "
                                                                 "(default: the shipped sim/engine_params.json)."),
    only: list[str] = typer.Option(None, "--only", help="Only the rows whose id matches this shell pattern "
                                                        "(repeatable), e.g. 'trtllm-*' or 'nanoflow-blendserve-t3-*-dp1'. "
                                                        "The cross-validations then fit on these rows alone."),
    cv: bool = typer.Option(True, "--cv/--no-cv", help="Also report leave-one-source-out, "
                                                       "-engine-version-, -model- and -hardware-out errors "
                                                       "(refits per group)."),
    cv_by: list[str] = typer.Option(None, "--cv-by", help="Only these cross-validations (repeatable): source, "
                                                          "engine_version, model, hardware (default: all four)."),
    jobs: int = typer.Option(1, "--jobs", "-j", help="Cross-validation folds fitted in this many processes "
                                                     "(results do not depend on it)."),
    markdown: Path = typer.Option(None, "--markdown", help="Also write |error| by engine and engine version, "
                                                           "then by deployment (leave-one-source-out, the "
                                                           "fit's own, leave-one-engine-version-out) as "
                                                           "Markdown tables here."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or progress lines on stderr."),
) -> None:
    """Simulate every row of a catalogue of published measurements; print predicted vs measured."""

    from blendsim.fidelity.suite import SHIPPED_CATALOGUES, cv_summary, load_suite, predictions, summarise
    from blendsim.fidelity.suite import refit as do_refit
    from blendsim.sim.engines import PARAMS_FILE, load_params
    from blendsim.sim.errors import UserError

    if params_file and not params_file.exists():
        raise UserError(f"--params-file {params_file}: no such file")
    params = load_params(params_file) if params_file else load_params()
    fitted = ("engine", "global", "arch", "hardware", "regime")
    if params_file and not any(params.get(k) for k in fitted):
        raise UserError(f"--params-file {params_file}: holds no fitted parameters (none under "
                        f"{', '.join(fitted)}): every row would run on the presets' own constants; give a file "
                        f"that fidelity --refit --save or calibrate engine wrote")
    if params_only:
        _print_params(params, params_file or PARAMS_FILE, as_json)
        return
    if save and not refit:
        raise UserError("--save needs --refit")
    if jobs < 1:
        raise UserError(f"--jobs {jobs}: must be at least 1")
    if cv_by and not cv:
        raise UserError("--cv-by picks cross-validations to run and --no-cv runs none; give one of them")
    bad = [k for k in cv_by or [] if k not in CV_ORDER]
    if bad:
        raise UserError(f"--cv-by {bad[0]}: use one of {', '.join(CV_ORDER)}")
    cv_keys = [k for k in CV_ORDER if k in cv_by] if cv_by else list(CV_ORDER)
    paths = list(catalogue or SHIPPED_CATALOGUES)
    for path in paths:
        if not Path(path).exists():
            raise UserError(f"catalogue {path} does not exist")
    inputs = [*paths, params_file]
    if out:  # before the work: never a folder this command did not make (sim.io.check_output_dir)
        from blendsim.reports.fidelity import REPORT_FILES, REPORT_KIND
        from blendsim.sim.io import check_output_dir

        check_output_dir(out, REPORT_KIND, REPORT_FILES, inputs)
    from blendsim.sim.io import check_output_file, check_own_file

    for dest, own, what in ((save, _own_params, "blendsim parameter file"),
                            (markdown, _own_markdown, "blendsim fidelity table")):
        if dest:  # replace only a file of this command's own kind, never a user's
            check_output_file(dest, inputs=paths)
            check_own_file(dest, own, what)
    from blendsim.progress import Progress

    with Progress("fidelity", unit="rows", quiet=quiet) as bar:
        suite = load_suite(paths, params, lambda i, n, rid: bar.update(i + 1, n, rid), only)
        from blendsim.reports.terminal import err_console, say

        if params_file and not refit:
            for line in _params_file_gaps(suite, params, params_file):
                say(err_console(), f"note: {line}", 0)
        if refit:
            bar.update(bar.done, detail="refitting the parameters")
            params = do_refit(suite)
            from blendsim.fidelity.suite import fit_size

            n_rows, n_free = fit_size(suite)
            if not save and n_rows < n_free:  # --save refuses such a fit (check_fit_size); say why here too
                say(err_console(), f"note: refitted {n_free} free parameters on {n_rows} runnable row(s): the "
                                   f"fit can match them whatever the model, so its in-sample error says nothing", 0)
            if save:
                from blendsim.fidelity.suite import check_fit_size
                from blendsim.sim.io import atomic_path

                check_fit_size(suite, f"--save {save}")
                with atomic_path(save) as tmp:
                    tmp.write_text(json.dumps(params, indent=1, sort_keys=True) + "\n")
                typer.echo(f"wrote {save}", err=True)
                from blendsim.sim.expected import TABLE_FILE, load

                if save.resolve() == PARAMS_FILE.resolve() and load() is None:
                    typer.echo(f"note: the shipped parameters changed: {TABLE_FILE.name}, the error simulate and plan "
                               f"quote, no longer applies; remake it (python -m blendsim.fidelity.expected --help)",
                               err=True)
        pred = predictions(suite, params)
        result = summarise(suite, pred)
        if cv and only:  # a fold learns from the selection's other rows only: not the whole catalogue's figures
            say(err_console(), f"note: the cross-validations fit on the {len(suite.ok)} row(s) --only selected, so a "
                               f"left-out group is predicted from fewer sources than over the whole catalogue (the "
                               f"README's figures); select every row for those", 0)
        if cv:
            result["cv"] = {}
            for k in cv_keys:
                bar.update(bar.done, detail=f"cross-validating: a refit per {k.replace('_', ' ')}")
                result["cv"][f"leave_one_{k}_out"] = cv_summary(suite, k, jobs)
    bounds = {r.id: suite.pricers[r.id].bound(params) for r, _ in suite.ok}
    # what the main predictions used: parameters refitted here, a --params-file, or the shipped file
    fit_label = "refit" if refit else "params-file" if params_file else "shipped"
    if markdown:
        from blendsim.sim.io import atomic_path

        with atomic_path(markdown) as tmp:
            tmp.write_text(markdown_table(result, suite, fit_label))
        typer.echo(f"wrote {markdown}", err=True)
    if out:
        from blendsim.reports.fidelity import write_fidelity_report

        rep = write_fidelity_report(result, suite.rows, bounds, out)
        typer.echo(f"wrote {rep}", err=True)
    if as_json:
        typer.echo(json.dumps(result, indent=1, sort_keys=True))
    else:
        _print_table(result, suite, bounds, fit_label)
    if not result["n_ok"]:  # a catalogue (or an --only) that predicts nothing is a mistake, not a result
        first = next((x for x in result["rows"] if x.get("status") != "ok"), None)
        why = f"; the first, {first['id']}: {first.get('reason')}" if first else ""
        raise UserError(f"{', '.join(str(p) for p in paths)}: nothing could be predicted ({result['n_skipped']} "
                        f"skipped{', --only ' + ', '.join(only) if only else ''}{why})")


# cross-validations, headline first: a source no fit has seen is what a user's own setup is
CV_ORDER = ("source", "engine_version", "model", "hardware")


def _print_params(params: dict, path: Path, as_json: bool) -> None:
    from blendsim.fidelity.fit import LOOP_AT_BOUND, SERVER_AT_BOUND, at_bound
    from blendsim.sim.efficiency import CEILINGS, MEASURED_SOURCE, PUBLISHED_SOURCE, measured
    from blendsim.sim.engines import VERSIONS

    def was_measured(n: str, b) -> bool:  # the file's bounds are measured ones (sim.efficiency MEASURED, PUBLISHED)
        parts = n.split(".")
        m = measured(parts[1], parts[2]) if len(parts) == 3 and parts[0] == "arch" else None
        return bool(m and b) and tuple(b) == m[:2]

    bounds = params.get("bounds", {})
    rows = [(n, v, bounds.get(n), at_bound(v, bounds.get(n))) for n, v in flatten(params)]
    head = params.get("profile") if isinstance(params.get("profile"), dict) else None
    # a calibrate engine file: the parameters its fit moved (none where it kept the values it started from)
    own = set() if not head or head.get("kept_shipped") else set(head.get("fitted") or [])
    if as_json:
        typer.echo(json.dumps({"file": str(path), "params": [{"name": n, "value": v, "bounds": b, "at_bound": a,
                                                               "measured_bounds": was_measured(n, b),
                                                               **({"calibrated": n in own} if head else {})}
                                                              for n, v, b, a in rows],
                               "at_bound": [n for n, _v, _b, a in rows if a]}, indent=1))
        return
    fitted_on = params.get("fitted_on")
    n_rows = (fitted_on.get("rows") if isinstance(fitted_on, dict) else None) \
        or len((params.get("profile") or {}).get("fitted_on") or []) or "?"  # a calibrated engine profile's runs
    if head:  # a calibrate engine file holds every parameter; its fit moved only some
        start = head.get("started_from") or "the shipped parameters"
        typer.echo(f"engine profile {path} ({head.get('engine')}@{head.get('version')} on {head.get('hardware')}, "
                   f"{n_rows} runs): " + (f"its fit was no better than {start}, which it holds unchanged:"
                                          if head.get("kept_shipped") else
                                          f"the {len(own)} parameter(s) its fit moved are marked CALIBRATED, the "
                                          f"others are {start}:"))
    else:
        typer.echo(f"fitted parameters ({path}; {n_rows} rows):")

    def ceiling(n: str, a) -> bool:  # an upper bound that is a physical ceiling (sim.efficiency.CEILINGS)
        return a == "upper" and n.rsplit(".", 1)[-1] in CEILINGS

    import shutil
    import textwrap

    cols = max(shutil.get_terminal_size().columns, 60)  # $COLUMNS, else the terminal's

    def echo(text: str, indent: str = "") -> None:  # prose wrapped to the terminal, never cut
        typer.echo(textwrap.fill(text, cols, subsequent_indent=indent + "  ", break_on_hyphens=False))

    w = max((len(n) for n, *_ in rows), default=0)
    vw = max((len(f"{v:.4g}") for _n, v, *_ in rows), default=7)  # the values' column, right-aligned
    for n, v, b, a in rows:
        bs = f"[{b[0]:g}, {b[1]:g}]" if b else "(transferred)"
        why = (" (ceiling)" if ceiling(n, a) else
               " (server stages)" if n.startswith("engine.") and ":server." in n and a == "upper" else
               " (engine loops)" if n.startswith("engine.") and a == "upper" else "")
        flag = f" AT {a.upper()} BOUND{why}" if a else ""  # the tag the notes below explain
        flag += " (measured)" if was_measured(n, b) else ""
        flag += " CALIBRATED" if n in own else ""
        line = (f"  {n:{w}s} {v:{vw}.4g}  {bs:12s}" + flag).rstrip()
        if len(line) > cols and flag:  # the flag on a line of its own rather than past the edge
            line = f"  {n:{w}s} {v:{vw}.4g}  {bs}\n      {flag.strip()}"
        typer.echo(line)
    hits = [n for n, _v, _b, a in rows if a]
    echo(f"{len(hits)} of {len(rows)} parameters at a bound" + (f": {', '.join(hits)}" if hits else ""))
    if any(ceiling(n, a) for n, _v, _b, a in rows):
        typer.echo("(ceiling): the upper bound is physical:")
    for key in sorted({n.rsplit(".", 1)[-1] for n, _v, _b, a in rows if ceiling(n, a)}):
        echo(f"  {key}: {CEILINGS[key]}", "  ")
    if any(n.startswith("engine.") and ":server." not in n and a == "upper" for n, _v, _b, a in rows):
        echo(f"(engine loops): {LOOP_AT_BOUND}")
    if any(n.startswith("engine.") and ":server." in n and a == "upper" for n, _v, _b, a in rows):
        echo(f"(server stages): {SERVER_AT_BOUND}")
    if any(was_measured(n, b) for n, _v, b, _a in rows):
        echo(f"(measured): bounds measured on a lent GPU's kernels ({MEASURED_SOURCE}; sim/efficiency.py MEASURED) "
             f"or in published kernel benchmarks ({PUBLISHED_SOURCE}; PUBLISHED); "
             "a fit at such a bound wants the kernels slower or faster than measured, i.e. the cost model misprices "
             "something else")
    cited = [f"{p.modelled}: fixed {p.fixed_s * 1e3:g} ms, {p.per_seq_s * 1e6:g} us/seq, graphs<={p.cuda_graph_max}, "
             f"{p.mode}" for p in VERSIONS.values() if not p.fitted and p.fit_as == ""]
    cited += [f"{p.modelled} offline (its served loop is fitted): fixed {p.fixed_s * 1e3:g} ms, "
              f"{p.per_seq_s * 1e6:g} us/seq" for p in VERSIONS.values() if p.fitted and not p.fit_offline]
    echo("engine constants (cited, not fitted): " + "; ".join(cited))


def flatten(params: dict, prefix: tuple = ()) -> list[tuple[str, float]]:
    """``(dotted name, value)`` of every parameter in a params dict (bookkeeping keys left out)."""
    out = []
    for k, v in sorted(params.items()):
        if not prefix and k in ("bounds", "fitted_on", "profile"):
            continue
        if isinstance(v, dict):
            out += flatten(v, prefix + (k,))
        else:
            out.append((".".join(prefix + (k,)), v))
    return out


FIT_LABELS = {"refit": "parameters refitted on these rows (in-sample)", "shipped": "shipped parameters",
              "params-file": "parameters of --params-file"}
CV_HEADS = (("LOSO", "source"), ("LOEVO", "engine_version"), ("LOMO", "model"), ("LOHO", "hardware"))


def _closed(name: str) -> str:
    """A source's name as its group key gives it (the text before its first comma), with the brackets that cut
    left open closed, for reading: ``... (2024-09-05)``."""
    return name + ")" * max(name.count("(") - name.count(")"), 0)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _params_file_gaps(suite, params: dict, params_file) -> list[str]:
    """Engine loops the rows run on that ``--params-file`` lacks but the shipped file has (a file refitted on
    other rows): those rows keep the profile's own constants, which the figures should say."""
    from blendsim.sim.engines import load_params

    shipped = load_params()
    gaps: dict = {}
    for _, pr in suite.ok:
        prof = pr.profile
        if not prof.async_scheduling and not prof.fitted_loop(params) and prof.fitted_loop(shipped):
            gaps[prof.overhead_key] = gaps.get(prof.overhead_key, 0) + 1
    out = [f"{params_file} has no fitted loop of {k} ({n} row(s)): they run on that profile's own constants, "
           f"not the shipped fit" for k, n in sorted(gaps.items())]
    head = params.get("profile") if isinstance(params.get("profile"), dict) else None
    if head and suite.ok:  # a calibrated engine profile: which rows its fit saw, and which run on another GPU
        name = Path(params_file).name
        own = {f.get("id") if isinstance(f, dict) else f for f in head.get("fitted_on") or []}
        ids = [row.id for row, _ in suite.ok]
        seen = sum(i in own for i in ids)
        if seen:
            out.append(f"{seen} of the {len(ids)} rows predicted are {name}'s own calibration rows: in-sample "
                       f"(its fit saw them); the other {len(ids) - seen} are out of its sample")
        hw = head.get("hardware")
        elsewhere = [pr for _, pr in suite.ok if pr.dep.hardware.name != hw] if hw else []
        if elsewhere:
            from blendsim.runner import fitted_for_arch
            from blendsim.sim.hardware import get_hardware

            arch = get_hardware(hw).arch
            own = fitted_for_arch(head, arch)
            akin = sum(pr.dep.hardware.arch == arch for pr in elsewhere)
            carried = (f"; the kernel efficiencies it fitted for every {arch} GPU ({', '.join(own)}) price the "
                       f"{akin} of them on {arch} GPUs, whatever their engine" if own and akin else "")
            out.append(f"{len(elsewhere)} row(s) run on GPUs other than {hw}, the one {name} was calibrated on: its "
                       f"fitted engine loop applies{carried}; their other kernel efficiencies are the shipped ones")
    return out


def _own_params(path) -> bool:
    """Whether ``path`` is a parameter file as --save writes it: a JSON object of sim.paramfile's sections, not a
    ``calibrate engine`` profile (its ``profile`` header)."""
    from blendsim.sim.paramfile import TOP

    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(doc, dict) and bool(doc) and set(doc) <= set(TOP) - {"profile"}


# the first cells of the table --markdown writes (markdown_table): how a file of that kind is known
MARKDOWN_HEAD = "| engine | version (profile) | rows | "


def _own_markdown(path) -> bool:
    """Whether ``path`` is a table ``--markdown`` wrote (its header row)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.readline().startswith(MARKDOWN_HEAD)
    except (OSError, UnicodeDecodeError):
        return False


def markdown_table(res: dict, suite, fit_label: str = "shipped") -> str:
    """|error| per engine, then per engine version under it, and over all rows and the rows of engines other
    than TensorRT-LLM: median (p90) left out of the fit by source, with the parameters in use (``fit_label``:
    shipped, refit, params-file) and left out by engine version, as far as those cross-validations were run; then
    the same columns per deployment (the GPU and its split, ``blendsim.fidelity.suite.deployment_key``)."""
    import numpy as np

    from blendsim.fidelity.catalogue import engine_version_key
    from blendsim.fidelity.suite import deployment_key

    cvs = res.get("cv", {})
    cols = [(h, cvs[f"leave_one_{k}_out"]["rows"]) for h, k in (("LOSO", "source"), ("LOEVO", "engine_version"))
            if f"leave_one_{k}_out" in cvs]
    fit_rows = {x["id"]: x["error"] for x in res["rows"] if x["status"] == "ok"}
    cols.insert(1 if cols and cols[0][0] == "LOSO" else 0, (fit_label, fit_rows))
    profile = {r.id: f"{pr.profile.name}@{pr.profile.version}" if pr.profile.version else pr.profile.name
               for r, pr in suite.ok}
    rows = [r for r in suite.rows if r.id in fit_rows]

    def cells(ids: list) -> list[str]:
        out = []
        for _h, errs in cols:
            e = np.abs([errs[i] for i in ids if i in errs])
            out.append(f"{100 * np.median(e):.1f}% ({100 * np.percentile(e, 90):.1f}%)" if len(e) else "-")
        return out

    heads = " | ".join(f"{h} median (p90)" for h, _e in cols) + " |"
    lines = [MARKDOWN_HEAD + heads,
             "|---|---|---:|" + "---:|" * len(cols)]
    for eng in sorted({r.engine for r in rows}):
        ids = [r.id for r in rows if r.engine == eng]
        lines.append(f"| **{eng}** | all | {len(ids)} | " + " | ".join(cells(ids)) + " |")
        for ver in sorted({engine_version_key(r) for r in rows if r.engine == eng}):
            vids = [r.id for r in rows if r.engine == eng and engine_version_key(r) == ver]
            profs = ", ".join(sorted({profile[i] for i in vids}))
            lines.append(f"| | {ver.partition('@')[2] or '-'} (`{profs}`) | {len(vids)} | " + " | ".join(cells(vids))
                         + " |")
    other = [r.id for r in rows if r.engine != "trtllm"]
    lines.append(f"| **all rows** | | {len(rows)} | " + " | ".join(cells([r.id for r in rows])) + " |")
    if other:
        lines.append(f"| **other than TensorRT-LLM** | | {len(other)} | " + " | ".join(cells(other)) + " |")
    lines += ["", "| deployment | rows | " + heads,
              "|---|---:|" + "---:|" * len(cols)]
    for dep in sorted({deployment_key(r) for r in rows}):
        ids = [r.id for r in rows if deployment_key(r) == dep]
        lines.append(f"| {dep} | {len(ids)} | " + " | ".join(cells(ids)) + " |")
    return "\n".join(lines) + "\n"


def _print_table(res: dict, suite, bounds: dict, fit_label: str) -> None:
    """Predicted vs measured per row, then |error| by group, at the terminal's width (80 or 120 columns
    keep every id and reason whole: a narrow terminal puts an id on its own line; a skipped row's reason
    goes under it)."""
    from rich.console import Console

    from blendsim.reports.terminal import records
    from blendsim.sim.metrics import METRIC_UNITS as UNITS
    from blendsim.sim.metrics import format_throughput as _num

    width = Console().width
    byid = {r.id: r for r in suite.rows}
    rows = []
    for x in res["rows"]:
        r = byid[x["id"]]
        if x["status"] == "ok":
            b = bounds[x["id"]]
            top = max(b, key=b.get)
            rows.append((x["id"], [r.engine, _num(x["predicted"]), _num(x["measured"]), UNITS[r.metric],
                                   f"{100 * x['error']:+.1f}%", f"{top} {100 * b[top]:.0f}%"],
                         f"note: {x['note']}" if x.get("note") else ""))
        else:
            rows.append((x["id"], [r.engine, "skipped", _num(x["measured"]), UNITS[r.metric], "", ""],
                         f"skipped: {x['reason']}"))
    cols = [("engine", "left"), ("predicted", "right"), ("measured", "right"), ("unit", "left"), ("error", "right"),
            ("bound by", "left")]
    out = ["predicted vs measured (each row's metric, of the whole deployment)", *records(width, cols, rows, "id"),
           "bound by: the largest share of the row's simulated time, by operator class (compute: GEMMs and prompt "
           "attention; memory: decode attention and KV writes; other: norms, activations, rotary; comm: collectives; "
           "overhead: the engine's own per-step work; server: steps its API server paces)"]
    cvs = res.get("cv", {})
    heads = [(h, k, cvs[f"leave_one_{k}_out"]) for h, k in CV_HEADS if f"leave_one_{k}_out" in cvs]
    fit_head = fit_label
    # the headline cross-validation (median, p90), the fit's own errors beside it, the others' medians
    gcols = [("n", "right")]
    if heads:
        gcols += [(heads[0][0], "right"), (f"{heads[0][0]} p90", "right")]
    gcols += [(fit_head, "right"), (f"{fit_head} p90", "right"), *((h, "right") for h, _k, _c in heads[1:])]
    for key, groups in res["by"].items():
        grows = []
        for name, s in groups.items():
            cv = [c.get("by", {}).get(key, {}).get(name, {}) for _h, _k, c in heads]
            cells = [str(s["n"])]
            if cv:
                cells += [_pct(cv[0].get("median_abs_error")), _pct(cv[0].get("p90_abs_error"))]
            cells += [_pct(s["median_abs_error"]), _pct(s["p90_abs_error"]),
                      *(_pct(c.get("median_abs_error")) for c in cv[1:])]
            grows.append((_closed(str(name)) if key == "source" else str(name), cells, ""))
        out += ["", f"|error| by {key.replace('_', ' ')}", *records(width, gcols, grows, key)]
    if heads:
        out.append("; ".join(f"{h}: |error| when the row's {k.replace('_', ' ')} was left out of the fit"
                             for h, k, _c in heads) + f" (each fold fitted from the presets on the other rows only); "
                   f"{fit_head}: with the {FIT_LABELS[fit_label]}.")
    what = f"with the {FIT_LABELS[fit_label]}"
    out.append(f"{res['n_ok']} rows predicted, {res['n_skipped']} skipped; {what}: median |error| "
               f"{_pct(res['median_abs_error'])}, p90 {_pct(res['p90_abs_error'])}")
    for key in CV_ORDER:
        k, label = f"leave_one_{key}_out", f"leave-one-{key.replace('_', '-')}-out"
        if k in cvs:
            c = cvs[k]
            out.append(f"{label}: median |error| {_pct(c['median_abs_error'])}, p90 {_pct(c['p90_abs_error'])} "
                       f"({c['n']} rows)" + (f": {c['note']}" if c.get("note") else ""))
    import textwrap

    for line in out:  # prose lines wrap on words; table lines already fit
        typer.echo("\n".join(textwrap.wrap(line, width, break_long_words=False, break_on_hyphens=False,
                                            subsequent_indent="  ")) if len(line) > width else line)


def register(app: typer.Typer) -> None:
    app.command("fidelity")(fidelity_cmd)
