"""Commands of this package, mounted on the ``blendsim`` app by ``sim.cli``: ``sweep`` and ``report``."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add ``sweep`` (runs a grid, code in ``sim.sweep``) and ``report`` (compares runs) to ``app``."""
    from reports.report_cli import report_cmd
    from sim.sweep.cli import sweep_cmd

    app.command("sweep")(sweep_cmd)
    app.command("report")(report_cmd)
