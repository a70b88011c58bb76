"""Option values that the Python API and the commands both take: the seed, comma lists of names and
``key=value`` settings. Each bad value is one :class:`~blendsim.sim.errors.UserError` line naming its
flag. (No typer here: the commands in ``blendsim.cli`` and ``blendsim.api`` both call these.)"""

from __future__ import annotations

from blendsim.sim.errors import UserError


def check_seed(seed: int) -> None:
    """Seeds are non-negative (numpy's generators take no negative seed)."""
    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")


def parse_names(text: str, flag: str) -> tuple[str, ...]:
    """A comma list of names (order kept, duplicates dropped)."""
    names = list(dict.fromkeys(p.strip() for p in str(text).split(",") if p.strip()))
    if not names:
        raise UserError(f"{flag} {text!r}: give at least one name")
    return tuple(names)


def parse_opts(opts: list[str] | None, flag: str = "--opt") -> dict:
    """``key=value`` settings (repeatable options such as ``--opt`` and ``--recipe-opt``) as a dict."""
    out = {}
    for o in opts or []:
        if "=" not in o:
            raise UserError(f"{flag} {o!r}: expected key=value")
        k, v = o.split("=", 1)
        out[k.strip()] = v.strip()
    return out


__all__ = ["check_seed", "parse_names", "parse_opts"]
