"""The physical terms of the step pricer (issue 24 item 2): in-switch all-reduce, FP8 dispatch of the MoE
all-to-all, grouped-GEMM and quantised-GEMM efficiencies, and compute efficiencies shared per architecture."""

from __future__ import annotations

from pathlib import Path

import pytest

from blendsim.sim.batch import BatchFeatures
from blendsim.sim.build_cost import build_cost_model
from blendsim.sim.deployment import make_deployment
from blendsim.sim.efficiency import BOUNDS, Efficiency, EfficiencyTimer
from blendsim.sim.hardware import PRESETS
from blendsim.sim.ops import MOE_GEMMS, Shapes, op_counts
from blendsim.sim.paramfile import check_params
from blendsim.sim.timers import NVLS_FACTOR, RooflineTimer

F = BatchFeatures.from_parts([(0, 512, 1024, 0)], 64, 64 * 2000, 65)


def _op(timer, op, f=F):
    flops, nbytes, kernels = op_counts(timer.shapes, f)[op]
    return float(timer.op_time(op, flops, nbytes, kernels, f))


def test_nvswitch_sharp_all_reduce_at_nccls_measured_rate():
    # TP8 on an NVLS switch (H100) costs 370/275 of its buffer at the ring's wire efficiency (NCCL's measured 275 GB/s
    # NVLS algorithm bandwidth against 370 GB/s on the wire for a ring): 1.30x faster than the ring's 2(t-1)/t = 1.75;
    # A100's NVSwitch runs the ring
    assert NVLS_FACTOR == pytest.approx(1.345, abs=1e-3) and 2 * 7 / 8 / NVLS_FACTOR == pytest.approx(1.30, abs=0.01)
    for hw, factor in (("h100-80gb", NVLS_FACTOR), ("a100-80gb", 2 * 7 / 8)):
        t = RooflineTimer(make_deployment("llama-3-70b", hw, tp=8))
        flops, nbytes, kernels = op_counts(t.shapes, F)["allreduce"]
        expect = kernels * t.link_lat + factor * nbytes / t.link_bw
        assert _op(t, "allreduce") == pytest.approx(expect, rel=1e-12)
    # TP2 is the same either way (2(t-1)/t = 1) and a PCIe card has no switch
    assert RooflineTimer(make_deployment("llama-3-70b", "h100-80gb", tp=2)).ar_factor == 1.0
    assert RooflineTimer(make_deployment("llama-3-70b", "h100-pcie", tp=4)).ar_factor == pytest.approx(1.5)


def test_fp8_experts_dispatch_fp8_tokens_where_the_gpu_has_fp8_cores():
    def a2a_bytes(hw):
        d = make_deployment("qwen3-235b-a22b", hw, tp=8, weights="fp8", ep=8)
        s = Shapes.of(d)
        A = s.expert_assignments(F.num_tokens)
        return s, op_counts(s, F)["a2a"][1], A * s.hidden * 7 / 8

    s, got, per = a2a_bytes("h100-80gb")  # FP8 cores: dispatch 1 byte, combine 2
    assert s.disp_bytes == 1 and got == pytest.approx(3 * per)
    s, got, per = a2a_bytes("a100-80gb")  # weight-only FP8 (Marlin): 16-bit tokens both ways
    assert s.disp_bytes == 2 and got == pytest.approx(4 * per)


def test_grouped_gemm_efficiencies_touch_only_the_expert_gemms():
    d = make_deployment("qwen3-30b-a3b", "h100-80gb")
    base = EfficiencyTimer(d, Efficiency(gemm_eff=0.7, mem_eff=0.8))
    slow = EfficiencyTimer(d, Efficiency(gemm_eff=0.7, mem_eff=0.8, moe_eff=0.35, moe_mem_eff=0.4))
    dec = BatchFeatures.decode_only(8, 4000)  # few tokens per expert: weight streaming
    for op in MOE_GEMMS:
        assert _op(slow, op, dec) > 1.5 * _op(base, op, dec)
    for op in ("qkv_proj", "o_proj", "router", "attn_decode", "lm_head"):
        assert _op(slow, op, dec) == _op(base, op, dec)


