"""``blendsim workloads``: synthesise, load and inspect traces."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sim.cli import _Group

app = typer.Typer(no_args_is_help=True, cls=_Group, rich_markup_mode=None)


@app.command("stats")
def stats_cmd(
    trace: Path = typer.Argument(..., help="Trace Parquet file."),
    model: str = typer.Option("llama-3-8b", "--model", "-m", help="Model for the compute density."),
    hardware: str = typer.Option("a100-80gb", "--hardware", help="Hardware for the compute density."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Requests, tokens, optimal sharing ratio s_o and compute density rho of a trace."""
    from sim.density import trace_bounds
    from sim.prefix_tree import PrefixTree
    from sim.run_cli import _deployment
    from workloads.trace import read_trace

    t = read_trace(trace)
    dep = _deployment(model, hardware, tp)
    tree = PrefixTree(t)
    b = trace_bounds(t, dep, tree)
    out = t.summary()
    out.update({"optimal_sharing_ratio": tree.optimal_sharing_ratio(), "compute_density": b.density,
                "t_comp_s": b.t_comp_s, "t_mem_s": b.t_mem_s, "t_opt_s": b.t_opt_s, "model": dep.model.name,
                "hardware": dep.hardware.name, "meta": t.meta})
    if as_json:
        typer.echo(json.dumps(out, indent=2, sort_keys=True, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    tab = Table(title=f"{trace}")
    tab.add_column("statistic")
    tab.add_column("value", justify="right")
    for k, v in out.items():
        if k in ("meta",):
            continue
        tab.add_row(k, f"{v:.4f}" if isinstance(v, float) else str(v))
    Console().print(tab)
