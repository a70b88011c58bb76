"""Which all-reduce a tensor-parallel step runs (issue 24, "the TP all-reduce implementation: custom vs NCCL"):
each engine's own kernel up to its buffer's limit, priced at the link, and NCCL above it, priced by the GPU's
measured NCCL curve where one is cited (8 x A100, 4 and 8 x H100 over NVSwitch; H200 as H100)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from blendsim.sim.batch import BatchFeatures
from blendsim.sim.build_cost import build_cost_model
from blendsim.sim.deployment import make_deployment
from blendsim.sim.engines import CUSTOM_ALLREDUCE, CUSTOM_ALLREDUCE_SOURCES, PROFILES, VERSIONS, get_profile
from blendsim.sim.hardware import NCCL_ALLREDUCE, PRESETS
from blendsim.sim.ops import op_counts
from blendsim.sim.timers import RooflineTimer, nccl_allreduce_s

CURVES = PRESETS["a100-80gb"].nccl_allreduce
CURVE = dict(CURVES)[8]
HIDDEN_70B = 8192  # llama-3-70b: one all-reduce message is tokens x 8192 x 2 bytes


def _allreduce(timer, f):
    flops, nbytes, kernels = op_counts(timer.shapes, f)["allreduce"]
    return float(timer.op_time("allreduce", flops, nbytes, kernels, f)), float(nbytes), float(kernels)


def _link(timer, nbytes, kernels):
    return kernels * timer.link_lat + timer.ar_factor * nbytes / timer.link_bw


def test_the_curve_returns_the_measurements_at_eight_gpus_and_scales_as_a_ring():
    assert [m for m, _ in CURVES] == [8] and PRESETS["a100-40gb"].nccl_allreduce == CURVES
    for b, s in CURVE:
        assert nccl_allreduce_s(CURVES, 8, b) == pytest.approx(s, rel=1e-9)
    sizes = [2 ** k for k in range(15, 36)]  # from the first point up: the floor is flat below it
    times = [float(nccl_allreduce_s(CURVES, 8, b)) for b in sizes]
    assert all(b > a for a, b in zip(times, times[1:]))  # more bytes never cost less
    assert nccl_allreduce_s(CURVES, 8, 8) == pytest.approx(CURVE[0][1])  # the latency floor below the first point
    last_b, last_s = CURVE[-1]
    assert nccl_allreduce_s(CURVES, 8, 4 * last_b) == pytest.approx(4 * last_s)  # the last point's bandwidth above it
    # a ring of t GPUs: 2(t - 1) steps of 1/t chunks, i.e. (t - 1)/7 of eight GPUs' time on a message 8/t as large,
    # but never under the measured latency floor
    for t in (2, 4):
        for b in (64e3, 3e6, 40e6):
            ring = (t - 1) / 7 * nccl_allreduce_s(CURVES, 8, 8 * b / t)
            assert nccl_allreduce_s(CURVES, t, b) == pytest.approx(max(ring, CURVE[0][1]))
    assert nccl_allreduce_s(CURVES, 2, 64e3) == pytest.approx(CURVE[0][1])  # 1/7 of the ring would be 6.5 us
    assert nccl_allreduce_s(CURVES, 2, 40e6) > 2 * CURVE[0][1]
    # arrays price element by element
    measured = dict(CURVE)
    arr = nccl_allreduce_s(CURVES, 8, [2**20, 2**23])
    assert arr[0] == pytest.approx(measured[2**20]) and arr[1] == pytest.approx(measured[2**23])
    assert measured[2**20] == pytest.approx(76.71e-6) and measured[2**23] == pytest.approx(185.8e-6)  # the log's rows
    # NCCL's mid-size messages cost far more than the link's bandwidth alone: why the limit matters
    assert nccl_allreduce_s(CURVES, 8, 8e6) > 3 * 1.75 * 8e6 / PRESETS["a100-80gb"].link_bandwidth


def test_a_measured_gpu_count_prices_as_measured_and_others_scale_from_the_next_larger():
    four, eight = ((1e3, 10e-6), (1e9, 5e-3)), ((1e3, 20e-6), (1e9, 8e-3))
    curves = ((4, four), (8, eight))
    assert nccl_allreduce_s(curves, 4, 1e9) == pytest.approx(5e-3)
    assert nccl_allreduce_s(curves, 8, 1e9) == pytest.approx(8e-3)
    assert nccl_allreduce_s(curves, 2, 5e8) == pytest.approx(1 / 3 * 5e-3)  # from four GPUs' curve
    assert nccl_allreduce_s(curves, 6, 6e8) == pytest.approx(5 / 7 * float(nccl_allreduce_s(curves, 8, 8e8)))
    assert nccl_allreduce_s(curves, 16, 2e9) == pytest.approx(15 / 7 * float(nccl_allreduce_s(curves, 8, 1e9)))
    assert nccl_allreduce_s(curves, 2, 1e3) == pytest.approx(10e-6)  # four GPUs' floor, not a third of it


def test_each_engine_hands_nccl_what_its_own_kernel_cannot_hold():
    vllm, trt, ds = PROFILES["vllm"], PROFILES["trtllm"], PROFILES["deepspeed-fastgen"]
    assert [vllm.custom_allreduce_max(t) for t in (2, 3, 4, 6, 7, 8, 16)] == [8 * 2**20, 0, 8 * 2**20, 8 * 2**20, 0,
                                                                            8 * 2**20, 0]
    assert [trt.custom_allreduce_max(t) for t in (2, 4, 8, 16)] == [16e6, 8e6, 8e6, 0]
    assert ds.custom_allreduce_max(8) == 0  # NCCL for every message
    for name in ("ideal", "nanoflow"):
        assert PROFILES[name].custom_allreduce_max(8) == math.inf  # not modelled: the link price throughout
    # every version of an engine shares its rule, and every engine says where its rule comes from
    for (name, _), prof in VERSIONS.items():
        assert name in CUSTOM_ALLREDUCE_SOURCES, name
        assert prof.custom_allreduce == CUSTOM_ALLREDUCE.get(name), name
    assert get_profile("sglang@0.3").custom_allreduce_max(8) == 8 * 2**20
    assert get_profile("vllm@0.5.3:fixed_s=0.001").custom_allreduce_max(4) == 8 * 2**20  # overrides keep it


def test_a100_tp8_messages_above_the_limit_are_priced_by_nccl():
    dep = make_deployment("llama-3-70b", "a100-80gb", tp=8)
    trt = build_cost_model(dep, engine="trtllm").timer
    # 600 decodes: 600 x 8192 x 2 = 9.8 MB > TensorRT-LLM's 8,000,000-byte workspace at TP8 -> NCCL
    t, nbytes, kernels = _allreduce(trt, BatchFeatures.decode_only(600, 1000))
    per = nbytes / kernels
    assert per == 600 * HIDDEN_70B * 2 > 8e6
    assert t == pytest.approx(kernels * float(nccl_allreduce_s(CURVES, 8, per)), rel=1e-12)
    assert t > 1.5 * _link(trt, nbytes, kernels)
    # 256 decodes (4.2 MB): its own kernel, at the link
    t, nbytes, kernels = _allreduce(trt, BatchFeatures.decode_only(256, 1000))
    assert t == pytest.approx(_link(trt, nbytes, kernels), rel=1e-12)
    # vLLM: decodes up to its 256-sequence cap stay in its kernel, an 8192-token prompt step goes to NCCL
    vllm = build_cost_model(dep, engine="vllm@0.5").timer
    t, nbytes, kernels = _allreduce(vllm, BatchFeatures.decode_only(256, 1000))
    assert t == pytest.approx(_link(vllm, nbytes, kernels), rel=1e-12)
    t, nbytes, kernels = _allreduce(vllm, BatchFeatures.prefill_only(8192, 0, 8))
    assert t == pytest.approx(kernels * float(nccl_allreduce_s(CURVES, 8, nbytes / kernels)), rel=1e-12)
    # DeepSpeed-FastGen: NCCL even for a single decode
    ds = build_cost_model(dep, engine="deepspeed-fastgen").timer
    t, nbytes, kernels = _allreduce(ds, BatchFeatures.decode_only(1, 1000))
    assert t == pytest.approx(kernels * CURVE[0][1], rel=1e-12)


def test_hopper_prices_from_its_own_measurements_at_four_and_eight_gpus():
    h100, h200 = PRESETS["h100-80gb"].nccl_allreduce, PRESETS["h200"].nccl_allreduce
    assert [m for m, _ in h100] == [4, 8] and h200 == h100
    eight, four = dict(h100)[8], dict(h100)[4]
    assert dict(eight)[2**24] == pytest.approx(123.8e-6) and dict(four)[2**24] == pytest.approx(104.4e-6)
    dep = make_deployment("llama-3-70b", "h100-80gb", tp=8)
    timer = build_cost_model(dep, engine="trtllm").timer
    t, nbytes, kernels = _allreduce(timer, BatchFeatures.decode_only(600, 1000))
    assert t == pytest.approx(kernels * float(nccl_allreduce_s(h100, 8, nbytes / kernels)), rel=1e-12)
    # TP4 reads the four-GPU log as measured; TP2 is scaled from it as a ring (no two-GPU log is cited)
    assert nccl_allreduce_s(h100, 4, 2**24) == pytest.approx(104.4e-6)
    assert nccl_allreduce_s(h100, 2, 2**23) == pytest.approx(1 / 3 * 104.4e-6)


def test_the_limit_is_inclusive_and_arrays_of_steps_price_each_message_by_its_own_side():
    dep = make_deployment("llama-3-70b", "a100-80gb", tp=8)
    vllm = build_cost_model(dep, engine="vllm@0.6").timer
    at, over = BatchFeatures.decode_only(512, 1000), BatchFeatures.decode_only(513, 1000)  # 512 x 8192 x 2 = 8 MiB
    t, nbytes, kernels = _allreduce(vllm, at)
    assert nbytes / kernels == 8 * 2**20 and t == pytest.approx(_link(vllm, nbytes, kernels), rel=1e-12)
    t, nbytes, kernels = _allreduce(vllm, over)
    assert t == pytest.approx(kernels * float(nccl_allreduce_s(CURVES, 8, nbytes / kernels)), rel=1e-12)
    # one call over many steps (the fidelity pricer's and the fast-forward's arrays)
    n_ar = kernels
    sizes = np.array([256, 513, 0, 4096]) * HIDDEN_70B * 2.0
    ks = np.where(sizes > 0, n_ar, 0.0)
    got = vllm.op_time("allreduce", 0 * sizes, sizes * n_ar, ks, None)
    for i, s in enumerate(sizes):
        one = float(vllm.op_time("allreduce", 0.0, s * n_ar, ks[i], None))
        assert got[i] == pytest.approx(one, rel=1e-12)
    assert got[2] == 0.0
    assert got[0] == pytest.approx(_link(vllm, sizes[0] * n_ar, n_ar), rel=1e-12)
    assert got[3] == pytest.approx(n_ar * float(nccl_allreduce_s(CURVES, 8, sizes[3])), rel=1e-12)


def test_a_calibration_profile_keeps_the_engines_rule_for_the_all_reduce_it_did_not_measure():
    from blendsim.sim.profile import ProfileTimer
    from tests.test_cost_model import make_profile

    dep = make_deployment("llama-3-8b", "a100-80gb", tp=2)
    roof = RooflineTimer(dep, 0.0)  # an engine whose every all-reduce is NCCL's
    prof = ProfileTimer(make_profile(tp=2), dep, 0.0)
    f = BatchFeatures.decode_only(64, 100)
    assert "allreduce" not in make_profile(tp=2).ops
    assert _allreduce(prof, f)[0] == pytest.approx(_allreduce(roof, f)[0], rel=1e-12)
    assert _allreduce(prof, f)[0] != pytest.approx(_allreduce(RooflineTimer(dep), f)[0], rel=1e-6)


def test_without_a_measured_curve_or_an_engine_rule_the_link_prices_everything():
    f = BatchFeatures.decode_only(600, 1000)
    for hw, engine in (("b200", "trtllm"), ("l40s", "vllm"), ("a100-80gb", "ideal"), ("a100-80gb", "nanoflow"),
                       ("h100-80gb", "ideal")):
        timer = build_cost_model(make_deployment("llama-3-70b", hw, tp=8), engine=engine).timer
        t, nbytes, kernels = _allreduce(timer, f)
        assert t == pytest.approx(_link(timer, nbytes, kernels), rel=1e-12), (hw, engine)
    assert set(NCCL_ALLREDUCE) == {"a100-80gb", "a100-40gb", "h100-80gb", "h200", "mi300x"}
    # the plain timer (no engine) keeps the link price, and TP1 has no all-reduce at all
    plain = RooflineTimer(make_deployment("llama-3-70b", "a100-80gb", tp=8))
    t, nbytes, kernels = _allreduce(plain, f)
    assert t == pytest.approx(_link(plain, nbytes, kernels), rel=1e-12)
    one = build_cost_model(make_deployment("llama-3-8b", "a100-80gb", tp=1), engine="trtllm").timer
    assert _allreduce(one, f)[0] == 0.0


def test_tp_across_nodes_keeps_the_network_price():
    # NCCL's curve is one node's; a TP group spanning two nodes is priced on the network as before
    dep = make_deployment("llama-3-70b", "a100-80gb", tp=16)
    timer = build_cost_model(dep, engine="trtllm").timer
    assert dep.tp_spans_nodes and timer.nccl == ()
    t, nbytes, kernels = _allreduce(timer, BatchFeatures.decode_only(600, 1000))
    assert t == pytest.approx(_link(timer, nbytes, kernels), rel=1e-12)
