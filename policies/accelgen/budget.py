"""AccelGen's token budget (sec. 4.2): the pivot forward size and Eq. 6.

The *pivot forward size* S_pf is the smallest forward size at which throughput (tokens per second of
one step) has nearly saturated; T_pf is the time of a step of that size. The paper profiles both on the
GPU; here the iteration-time model is the project's cost model (``ctx.cost_model``), probed with
prefill-only steps of one sequence and no prior context, as a forward-size sweep on a GPU would be.

Eq. 6 scales the pivot linearly to the tightest iteration-level SLO of the batch:
``S_b = S_pf * SLO_min / T_pf``. It ignores what a chunk's context costs (attention reads all earlier
tokens of the prompt: the term S/(6H) of Eq. 4, which the paper drops for S < 6H), so chunks deep
into a long prompt run far over SLO_min (twice it at 6H of context). Option
``budget_model=cost`` (an extension, not the paper's rule) sizes every chunk so the cost-model time of
the whole step — its decodes, its chunks and their contexts — fits SLO_min.
"""

from __future__ import annotations

import math

PIVOT_GRID = 16  # forward sizes probed: multiples of this
PIVOT_MAX = 16384  # largest forward size probed


def prefill_step_time(cm, tokens: int, decodes: int = 0, decode_ctx_sum: int = 0) -> float:
    """Cost-model seconds of one step: a ``tokens``-long prefill chunk (no prior context) plus
    ``decodes`` decode sequences with ``decode_ctx_sum`` tokens of context in all."""
    n = tokens
    logits = decodes + (1 if n else 0)
    return cm.step(n + decodes, n, 1 if n else 0, n * (n + 1) // 2, n, decodes, decode_ctx_sum, logits)[0]


def pivot_forward_size(cm, tol: float, grid: int = PIVOT_GRID, limit: int = PIVOT_MAX) -> tuple[int, float]:
    """``(S_pf, T_pf)``: the smallest forward size on the grid whose throughput is within ``tol`` of the
    best throughput of the sweep, and the time of a step of that size."""
    sizes = range(grid, limit + 1, grid)
    times = [prefill_step_time(cm, s) for s in sizes]
    thr = [s / t for s, t in zip(sizes, times, strict=True)]
    peak = max(thr)
    for s, t, x in zip(sizes, times, thr, strict=True):
        if x >= (1.0 - tol) * peak:
            return s, t
    raise AssertionError("unreachable: the peak itself qualifies")


def eq6_budget(s_pf: int, t_pf: float, slo_min: float) -> int:
    """Eq. 6: ``S_b = S_pf * SLO_min / T_pf`` (floored; S_pf itself when no SLO binds)."""
    if math.isinf(slo_min):
        return s_pf
    return int(s_pf * slo_min / t_pf)


def largest_fit(time_of, limit: float, cap: int) -> int:
    """Largest n in [0, cap] with ``time_of(n) <= limit`` (``time_of`` increasing); 0 if none."""
    if cap <= 0 or time_of(1) > limit:
        return 0
    if time_of(cap) <= limit:
        return cap
    lo, hi = 1, cap
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if time_of(mid) <= limit:
            lo = mid
        else:
            hi = mid
    return lo


def clamp_budget(sb: int, cap: int, round_tokens: int) -> int:
    """At least one token, at most the engine's cap, trimmed to a multiple of ``round_tokens``."""
    sb = max(1, min(sb, cap))
    if round_tokens and sb >= round_tokens:
        sb = sb // round_tokens * round_tokens
    return sb


__all__ = ["clamp_budget", "eq6_budget", "largest_fit", "pivot_forward_size", "prefill_step_time"]
