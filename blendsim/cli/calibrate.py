"""``blendsim calibrate``: profile a model's kernels on this device; ``show`` and ``import-vidur`` profiles.

    blendsim calibrate --device cuda --model llama-3-8b --dtype bf16 --tp 1 -o profile.json
    blendsim calibrate --device cpu --model tiny --quick -o p.json
    blendsim calibrate show profile.json
    blendsim calibrate import-vidur DIR --model llama-2-7b -o vidur.json

Profiles are written atomically: a failed or interrupted run leaves any earlier file untouched.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from blendsim.sim.errors import UserError

OUT_HELP = "Profile JSON to write (atomically; an existing file is replaced only by a complete profile)."

cal_app = typer.Typer(invoke_without_command=True, no_args_is_help=False, add_completion=False,
                      pretty_exceptions_enable=False, rich_markup_mode=None,
                      help="Profile GEMM, attention and overlap kernels on a device and fit a cost profile.")


@cal_app.callback(invoke_without_command=True)
def calibrate_cmd(
    ctx: typer.Context,
    device: str = typer.Option("cuda", "--device", help="Where to profile: cuda or cpu."),
    model: str = typer.Option(None, "--model", "-m", help="Model preset (see `blendsim models`) or a config.json."),
    dtype: str = typer.Option(None, "--dtype", help="bf16, fp16 or fp32 (default: the model's)."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree: its per-GPU shard is profiled."),
    quick: bool = typer.Option(False, "--quick", help="A small grid (CI and smoke runs)."),
    threads: int = typer.Option(1, "--threads", help="CPU threads (torch.set_num_threads); cpu only."),
    holdout: int = typer.Option(4, "--holdout", help="Off-grid points per operator timed with the grid and kept "
                                                     "out of the fit, to report a true held-out error (0: none)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random inputs."),
    out: Path = typer.Option(None, "-o", "--out", help=OUT_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or progress lines on stderr."),
) -> None:
    """Profile the model's operators on DEVICE, fit them, and write a profile (or run a subcommand)."""
    if ctx.invoked_subcommand is not None:
        given = [p.opts[0] for p in ctx.command.params if p.name != "help"  # given on the command line
                 and getattr(ctx.get_parameter_source(p.name), "name", "DEFAULT") == "COMMANDLINE"]
        if given:  # the kernel profiling's options: the subcommand has its own, after its name
            raise UserError(f"calibrate {ctx.invoked_subcommand}: {', '.join(given)} before the subcommand "
                            f"{'is' if len(given) == 1 else 'are'} the kernel profiling's; give the subcommand's "
                            f"options after its name (blendsim calibrate {ctx.invoked_subcommand} --help)")
        return
    missing = [what for what, v in (("--model (a preset or a config.json)", model),
                                    ("-o/--out (the profile JSON to write)", out)) if v is None]
    if missing:  # only what is missing: a user who gave --model is not sent to look at it
        raise UserError(f"calibrate: give {' and '.join(missing)} (or a subcommand: show, import-vidur, engine)")
    if holdout < 0:
        raise UserError(f"--holdout must be >= 0, got {holdout}")
    _check_out(out)
    from rich.console import Console

    from blendsim.calibrate.report import fit_table
    from blendsim.calibrate.run import CalibrationConfig, Calibrator

    cfg = CalibrationConfig(model=model, device=device, dtype=dtype, tp=tp, quick=quick, threads=threads,
                            seed=seed, holdout=holdout, command=_command(ctx))
    cal = Calibrator(cfg)
    profile = _with_progress(cal, quiet)
    profile.save(out)
    profile.path = str(out)
    c = Console()
    c.print(fit_table(profile, title=f"{profile.model} {profile.dtype} tp={tp} on {profile.device.get('name', device)}"))
    for s in profile.skipped:
        pt = f" at {s['point']}" if s.get("point") else ""
        typer.echo(f"note: skipped {s['op']}{pt}: {s['reason']}", err=True)
    c.print(f"wrote {out}")


@cal_app.command("show")
def show_cmd(
    profile: Path = typer.Argument(..., help="Profile JSON."),
    weights: str = typer.Option(None, "--weights", help="Say whether the profile prices runs with these GEMM "
                                                        "weights (bf16, fp16, fp8, fp4, int4)."),
    kv_dtype: str = typer.Option(None, "--kv-dtype", help="... and this KV-cache dtype (bf16, fp16, fp8)."),
) -> None:
    """Print a profile's device, fit errors and coverage (operators and grid ranges)."""
    from blendsim.calibrate.report import print_profile
    from blendsim.sim.models import KV_DTYPES, WEIGHT_PRECISIONS
    from blendsim.sim.profile import load_profile

    if weights is not None and weights not in WEIGHT_PRECISIONS:
        raise UserError(f"--weights {weights}: use one of {', '.join(WEIGHT_PRECISIONS)}")
    if kv_dtype is not None and kv_dtype not in KV_DTYPES:
        raise UserError(f"--kv-dtype {kv_dtype}: use one of {', '.join(KV_DTYPES)}")
    prof = load_profile(profile)
    print_profile(prof)
    if weights or kv_dtype:
        asked = {"--weights": weights, "--kv-dtype": kv_dtype}
        off = [f"{k} {v}" for k, v in asked.items() if v is not None and v != prof.dtype]
        typer.echo(f"precision: measured with {prof.dtype} weights and KV; "
                   + (f"it does not price runs with {' and '.join(off)} (the roofline or a profile measured in "
                      f"that precision does)" if off else "it prices runs with these precisions"))


