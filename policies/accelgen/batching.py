"""Multi-resource-aware batching arithmetic (AccelGen sec. 4.4, Alg. 2), free of engine state.

A candidate's GPU demand D_c is the tokens it would compute this step; its KV demand D_m is the KV it
would newly allocate, ``ceil`` to whole blocks and counted in tokens, as the paper writes
``ceil(S_l / b) x b`` (a later chunk only pays for blocks beyond those it already holds). Alg. 2 picks,
among candidates that fit both the free compute A_c and the free KV A_m, the one nearest to
``(A_c, A_m)`` in Euclidean distance.
"""

from __future__ import annotations

import math


def new_blocks(computed: int, n: int, block: int) -> int:
    """Blocks a sequence holding KV for ``computed`` tokens must add to hold ``n`` more."""
    return -(-(computed + n) // block) - -(-computed // block)


def kv_fit(computed: int, free_blocks: int, block: int) -> int:
    """Most tokens a sequence holding ``computed`` tokens can add with ``free_blocks`` more blocks."""
    return max(0, (-(-computed // block) + free_blocks) * block - computed)


def chunk_len(remaining: int, a_c: int, computed: int, free_blocks: int, block: int) -> int:
    """Dynamic chunk (Alg. 2 lines 4-6): the remaining prompt, cut where the step reaches S_b or where
    the free KV is fully allocated, whichever comes first."""
    return min(remaining, a_c, kv_fit(computed, free_blocks, block))


def nearest(a_c: float, a_m: float, demands: list, scale: tuple[float, float] = (1.0, 1.0)) -> int | None:
    """Index of the demand ``(D_c, D_m)`` (None entries skipped) with D_c <= A_c, D_m <= A_m and D_c > 0
    nearest to ``(A_c, A_m)``; ties go to the lowest index (the earliest in T_r order). ``scale``
    divides the compute and KV axes (1, 1 is the paper's raw token distance)."""
    best, best_d = None, math.inf
    sc, sm = scale
    for i, dm in enumerate(demands):
        if dm is None:
            continue
        d_c, d_m = dm
        if d_c <= 0 or d_c > a_c or d_m > a_m:
            continue
        d = math.hypot((a_c - d_c) / sc, (a_m - d_m) / sm)
        if d < best_d:
            best, best_d = i, d
    return best


__all__ = ["chunk_len", "kv_fit", "nearest", "new_blocks"]
