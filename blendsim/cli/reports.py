"""``blendsim report``: compare policies from sweep, run and validation directories."""

from __future__ import annotations

from pathlib import Path

import typer


def report_cmd(
    inputs: list[Path] = typer.Argument(..., help="Sweep directories, run directories (or folders of them) "
                                                  "and validation directories."),
    out: Path = typer.Option(None, "-o", "--out", help="Report directory to write (default: "
                                                       "reports/generated/<first input's name>)."),
    baseline: str = typer.Option(None, "--baseline", help="Policy the speedups are over (default: dfs when present, "
                                                           "else the first by name; the report says which and why)."),
    steps_workload: str = typer.Option(None, "--steps-workload", help="Workload whose per-step compute and memory "
                                                                      "time is drawn (default: the middle one)."),
    steps_policies: str = typer.Option(None, "--steps-policies", help="Comma list of policies drawn per step "
                                                                      "(default: all)."),
    steps_x: str = typer.Option("step", "--steps-x", help="x axis of the per-step plots: step (index) or time "
                                                          "(the step's end, seconds)."),
    mixed: bool = typer.Option(False, "--mixed", help="Rank runs priced by different engines or cost models "
                                                      "together, naming the engine in every row (refused "
                                                      "otherwise); a speedup is over the baseline run on the "
                                                      "same engine, never across engines."),
) -> None:
    """Write REPORT_DIR/index.html (self-contained: tables and plots), report.md and CSV tables.

    Online workloads (requests with arrival times) are compared by latency (mean, p50, p99, TTFT, TBT;
    SLO attainment and goodput when the traces have SLOs). Offline workloads are compared by
    throughput: speedup over the baseline (averaged only over the workloads each policy shares with
    it), prefix sharing and its fraction of optimal, fraction of T_o (each run's own lower bound) and of its blended reference (an estimate).
    Plots: latency per policy, throughput with the optimal bound, speedup heatmaps over a sweep's
    grid, prefix sharing vs optimal, per-step compute vs memory time, and predicted vs measured step
    time for validation directories. Runs whose makespan one long request dominates are flagged.
    """
    from blendsim.options import parse_names
    from blendsim.reports.render import MARKER, write_report
    from blendsim.sim.io import check_output_dir

    if out is None:
        out = Path("reports/generated") / (inputs[0].resolve().name or "report")
    check_output_dir(out, "blendsim report directory", MARKER, inputs)
    pols = list(parse_names(steps_policies, "--steps-policies")) if steps_policies else None
    if steps_x not in ("step", "time"):
        from blendsim.sim.errors import UserError

        raise UserError(f"--steps-x must be step or time, got {steps_x!r}")
    notes: list = []
    page = write_report(inputs, out, baseline=baseline, steps_workload=steps_workload, steps_policies=pols,
                        steps_x=steps_x, mixed=mixed, notes=notes)
    for note in notes:
        typer.echo(f"note: {note}", err=True)
    typer.echo(f"wrote {page} (and report.md, CSV tables, figures/ beside it)")


def register(app: typer.Typer) -> None:
    """Add ``report`` (compares runs) to ``app``."""
    app.command("report")(report_cmd)


__all__ = ["register", "report_cmd"]
