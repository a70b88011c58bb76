"""Conditional node splitting and the sort -> split -> resort loop (BlendServe sec. 5.2, 5.4, Alg. 2).

After a layer-wise sort the leaf sequence runs from compute- to memory-intensive, except for local
outliers (Fig. 5: request #2, memory-intensive, sits among compute-intensive siblings). A split moves
such outliers under the root, where the resort puts them by their own density; they then recompute the
prompt tokens they shared where they stood (Alg. 2: the node's prefix length, ``len_prefix - len``).
The loop repeats until (C1) the leaf densities are non-increasing, or (C2) every split that could
remove a remaining inversion costs more than the threshold t (or than what is left of the
recomputation budget). Each unit moves at most once (a unit already under the root is never moved
again), so it terminates (sec. 5.4); ``max_rounds`` is a safety cap.

Two units of a split (option ``split``):
* ``subtree`` (default, Alg. 2): the highest node whose leaves are all outliers of the run -- a whole
  subtree, detached with its internal sharing (its shared nodes stay computed once) and re-attached
  under the root, where it recomputes the path above it once: cost = its shared prefix above it
  (``ResourceTree.unit_cost``), counted once for the subtree, not per leaf. A run that is not one
  subtree is covered by its maximal subtrees; a node over a single request is that request's leaf.
* ``leaf``: every outlier request moves on its own, paying its own shared prefix.
Where every unit is one request the two modes move the same requests at the same cost.

How this reads Alg. 2. NODE_SPLIT(ptr, t) detaches ptr -- a whole subtree -- when
``ptr.len_prefix * len(ptr.childList) > t``, i.e. when splitting ptr's children apart would cost more
than t (each child would recompute ptr's prefix), it keeps ptr whole and moves it as one unit at the
cost of its prefix once; otherwise it recurses into the children with t / len(childList). The
pseudo-code never appends single leaves and does not say which nodes to visit (its condition holds for
any node with a long enough prefix, outlier or not), so we keep the inversion-driven choice of *what*
is misplaced (below) and take from Alg. 2 *what moves* (the whole subtree holding the outliers, at its
prefix cost once) and *the threshold* (t, divided by the fan-out at every level on the way down when
``divide=True``, the ``split_divide`` option; without it every unit is checked against t itself).

NOTE (choices the paper leaves open, see the package docstring for the rationale):
* which leaves are outliers: at every inversion (rho[i] < rho[i+1]) of the sorted leaf sequence, the
  run of leaves before it that are sparser than the leaf after it (they belong further right), or the
  run after it that is denser than the leaf before it (further left); the cheaper run whose units are
  all splittable is moved. Cheapest runs are taken first when the budget cannot pay for all; in
  subtree mode a run overlapping one already taken this round waits for the resort.
* t: a split is allowed when each moved unit costs <= t tokens and the total recomputation stays
  within (1 - keep_sharing) of the trace's shared tokens, so "preserve 99% of the sharing ratio" is a
  hard guarantee of the optimal sharing left (``t = -1`` lets a single split use the whole budget).
  Costs are charged per unit as if the others stayed, so units moved together (siblings) are charged
  at least what they cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blendsim.policies.blendserve.restree import ResourceTree

SPLIT_MODES = ("subtree", "leaf")


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
    mode: str = "leaf"  # the unit moved: "subtree" (Alg. 2) or "leaf"
    moved_requests: int = 0  # requests below the moved units (= splits in leaf mode)


def inversions(rho: np.ndarray) -> np.ndarray:
    """Positions i with rho[i] < rho[i+1] (infinite densities compare equal to each other)."""
    return np.flatnonzero(rho[:-1] < rho[1:])


def _sides(rho, viol):
    """Both candidate runs of every inversion k: (k, start, end), end exclusive -- the leaves before it
    that are sparser than the leaf after it (they belong further right), and the leaves after it that
    are denser than the leaf before it (further left)."""
    n = len(rho)
    neg = -rho
    seg_lo = np.r_[0, viol[:-1] + 1]
    seg_hi = np.r_[viol[1:], n - 1]
    out = []
    for k, (b, lo, hi) in enumerate(zip(viol.tolist(), seg_lo.tolist(), seg_hi.tolist())):
        # each segment between inversions is non-increasing, so -rho is sorted inside it
        lt = lo + int(np.searchsorted(neg[lo:b + 1], neg[b + 1], side="right"))
        hh = b + 1 + int(np.searchsorted(neg[b + 1:hi + 1], neg[b], side="left"))
        for s, e in ((lt, b + 1), (b + 1, hh)):
            if e > s:
                out.append((k, s, e))
    return np.array(out, dtype=np.int64).reshape(-1, 3)


def candidate_runs(rho, blocked, cost, viol):
    """For each inversion, the cheaper movable run: (start, end, cost) triples, end exclusive.

    ``blocked[i]`` marks leaves that cannot move (already split, or over their threshold)."""
    cb = np.r_[0, np.cumsum(blocked)]
    cc = np.r_[0.0, np.cumsum(cost)]
    best = {}
    for k, s, e in _sides(rho, viol).tolist():
        if cb[e] == cb[s]:
            c = cc[e] - cc[s]
            if k not in best or (c, e - s) < (best[k][2], best[k][1] - best[k][0]):
                best[k] = (s, e, c)
    return list(best.values())


def subtree_runs(rt: ResourceTree, viol, cost_node, thr_node):
    """For each inversion, the cheaper movable run as a set of whole subtrees.

    A run of outlier leaves (as in :func:`candidate_runs`) is covered by its maximal units: for every
    leaf, the highest (extended) node whose leaves all lie in the run and which is not the root (a
    request leaf itself where that node holds one request only). A
    run is movable when none of its units is already a child of the root (moved before, or a root
    child from the start: moving it changes nothing) and each costs at most its threshold; its cost
    is the sum of its units' costs (each unit's shared prefix, once for its whole subtree).
    Returns (cost, start, end, units) per inversion that has a movable run."""
    m, seq = rt.m, rt.seq
    sides = _sides(rt.rho_seq, viol)
    if not len(sides):
        return []
    K, S, E = sides[:, 0], sides[:, 1], sides[:, 2]
    ln = E - S
    side = np.repeat(np.arange(len(sides)), ln)
    pos = np.arange(int(ln.sum())) - np.repeat(np.cumsum(ln) - ln, ln) + np.repeat(S, ln)
    cur = m + seq[pos]
    pre_leaf = rt.pre[m + seq]  # ascending: seq is in preorder
    par_of, cnt = rt.ext_parent, rt.cnt
    walk = cur.copy()
    live = np.arange(len(cur))
    while len(live):
        par = par_of[walk[live]]
        lo = np.searchsorted(pre_leaf, rt.pre[par])
        ok = (par > 0) & (lo >= S[side[live]]) & (lo + cnt[par] <= E[side[live]])
        live, par = live[ok], par[ok]
        walk[live] = par
        # a static node over one request is that request: move the leaf (same cost and aggregates),
        # so subtree mode moves exactly what leaf mode does where every unit is a single request
        many = cnt[par] >= 2
        cur[live[many]] = par[many]
    # one entry per (side, unit): a unit's leaves are contiguous inside its side, and sides are laid
    # out one after the other, so a unit starts where (side, unit) changes
    start = np.r_[True, (side[1:] != side[:-1]) | (cur[1:] != cur[:-1])]
    us, uu = side[start], cur[start]
    bad = (par_of[uu] <= 0) | (cost_node[uu] > thr_node[uu])
    blocked = np.bincount(us, weights=bad, minlength=len(sides)) > 0
    cost = np.bincount(us, weights=cost_node[uu], minlength=len(sides))
    first_unit = np.searchsorted(us, np.arange(len(sides) + 1))
    best = {}
    for j in np.flatnonzero(~blocked).tolist():
        k = int(K[j])
        cand = (float(cost[j]), int(ln[j]), int(S[j]), int(E[j]), uu[first_unit[j]:first_unit[j + 1]])
        if k not in best or cand[:2] < best[k][:2]:
            best[k] = cand
    return [(c, s, e, u) for c, _, s, e, u in best.values()]


def sort_and_split(rt: ResourceTree, keep_sharing: float = 0.99, threshold: float = -1.0,
                   divide: bool = False, max_rounds: int = 64, mode: str = "subtree") -> SplitReport:
    """Run the loop on ``rt`` in place; the tree ends sorted (``rt.seq`` is the final leaf order).

    ``mode``: "subtree" moves the highest nodes whose leaves are all outliers (Alg. 2's unit), "leaf"
    moves the outlier requests one by one."""
    if mode not in SPLIT_MODES:
        raise ValueError(f"split mode: choose one of {', '.join(SPLIT_MODES)}, got {mode!r}")
    rt.aggregate()
    s0 = rt.sharing()
    shared = s0 * float(rt.P[0])
    budget = max(0.0, 1.0 - keep_sharing) * shared
    t = budget if threshold < 0 else float(threshold)
    spent, rounds, splits, moved_req, stop = 0.0, 0, 0, 0, "max_rounds"
    while True:
        rt.sort()
        viol = inversions(rt.rho_seq)
        if not len(viol):
            stop = "C1"
            break
        if rounds >= max_rounds:
            break
        seq = rt.seq
        if mode == "leaf":
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
            moved_req += int(chosen.sum())
        else:
            cost_node = rt.unit_cost()
            thr_node = t / rt.node_fanout_product() if divide else np.full(len(cost_node), t)
            runs = subtree_runs(rt, viol, cost_node, thr_node)
            runs.sort(key=lambda r: (r[0], r[1]))
            taken = np.zeros(len(seq), dtype=bool)
            units = []
            for c, s, e, u in runs:
                # runs of neighbouring inversions may overlap: a leaf already taken waits for the resort
                if spent + c > budget + 1e-9 or taken[s:e].any():
                    continue
                spent += c
                taken[s:e] = True
                units.append(u)
            if not units:
                stop = "C2"
                break
            u = np.concatenate(units)
            rt.moved_node[u[u < rt.m]] = True
            rt.moved[u[u >= rt.m] - rt.m] = True
            splits += len(u)
            moved_req += int(taken.sum())
        rounds += 1
        rt.aggregate()
    return SplitReport(rounds, splits, spent, budget, t, stop, int(len(inversions(rt.rho_seq))), s0, rt.sharing(),
                       mode, moved_req)


__all__ = ["SPLIT_MODES", "SplitReport", "candidate_runs", "inversions", "sort_and_split", "subtree_runs"]
