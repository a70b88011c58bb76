"""Option values that the Python API and the commands both take: the seed, comma lists of names and
``key=value`` settings. Each bad value is one :class:`~blendsim.sim.errors.UserError` line naming its
flag. (No typer here: the commands in ``blendsim.cli`` and ``blendsim.api`` both call these.)"""

from __future__ import annotations

from blendsim.sim.errors import UserError


def check_seed(seed: int) -> None:
    """Seeds are non-negative (numpy's generators take no negative seed)."""
    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")


def parse_names(text: str, flag: str, engines: bool = False) -> tuple[str, ...]:
    """A comma list of names (order kept, duplicates dropped). With ``engines``, a ``field=value`` part continues
    the engine key before it, so ``vllm:fixed_s=0.001,per_seq_s=1e-6,sglang`` is two engines (an engine's
    overrides are themselves a comma list; no engine name has an ``=``). A part with an unclosed ``[`` goes on to its
    ``]``: ``dfs[router=contiguous,heavier_first=true],random`` is two policies (``plan --policies``)."""
    parts: list[str] = []
    for p in str(text).split(","):
        p = p.strip()
        if parts and parts[-1].count("[") > parts[-1].count("]"):  # a policy's options: dfs[router=contiguous,...]
            parts[-1] = f"{parts[-1]},{p}"
        elif engines and parts and "=" in p and not any(c in p.partition("=")[0] for c in ":@"):
            parts[-1] = f"{parts[-1]},{p}"
        elif p:
            parts.append(p)
    names = list(dict.fromkeys(parts))
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
        k = k.strip()
        if not k:
            raise UserError(f"{flag} {o!r}: no name before '='")
        if k in out:  # as --engine refuses a field given twice: which one was meant?
            raise UserError(f"{flag} {k} is given twice ({k}={out[k]} and {o.strip()})")
        out[k] = v.strip()
    return out


__all__ = ["check_seed", "parse_names", "parse_opts"]