def test_lowp_eff_slows_only_quantised_gemms():
    fp8 = make_deployment("llama-3.1-8b", "h100-80gb", weights="fp8")
    big = BatchFeatures.from_parts([(0, 8192, 0, 0)], 0, 0, 1)  # compute-bound GEMMs
    a, b = EfficiencyTimer(fp8, Efficiency(gemm_eff=0.7)), EfficiencyTimer(fp8, Efficiency(gemm_eff=0.7, lowp_eff=0.35))
    assert b.lowp_ratio == pytest.approx(a.lowp_ratio * 0.5)  # 0.35 of the FP8 peak instead of 0.7
    assert _op(b, "qkv_proj", big) > 1.8 * _op(a, "qkv_proj", big)
    assert _op(b, "lm_head", big) == _op(a, "lm_head", big)  # the LM head stays 16-bit
    bf16 = make_deployment("llama-3.1-8b", "h100-80gb")  # nothing quantised: lowp_eff has nothing to act on
    assert EfficiencyTimer(bf16, Efficiency(lowp_eff=0.5)).lowp_ratio == 1.0


@pytest.mark.parametrize("hw", ["h100-80gb", "mi300x", "b200"])
def test_weight_only_gemms_on_a_gpu_with_low_precision_cores_keep_the_16_bit_efficiency(hw):
    # lowp_eff is fitted on FP8/FP4 tensor-core GEMMs there: INT4 dequantised onto the 16-bit cores runs at gemm_eff
    big = BatchFeatures.from_parts([(0, 8192, 0, 0)], 0, 0, 1)
    eff = Efficiency(gemm_eff=0.7, lowp_eff=0.3)
    int4 = EfficiencyTimer(make_deployment("llama-3.1-8b", hw, weights="int4"), eff)
    bf16 = EfficiencyTimer(make_deployment("llama-3.1-8b", hw), eff)
    fp8 = EfficiencyTimer(make_deployment("llama-3.1-8b", hw, weights="fp8"), eff)
    assert int4.lowp_ratio == 1.0
    assert _op(int4, "qkv_proj", big) <= _op(bf16, "qkv_proj", big) * 1.001  # compute-bound: no slower than BF16
    plain = EfficiencyTimer(make_deployment("llama-3.1-8b", hw, weights="fp8"), Efficiency(gemm_eff=0.7))
    assert fp8.lowp_ratio == pytest.approx(plain.lowp_ratio * 0.3 / 0.7)  # FP8 on its own cores still takes lowp_eff
    gpt_oss = EfficiencyTimer(make_deployment("gpt-oss-120b", "h100-80gb"), eff)  # MXFP4 experts, weight-only there
    assert gpt_oss.expert_ratio == 1.0


def test_weight_only_gemms_on_ampere_take_the_fitted_weight_only_efficiency():
    # no FP8/FP4 cores: the quantised GEMMs an A100 runs are all weight-only (Marlin), which is what lowp_eff fits
    for w in ("fp8", "int4"):
        t = EfficiencyTimer(make_deployment("llama-3.1-8b", "a100-80gb", weights=w), Efficiency(gemm_eff=0.7,
                                                                                               lowp_eff=0.35))
        assert t.lowp_ratio == pytest.approx(0.5)


def test_elementwise_bandwidth_and_per_kernel_time_replace_the_presets():
    d = make_deployment("llama-3.1-8b", "h100-80gb")
    a, b = EfficiencyTimer(d, Efficiency()), EfficiencyTimer(d, Efficiency(ew_eff=0.9, launch_s=1e-6))
    hw = d.hardware
    assert b.ew_bw == pytest.approx(hw.mem_bandwidth * 0.9) and a.ew_bw == pytest.approx(hw.mem_bandwidth * 0.45)
    flops, nbytes, kernels = op_counts(b.shapes, F)["norm"]
    assert _op(b, "norm") == pytest.approx(nbytes / b.ew_bw + kernels * 1e-6)
    assert _op(a, "norm") - _op(b, "norm") > kernels * 2.9e-6  # 4 us a kernel down to 1, and a faster pass