@cal_app.command("import-vidur")
def import_vidur_cmd(
    ctx: typer.Context,
    folder: Path = typer.Argument(..., help="Folder with Vidur's mlp.csv (and attention.csv), or either file (also renamed as "
                                                  "PREFIXmlp.csv / PREFIXattention.csv)."),
    model: str = typer.Option(None, "--model", "-m", help="Model the CSVs profile (default: the preset of their shape)."),
    tp: int = typer.Option(1, "--tp", help="Which num_tensor_parallel_workers rows to use."),
    dtype: str = typer.Option("fp16", "--dtype", help="dtype to label the profile with (Vidur measures fp16; "
                                                       "bf16 runs at the same speed on A100/H100)."),
    out: Path = typer.Option(..., "-o", "--out", help=OUT_HELP),
) -> None:
    """Turn Vidur-format profiling CSVs into a blendsim profile."""
    from rich.console import Console

    from blendsim.calibrate.report import fit_table
    from blendsim.calibrate.vidur import import_vidur

    _check_out(out)
    profile = import_vidur(folder, model, tp, dtype, command=_command(ctx))
    profile.save(out)
    Console().print(fit_table(profile, title=f"{profile.model} tp={tp} from {folder}"))
    for s in profile.skipped:
        typer.echo(f"note: {s['op']}: {s['reason']}", err=True)
    typer.echo(f"wrote {out}")


