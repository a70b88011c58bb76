"""The dual scan's arithmetic (BlendServe sec. 5.3, Alg. 3) and the data-parallel split (sec. 5.5).

Memory partition: M_L + M_R = M and M_L rho(L) + M_R rho(R) = M rho(rt), so
M_L = M (rho(rt) - rho(R)) / (rho(L) - rho(R)). Budgets (Alg. 3): a side with memory M_s holds
N_s = M_s / ((p_s + d_s / 2) kv_bytes) decoding requests (their average KV is p + d/2) and, to keep N_s
steady, admits N_s p_s / d_s prompt tokens per step (N_s / d_s requests finish per step).

The densities in these equations are *occupancy* densities: Comp over the paper's Mem(r) = (p d +
d^2/2) kv_bytes / bandwidth (sec. 4.1), the KV a request keeps resident over its d steps. That is what
the partition trades (a share of the cache), it is the model Alg. 3's N and C come from, and it is
how Fig. 6's 3.73 and 0.096 are computed. NOTE: sim.density's request-level Mem counts only the d - 1
decode steps' reads, so one-token outputs (e.g. MMLU) have infinite density there; in the occupancy
model they are finite, so the partition never degenerates to "no memory and no budget" for them.

Degenerate cases (rho(rt) not strictly between rho(L) and rho(R), e.g. rho(L) <= rho(rt): the left
scanner has run out of compute-intensive requests; rho(R) >= rho(rt): every memory-intensive request is
already running): no mix of the two units reaches the target. ``clip`` (default) solves the equations
and clips M_L / M to [0, 1], i.e. all memory goes to the side nearer the target (rho(L) <= rho(rt):
the left, the denser; rho(R) >= rho(rt): the right, the sparser); the scanner itself still lets a side
with nothing running admit one request, so neither stalls. ``even`` splits M in half instead (on the
BlendServe traces the two agree within 0.2% of throughput). rho(L) == rho(R) (both pointers in one
unit): half each. An infinite density (no decode reads at all) takes the formula's limit.
"""

from __future__ import annotations

import numpy as np


def occupancy_time(p, d, rates):
    """The paper's Mem(r): KV resident over the d steps, (p d + d^2 / 2) kv_bytes / bandwidth."""
    p = np.asarray(p, dtype=np.float64)
    d = np.asarray(d, dtype=np.float64)
    return (p * d + d * d / 2.0) * rates.kv_bytes / rates.bandwidth


def left_fraction(rho_rt: float, rho_l: float, rho_r: float, degenerate: str = "clip") -> float:
    """M_L / M from the two constraints (see the module docstring for the degenerate cases)."""
    lo, hi = min(rho_l, rho_r), max(rho_l, rho_r)
    if rho_l == rho_r or not lo < rho_rt < hi:
        if degenerate == "even" or rho_l == rho_r:
            return 0.5
        # clip: everything to the side whose density is closer to the target
        return 1.0 if abs(rho_l - rho_rt) < abs(rho_r - rho_rt) else 0.0
    if np.isinf(rho_l):
        return 0.0
    if np.isinf(rho_r):
        return 1.0
    return float((rho_rt - rho_r) / (rho_l - rho_r))


def dual_scan_budgets(rho_rt, rho_l, rho_r, M, p_l, d_l, p_r, d_r, kv_bytes=1.0, degenerate="clip"):
    """Alg. 3: (M_L, M_R, C_L, C_R) for total memory M (bytes, or tokens with kv_bytes=1).

    C_L and C_R are prompt tokens per step."""
    f = left_fraction(rho_rt, rho_l, rho_r, degenerate)
    m_l, m_r = M * f, M * (1.0 - f)
    d_l, d_r = max(d_l, 1.0), max(d_r, 1.0)
    n_l = m_l / ((p_l + d_l / 2.0) * kv_bytes)
    n_r = m_r / ((p_r + d_r / 2.0) * kv_bytes)
    return m_l, m_r, n_l * p_l / d_l, n_r * p_r / d_r


_WINDOW = 16  # neighbourhood searched around the best compute-exact pair


def dp_partition(comp: np.ndarray, mem: np.ndarray, k: int) -> np.ndarray:
    """Replica of each position of a density-sorted sequence, for ``k`` data-parallel replicas.

    The dual-scanner idea applied offline (sec. 5.5): replica j takes the j-th block from the left
    (compute-intensive) end and the j-th block from the right end, the two blocks sized so that the
    replica gets 1/k of the total compute work and 1/k of the total memory work (so its density is
    the root's). Blocks are contiguous, so subtrees stay together except at the 2(k - 1) cuts.
    Boundary b (b = 1 .. k-1) is the pair (i, j) -- i positions from the left, j from the right --
    whose cumulative compute matches b/k of the total, choosing among those the i whose memory is
    closest to b/k (both relative errors are minimised together, the larger one first).
    """
    n = len(comp)
    out = np.full(n, k - 1, dtype=np.int64)
    if k <= 1 or n == 0:
        return np.zeros(n, dtype=np.int64)
    cl = np.r_[0.0, np.cumsum(comp)]
    ml = np.r_[0.0, np.cumsum(mem)]
    cr = np.r_[0.0, np.cumsum(comp[::-1])]
    mr = np.r_[0.0, np.cumsum(mem[::-1])]
    C, Mt = max(cl[-1], 1e-300), max(ml[-1], 1e-300)
    i0 = j0 = 0
    for b in range(1, k):
        tc, tm = b * C / k, b * Mt / k
        i = np.arange(i0, n - j0 + 1)  # the left block may not run into the right one
        j = np.clip(np.searchsorted(cr, tc - cl[i]), j0, n - i)  # right items completing the compute
        # the best pair along that curve, then (NOTE) a small neighbourhood of (i, j) pairs, which
        # trades a little compute error for memory error where single requests are coarse
        mid = int(np.argmin(np.maximum(np.abs(cl[i] + cr[j] - tc) / C, np.abs(ml[i] + mr[j] - tm) / Mt)))
        ii = i[max(0, mid - _WINDOW):mid + _WINDOW + 1][:, None]
        jj = j[max(0, mid - _WINDOW):mid + _WINDOW + 1][:, None] + np.arange(-_WINDOW, _WINDOW + 1)[None, :]
        jj = np.clip(jj, j0, n - ii)
        ii = np.broadcast_to(ii, jj.shape)
        ec = np.abs(cl[ii] + cr[jj] - tc) / C
        em = np.abs(ml[ii] + mr[jj] - tm) / Mt
        best = int(np.lexsort((np.minimum(ec, em).ravel(), np.maximum(ec, em).ravel()))[0])
        i1, j1 = int(ii.ravel()[best]), int(jj.ravel()[best])
        out[i0:i1] = b - 1
        out[n - j1:n - j0] = b - 1
        i0, j0 = i1, j1
    return out


__all__ = ["dp_partition", "dual_scan_budgets", "left_fraction", "occupancy_time"]
