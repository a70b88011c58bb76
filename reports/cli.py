"""Commands of this package, mounted on the ``blendsim`` app by ``blendsim.cli``: ``report``."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add ``report`` (compares runs) to ``app``."""
    from blendsim.reports.report_cli import report_cmd

    app.command("report")(report_cmd)
