"""Merging the sorted tree into scan units (BlendServe App. A.2) and their densities.

The paper merges subtrees into single nodes "if doing so does not hurt the prefix sharing ratio", to
stop the dual scanner's densities from fluctuating leaf by leaf. A merged node is what the scanner
treats as R_L or R_R: its density and mean lengths stay fixed while the scanner is inside it.

NOTE (the paper gives no rule or size): a subtree is merged into one unit when its requests' KV
footprint (sum of p + d/2, the per-request average the dual scan itself assumes) is at most ``cap``
tokens -- one KV cache by default, i.e. about the set of requests that share the GPU at one time, so a
unit's density is the density of what is actually running. Larger subtrees are not merged; their
merged children are, and runs of adjacent whole siblings are grouped up to about ``cap`` as well.
Merging only groups requests that are already adjacent in the sorted order, so it never changes the
order nor the sharing.
"""

from __future__ import annotations

import numpy as np

from blendsim.policies.blendserve.restree import ResourceTree


def scan_units(rt: ResourceTree, footprint: np.ndarray, cap: float) -> np.ndarray:
    """Unit id (0, 1, ... left to right) of every request in ``rt.seq`` (after ``rt.sort``)."""
    seq = rt.seq
    if not len(seq):
        return np.zeros(0, dtype=np.int64)
    F = np.concatenate([rt.per_node(footprint), footprint])
    whole = F <= cap
    run = np.zeros(len(F), dtype=np.int64)
    for idx, _, first in rt._sorted_levels:
        wh = whole[idx]
        newblk = first | ~wh | np.r_[True, ~wh[:-1]]
        Fw = np.where(wh, F[idx], 0.0)
        cs = np.cumsum(Fw) - Fw
        bs = np.flatnonzero(newblk)
        base = np.repeat(cs[bs], np.diff(np.r_[bs, len(idx)]))
        sub = np.floor((cs - base) / cap).astype(np.int64)
        run[idx] = np.cumsum(newblk) * (len(idx) + 1) + sub
    if len(seq) == 1:
        return np.zeros(1, dtype=np.int64)
    c1, c2, w = rt.next_lca()
    same = whole[w] | (whole[c1] & whole[c2] & (run[c1] == run[c2]))
    return np.r_[0, np.cumsum(~same)].astype(np.int64)


def unit_stats(unit: np.ndarray, comp: np.ndarray, occ: np.ndarray, p: np.ndarray, d: np.ndarray):
    """Per unit: occupancy density (sum comp / sum occ), mean prompt and mean estimated output."""
    k = int(unit.max(initial=-1)) + 1
    cnt = np.bincount(unit, minlength=k).astype(np.float64)
    sc = np.bincount(unit, weights=comp, minlength=k)
    so = np.bincount(unit, weights=occ, minlength=k)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho = np.where(so > 0, sc / so, np.inf)
        return rho, np.bincount(unit, weights=p, minlength=k) / cnt, np.bincount(unit, weights=d, minlength=k) / cnt


__all__ = ["scan_units", "unit_stats"]
