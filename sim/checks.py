"""The checks of a value given by a user -- an option on the command line or an argument of the Python API.

One check per kind of value, with the command line's flag names in its one line (``--tp must be a whole
number >= 1, got '2' (str)``), so a script and a command that make the same mistake read the same
message. Typer has already parsed a command line's values; the Python API's arrive as anything: a string
where a number belongs, a float where a count belongs, NaN, a string where a switch belongs (``"no"`` is
true to Python, so a switch takes only True or False).
"""

from __future__ import annotations

import math
import os
import typing
from pathlib import Path

from blendsim.sim.errors import UserError

MAX_GPUS = 4096  # GPUs of one replica (--tp, --ep) and replicas of a run: beyond any deployment modelled
MAX_SEED = 2**63 - 1


def describe(v) -> str:
    text = repr(v)
    return f"{text if len(text) <= 40 else text[:37] + '...'} ({type(v).__name__})"


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def _is_int(v) -> bool:
    import numpy as np

    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def integer(v, flag: str, lo: int | None = None, hi: int | None = None) -> int:
    """A whole number (an int, not a bool, float or string) in ``lo..hi``."""
    if not _is_int(v):
        rng = "" if lo is None and hi is None else f" >= {lo}" if hi is None else \
            f" <= {hi:,}" if lo is None else f" in {lo}..{hi:,}"
        raise UserError(f"{flag} must be a whole number{rng}, got {describe(v)}")
    v = int(v)
    if lo is not None and v < lo:
        raise UserError(f"{flag} must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise UserError(f"{flag} must be <= {hi:,} (the limit), got {v:,}")
    return v


def number(v, flag: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> float:
    """A finite real number (int or float, not a bool or string) with ``lo <= v <= hi`` (``lo < v``)."""
    import numpy as np

    ok_type = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
    x = float(v) if ok_type else None
    if x is None or not math.isfinite(x) or (lo is not None and (x <= lo if lo_open else x < lo)) \
            or (hi is not None and x > hi):
        parts = [f"> {lo:g}" if lo_open else f">= {lo:g}"] if lo is not None else []
        parts += [f"<= {hi:g}"] if hi is not None else []
        raise UserError(f"{flag} must be a finite number{' ' + ' and '.join(parts) if parts else ''}, "
                        f"got {describe(v)}")
    return x


def boolean(v, flag: str) -> bool:
    """True or False (a string such as ``"no"`` is refused: Python counts it as true)."""
    import numpy as np

    if not isinstance(v, (bool, np.bool_)):
        raise UserError(f"{flag} must be True or False, got {describe(v)}")
    return bool(v)


def text(v, flag: str, choices=None) -> str:
    """A string (one of ``choices`` when given)."""
    if not isinstance(v, str) or not v.strip():
        raise UserError(f"{flag} must be a non-empty string, got {describe(v)}")
    if choices is not None and v not in choices:
        raise UserError(f"{flag} must be one of {', '.join(choices)}, got {v!r}")
    return v


def misspelt(names, optional, known=()) -> tuple[str, str] | None:
    """The first of ``names`` that is neither in ``optional`` nor in ``known`` but close to one of ``optional``
    (``ttft_slo`` for ``ttft_slo_s``, ``host_kv_GB`` for ``host_kv_gb``), with that one; None when there is none. A
    reader that passes over columns it does not use (notes, a tool's own) refuses these: an optional column's value
    would be lost unsaid (a required one's absence is said already)."""
    import difflib

    lower = {k.lower(): k for k in optional}
    for n in names:
        n = str(n)
        if n in optional or n in known:
            continue
        near = lower.get(n.strip().lower()) or next(iter(difflib.get_close_matches(n, list(optional), 1, 0.85)), None)
        if near:
            return n, near
    return None


def path(v, flag: str) -> Path:
    """A file or folder path: a string or an ``os.PathLike``."""
    if not isinstance(v, (str, os.PathLike)) or not str(os.fspath(v)).strip():
        raise UserError(f"{flag} must be a file path (a string or pathlib.Path), got {describe(v)}")
    p = os.fspath(v)
    if isinstance(p, bytes):
        raise UserError(f"{flag} must be a file path (a string or pathlib.Path), got {describe(v)}")
    return Path(p)


def optional(check, v, flag: str, *args, **kwargs):
    """``None``, or ``v`` passed by ``check``."""
    return None if v is None else check(v, flag, *args, **kwargs)


def by_type(v, typ, flag: str):
    """``v`` checked against a dataclass field's type (int, float, bool, str, their ``| None``)."""
    args = typing.get_args(typ)
    if type(None) in args:
        if v is None:
            return None
        typ = next(a for a in args if a is not type(None))
    if typ is bool:
        return boolean(v, flag)
    if typ is int:
        return integer(v, flag)
    if typ is float:
        return number(v, flag)
    if typ is str:
        if not isinstance(v, str):
            raise UserError(f"{flag} must be a string, got {describe(v)}")
        return v
    return v


def dataclass_fields(obj, flags: dict | None = None) -> None:
    """Every field of dataclass instance ``obj`` checked against its annotated type (see :func:`by_type`)."""
    import dataclasses

    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        by_type(getattr(obj, f.name), hints[f.name], (flags or {}).get(f.name, flag_of(f.name)))


def check_run_config(cfg) -> None:
    """Every field of a run's configuration (``blendsim.runner.RunConfig``): the one check the command line,
    the Python API, sweeps and the fidelity suite share. The numbers it accepts are kept as Python ints and
    floats (a numpy int8 or int32 is accepted as the count it holds, never computed with at its width)."""
    p = cfg.policy
    if not (isinstance(p, type) or (isinstance(p, str) and p.strip())):
        raise UserError(f"--policy must be a policy name, 'path/to/file.py:ClassName' or a blendsim.Policy "
                        f"subclass, got {describe(p)}")

    def keep(name: str, v) -> None:  # the checked value in place of the given one (a frozen dataclass)
        object.__setattr__(cfg, name, v)

    text(cfg.model, "--model")
    text(cfg.hardware, "--hardware")
    keep("tp", integer(cfg.tp, "--tp", 1, MAX_GPUS))
    keep("replicas", integer(cfg.replicas, "--replicas", 1, MAX_GPUS))
    keep("ep", integer(cfg.ep, "--ep", 1, MAX_GPUS))
    keep("pp", integer(cfg.pp, "--pp", 1, MAX_GPUS))
    optional(text, cfg.mode, "--mode")
    for name in ("engine", "profile", "dtype", "weights", "kv_dtype", "mix", "admission", "kv_full"):
        optional(text, getattr(cfg, name), flag_of(name))
    from blendsim.sim.seq import ADMISSION, KV_FULL

    # named as the user gives it, before any work: the --admission flag, kv_full (the API's: no flag)
    for name, said, allowed in (("admission", "--admission", ADMISSION), ("kv_full", "kv_full", KV_FULL)):
        v = getattr(cfg, name)
        if v is not None and v not in allowed:
            raise UserError(f"{said} must be one of {', '.join(allowed)}, got {v!r}")
    keep("expert_skew", number(cfg.expert_skew, "--expert-skew", 0.0))
    keep("token_budget", optional(integer, cfg.token_budget, "--token-budget", 1))
    keep("max_seqs", optional(integer, cfg.max_seqs, "--max-seqs", 0))
    keep("block_size", optional(integer, cfg.block_size, "--block-size", 1))
    keep("round_tokens", optional(integer, cfg.round_tokens, "--round-tokens", 0))
    keep("gpu_memory_utilization",
         optional(number, cfg.gpu_memory_utilization, "--gpu-memory-utilization", 0.0, 1.0, lo_open=True))
    keep("reserve_ratio", optional(number, cfg.reserve_ratio, "--reserve-ratio", 0.0, 4.0))
    for name in ("prefix_caching", "prefix_retain", "fast_forward"):
        keep(name, optional(boolean, getattr(cfg, name), flag_of(name)))
    for name in ("offline", "record_schedule"):
        keep(name, boolean(getattr(cfg, name), flag_of(name)))
    keep("seed", integer(cfg.seed, "--seed", 0, MAX_SEED))
    keep("kv_capacity_override", integer(cfg.kv_capacity_override, "kv_capacity_override", 0))
    # KV tiers: numbers, not a string or True (a bool would be a 1 GB tier); sizes and ranges checked in sim.kv_tiers
    for name in ("host_kv_gb", "disk_kv_gb"):
        keep(name, optional(number, getattr(cfg, name), flag_of(name), 0.0))
    for name in ("host_link_gbps", "disk_read_gbps", "disk_write_gbps"):
        keep(name, optional(number, getattr(cfg, name), flag_of(name), 0.0, lo_open=True))
    optional(text, cfg.kv_load, flag_of("kv_load"))
    if not isinstance(cfg.options, dict) or not all(isinstance(k, str) for k in cfg.options):
        raise UserError(f"--opt (options) must be a dict of option name -> value, got {describe(cfg.options)}")


__all__ = ["check_run_config", "MAX_GPUS", "MAX_SEED", "boolean", "by_type", "dataclass_fields", "describe", "flag_of", "integer",
           "number", "optional", "path", "text"]
