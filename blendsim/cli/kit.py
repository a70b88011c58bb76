"""Pieces every command module shares: the click group that turns a UserError into one line and exit
code 2. (Option values the API takes too -- seeds, comma lists, key=value -- are parsed by
``blendsim.options``.)"""

from __future__ import annotations

import typer
from typer.core import TyperGroup

from blendsim.sim.errors import UserError


class UserErrorGroup(TyperGroup):
    """Turns a UserError raised by any (sub)command into one line on stderr and exit code 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except UserError as e:
            typer.echo(f"blendsim: error: {e}", err=True)
            ctx.exit(e.exit_code)


__all__ = ["UserErrorGroup"]
