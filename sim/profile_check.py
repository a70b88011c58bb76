"""Checks of every field of a calibration profile's JSON, run when it is loaded.

A profile is a file users copy between machines and may edit, so :func:`check_profile` refuses anything
the loader, the cost model or ``calibrate show`` could not use as written: a wrong type anywhere, a
domain that is inverted or does not cover every variable, a scale of zero, and polynomials that cannot
be operator times — not finite, over :data:`MAX_OP_S` anywhere in their domain, not positive at the
measured points (over the whole domain when the profile keeps no measurements), or not reproducing the
fit errors the profile reports for its measurements, which is how edited coefficients show. Each failure is one :class:`UserError` line naming the
file and the field.
"""

from __future__ import annotations

import math

import numpy as np

from blendsim.sim.errors import UserError

# No single operator call (one layer's GEMM or attention kernel) takes an hour; a polynomial that
# reaches it inside the range it was measured over is corrupt.
MAX_OP_S = 3600.0
MIN_EXP, MAX_EXP = -1, 6  # exponents the fitter writes are -1 (the x^-1 term) to 3
REL_TOL = 1e-6  # recomputed vs stored fit error: only float rounding may differ
FIT_NUMBERS = ("degree", "n_points", "median_rel_err", "max_rel_err", "heldout_median_rel_err", "selection_score")


def check_profile(d: dict, where: str, op_vars: dict, shape_keys: tuple, dtypes) -> None:
    """Raise :class:`UserError` for the first field of profile ``d`` (read from ``where``) that is unusable."""
    _str(d.get("model"), where, "model")
    if not isinstance(d.get("dtype"), str) or d["dtype"] not in dtypes:
        raise UserError(f"{where}: field 'dtype': {_short(d.get('dtype'))} is not one of {', '.join(sorted(dtypes))}")
    tp = d.get("tp")
    if not (_is_int(tp) and 1 <= tp <= 1024):
        raise UserError(f"{where}: field 'tp': {_short(tp)} must be a whole number in 1..1024")
    shape = d.get("model_shape")
    if shape in (None, {}):  # without it no run could be checked against the model the kernels were timed for
        raise UserError(f"{where}: field 'model_shape' is missing: a profile names the shape of the model its kernels "
                        f"were timed for ({', '.join(shape_keys)}); calibrate again, or add it")
    _dict(shape, where, "model_shape")
    for k in shape_keys:
        if not (_is_int(shape.get(k)) and shape[k] >= 1):
            raise UserError(f"{where}: field 'model_shape.{k}': {_short(shape.get(k))} must be a positive integer")
    for k in ("device", "software", "produced_by"):
        if d.get(k) is not None:
            _dict(d[k], where, k)
    for k in ("memory_bytes", "num_sms"):
        v = (d.get("device") or {}).get(k)
        if v is not None and not (_is_int(v) and v >= 0):
            raise UserError(f"{where}: field 'device.{k}': {_short(v)} must be a whole number >= 0")
    interf = d.get("interference")
    if interf is not None and not (_is_num(interf) and 0 <= interf <= 1):
        raise UserError(f"{where}: field 'interference' must be a number in [0, 1], not {_short(interf)}")
    if d.get("overlap") is not None:
        _dict(d["overlap"], where, "overlap")
        if "fit" in d["overlap"]:  # calibrate show reads it as an object
            _numbers_of(_dict(d["overlap"]["fit"], where, "overlap.fit"), where, "overlap.fit", FIT_NUMBERS)
    if d.get("hardware") is not None:
        hw = _dict(d["hardware"], where, "hardware")
        for k in ("peak_flops", "mem_bandwidth"):
            if k in hw and not (_is_num(hw[k]) and hw[k] > 0):
                raise UserError(f"{where}: field 'hardware.{k}': {_short(hw[k])} must be a positive number")
        _numbers_of(hw, where, "hardware", ("copy_bytes", "matmul_n"))
        if "peak_flops_dtype" in hw:
            _str(hw["peak_flops_dtype"], where, "hardware.peak_flops_dtype")
    skipped = d.get("skipped")
    if skipped is not None:
        if not isinstance(skipped, list):
            raise UserError(f"{where}: field 'skipped' must be a list of {{op, reason}} objects")
        for i, s in enumerate(skipped):
            at = f"skipped[{i}]"
            _dict(s, where, at)
            _str(s.get("op"), where, f"{at}.op")
            _str(s.get("reason"), where, f"{at}.reason")
            if s.get("point") is not None and not (isinstance(s["point"], list) and all(map(_is_num, s["point"]))):
                raise UserError(f"{where}: field '{at}.point' must be a list of numbers")
    ops = d.get("ops")
    if not isinstance(ops, dict):
        raise UserError(f"{where}: field 'ops' must be an object")
    for name, o in ops.items():
        if name not in op_vars:
            raise UserError(f"{where}: ops.{name}: unknown operator (known: {', '.join(op_vars)})")
        check_op(o, f"{where}: ops.{name}", op_vars[name])


