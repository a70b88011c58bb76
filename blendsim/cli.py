"""The ``blendsim`` command line (typer).

Each feature area keeps its commands next to its code (``workloads/cli.py``, ``calibrate/cli.py``, ...)
and they are mounted here. Command bodies import their heavy modules lazily so ``blendsim --help`` and
short commands start fast. A :class:`sim.errors.UserError` anywhere ends the command with one line on
stderr and exit code 2.
"""

from __future__ import annotations

import json

import typer

from sim.clikit import UserErrorGroup

app = typer.Typer(
    name="blendsim",
    cls=UserErrorGroup,
    help="Simulate, calibrate and compare schedulers for offline batch LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _mount() -> None:
    from blendsim.fidelity.cli import register as register_fidelity
    from blendsim.run_cli import register as register_run
    from blendsim.sweep.cli import sweep_cmd
    from blendsim.validate_cli import register as register_validate
    from calibrate.cli import register as register_calibrate
    from reports.cli import register as register_reports
    from workloads.cli import app as workloads_app

    app.add_typer(workloads_app, name="workloads", help="Synthesise, load and inspect request traces.")
    register_run(app)
    register_calibrate(app)
    register_validate(app)
    app.command("sweep")(sweep_cmd)
    register_reports(app)
    register_fidelity(app)


@app.command("models")
def models_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List the model presets with their derived parameter counts and KV bytes per token."""
    from sim.models import PRESETS

    rows = [{"name": m.name, "params_b": round(m.num_params / 1e9, 3), "layers": m.num_layers,
             "hidden": m.hidden_size, "heads": m.num_heads, "kv_heads": m.num_kv_heads,
             "kv_bytes_per_token": m.kv_bytes_per_token, "dtype": m.dtype}
            for m in PRESETS.values()]
    _print_rows(rows, as_json, "Model presets")


@app.command("hardware")
def hardware_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List the hardware presets with their peak numbers and efficiencies."""
    from sim.hardware import PRESETS

    rows = [{"name": h.name, "bf16_tflops": round(h.peak_flops / 1e12, 1), "hbm_gb_s": round(h.mem_bandwidth / 1e9),
             "memory_gib": round(h.memory_bytes / 2**30, 1), "compute_eff": h.compute_efficiency,
             "memory_eff": h.memory_efficiency} for h in PRESETS.values()]
    _print_rows(rows, as_json, "Hardware presets")


def _print_rows(rows: list[dict], as_json: bool, title: str) -> None:
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for i, k in enumerate(rows[0]):
        table.add_column(k, no_wrap=i == 0, overflow="fold")
    for r in rows:
        table.add_row(*(str(v) for v in r.values()))
    Console().print(table)


def get_app() -> typer.Typer:
    """The app with every feature's commands mounted (tests use this with typer's CliRunner)."""
    if not getattr(app, "_mounted", False):
        _mount()
        app._mounted = True
    return app


def main(argv: list[str] | None = None) -> None:
    """Console entry point. Every error ends in one line on stderr: a UserError (exit 2, see
    UserErrorGroup) and also the command line's own usage errors — a bad option value, an unknown
    option or command — which click would print as usage, hint and message on three lines (exit 2)."""
    import sys

    try:
        rc = get_app()(args=argv, prog_name="blendsim", standalone_mode=False)
    except typer.Abort:
        typer.echo("blendsim: aborted", err=True)
        sys.exit(1)
    except typer.TyperException as e:  # click's usage errors (UsageError is not public in typer)
        if type(e).__name__ == "NoArgsIsHelpError":  # a bare group: its help, as click shows it
            e.show()
            sys.exit(e.exit_code)
        ctx = getattr(e, "ctx", None)
        path = ctx.command_path if ctx is not None else "blendsim"
        where = path.partition(" ")[2]
        msg = " ".join(e.format_message().split())
        typer.echo(f"blendsim: error: {where + ': ' if where else ''}{msg} (see '{path} --help')", err=True)
        sys.exit(e.exit_code)
    sys.exit(rc if isinstance(rc, int) and not isinstance(rc, bool) else 0)
