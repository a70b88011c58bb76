"""A policy with its options in one name, ``NAME[key=value,...]``: how ``plan --policies`` and ``sweep --policies``
name each policy they compare (``simulate`` takes the same options as ``--opt key=value``).

``dfs[router=contiguous]`` and ``dfs`` are two policies of a comparison: two cells of a sweep, two sets of a plan's
deployments. :func:`canonical_policy` checks a spec before any simulation and writes it one way, so two spellings of
one policy are one.
"""

from __future__ import annotations

import re

from blendsim.policies.option import format_policy
from blendsim.sim.errors import UserError


def split_policy(spec: str, flag: str = "--policies") -> tuple[str, dict]:
    """``NAME[key=value,...]`` as its name and its options (strings, as --opt gives them); a plain name has none."""
    from blendsim.options import parse_opts

    m = re.fullmatch(r"\s*(.+?)\s*\[(.*)\]\s*", spec)
    if not m:
        return spec, {}
    return m.group(1), parse_opts(m.group(2).split(","), f"{flag} {spec!r}: options go as NAME[key=value,...];")


def canonical_policy(spec: str, flag: str = "--policies") -> str:
    """``spec``, ``NAME`` or ``NAME[key=value,...]``, checked: the policy exists, takes those options and accepts
    their values (one line each otherwise). Returns it canonical: the options sorted, each value as the policy reads
    it (``dfs[router=contiguous, heavier_first=1]`` -> ``dfs[heavier_first=true,router=contiguous]``)."""
    from blendsim.policies.base import option_records
    from blendsim.policies.registry import resolve_policy

    name, opts = split_policy(spec, flag)
    ref = resolve_policy(name)
    if not opts:
        return spec
    records = option_records(ref.cls)
    unknown = sorted(set(opts) - set(records))
    if unknown:
        raise UserError(f"{flag} {spec}: policy {ref.label!r} has no option(s) {', '.join(unknown)}; it takes: "
                        f"{', '.join(records) or 'none'}")
    out = {}
    for k, v in opts.items():
        try:
            out[k] = records[k].coerce(k, v)
        except UserError as e:
            raise UserError(f"{flag} {spec}: {e}") from None
    return format_policy(name, out)


__all__ = ["canonical_policy", "format_policy", "split_policy"]
