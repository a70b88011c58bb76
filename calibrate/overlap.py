"""Operator overlap: a GEMM and a decode attention on two CUDA streams, together versus alone.

The cost model's ``overlap`` mode prices co-running compute- and memory-bound work as
``t_together = max(t_a, t_b) + kappa * min(t_a, t_b)`` (``blendsim.sim.cost.CostModel._combine``): kappa = 0 is
perfect overlap, kappa = 1 no overlap at all. Here both kernels are timed alone and launched together
on two streams over a grid of sizes, and kappa is fitted to the measured ``t_together``. CPUs have no
streams: the caller records the skip and leaves the interference null (the hardware default applies).
"""

from __future__ import annotations

import numpy as np

GEMM_OP = "gate_up_proj"  # the largest GEMM of a layer, as NanoFlow overlaps it with decode attention


def fit_interference(t_a, t_b, t_together) -> dict:
    """Least-squares kappa on relative error of ``t_together``, clipped to [0, 1].

    Minimises sum(((max + k*min) - t_ab) / t_ab)^2 over k: k = sum(m*r/t^2) / sum(m^2/t^2) with m the
    shorter time and r the excess of the together time over the longer one.
    """
    a, b, ab = (np.asarray(v, dtype=float) for v in (t_a, t_b, t_together))
    if len(ab) == 0 or np.any(ab <= 0):
        raise ValueError("need positive together-times")
    hi, lo = np.maximum(a, b), np.minimum(a, b)
    w = 1.0 / ab**2
    raw = float(np.sum(w * lo * (ab - hi)) / np.sum(w * lo * lo))
    kappa = float(min(1.0, max(0.0, raw)))
    pred = hi + kappa * lo
    err = np.abs(pred - ab) / ab
    return {"kappa": kappa, "kappa_raw": raw, "median_rel_err": float(np.median(err)),
            "max_rel_err": float(err.max()), "n_points": int(len(ab))}


def together(fa, fb):
    """A callable launching ``fa`` and ``fb`` on two fresh streams; the current stream waits for both."""
    import torch

    sa, sb = torch.cuda.Stream(), torch.cuda.Stream()

    def run():
        cur = torch.cuda.current_stream()
        sa.wait_stream(cur)
        sb.wait_stream(cur)
        with torch.cuda.stream(sa):
            fa()
        with torch.cuda.stream(sb):
            fb()
        cur.wait_stream(sa)
        cur.wait_stream(sb)

    return run


def measure_overlap(clock, gemm_build, decode_build, grid, skipped: list, on_point=None, release=None) -> dict | None:
    """Time GEMM, decode and both together at each ``(tokens, batch, context)``; fit kappa.

    Returns the profile's ``overlap`` record (points and fit), or None when no point could be measured.
    """
    from blendsim.calibrate.timing import is_oom

    points = []
    for t, b, c in grid:
        try:
            fa, fb = gemm_build(t), decode_build(b, c)
            ta, tb = clock.time(fa).median_s, clock.time(fb).median_s
            tab = clock.time(together(fa, fb)).median_s
            points.append({"gemm_tokens": t, "decode_batch": b, "decode_context": c, "t_gemm_s": ta,
                           "t_decode_s": tb, "t_together_s": tab})
            del fa, fb
        except Exception as e:  # noqa: BLE001 - out-of-memory is skipped, anything else re-raised
            if not is_oom(e):
                raise
            skipped.append({"op": "overlap", "point": [t, b, c], "reason": f"out of memory ({type(e).__name__})"})
            if release is not None:
                release()
        if on_point:
            on_point()
    if not points:
        return None
    fit = fit_interference([p["t_gemm_s"] for p in points], [p["t_decode_s"] for p in points],
                           [p["t_together_s"] for p in points])
    return {"gemm_op": GEMM_OP, "points": points, "fit": fit,
            "method": "two CUDA streams; t_together = max(t_a, t_b) + kappa * min(t_a, t_b), relative least squares"}


__all__ = ["GEMM_OP", "fit_interference", "measure_overlap", "together"]
