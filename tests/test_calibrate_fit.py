"""Calibration internals without timing noise: fitting, refitting, interference, OOM handling, grids."""

from __future__ import annotations

import json

import numpy as np
import pytest

from blendsim.calibrate import grids
from blendsim.calibrate.fit import fit_op, forms, monomials, refit
from blendsim.calibrate.grids import heldout_points
from blendsim.calibrate.measure import measure_op
from blendsim.calibrate.overlap import fit_interference
from blendsim.calibrate.timing import Clock, Timing, is_oom, summarize
from blendsim.sim.profile import OpFit, Profile, load_profile

TOKENS = grids.token_grid("cpu", quick=True)


def _profile(ops: dict) -> Profile:
    from blendsim.sim.models import get_model
    from blendsim.sim.profile import model_shape

    return Profile(model="tiny", model_shape=model_shape(get_model("tiny")), dtype="fp32", tp=1, ops=ops)


# ---- fitting ------------------------------------------------------------------------------
def test_monomials_and_forms():
    assert monomials(1, 3) == [(0,), (1,), (2,), (3,)]
    assert sorted(monomials(2, 2)) == sorted([(0, 0), (1, 0), (0, 1), (2, 0), (1, 1), (0, 2)])
    f1 = forms(1, low=1)
    assert list(f1)[:3] == ["1", "2", "1+1/x"]  # fewest terms first, plain before 1/x on a tie
    assert f1["2+1/x"] == [(-1,), (0,), (1,), (2,)]
    assert not any("/" in k for k in forms(1, low=0))  # no 1/x term where the variable can be 0
    assert list(forms(2, low=0)) == ["1", "2", "3"]


def test_linear_times_recovered_exactly_with_relative_errors_tiny():
    t = np.asarray(TOKENS, dtype=float)
    y = 20e-6 + 3e-6 * t  # 23 us .. 3 ms: two decades
    f = fit_op("o_proj", [[v] for v in t], y)
    assert f.fit["form"] == "1"
    assert f.fit["max_rel_err"] < 1e-9 and f.fit["heldout_median_rel_err"] < 1e-9
    assert f.predict(7.0) == pytest.approx(20e-6 + 21e-6, rel=1e-9)
    assert f.vars == ("tokens",) and f.domain == [[1.0, 1024.0]] and f.scale == [1024.0]


def test_small_times_are_fitted_as_well_as_large_ones():
    # a quadratic over 3.5 decades: an unweighted fit would miss the microsecond end badly
    t = np.asarray(TOKENS, dtype=float)
    y = 5e-6 + 1e-7 * t + 4e-9 * t * t
    f = fit_op("act", [[v] for v in t], y)
    err = np.abs(f.predict(t) - y) / y
    assert err.max() < 1e-6
    assert f.fit["form"] == "2"


def test_concave_start_selects_the_inverse_term():
    # a + b t - c / t: a steep rise over the first tokens, then linear (CPU GEMMs)
    t = np.asarray(TOKENS, dtype=float)
    y = 100e-6 + 10e-6 * t - 50e-6 / t
    f = fit_op("qkv_proj", [[v] for v in t], y)
    assert "1/x" in f.fit["form"] and [-1] in f.terms
    for x in (1, 5, 37, 700):
        assert f.predict_scalar(x) == pytest.approx(100e-6 + 10e-6 * x - 50e-6 / x, rel=1e-6)


def test_two_variable_attention_fit():
    pts = grids.prefill_grid("cpu", quick=True)
    n, c = np.asarray(pts, dtype=float).T
    y = 8e-6 + 2e-8 * n + 3e-10 * n * (c + n / 2)  # launch + per token + per (query, key) pair
    f = fit_op("attn_prefill", pts, y)
    assert f.fit["degree"] == 2 and f.fit["max_rel_err"] < 1e-6
    assert f.predict(100, 1000) == pytest.approx(8e-6 + 2e-6 + 3e-10 * 100 * 1050, rel=1e-6)


def test_noisy_outlier_does_not_bend_the_fit():
    t = np.asarray(TOKENS, dtype=float)
    rng = np.random.default_rng(0)
    truth = 40e-6 + 5e-6 * t
    y = truth * np.exp(rng.normal(0, 0.02, t.size))
    y[9] *= 3.0  # one point measured while the host was busy
    f = fit_op("down_proj", [[v] for v in t], y)
    err = np.abs(f.predict(t) - truth) / truth
    assert np.median(err) < 0.03 and np.delete(err, 9).max() < 0.1


def test_fit_rejects_unusable_data():
    with pytest.raises(ValueError):
        fit_op("norm", [[1], [2]], [1e-6, 2e-6])
    with pytest.raises(ValueError):
        fit_op("norm", [[1], [2], [3]], [1e-6, -2e-6, 3e-6])


def test_refit_reproduces_coefficients_from_the_stored_raw_medians(tmp_path):
    rng = np.random.default_rng(3)
    t = np.asarray(TOKENS, dtype=float)
    tok = fit_op("gate_up_proj", [[v] for v in t], (30e-6 + 7e-6 * t) * np.exp(rng.normal(0, 0.05, t.size)))
    pts = grids.decode_grid("cpu", quick=True)
    b, c = np.asarray(pts, dtype=float).T
    dec = fit_op("attn_decode", pts, (5e-6 + 1e-6 * b + 2e-10 * b * c) * np.exp(rng.normal(0, 0.05, b.size)))
    path = _profile({"gate_up_proj": tok, "attn_decode": dec}).save(tmp_path / "p.json")
    loaded = load_profile(path)
    again = refit(loaded)
    for op, before in (("gate_up_proj", tok), ("attn_decode", dec)):
        after = again.ops[op]
        assert after.terms == before.terms
        np.testing.assert_allclose(after.coef, before.coef, rtol=1e-9, atol=0)
        assert after.fit["form"] == before.fit["form"]


