"""Conditional node splitting and the sort -> split -> resort loop (BlendServe sec. 5.2, 5.4, Alg. 2).

After a layer-wise sort the leaf sequence runs from compute- to memory-intensive, except for local
outliers (Fig. 5: request #2, memory-intensive, sits among compute-intensive siblings). A split moves
such a leaf under the root, where the resort puts it by its own density; it then recomputes the prompt
tokens it shared where it stood (Alg. 2: the node's prefix length, ``len_prefix - len``). The loop
repeats until (C1) the leaf densities are non-increasing, or (C2) every split that could remove a
remaining inversion costs more than the threshold t (or than what is left of the recomputation budget).
Each leaf is split at most once, so it terminates (sec. 5.4); ``max_rounds`` is a safety cap.

NOTE (choices the paper leaves open, see the package docstring for the rationale):
* which leaves are outliers: at every inversion (rho[i] < rho[i+1]) of the sorted leaf sequence, the
  run of leaves before it that are sparser than the leaf after it (they belong further right), or the
  run after it that is denser than the leaf before it (further left); the cheaper run whose leaves are
  all splittable is moved. Cheapest runs are taken first when the budget cannot pay for all.
* t: a split is allowed when each moved leaf costs <= t tokens and the total recomputation stays
  within (1 - keep_sharing) of the trace's shared tokens, so "preserve 99% of the sharing ratio" is a
  hard guarantee of the optimal sharing left (``t = -1`` lets a single split use the whole budget).
  Alg. 2 divides t by the fan-out at every level on its way down; ``divide=True`` does that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies.blendserve.restree import ResourceTree


@dataclass(frozen=True)
class SplitReport:
    rounds: int  # sort -> split passes that moved something
    splits: int  # leaves moved under the root
    recompute_tokens: float  # prompt tokens the splits made recomputable (their summed costs)
    budget_tokens: float  # allowed total, (1 - keep_sharing) x shared tokens
    threshold: float  # t in tokens per split (before Alg. 2's division, if any)
    stop: str  # "C1" (monotone), "C2" (no affordable split left) or "max_rounds"
    inversions_left: int
    sharing_before: float
    sharing_after: float


def inversions(rho: np.ndarray) -> np.ndarray:
    """Positions i with rho[i] < rho[i+1] (infinite densities compare equal to each other)."""
    return np.flatnonzero(rho[:-1] < rho[1:])


def candidate_runs(rho, blocked, cost, viol):
    """For each inversion, the cheaper movable run: (start, end, cost) triples, end exclusive.

    ``blocked[i]`` marks leaves that cannot move (already split, or over their threshold)."""
    n = len(rho)
    neg = -rho
    cb = np.r_[0, np.cumsum(blocked)]
    cc = np.r_[0.0, np.cumsum(cost)]
    seg_lo = np.r_[0, viol[:-1] + 1]
    seg_hi = np.r_[viol[1:], n - 1]
    out = []
    for b, lo, hi in zip(viol.tolist(), seg_lo.tolist(), seg_hi.tolist()):
        # each segment between inversions is non-increasing, so -rho is sorted inside it
        lt = lo + int(np.searchsorted(neg[lo:b + 1], neg[b + 1], side="right"))  # [lt, b] sparser than b+1
        hh = b + 1 + int(np.searchsorted(neg[b + 1:hi + 1], neg[b], side="left"))  # [b+1, hh) denser than b
        best = None
        for s, e in ((lt, b + 1), (b + 1, hh)):
            if e > s and cb[e] == cb[s]:
                c = cc[e] - cc[s]
                if best is None or (c, e - s) < (best[2], best[1] - best[0]):
                    best = (s, e, c)
        if best is not None:
            out.append(best)
    return out


def sort_and_split(rt: ResourceTree, keep_sharing: float = 0.99, threshold: float = -1.0,
                   divide: bool = False, max_rounds: int = 64) -> SplitReport:
    """Run the loop on ``rt`` in place; the tree ends sorted (``rt.seq`` is the final leaf order)."""
    rt.aggregate()
    s0 = rt.sharing()
    shared = s0 * float(rt.P[0])
    budget = max(0.0, 1.0 - keep_sharing) * shared
    t = budget if threshold < 0 else float(threshold)
    spent, rounds, splits, stop = 0.0, 0, 0, "max_rounds"
    while True:
        rt.sort()
        viol = inversions(rt.rho_seq)
        if not len(viol):
            stop = "C1"
            break
        if rounds >= max_rounds:
            break
        seq = rt.seq
        cost = rt.shared_prefix()[seq]
        thr = t / rt.fanout_product()[seq] if divide else np.full(len(seq), t)
        blocked = rt.moved[seq] | (cost > thr)
        runs = candidate_runs(rt.rho_seq, blocked, cost, viol)
        runs.sort(key=lambda r: (r[2], r[0]))
        chosen = np.zeros(len(seq), dtype=bool)
        for s, e, c in runs:
            if spent + c > budget + 1e-9:
                continue
            new = ~chosen[s:e]
            spent += float(cost[s:e][new].sum())
            chosen[s:e] = True
        if not chosen.any():
            stop = "C2"
            break
        rt.moved[seq[chosen]] = True
        splits += int(chosen.sum())
        rounds += 1
        rt.aggregate()
    return SplitReport(rounds, splits, spent, budget, t, stop, int(len(inversions(rt.rho_seq))), s0, rt.sharing())


__all__ = ["SplitReport", "candidate_runs", "inversions", "sort_and_split"]
