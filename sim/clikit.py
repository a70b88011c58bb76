"""Pieces every command module shares: the click group that turns a UserError into one line and exit
code 2, and the parsing of comma lists given on the command line."""

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


def parse_names(text: str, flag: str) -> tuple[str, ...]:
    """A comma list of names (order kept, duplicates dropped)."""
    names = list(dict.fromkeys(p.strip() for p in str(text).split(",") if p.strip()))
    if not names:
        raise UserError(f"{flag} {text!r}: give at least one name")
    return tuple(names)


__all__ = ["UserErrorGroup", "parse_names"]
