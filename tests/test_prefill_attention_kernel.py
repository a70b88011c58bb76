"""An engine's prompt-attention kernel family caps the fitted attention efficiency where it reaches less of a GPU:
FlashAttention-2 on Hopper (35% of the 16-bit peak, FlashAttention-3's abstract) for vLLM 0.5-0.6 and SGLang 0.2-0.3."""

from __future__ import annotations

import pytest

import blendsim
from blendsim.sim.build_cost import build_cost_model, engine_timer
from blendsim.sim.deployment import make_deployment
from blendsim.sim.efficiency import Efficiency
from blendsim.sim.engines import PREFILL_ATTN_CAPS, get_profile, load_params


def _attn_ms(engine: str, hardware: str, tokens: int = 32768) -> float:
    c = blendsim.cost("llama-3-8b", hardware, prefill_tokens=tokens, engine=engine)
    return next(r["time_s"] for r in c["per_layer"] if r["op"] == "attn_prefill") * 1e3


@pytest.mark.parametrize("old, new", [("vllm@0.5", "vllm@0.10"), ("vllm@0.6", "vllm@0.10"), ("sglang@0.2", "sglang@0.4"),
                                      ("sglang@0.3", "sglang@0.4"), ("vllm-v0@0.5", "trtllm")])
def test_flashattention2_engines_run_long_prompts_slower_on_hopper_only(old, new):
    assert get_profile(old).prefill_attention == "fa2" and not get_profile(new).prefill_attention
    hopper_old, hopper_new = _attn_ms(old, "h100-80gb"), _attn_ms(new, "h100-80gb")
    assert hopper_old > 1.5 * hopper_new  # 35% of the peak against the fitted ~71%
    assert _attn_ms(old, "a100-80gb") == pytest.approx(_attn_ms(new, "a100-80gb"))  # FA2 is Ampere's own kernel


def test_the_cap_is_the_published_share_of_the_peak_in_a_run_and_in_fidelitys_re_pricing():
    dep = make_deployment("llama-3-8b", "h100-80gb")
    prof = get_profile("vllm@0.6")
    peak = dep.hardware.flops_for(dep.model.dtype)
    run = build_cost_model(dep, engine="vllm@0.6").timer
    refit = engine_timer(dep, Efficiency.lookup(load_params(), prof.regime, dep.hardware.name), prof)
    assert run.attn_rate == refit.attn_rate == pytest.approx(PREFILL_ATTN_CAPS[("fa2", "hopper")] * peak)
    # decode attention (KV reads) and the GEMMs keep the fitted efficiencies
    v1 = build_cost_model(dep, engine="vllm@0.10").timer
    assert run.attn_bw == v1.attn_bw and run.gemm_rate == v1.gemm_rate


def test_engines_shows_the_kernel_and_its_cap():
    from blendsim.sim.engines import describe_profile

    d = describe_profile(get_profile("vllm@0.6"))
    assert "fa2" in d["prefill_attention"] and "35%" in d["prefill_attention"]
    assert "prefill_attention" not in describe_profile(get_profile("vllm@0.10"))