def check_op(o, at: str, names: tuple) -> None:
    """One operator's fit: types and shapes first, then what its polynomial predicts over its domain."""
    if not isinstance(o, dict):
        raise UserError(f"{at}: must be an object")
    for k in ("vars", "terms", "coef", "scale", "domain"):
        if k not in o:
            raise UserError(f"{at}: missing field {k!r}")
    if o["vars"] != list(names):
        raise UserError(f"{at}: variables {_short(o['vars'])} should be {list(names)}")
    k = len(names)
    terms, coef, scale, domain = o["terms"], o["coef"], o["scale"], o["domain"]
    if isinstance(coef, list) and any(isinstance(x, float) and not math.isfinite(x) for x in coef):
        raise UserError(f"{at}: non-finite coefficient")
    if not (isinstance(coef, list) and coef and all(map(_is_num, coef))):
        raise UserError(f"{at}: malformed fit: coef must be a non-empty list of finite numbers")
    if not (isinstance(terms, list) and len(terms) == len(coef) and all(
            isinstance(t, list) and len(t) == k and all(_is_int(e) and MIN_EXP <= e <= MAX_EXP for e in t)
            for t in terms)):
        raise UserError(f"{at}: malformed fit: terms must be {len(coef)} lists (one per coefficient) of {k} whole exponents "
                        f"in {MIN_EXP}..{MAX_EXP}")
    if not (isinstance(scale, list) and len(scale) == k and all(_is_num(s) and s > 0 for s in scale)):
        raise UserError(f"{at}: malformed fit: scale must be {k} positive numbers, one per variable {list(names)}")
    if not (isinstance(domain, list) and len(domain) == k and all(
            isinstance(r, list) and len(r) == 2 and all(map(_is_num, r)) for r in domain)):
        raise UserError(f"{at}: malformed fit: domain must be {k} [low, high] pairs, one per variable {list(names)}")
    for v, (lo, hi) in zip(names, domain):
        if not 0 <= lo <= hi or hi <= 0:
            raise UserError(f"{at}: malformed fit: domain of {v} [{lo}, {hi}] must satisfy 0 <= low <= high and high > 0")
    for j, v in enumerate(names):
        if domain[j][0] == 0 and any(t[j] < 0 for t in terms):
            raise UserError(f"{at}: malformed fit: domain of {v} starts at 0 but a term divides by it")
    fit = o.get("fit", {})
    _numbers_of(_dict(fit, at, "fit"), at, "fit", FIT_NUMBERS)
    if "form" in fit and fit["form"] is not None:
        _str(fit["form"], at, "fit.form")
    grid, med = o.get("grid", []), o.get("median_s", [])
    for key in ("median_s", "p10_s", "p90_s"):
        v = o.get(key, [])
        if not (isinstance(v, list) and all(_is_num(x) and x > 0 for x in v)):
            raise UserError(f"{at}: malformed fit: {key} must be a list of positive times (seconds)")
        if key != "median_s" and v and len(v) != len(med):
            raise UserError(f"{at}: malformed fit: {key} has {len(v)} values for {len(med)} median times")
    if not (isinstance(grid, list) and all(isinstance(r, list) and len(r) == k and all(map(_is_num, r))
                                           for r in grid)):
        raise UserError(f"{at}: malformed fit: grid must be a list of points of {k} numbers")
    if grid and len(grid) != len(med):
        raise UserError(f"{at}: malformed fit: grid has {len(grid)} points for {len(med)} median times")
    h = fit.get("holdout")
    if h is not None:
        _numbers_of(_dict(h, at, "fit.holdout"), at, "fit.holdout", ("median_rel_err", "max_rel_err"))
        if not isinstance(h.get("grid", []), list):
            raise UserError(f"{at}: field 'fit.holdout.grid' must be a list")
    _check_values(at, names, np.asarray(terms, dtype=float), np.asarray(coef, dtype=float),
                  np.asarray(scale, dtype=float), domain, grid, med, fit)


