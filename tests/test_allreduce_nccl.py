"""Which all-reduce a tensor-parallel step runs (issue 24, "the TP all-reduce implementation: custom vs NCCL"):
each engine's own kernel up to its buffer's limit, priced at the link, and NCCL above it, priced by the GPU's
measured NCCL curve where one is cited (8 x A100, 4 and 8 x H100 over NVSwitch; H200 as H100)."""

from __future__ import annotations

import math

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
    # a ring of t GPUs: 2(t - 1) steps of 1/t chunks, i.e. (t - 1)/7 of eight GPUs' time on a message 8/t as large
    for t in (2, 4):
        for b in (64e3, 3e6, 40e6):
            assert nccl_allreduce_s(CURVES, t, b) == pytest.approx((t - 1) / 7 * nccl_allreduce_s(CURVES, 8, 8 * b / t))
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


def test_without_a_measured_curve_or_an_engine_rule_the_link_prices_everything():
    f = BatchFeatures.decode_only(600, 1000)
    for hw, engine in (("b200", "trtllm"), ("mi300x", "vllm"), ("a100-80gb", "ideal"), ("a100-80gb", "nanoflow"),
                       ("h100-80gb", "ideal")):
        timer = build_cost_model(make_deployment("llama-3-70b", hw, tp=8), engine=engine).timer
        t, nbytes, kernels = _allreduce(timer, f)
        assert t == pytest.approx(_link(timer, nbytes, kernels), rel=1e-12), (hw, engine)
    assert set(NCCL_ALLREDUCE) == {"a100-80gb", "a100-40gb", "h100-80gb", "h200"}
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
