"""Fitting operator times with polynomials: relative-error least squares, degree chosen held out.

Kernel times span three or more decades over a grid (a GEMM takes microseconds at one token and
milliseconds at thousands), and the cost model is judged by relative error. An unweighted fit would
spend its freedom on the largest times and miss the small ones by 100% or more, so each row is
weighted by 1/y: the residual becomes ``(p(x) - y) / y``, the relative error itself. (A log-space fit
would do the same but give ``exp(poly(log x))``, which the profile schema's plain polynomials cannot
hold.) Timing noise is roughly multiplicative too, so equal weights in relative terms are also the
right noise model. A soft-L1 loss then keeps one disturbed point (a CPU time slice lost to another
process) from bending the curve. For one variable, rows are also weighted by the log-width of the grid
they stand for (:func:`density_weights`), so each decade of token counts counts equally however densely
it was sampled (Vidur's grid has 224 of its 259 points above 256 tokens).

Variables are scaled by their largest measured value (``scale``), so every monomial lies in [0, 1] and
the normal equations stay well conditioned. Candidate forms are the polynomials of degree 1-3 (total
degree for two variables) and, for one variable whose domain starts at 1 or more, the same plus an
``x^-1`` term: small GEMMs on CPUs rise steeply over the first few tokens (a matrix-vector kernel at
one token, packing costs amortised over the next ones) and then grow linearly, a concave start no
low-degree polynomial in ``x`` can follow (it misses 1-16 tokens by 20-50%), while ``a + b x - c / x``
does. ``OpFit`` evaluates such a term as it is (``x`` is clamped to the domain, so never 0).

Selection: the grid's corner points always stay in training (held-out error then measures
interpolation, which is how the cost model uses a fit; beyond the domain it scales linearly, see
``blendsim.sim.profile.OpFit.predict``); the other points are split into k interleaved folds. A form's score is
the (density-weighted) mean relative error over the folds' held-out points and the corners' in-sample
errors, each capped at 100%: a mean, so that a form missing a whole region counts (the one-token
matrix-vector GEMM is a corner, 2x faster than two tokens on CPUs), and capped, so that one disturbed
point does not decide.
The form chosen has the fewest terms among those within 10% (+0.5 points) of the best score and that
stay positive across their domain. The reported held-out error is the median over the folds.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
from scipy.optimize import least_squares

from blendsim.sim.profile import OP_VARS, OpFit, Profile

MAX_DEGREE = 3
FOLDS = 5
SOFT_L1_SCALE = 0.05  # relative residual where the loss turns from quadratic to linear
METHOD = "weighted least squares on relative error (rows / y), soft-L1 refinement; degree by k-fold held-out error"


def monomials(n_vars: int, degree: int) -> list[tuple[int, ...]]:
    """Exponent tuples of all monomials of total degree <= ``degree``, lowest first."""
    terms = [e for e in itertools.product(range(degree + 1), repeat=n_vars) if sum(e) <= degree]
    return sorted(terms, key=lambda e: (sum(e), tuple(-x for x in e)))


def design(z: np.ndarray, terms) -> np.ndarray:
    """Monomial matrix: one row per point of scaled variables ``z`` (n, k), one column per term."""
    e = np.asarray(terms, dtype=float)
    return np.prod(z[:, None, :] ** e[None, :, :], axis=-1)


def solve(a: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """Coefficients minimising the soft-L1 loss of the weighted relative residuals ``sqrt(w) (a c - y) / y``."""
    sw = np.ones(len(y)) if w is None else np.sqrt(w)
    aw = a * (sw / y)[:, None]
    c0, *_ = np.linalg.lstsq(aw, sw, rcond=None)
    if len(y) <= a.shape[1]:
        return c0
    res = least_squares(lambda c: aw @ c - sw, c0, jac=lambda c: aw, loss="soft_l1", f_scale=SOFT_L1_SCALE,
                        method="trf", x_scale="jac")
    return res.x


def density_weights(x: np.ndarray) -> np.ndarray:
    """Per-point weights giving each decade of a one-variable grid equal say (mean 1); 1s otherwise.

    A grid that is dense where a curve bends (around GEMM tile boundaries) or linear at its top end
    would otherwise let that stretch outvote the rest: each point weighs the log-width it stands for.
    """
    n, k = x.shape
    if k != 1 or n < 3 or x.min() <= 0:
        return np.ones(n)
    order = np.argsort(x[:, 0])
    w = np.empty(n)
    w[order] = np.maximum(np.gradient(np.log(x[order, 0])), 1e-9)
    return w / w.mean()


def rel_err(pred, y) -> np.ndarray:
    return np.abs(np.asarray(pred, dtype=float) - y) / y


def forms(n_vars: int, low: float, max_degree: int = MAX_DEGREE) -> dict[str, list]:
    """Candidate term lists by name, simplest first: ``"2"`` (degree 2), ``"2+1/x"`` (with x^-1)."""
    out = {}
    for d in range(1, max_degree + 1):
        out[str(d)] = monomials(n_vars, d)
        if n_vars == 1 and low >= 1:
            out[f"{d}+1/x"] = [(-1,)] + monomials(1, d)
    return dict(sorted(out.items(), key=lambda kv: (len(kv[1]), "/" in kv[0])))


def fit_op(op: str, grid, median_s, p10_s=(), p90_s=(), max_degree: int = MAX_DEGREE, folds: int = FOLDS) -> OpFit:
    """Fit ``op``'s times ``median_s`` measured at ``grid`` (rows of OP_VARS[op] values) and keep the data."""
    names = OP_VARS[op]
    x = np.asarray(grid, dtype=float).reshape(len(median_s), len(names))
    y = np.asarray(median_s, dtype=float)
    if len(y) < 3 or not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError(f"{op}: need at least 3 positive finite times, got {len(y)}")
    scale = [float(max(v, 1.0)) for v in x.max(axis=0)]
    domain = [[float(lo), float(hi)] for lo, hi in zip(x.min(axis=0), x.max(axis=0))]
    z = x / np.asarray(scale)
    w = density_weights(x)
    cands = forms(len(names), float(x.min()), max_degree)
    scores = _cv_scores(z, y, w, cands, folds, domain, scale)
    if not scores:  # too few points for held-out selection: the straight line, if it stays a time
        form, held = "1", None
        line = solve(design(z, cands[form]), y, w)
        if np.min(design(_dense(domain, scale), cands[form]) @ line) <= 0:
            form = "0"  # it dips below zero inside the domain (a profile check refuses that): a constant
            cands = {**cands, "0": [tuple([0] * len(names))]}
    else:
        best = min(v[0] for v in scores.values())
        form = next(k for k, v in scores.items() if v[0] <= 1.1 * best + 0.005)
        held = scores[form][1]
    terms = cands[form]
    coef = solve(design(z, terms), y, w)
    err = rel_err(design(z, terms) @ coef, y)
    fit = {"degree": int(form.split("+")[0]), "form": form, "median_rel_err": float(np.median(err)),
           "max_rel_err": float(err.max()), "heldout_median_rel_err": held, "n_points": int(len(y)),
           "method": METHOD, "selection_score": scores[form][0] if scores else None,
           "heldout_by_form": {k: v[1] for k, v in scores.items()}}
    return OpFit(op=op, vars=names, terms=[list(t) for t in terms], coef=[float(c) for c in coef], scale=scale,
                 domain=domain, fit=fit, grid=[[_num(v) for v in row] for row in x],
                 median_s=[float(v) for v in y], p10_s=[float(v) for v in p10_s], p90_s=[float(v) for v in p90_s])