def _check_values(at, names, e, c, scale, domain, grid, med, fit) -> None:
    lo = np.array([r[0] for r in domain], dtype=float) / scale
    hi = np.array([r[1] for r in domain], dtype=float) / scale
    # each monomial is monotone in each variable, so its largest value on the box is at a corner
    corners = np.array(np.meshgrid(*[[a, b] for a, b in zip(lo, hi)], indexing="ij")).reshape(len(lo), -1).T
    with np.errstate(all="ignore"):
        bound = float(np.abs(c) @ _monomials(corners, e).max(axis=0))
    if not bound <= MAX_OP_S:
        raise UserError(f"{at}: coef: the polynomial reaches {bound:.3g} s inside its domain (over {MAX_OP_S:.0f} s "
                        "for one operator call: corrupt coefficients)")
    # positive times where it was measured; without measurements, everywhere over its domain (NOTE: not
    # both: the fitter's straight-line fallback for a few points may dip below zero between them, where
    # OpFit.predict's floor holds)
    pts = np.asarray(grid, dtype=float) / scale if grid else _dense(domain, scale)
    y = _monomials(pts, e) @ c
    if not np.all(y > 0):
        i = int(np.argmin(y))
        raise UserError(f"{at}: coef: the polynomial gives {float(y[i]):.3g} s (not a positive time) at "
                        f"{[float(v) for v in pts[i] * scale]}")
    stored = fit.get("max_rel_err")
    if grid and _is_num(stored):
        x = np.asarray(grid, dtype=float) / scale
        pred = _monomials(x, e) @ c
        err = float(np.max(np.abs(pred - np.asarray(med)) / np.asarray(med)))
        if err > stored * (1 + REL_TOL) + 1e-12:
            raise UserError(f"{at}: coef: the coefficients miss the profile's own measurements by up to "
                            f"{100 * err:.3g}%, but its fit reports {100 * stored:.3g}% (edited or corrupt)")


def _monomials(z: np.ndarray, e: np.ndarray) -> np.ndarray:
    return np.prod(z[:, None, :] ** e[None, :, :], axis=-1)


def _dense(domain, scale, n: int = 64) -> np.ndarray:
    """The fitter's positivity grid (calibrate.fit._dense): n points per variable over the domain."""
    axes = [np.geomspace(max(lo, 1e-3), hi, n) / s if hi > lo else np.array([lo / s])
            for (lo, hi), s in zip(domain, scale)]
    axes = [np.concatenate(([0.0], a)) if lo == 0 else a for a, (lo, _) in zip(axes, domain)]
    return np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")], axis=-1)


# ---- small type checks --------------------------------------------------------------------
def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int too large for a float
        return False


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _dict(v, where: str, field: str) -> dict:
    if not isinstance(v, dict):
        raise UserError(f"{where}: field '{field}' must be an object, not {_short(v)}")
    return v


def _str(v, where: str, field: str) -> None:
    if not isinstance(v, str):
        raise UserError(f"{where}: field '{field}' must be a string, not {_short(v)}")


def _numbers_of(d: dict, where: str, field: str, keys) -> None:
    for k in keys:
        if d.get(k) is not None and not _is_num(d[k]):
            raise UserError(f"{where}: field '{field}.{k}' must be a number, not {_short(d[k])}")


__all__ = ["MAX_OP_S", "check_op", "check_profile"]
