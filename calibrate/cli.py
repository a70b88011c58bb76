"""Commands of this package, mounted on the ``blendsim`` app by ``sim.cli``."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this package's commands to ``app`` (filled in as the package grows)."""
    return None