def test_compute_efficiencies_are_shared_per_architecture():
    params = {"arch": {"hopper": {"gemm_eff": 0.6, "moe_eff": 0.3}}, "hardware": {"h200": {"gemm_eff": 0.65}}}
    assert PRESETS["h100-80gb"].arch == PRESETS["h200"].arch == "hopper"
    assert Efficiency.lookup(params, "trtllm", "h100-80gb") == Efficiency(gemm_eff=0.6, moe_eff=0.3)
    assert Efficiency.lookup(params, "trtllm", "h200") == Efficiency(gemm_eff=0.65, moe_eff=0.3)  # hardware wins
    assert Efficiency.lookup(params, "trtllm", "a100-80gb") == Efficiency()
    assert check_params(params) is params
    with pytest.raises(Exception, match="arch.hopper.bogus"):
        check_params({"arch": {"hopper": {"bogus": 0.5}}})


def test_new_bounds_are_physical_fractions():
    for k in ("moe_mem_eff", "lowp_eff", "a2a_eff", "ew_eff"):
        lo, hi = BOUNDS[k]
        assert 0 < lo < hi <= 1.0


@pytest.mark.parametrize("model,weights", [("qwen3-30b-a3b", "fp8"), ("deepseek-v3", None), ("llama-3.1-8b", "fp8")])
def test_engine_fast_path_equals_exact_cost_with_the_new_terms(model, weights):
    params = {"arch": {"hopper": {"gemm_eff": 0.6, "moe_eff": 0.3, "lowp_eff": 0.55, "launch_s": 2e-6}},
              "hardware": {"h100-80gb": {"mem_eff": 0.85, "moe_mem_eff": 0.5, "ew_eff": 0.7}},
              "global": {"link_eff": 0.9}}
    d = make_deployment(model, "h100-80gb", tp=8 if model == "deepseek-v3" else 1, weights=weights,
                        kv_capacity_override=10**12)
    c = build_cost_model(d, "sequential", "vllm", params=params)
    for f in (F, BatchFeatures.decode_only(37, 37 * 900), BatchFeatures.from_parts([(0, 3000, 0, 0)], 0, 0, 1)):
        exact = c.cost(f)
        t, comp, mem = c.step(f.num_tokens, f.num_prefill_tokens, f.num_prefill_seqs, f.attn_pairs,
                              f.prefill_kv_tokens, f.num_decode, f.decode_ctx_sum, f.num_logits)
        assert t == pytest.approx(exact.time_s, rel=1e-9)
        assert comp == pytest.approx(exact.compute_s, rel=1e-9)
        assert mem == pytest.approx(exact.memory_s, rel=1e-9)


def test_shipped_parameters_sit_at_no_bound_but_a_physical_ceiling():
    import json

    from blendsim.cli.fidelity import flatten
    from blendsim.fidelity.fit import at_bound
    from blendsim.sim.efficiency import CEILINGS, measured
    from blendsim.sim.engines import PARAMS_FILE

    params = json.loads(PARAMS_FILE.read_text())
    bounds = params["bounds"]
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    readme_bounds = readme[readme.index("**Parameters at a bound**"):readme.index("**What still misses, and why.**")]
    for name, value in flatten(params):
        a = at_bound(value, bounds.get(name))
        parts = name.split(".")
        # or at the end of a range a lent GPU measured (sim.efficiency.MEASURED), which the README explains
        m = measured(parts[1], parts[2]) if parts[0] == "arch" else None
        was_measured = m is not None and tuple(bounds.get(name)) == m[:2]
        # or an engine loop at the most blendsim lets it cost (fit.LOOP_AT_BOUND), which the README names and explains
        loop = parts[0] == "engine" and a == "upper" and f"`{name}`" in readme_bounds
        assert a is None or (a == "upper" and name.rsplit(".", 1)[-1] in CEILINGS) or was_measured or loop, \
            (name, value, a)
