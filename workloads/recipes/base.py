"""What a recipe is (:class:`Recipe`) and the helpers the recipe modules share (numpy is imported inside
them, so listing recipes stays light). The registry that finds recipes by name is the package,
``blendsim.workloads.recipes``; recipe modules import from here, never from it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from blendsim.sim.errors import UserError


@dataclass(frozen=True, slots=True)
class Recipe:
    """A named trace generator with typed options."""

    name: str
    summary: str  # one line for listings and CLI help
    options: type  # frozen dataclass; fields are the options, metadata["help"] describes each
    build: Callable[[Any], Any]  # options instance -> Trace

    def make(self, **options):
        """Validate ``options`` (UserError on a bad one) and build the trace."""
        trace = self.build(self.check(**options))
        # what its options make must be a trace blendsim reads back (each length and time within MAX_TOKENS /
        # MAX_TIME_S, a prompt's segments summed too): refused here rather than written and refused on reading
        trace.validate(f"recipe {self.name} (these options make a trace beyond blendsim's limits)")
        return trace

    def check(self, **options):
        """The options instance of ``options``, validated (UserError on a bad one), without building anything: a
        command checks them before it creates its output."""
        names = {f.name for f in dataclasses.fields(self.options)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise UserError(f"recipe {self.name}: unknown option(s) {', '.join(unknown)}; "
                            f"options are {', '.join(sorted(names))}")
        missing = [f.name for f in dataclasses.fields(self.options)
                   if f.default is dataclasses.MISSING and f.name not in options]
        if missing:
            raise UserError(f"recipe {self.name}: missing option(s) "
                            f"{', '.join('--' + m.replace('_', '-') for m in missing)}")
        import typing

        from blendsim.sim.checks import by_type, flag_of, integer
        from blendsim.workloads.trace import MAX_REQUESTS, MAX_TOKENS

        hints = typing.get_type_hints(self.options)
        for k, v in options.items():  # each of its declared type, before the recipe reads it (Python callers)
            by_type(v, hints[k], flag_of(k))
            if hints[k] in (int, int | None) and k != "seed" and v is not None:  # token counts, request counts,
                integer(v, flag_of(k), None, MAX_TOKENS)  # degrees: bounded (10**30 would overflow numpy, 10**12
                # allocate terabytes)
        opts = self.options(**options)  # the recipe's own checks first: its minimum is the one to name
        if options.get("requests") is not None:  # None: the recipe's own default
            integer(options["requests"], "--requests", 0, MAX_REQUESTS)  # a recipe refuses 0 if 0 is no default
        return opts


def option_help(options_cls: type) -> dict[str, str]:
    """Field name -> help text of an options dataclass."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(options_cls)}


def rngs(seed: int, k: int) -> list:
    """``k`` independent generators derived from one seed (adding a stream never shifts the others)."""
    import numpy as np

    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(k)]


def poisson_arrivals(rng, n: int, rate: float):
    """Arrival times (s) of a Poisson process of ``rate`` requests/s; all zero when ``rate`` is 0."""
    import numpy as np

    if rate < 0 or not np.isfinite(rate):
        raise UserError(f"--rate must be a finite number >= 0 (requests/s), got {rate}")
    if rate == 0:
        return np.zeros(n)
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def popularity(k: int, zipf: float):
    """Probability of each of ``k`` shared prefixes: uniform for ``zipf`` = 0, else rank^-zipf."""
    import numpy as np

    if zipf < 0:
        raise UserError(f"--zipf must be >= 0, got {zipf}")
    w = np.arange(1, k + 1, dtype=np.float64) ** -zipf
    return w / w.sum()


def paths(columns: list[tuple]) -> tuple:
    """CSR segment paths from per-request columns, left to right.

    Each column is ``(segment_id, length)``, two arrays of one entry per request; a request skips a
    column where its segment id is negative. Returns ``(offsets, segment_ids, segment_lengths)``.
    """
    import numpy as np

    ids = np.stack([np.asarray(c[0], dtype=np.int64) for c in columns], axis=1)
    lens = np.stack([np.asarray(c[1], dtype=np.int64) for c in columns], axis=1)
    keep = ids >= 0
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(keep.sum(axis=1), out=offsets[1:])
    return offsets, ids[keep], lens[keep]


def lengths_with_mean_sd(rng, n: int, mean: float, sd: float, lo: int, hi: int):
    """Log-normal token counts with the given (unclipped) mean and standard deviation."""
    import numpy as np

    sigma = float(np.sqrt(np.log1p((sd / mean) ** 2)))
    mu = float(np.log(mean) - sigma**2 / 2)
    return np.clip(np.rint(np.exp(rng.normal(mu, sigma, size=n))), lo, hi).astype(np.int64)


def require_positive(**values) -> None:
    """Raise a UserError naming the first option (``--flag`` form) that is not > 0."""
    for k, v in values.items():
        if not (v > 0):
            raise UserError(f"--{k.replace('_', '-')} must be > 0, got {v}")


__all__ = ["Recipe", "lengths_with_mean_sd", "option_help", "paths", "poisson_arrivals", "popularity",
           "require_positive", "rngs"]
