"""Pieces every recipe uses: seeded generators, Poisson arrivals, prefix popularity, segment paths."""

from __future__ import annotations

import numpy as np

from sim.errors import UserError


def rngs(seed: int, k: int) -> list[np.random.Generator]:
    """``k`` independent generators derived from one seed (adding a stream never shifts the others)."""
    if seed < 0:
        raise UserError(f"--seed must be >= 0, got {seed}")
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(k)]


def poisson_arrivals(rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    """Arrival times (s) of a Poisson process of ``rate`` requests/s; all zero when ``rate`` is 0."""
    if rate < 0 or not np.isfinite(rate):
        raise UserError(f"--rate must be a finite number >= 0 (requests/s), got {rate}")
    if rate == 0:
        return np.zeros(n)
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def popularity(k: int, zipf: float) -> np.ndarray:
    """Probability of each of ``k`` shared prefixes: uniform for ``zipf`` = 0, else rank^-zipf."""
    if zipf < 0:
        raise UserError(f"--zipf must be >= 0, got {zipf}")
    w = np.arange(1, k + 1, dtype=np.float64) ** -zipf
    return w / w.sum()


def paths(columns: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR segment paths from per-request columns, left to right.

    Each column is ``(segment_id, length)``, two arrays of one entry per request; a request skips a
    column where its segment id is negative. Returns ``(offsets, segment_ids, segment_lengths)``.
    """
    ids = np.stack([np.asarray(c[0], dtype=np.int64) for c in columns], axis=1)
    lens = np.stack([np.asarray(c[1], dtype=np.int64) for c in columns], axis=1)
    keep = ids >= 0
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(keep.sum(axis=1), out=offsets[1:])
    return offsets, ids[keep], lens[keep]


def lengths_with_mean_sd(rng: np.random.Generator, n: int, mean: float, sd: float, lo: int, hi: int) -> np.ndarray:
    """Log-normal token counts with the given (unclipped) mean and standard deviation."""
    sigma = float(np.sqrt(np.log1p((sd / mean) ** 2)))
    mu = float(np.log(mean) - sigma**2 / 2)
    return np.clip(np.rint(np.exp(rng.normal(mu, sigma, size=n))), lo, hi).astype(np.int64)


def require_positive(**values) -> None:
    """Raise a UserError naming the first option (``--flag`` form) that is not > 0."""
    for k, v in values.items():
        if not (v > 0):
            raise UserError(f"--{k.replace('_', '-')} must be > 0, got {v}")


__all__ = ["lengths_with_mean_sd", "paths", "poisson_arrivals", "popularity", "require_positive", "rngs"]