def attach_holdout(fit: OpFit, grid, median_s, p10_s=(), p90_s=()) -> OpFit:
    """Store points measured with the grid but kept out of the fit, and the fit's error at them."""
    if len(median_s):
        x = np.asarray(grid, dtype=float).reshape(len(median_s), len(fit.vars))
        y = np.asarray(median_s, dtype=float)
        err = rel_err(fit.predict(*x.T), y)
        fit.fit["holdout"] = {"grid": [[_num(v) for v in row] for row in x], "median_s": [float(v) for v in y],
                              "p10_s": [float(v) for v in p10_s], "p90_s": [float(v) for v in p90_s],
                              "median_rel_err": float(np.median(err)), "max_rel_err": float(err.max())}
    return fit


def refit(profile: Profile, **kw) -> Profile:
    """The profile with every operator refitted from its stored grid and raw medians."""
    ops = {}
    for name, f in profile.ops.items():
        new = fit_op(name, f.grid, f.median_s, f.p10_s, f.p90_s, **kw)
        h = (f.fit or {}).get("holdout")
        if h:
            attach_holdout(new, h["grid"], h["median_s"], h.get("p10_s", ()), h.get("p90_s", ()))
        ops[name] = new
    return replace(profile, ops=ops)


# ---- internals ----------------------------------------------------------------------------
def _num(v: float):
    return int(v) if float(v).is_integer() else float(v)


def _cv_scores(z, y, w, cands: dict, folds, domain, scale) -> dict[str, tuple[float, float]]:
    """Per admissible form: (selection score, held-out median relative error); see the module doc."""
    lo, hi = z.min(axis=0), z.max(axis=0)
    corner = np.all(np.isclose(z, lo) | np.isclose(z, hi), axis=1)
    free = np.flatnonzero(~corner)
    n_folds = min(folds, len(free))
    if n_folds < 2:
        return {}
    fold_of = np.full(len(y), -1)
    fold_of[free] = np.arange(len(free)) % n_folds  # interleaved: every fold spans the range
    dense = _dense(domain, scale)
    scores = {}
    for name, terms in cands.items():
        if len(y) - int(np.ceil(len(free) / n_folds)) < len(terms) + 2:
            continue
        a = design(z, terms)
        errs = []
        for f in range(n_folds):
            train = fold_of != f
            c = solve(a[train], y[train], w[train])
            errs.append(rel_err(a[~train] @ c, y[~train]))
        c_all = solve(a, y, w)
        if np.min(design(dense, terms) @ c_all) <= 0.5 * y.min():
            continue  # dips towards zero between grid points: not a usable time model
        held = np.concatenate(errs)
        pool = np.concatenate([held, rel_err(a[corner] @ c_all, y[corner])])
        pw = np.concatenate([np.concatenate([w[fold_of == f] for f in range(n_folds)]), w[corner]])
        scores[name] = (float(np.average(np.minimum(pool, 1.0), weights=pw)), float(np.median(held)))
    return scores


def _dense(domain, scale, n: int = 64) -> np.ndarray:
    """A dense grid over the domain, in scaled variables (positivity check)."""
    axes = [np.geomspace(max(lo, 1e-3), hi, n) / s if hi > lo else np.array([lo / s])
            for (lo, hi), s in zip(domain, scale)]
    if any(lo == 0 for lo, _ in domain):
        axes = [np.concatenate(([0.0], a)) if lo == 0 else a for a, (lo, _) in zip(axes, domain)]
    return np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")], axis=-1)


__all__ = ["METHOD", "attach_holdout", "density_weights", "fit_op", "forms", "monomials", "refit", "rel_err", "solve"]