# ---- interference -------------------------------------------------------------------------
@pytest.mark.parametrize("kappa", [0.0, 0.15, 0.6, 1.0])
def test_interference_fit_recovers_kappa(kappa):
    rng = np.random.default_rng(1)
    a = rng.uniform(1e-4, 5e-3, 12)
    b = rng.uniform(1e-4, 5e-3, 12)
    ab = np.maximum(a, b) + kappa * np.minimum(a, b)
    fit = fit_interference(a, b, ab)
    assert fit["kappa"] == pytest.approx(kappa, abs=1e-9)
    assert fit["median_rel_err"] < 1e-9 and fit["n_points"] == 12


def test_interference_is_clipped_to_the_schema_range_and_keeps_the_raw_value():
    a, b = np.array([1e-3, 2e-3, 3e-3]), np.array([1e-3, 1e-3, 1e-3])
    slower = fit_interference(a, b, a + 1.3 * b)  # contention: worse than running one after the other
    assert slower["kappa"] == 1.0 and slower["kappa_raw"] == pytest.approx(1.3)
    faster = fit_interference(a, b, np.maximum(a, b) * 0.97)  # noise below perfect overlap
    assert faster["kappa"] == 0.0 and faster["kappa_raw"] < 0


# ---- measurement: out-of-memory points ----------------------------------------------------
class _OOM(RuntimeError):
    pass


def test_is_oom():
    import torch

    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory"))
    assert is_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert is_oom(MemoryError())
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("out of memory"))


def test_oom_point_is_skipped_recorded_and_the_run_carries_on():
    calls = []

    def build(p):
        if p == (64,):
            raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 8 GB")
        return lambda: calls.append(p)

    released = []
    skipped = []
    clock = Clock("cpu", budget_s=1e-3, min_reps=3, max_reps=3)
    data = measure_op(clock, "qkv_proj", [(8,), (64,), (512,)], build, passes=2, skipped=skipped,
                      release=lambda: released.append(1))
    assert data.grid == [[8], [512]] and len(data.median_s) == 2
    assert skipped == [{"op": "qkv_proj", "point": [64],
                        "reason": "out of memory (RuntimeError: DefaultCPUAllocator: not enough memory: you tried "
                                  "to allocate 8 GB)"}]
    assert released == [1]  # freed once; the point is not retried in the second pass
    assert (64,) not in calls and (8,) in calls and (512,) in calls


def test_other_errors_are_not_swallowed():
    def build(p):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes"):
        measure_op(Clock("cpu"), "o_proj", [(8,)], build)


def test_summarize_and_clock():
    t = summarize([3.0, 1.0, 2.0, 10.0, 2.0])
    assert t == Timing(2.0, pytest.approx(1.4), pytest.approx(7.2), 5)
    c = Clock("cpu", budget_s=0.01, min_reps=4, max_reps=50)
    n = c.reps_for(lambda: sum(range(1000)))
    assert 4 <= n <= 50
    assert len(c.samples(lambda: None, 7)) == 7


# ---- grids and held-out points ------------------------------------------------------------
def test_gpu_grid_is_dense_small_and_around_tile_boundaries():
    g = grids.token_grid("cuda", quick=False)
    assert g == sorted(set(g)) and g[0] == 1 and g[-1] == 16384
    assert all(m in g and m - 8 in g and m + 8 in g for m in range(128, 2049, 128))
    assert sum(t <= 128 for t in g) >= 18
    q = grids.token_grid("cuda", quick=True)
    assert len(q) < len(g) / 3 and q[-1] == 16384
    assert grids.token_grid("cpu", quick=True)[-1] <= grids.token_grid("cpu", quick=False)[-1]


def test_attention_grids_respect_their_kv_caps():
    for dev in ("cpu", "cuda"):
        for quick in (True, False):
            dec = grids.decode_grid(dev, quick)
            assert max(b * c for b, c in dec) <= (1 << 21 if dev == "cuda" else 1 << 17)
            assert len({b for b, _ in dec}) >= 4 and len({c for _, c in dec}) >= 4
            pre = grids.prefill_grid(dev, quick)
            assert any(c == 0 for _, c in pre) and len(pre) >= 20


def test_heldout_points_are_off_grid_and_inside_the_domain():
    rng = np.random.default_rng(0)
    tok = [(t,) for t in TOKENS]
    pts = heldout_points("qkv_proj", tok, 8, rng)
    assert len(pts) == 8 and not set(pts) & set(tok) and all(1 < p[0] < 1024 for p in pts)
    dec = grids.decode_grid("cpu", True)
    hp = heldout_points("attn_decode", dec, 10, rng)
    assert len(hp) == 10 and not set(hp) & set(dec)
    assert all(1 <= b <= 48 and 16 <= c <= 2048 and b * c <= max(x * y for x, y in dec) for b, c in hp)


def test_profile_json_keeps_inverse_terms(tmp_path):
    t = np.asarray(TOKENS, dtype=float)
    f = fit_op("lm_head", [[v] for v in t], 100e-6 + 10e-6 * t - 60e-6 / t)
    p = _profile({"lm_head": f}).save(tmp_path / "p.json")
    raw = json.loads(p.read_text())
    assert [-1] in raw["ops"]["lm_head"]["terms"]
    g = load_profile(p).ops["lm_head"]
    assert isinstance(g, OpFit) and g.predict_scalar(3) == pytest.approx(f.predict_scalar(3), rel=1e-12)