@cal_app.command("engine")
def engine_cmd(
    results: list[str] = typer.Argument(..., help="Benchmark results: vLLM bench throughput JSON, SGLang "
                                                  "bench_offline_throughput JSONL, trtllm-bench report JSON, or "
                                                  "a catalogue CSV; FILE=WORKLOAD gives one file its run's workload "
                                                  "(a.json=const:1024/128 b.json=const:512/512), a plain FILE "
                                                  "takes --workload."),
    engine: str = typer.Option(..., "--engine", help="NAME or NAME@VERSION of the engine that ran them."),
    hardware: str = typer.Option(..., "--hardware", help="GPU preset the runs used."),
    out: Path = typer.Option(..., "-o", "--out", help="Profile JSON to write (a parameters file with a "
                                                     "'profile' header)."),
    model: str = typer.Option(None, "--model", "-m", help="Model preset or config.json (result files)."),
    tp: int = typer.Option(None, "--tp", help="Tensor-parallel degree of the runs (default: what a trtllm-bench "
                                             "report states, else 1; a report that states another is refused)."),
    weights: str = typer.Option(None, "--weights", help="Weight precision of the runs (default: what a "
                                                        "trtllm-bench report's quantization states, else bf16)."),
    kv_dtype: str = typer.Option("", "--kv-dtype", help="KV-cache precision of the runs (default: what a "
                                                         "trtllm-bench report states, else the model's 16-bit)."),
    workload: str = typer.Option(None, "--workload", help="const:ISL/OSL, random:..., file:PATH or synth:RECIPE?... "
                                                          "of the runs given as plain FILE (required for vLLM JSON; "
                                                          "for a result that records its lengths, checked against "
                                                          "them)."),
    params_file: Path = typer.Option(None, "--params-file", help="Parameters to start from (default: shipped)."),
) -> None:
    """Fit ENGINE's step overhead and the GPU's efficiencies to your own benchmark runs; write a profile."""
    import sys

    import numpy as np

    from blendsim.fidelity.engine_calibration import (
        Setup,
        calibrate,
        check_profile_out,
        read_results,
        split_engine,
        write_profile,
    )
    from blendsim.sim.engines import load_params
    from blendsim.sim.hardware import get_hardware

    name, version = split_engine(engine)
    if not str(out).lower().endswith(".json"):
        raise UserError(f"-o {out}: an engine profile is a .json file (--engine takes it by that suffix)")
    try:
        get_hardware(hardware)
    except UserError as e:
        raise UserError(f"--hardware: {e}") from None
    if model:  # the model the results ran: an unknown one is the option's mistake, not a result file's
        from blendsim.sim.models import get_model

        try:
            get_model(model)
        except UserError as e:
            raise UserError(f"--model: {e}") from None
    if tp is not None and tp < 1:
        raise UserError(f"--tp must be >= 1, got {tp}")
    if params_file and not Path(params_file).exists():
        raise UserError(f"--params-file {params_file}: no such file")
    if Path(out).exists() and Path(out).is_dir():
        raise UserError(f"-o {out}: is a folder")
    check_profile_out(out)  # before the fit: a place it can write, never a file of the user's
    setup = Setup(name, version, hardware, model, tp, weights or "", kv_dtype, workload)
    notes: list = []
    from blendsim.runner import newer_than_modelled
    from blendsim.sim.engines import get_profile

    # a release beyond every modelled one fits that newest profile's loop: said, as simulate says it
    notes += newer_than_modelled(get_profile(engine, {}))
    rows = read_results(list(results), setup, notes)
    for line in notes:
        typer.echo(f"note: {line}", err=True)
    base = load_params(params_file) if params_file else load_params()
    tty = sys.stderr.isatty()

    def progress(i, n, rid):
        if tty:
            typer.echo(f"\r  simulating {i + 1}/{n} {rid[:60]:60s}", err=True, nl=False)

    params, report = calibrate(rows, name, hardware, base, progress,
                               start=f"the starting parameters (--params-file {params_file})" if params_file
                               else "the shipped parameters")
    if tty:
        typer.echo("", err=True)
    write_profile(out, params, setup, report)
    from blendsim.reports.terminal import console, records, say

    c = console()  # the terminal's width (80 piped): every id whole, its figures beside it or under it
    fitted = [x for x in report if "error" in x]
    if fitted:
        # what each figure measures: vLLM's JSON gives total (prompt + output) tok/s, the other tools output tok/s
        for line in records(c.width, [("metric", "left"), ("measured", "right"), ("predicted", "right"),
                                      ("error", "right")],
                            [(x["id"], [x["metric"], f"{x['measured']:,.1f}", f"{x['predicted']:,.1f}",
                                        f"{100 * x['error']:+.1f}%"], "") for x in fitted], name_head="run"):
            c.print(line, soft_wrap=True, highlight=False, markup=False)  # ids verbatim: bench[tp2] is no markup
    for x in report:
        if "error" not in x:
            say(c, f"skipped {x['skipped']}")
    errs = [abs(x["error"]) for x in fitted]
    ship = [abs(x["shipped"] / x["measured"] - 1) for x in fitted]
    start = params.get("_start", "the shipped parameters")
    names = ", ".join(params.get("_fitted", [])) or "nothing"
    what = (f"kept {names} at their starting values" if params.get("_kept_shipped") else f"fitted {names}")
    say(c, f"{what} on {len(errs)} run(s); in-sample median |error| {100 * float(np.median(errs)):.1f}%, "
           f"{100 * float(np.median(ship)):.1f}% with {start}", indent=0)
    prec = sorted({(r.weights or "bf16", r.kv_dtype or "the model's 16-bit", r.tp, r.pp) for r in rows})
    say(c, "priced as " + "; ".join(f"{w} weights, {kv} KV, TP {t}" + (f" x PP {p}" if p > 1 else "")
                                    for w, kv, t, p in prec), indent=0)
    for note in params.get("_notes", []):
        say(c, f"note: {note}", indent=0)
    typer.echo(f"wrote {out}")

def register(app: typer.Typer) -> None:
    """Mount ``calibrate`` (with ``show``, ``import-vidur`` and ``engine``) on the ``blendsim`` app."""
    app.add_typer(cal_app, name="calibrate")


# ---- helpers ------------------------------------------------------------------------------
def _check_out(out: Path) -> None:
    """Fail before any work when the output cannot be written, or would replace a file that is no calibration
    profile (a user's own file is never overwritten)."""
    if out.is_dir():
        raise UserError(f"{out}: is a folder; give a file name for the profile")
    from blendsim.sim.io import check_own_file, json_value
    from blendsim.sim.profile import SCHEMA

    check_own_file(out, lambda p: json_value(p, "schema") == SCHEMA, "blendsim calibration profile")
    parent = out.parent if str(out.parent) else Path(".")
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"{out}: {probe} is not a folder")
    import os

    if not os.access(probe, os.W_OK):
        raise UserError(f"{out}: cannot write in {probe}")


def _command(ctx: typer.Context) -> str:
    """The command as given (options in canonical form), for ``produced_by``."""
    parts = [ctx.command_path]
    for k, v in ctx.params.items():
        if v is None or v is False or k == "quiet":  # display only: the profile is the same
            continue
        flag = "--" + k.replace("_", "-")
        parts += [flag] if v is True else [flag, shlex.quote(str(v))]
    return " ".join(parts)


def _with_progress(cal, quiet: bool = False):
    from blendsim.progress import Progress

    with Progress("calibrating", total=cal.total_steps(), unit="points", quiet=quiet) as bar:
        return cal.run(advance=lambda label: bar.update(bar.done + 1, detail=label))
