"""Held-out checks of a profile: points off its grid, timed, against the cost model's prediction.

Points are drawn (seeded, :func:`blendsim.calibrate.grids.heldout_points`) inside each operator's measured domain but off its grid: log-spaced token
counts nudged off grid values, and log-uniform (tokens, context) / (batch, context) pairs for
attention. Predictions go through :class:`blendsim.sim.profile.ProfileTimer` (the cost model's path, with
features built as the engine builds them), not through the fit directly, so the check covers the chain.

Two ways to time them: :func:`validate` measures them now, on this device (a later check of a
profile); a calibration run with ``holdout > 0`` measures them inside its own interleaved sweeps,
so that they share the grid's conditions, keeps them out of the fit, and stores them with each
operator (``fit["holdout"]``), where :func:`holdout_errors` reads them. On a shared host the
machine's speed drifts by tens of percent within minutes (other tenants' work, SMT siblings), so only
the second separates the fit's error from the machine's drift.
"""

from __future__ import annotations

import numpy as np

from blendsim.sim.batch import BatchFeatures
from blendsim.sim.profile import Profile, ProfileTimer


def features(op: str, p) -> BatchFeatures:
    """The step features under which ``op`` runs at point ``p`` (one sequence for prefill)."""
    if op == "attn_prefill":
        return BatchFeatures.prefill_only(p[0], p[1])
    if op == "attn_decode":
        return BatchFeatures.decode_only(p[0], p[1])
    t = p[0]
    return BatchFeatures(num_tokens=t, num_prefill_tokens=t, num_prefill_seqs=1, attn_pairs=t, prefill_kv_tokens=t,
                         num_logits=t)


def predict(timer: ProfileTimer, op: str, p) -> float:
    """Seconds the cost model gives ``op`` at ``p``."""
    from blendsim.sim.ops import op_counts

    f = features(op, p)
    flops, nbytes, kernels = op_counts(timer.shapes, f)[op]
    return float(timer.op_time(op, flops, nbytes, kernels, f))


def validate(profile: Profile, model, device: str, n_points: int = 8, seed: int = 1, threads: int = 1,
             passes: int = 3, ops=None) -> dict:
    """Measure held-out points of every fitted operator; ``{op: {points, measured_s, predicted_s, rel_err}}``."""
    import torch

    from blendsim.calibrate.run import shard_deployment
    from blendsim.calibrate.timing import keep_freed_memory, pin_threads

    timer = ProfileTimer(profile, shard_deployment(model, profile.tp))
    threads_before = torch.get_num_threads()
    if device == "cpu":
        pin_threads(threads)
        keep_freed_memory()
        torch.set_flush_denormal(True)
    try:
        return _validate(profile, model, device, timer, n_points, seed, passes, ops)
    finally:
        torch.set_num_threads(threads_before)


def _validate(profile, model, device, timer, n_points, seed, passes, ops) -> dict:
    import torch

    from blendsim.calibrate.forward import ForwardProbe, longest_position, measure_plan
    from blendsim.calibrate.grids import heldout_points
    from blendsim.calibrate.timing import Clock

    rng = np.random.default_rng(seed)
    clock = Clock(device, budget_s=0.06, min_reps=6, max_reps=60)
    plan = {op: heldout_points(op, fit.grid, n_points, rng) for op, fit in sorted(profile.ops.items())
            if ops is None or op in ops}
    if model.dtype != profile.dtype:
        model = model.with_dtype(profile.dtype)
    with torch.inference_mode():
        probe = ForwardProbe(model, profile.tp, device, seed=seed, max_position=longest_position(plan),
                             prefer_backend=(profile.software or {}).get("attention_backend"))
        data = measure_plan(probe, clock, plan, passes, release=probe.release)
    out = {}
    for op, d in sorted(data.items()):
        meas = np.asarray(d.median_s)
        pred = np.asarray([predict(timer, op, tuple(p)) for p in d.grid])
        out[op] = {"points": d.grid, "measured_s": meas.tolist(), "predicted_s": pred.tolist(),
                   "rel_err": (np.abs(pred - meas) / meas).tolist()}
    return out


def holdout_errors(profile: Profile, model) -> dict:
    """Errors of the cost model at the held-out points a calibration measured alongside its grid.

    Same shape as :func:`validate`'s result; operators without stored held-out points are left out.
    """
    from blendsim.calibrate.run import shard_deployment

    timer = ProfileTimer(profile, shard_deployment(model, profile.tp))
    out = {}
    for op, fit in sorted(profile.ops.items()):
        h = (fit.fit or {}).get("holdout") or {}
        if not h.get("grid"):
            continue
        meas = np.asarray(h["median_s"], dtype=float)
        pred = np.asarray([predict(timer, op, tuple(p)) for p in h["grid"]])
        out[op] = {"points": h["grid"], "measured_s": meas.tolist(), "predicted_s": pred.tolist(),
                   "rel_err": (np.abs(pred - meas) / meas).tolist()}
    return out


def summary(result: dict) -> dict:
    """Median relative error per operator and over all points."""
    per_op = {op: float(np.median(r["rel_err"])) for op, r in result.items() if r["rel_err"]}
    every = np.concatenate([r["rel_err"] for r in result.values() if r["rel_err"]])
    return {"per_op": per_op, "all": float(np.median(every)), "n_points": int(every.size)}


__all__ = ["features", "holdout_errors", "predict", "summary", "validate"]
