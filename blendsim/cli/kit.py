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
            if e.__cause__ is not None and debug_enabled(ctx):  # a user's code failed: its full traceback
                import traceback

                typer.echo("".join(traceback.format_exception(e.__cause__)).rstrip(), err=True)
            typer.echo(f"blendsim: error: {e}", err=True)
            ctx.exit(e.exit_code)


DEBUG_KEY = "blendsim.debug"


def debug_enabled(ctx=None) -> bool:
    """``blendsim --debug ...`` or BLENDSIM_DEBUG=1: print the traceback behind a one-line error whose cause
    is an exception from the user's own code (a policy, a router)."""
    import os

    if os.environ.get("BLENDSIM_DEBUG", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    return bool(ctx is not None and ctx.meta.get(DEBUG_KEY))


__all__ = ["DEBUG_KEY", "UserErrorGroup", "debug_enabled"]
