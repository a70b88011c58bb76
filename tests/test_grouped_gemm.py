"""The grouped (MoE expert) GEMM's K law (``blendsim.sim.timers.GROUPED_K0``) against the H100 GPU day's
measurements (docs/gpu-days/2026-11-26-h100/moe_gemm.json, benchmarks/gpu_moe_gemm.py), and how the cost model
applies it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from blendsim.sim.deployment import make_deployment
from blendsim.sim.ops import Shapes
from blendsim.sim.timers import GROUPED_K0, RooflineTimer, grouped_k_factors
from tests.helpers import load_benchmark

DAY = Path(__file__).resolve().parents[1] / "docs" / "gpu-days" / "2026-11-26-h100" / "moe_gemm.json"


@pytest.fixture(scope="module")
def G():
    return load_benchmark("gpu_moe_gemm")


@pytest.fixture(scope="module")
def fits(G):
    return G.analyse(DAY)


@pytest.mark.parametrize("prec, key", [("bf16", "16-bit"), ("fp8", "low-precision")])
def test_shipped_k0_is_what_the_measurements_fit(fits, prec, key):
    # the constant in sim/timers.py is the fit of the committed measurements, not a hand-set number
    assert fits[prec]["k_law"]["K0"] == pytest.approx(GROUPED_K0[key], rel=0.03)


@pytest.mark.parametrize("prec", ["bf16", "fp8"])
def test_the_k_law_explains_the_measured_grouped_gemms(fits, prec):
    with_k, without = fits[prec]["k_law"], fits[prec]["no_k_law"]
    assert with_k["points"] >= 150
    # the form with the K law follows the measurements, and much better than without it
    assert with_k["median_err"] < 0.08 and with_k["p90_err"] < 0.25
    assert with_k["median_err"] < 0.7 * without["median_err"]
    assert with_k["p90_err"] < 0.7 * without["p90_err"]


def test_measured_small_k_is_slow_in_the_raw_data():
    # the raw timings, without any model: at 1,024 rows per expert and N = 4,096 the bf16 grouped GEMM's rate
    # falls steadily as K shrinks, and FP8 at K = 96 is no faster than bf16
    sweep = json.loads(DAY.read_text())["sweep"]
    cell = {(r["N"], r["K"], r["rows_per_expert"]): r for r in sweep}
    rate = [cell[(4096, k, 1024)]["flops"] / cell[(4096, k, 1024)]["grouped_s"] for k in (96, 256, 1024, 4096)]
    assert all(a < b for a, b in zip(rate, rate[1:]))
    assert rate[0] < 0.35 * rate[-1]
    c = cell[(4096, 96, 1024)]
    assert c["fp8_grouped_s"] > 0.9 * c["grouped_s"]


def test_factors_by_shape_and_precision():
    d = make_deployment("qwen3-30b-a3b", "h100-80gb", tp=1)
    f = grouped_k_factors(Shapes.of(d), low_precision=False)
    assert f["moe_gate_up"] == pytest.approx(1 + 184 / 2048)
    assert f["moe_down"] == pytest.approx(1 + 184 / 768)
    # TP-sharded experts have a shorter K: a larger factor on the down GEMM only
    f4 = grouped_k_factors(Shapes.of(make_deployment("qwen3-30b-a3b", "h100-80gb", tp=4)), low_precision=False)
    assert f4["moe_gate_up"] == pytest.approx(f["moe_gate_up"])
    assert f4["moe_down"] == pytest.approx(1 + 184 / 192)
    assert grouped_k_factors(Shapes.of(make_deployment("llama-3-8b", "h100-80gb", tp=1)), False) == {}


def test_the_timer_picks_k0_by_the_tensor_cores_the_gemm_runs_on():
    fp8_hopper = RooflineTimer(make_deployment("qwen3-30b-a3b", "h100-80gb", tp=1, weights="fp8"))
    assert fp8_hopper.grouped_k["moe_down"] == pytest.approx(1 + GROUPED_K0["low-precision"] / 768)
    # FP8 weights on an A100 are dequantised to 16-bit in the main loop: the 16-bit constant
    fp8_ampere = RooflineTimer(make_deployment("qwen3-30b-a3b", "a100-80gb", tp=1, weights="fp8"))
    assert fp8_ampere.grouped_k["moe_down"] == pytest.approx(1 + GROUPED_K0["16-bit"] / 768)


@pytest.mark.parametrize("hw, weights, key", [
    ("h100-80gb", "fp8", "low-precision"), ("h100-80gb", "fp4", "16-bit"), ("h100-80gb", "int4", "16-bit"),
    ("h100-80gb", "bf16", "16-bit"), ("a100-80gb", "fp8", "16-bit"), ("b200", "fp4", "low-precision"),
    ("b200", "fp8", "low-precision"),
])
def test_fitted_timers_keep_the_devices_precision_rule(hw, weights, key):
    # the fitted timer rescales its low-precision rate after the roofline's set-up; the K0 it uses must still
    # follow the tensor cores the expert GEMMs run on (FP4 on Hopper and INT4 are dequantised to 16-bit)
    from blendsim.sim.efficiency import Efficiency, EfficiencyTimer
    from blendsim.sim.engines import load_params

    d = make_deployment("qwen3-30b-a3b", hw, tp=1, weights=weights)
    t = EfficiencyTimer(d, Efficiency.lookup(load_params(), "cuda-graph", hw))
    assert t.grouped_k["moe_down"] == pytest.approx(1 + GROUPED_K0[key] / 768)


def test_expert_gemms_cost_more_and_dense_gemms_do_not_change(monkeypatch):
    import blendsim.sim.timers as T
    from blendsim.sim.batch import features_arrays

    d = make_deployment("qwen3-30b-a3b", "h100-80gb", tp=1)
    f = features_arrays(num_tokens=[4096.0], num_prefill_tokens=[4096.0], num_prefill_seqs=[1.0])
    with_k = RooflineTimer(d)
    monkeypatch.setattr(T, "grouped_k_factors", lambda s, low_precision: {})
    without = RooflineTimer(d)
    for op in ("moe_down", "qkv_proj"):
        args = (op, np.array([1e12]), np.array([1e9]), np.array([1.0]), f)
        ratio = float(with_k.op_time(*args)[0] / without.op_time(*args)[0])
        if op == "moe_down":
            assert 1.05 < ratio <= 1 + 184 / 768 + 1e-9
        else:
            assert ratio == pytest.approx(1.0)


def test_cpu_path_writes_every_section(G, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "m.json"
    assert G.main(["--device", "cpu", "--small", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["moe"] and data["sweep"] and data["fp8"] == []  # FP8 kernels need CUDA
    assert all(r["gate_up_grouped_s"] > 0 and r["down_dense_s"] > 0 for r in data["moe"])
    with pytest.raises(SystemExit, match="exists"):
        G.main(["--device", "cpu", "--small", "-o", str(out)])
