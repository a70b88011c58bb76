"""A policy option as a record: its default, what it means, the range it accepts and where its default comes from.

A policy declares ``options = {"name": Option(default, "meaning", source="paper sec. 5.1", ...)}``;
``blendsim policies NAME`` prints every record (default, meaning, source), and the runner coerces and checks
a ``--opt name=value`` against it (:meth:`Option.coerce`): a value outside ``lo``..``hi`` or not among
``choices`` is one clear line. A plain ``(default, meaning)`` pair (a user's own policy) still works: it
is read as an Option without a source or range.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from blendsim.sim.errors import UserError

OURS = "ours (the paper leaves it open)"
EXT = "extension (not in the paper)"


class Option(NamedTuple):
    default: object
    meaning: str
    source: str = ""  # where the default comes from: a paper section, a public implementation, OURS or EXT
    lo: float | None = None  # numbers: smallest accepted value
    hi: float | None = None  # numbers: largest accepted value
    choices: tuple = ()  # strings: the accepted values

    @staticmethod
    def of(spec) -> Option:
        """``spec`` as an Option (a ``(default, meaning)`` pair is accepted)."""
        if isinstance(spec, Option):
            return spec
        default, meaning = spec
        return Option(default, meaning)

    def coerce(self, key: str, value):
        """``value`` (a string from the command line, or a Python value) as the default's type, checked."""
        v = _coerce(key, value, self.default)
        if self.choices and v not in self.choices:
            raise UserError(f"option {key}: expected one of {', '.join(map(str, self.choices))}, got {value!r}")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
                lo = "-inf" if self.lo is None else f"{self.lo:g}"
                hi = "inf" if self.hi is None else f"{self.hi:g}"
                raise UserError(f"option {key}: expected a value in [{lo}, {hi}], got {value!r}")
        return v


def _coerce(key: str, value, default):
    if isinstance(default, bool):
        if isinstance(value, str):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise UserError(f"option {key}: expected true/false, got {value!r}")
        if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
            return bool(value)  # 0 and 1 as the command line's "0" and "1"
        # 2, 1.5, None or NaN is no switch: bool() would quietly make them True or False
        raise UserError(f"option {key}: expected true/false, got {value!r}")
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        if isinstance(value, (bool, np.bool_)) or value is None:  # True is no number, whatever int(True) says
            raise UserError(f"option {key}: expected a number, got {value!r}")
        try:
            v = type(default)(value) if isinstance(default, float) or str(value).lstrip("-").isdigit() \
                else float(value)
        except (TypeError, ValueError):
            raise UserError(f"option {key}: expected a number, got {value!r}") from None
        if isinstance(default, int) and math.isfinite(v) and v != int(v):  # a count: no fractions of one
            raise UserError(f"option {key}: expected a whole number, got {value!r}")
        v = int(v) if isinstance(default, int) and math.isfinite(v) else v
        # NaN passes every `x < lo` check unnoticed; inf only where the option's default is inf
        if not math.isfinite(v) and not (math.isinf(v) and math.isinf(default) and (v > 0) == (default > 0)):
            raise UserError(f"option {key}: expected a finite number, got {value!r}")
        return v
    if isinstance(default, str):  # as the command line gives it: text (a number as its digits, "3" for 3)
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
            return str(value)
        raise UserError(f"option {key}: expected text, got {value!r}")
    return value



def format_policy(name: str, values: dict) -> str:
    """``name`` with option ``values`` (as the policy reads them: a run summary's ``policy_options``) in the one way
    :func:`blendsim.policy_spec.canonical_policy` writes a spec: ``NAME[k=v,...]``, keys sorted, switches true/false; ``name`` alone
    without options."""
    if not values:
        return name

    def text(x) -> str:
        return str(x).lower() if isinstance(x, bool) else repr(x) if isinstance(x, float) else str(x)

    return f"{name}[{','.join(f'{k}={text(values[k])}' for k in sorted(values))}]"


__all__ = ["EXT", "OURS", "Option", "format_policy"]
