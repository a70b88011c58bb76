"""Predicted vs measured: the figures ``blendsim validate`` reports.

Relative error is ``(predicted - measured) / measured`` throughout (positive: the simulator is slow to
the device's real speed, i.e. pessimistic). The functions take numpy columns of the per-step table
(``steps.parquet``) and of the per-operator table (``ops.parquet``) and return plain dicts for
``summary.json``.

* per step: median and 90th percentile of |error|, mean signed error, error of the summed time, and the
  median per step kind (``prefill``: no decodes, ``decode``: no prefill, ``mixed``);
* per operator class (GEMMs, attention, other) on the steps whose operators were timed;
* end to end: per replica the replayed steps' summed times, the makespan (slowest replica), throughput
  ((input + output tokens) / makespan, BlendServe's definition) and its error;
* the speedup between two policies (throughput ratio) predicted and measured, and its error;
* hardware efficiency: achieved bandwidth (cost-model bytes / measured time) in decode-only steps and
  achieved FLOP/s in prefill-heavy steps, as fractions of the device's measured peaks.
"""

from __future__ import annotations

import numpy as np

from blendsim.sim.ops import GEMM_OPS, OPS

CLASSES = ("gemm", "attention", "other")
PREFILL_HEAVY = 0.9  # a step is prefill-heavy when this share of its tokens are prefill tokens


def op_class(op: str) -> str:
    if op in GEMM_OPS:
        return "gemm"
    return "attention" if op.startswith("attn") else "other"


def rel_err(pred, meas) -> np.ndarray:
    pred, meas = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
    return (pred - meas) / np.where(meas > 0, meas, np.nan)


def step_kind(num_prefill_tokens, num_decode) -> np.ndarray:
    p, d = np.asarray(num_prefill_tokens), np.asarray(num_decode)
    return np.where(d == 0, "prefill", np.where(p == 0, "decode", "mixed"))


def _abs_stats(e: np.ndarray) -> dict:
    a = np.abs(e[np.isfinite(e)])
    if not len(a):
        return {"steps": 0}
    return {"steps": int(len(a)), "median_abs_err": float(np.median(a)), "p90_abs_err": float(np.percentile(a, 90))}


def step_errors(pred, meas, kind) -> dict:
    """Per-step error statistics, overall and per step kind."""
    e = rel_err(pred, meas)
    out = _abs_stats(e)
    if out["steps"]:
        out["mean_err"] = float(np.nanmean(e))
        out["total_err"] = float(np.sum(pred) / np.sum(meas) - 1.0)
    kind = np.asarray(kind)
    out["by_kind"] = {k: _abs_stats(e[kind == k]) for k in ("prefill", "decode", "mixed") if (kind == k).any()}
    return out


def op_class_errors(step_id, op, pred, meas) -> dict:
    """Per class: summed predicted and measured seconds over the timed steps, their error, and the
    median |error| of the per-step class times. ``step_id`` identifies a step (e.g. policy/replica/step)."""
    op = np.asarray(op)
    cls = np.array([op_class(o) for o in op])
    step_id = np.asarray(step_id)
    out = {}
    for c in CLASSES:
        m = cls == c
        if not m.any():
            continue
        ids, inv = np.unique(step_id[m], return_inverse=True)
        p = np.bincount(inv, weights=np.asarray(pred, dtype=float)[m])
        t = np.bincount(inv, weights=np.asarray(meas, dtype=float)[m])
        out[c] = {"steps": int(len(ids)), "predicted_s": float(p.sum()), "measured_s": float(t.sum()),
                  "total_err": float(p.sum() / t.sum() - 1.0) if t.sum() > 0 else None,
                  "median_abs_err": float(np.nanmedian(np.abs(rel_err(p, t))))}
    return out


def end_to_end(replica, pred, meas, tokens: float, sim_makespan_s: float | None = None) -> dict:
    """Makespan and throughput, predicted vs measured, over the replayed steps (``tokens`` processed).

    ``sim_makespan_s``, when the whole schedule was replayed, is the simulator's own makespan: it
    equals the summed predicted step times of the slowest replica for an offline trace (checked).
    """
    replica = np.asarray(replica)
    mk_p = max(float(np.sum(np.asarray(pred)[replica == r])) for r in np.unique(replica))
    mk_m = max(float(np.sum(np.asarray(meas)[replica == r])) for r in np.unique(replica))
    out = {"makespan_pred_s": mk_p, "makespan_meas_s": mk_m, "tokens": float(tokens),
           "throughput_pred_tok_s": tokens / mk_p if mk_p > 0 else 0.0,
           "throughput_meas_tok_s": tokens / mk_m if mk_m > 0 else 0.0,
           "throughput_err": mk_m / mk_p - 1.0 if mk_p > 0 else None}
    if sim_makespan_s is not None:
        out["sim_makespan_s"] = float(sim_makespan_s)
    return out


def speedup(base: dict, other: dict) -> dict:
    """Speedup of ``other`` over ``base`` (throughput ratio), predicted and measured, and its error."""
    sp = other["throughput_pred_tok_s"] / base["throughput_pred_tok_s"]
    sm = other["throughput_meas_tok_s"] / base["throughput_meas_tok_s"]
    return {"speedup_pred": sp, "speedup_meas": sm, "speedup_err": sp / sm - 1.0}


def work(shapes, layers: int, feats) -> tuple[np.ndarray, np.ndarray]:
    """FLOPs and bytes of each step from the cost model's accounting (``blendsim.sim.ops.op_counts``)."""
    from blendsim.sim.ops import op_counts

    flops = bytes_ = 0.0
    for name, (f, b, _k) in op_counts(shapes, feats).items():
        mult = layers if OPS[name][1] == "layer" else 1
        flops = flops + np.asarray(f, dtype=float) * mult
        bytes_ = bytes_ + np.asarray(b, dtype=float) * mult
    return np.asarray(flops, dtype=float), np.asarray(bytes_, dtype=float)


def efficiency(flops, bytes_, meas, num_prefill_tokens, num_tokens, peaks: dict) -> dict:
    """Achieved bandwidth in decode-only steps and FLOP/s in prefill-heavy steps vs measured peaks."""
    meas = np.asarray(meas, dtype=float)
    pt, t = np.asarray(num_prefill_tokens), np.asarray(num_tokens)
    out = {"peaks": peaks}
    dec = pt == 0
    if dec.any():
        bw = float(np.median(np.asarray(bytes_)[dec] / meas[dec]))
        out["decode"] = {"steps": int(dec.sum()), "achieved_bandwidth": bw,
                         "fraction_of_peak": bw / peaks["mem_bandwidth"]}
    pf = pt >= PREFILL_HEAVY * t
    pf &= pt > 0
    if pf.any():
        fl = float(np.median(np.asarray(flops)[pf] / meas[pf]))
        out["prefill"] = {"steps": int(pf.sum()), "achieved_flops": fl, "fraction_of_peak": fl / peaks["matmul_flops"]}
    return out


__all__ = ["CLASSES", "end_to_end", "efficiency", "op_class", "op_class_errors", "rel_err", "speedup",
           "step_errors", "step_kind", "work"]
