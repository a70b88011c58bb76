"""gpt-oss: MXFP4 routed experts beside BF16 attention, and sliding-window layers (every other one, 128 tokens).

Sizes against OpenAI's model card (116.8B / 20.9B parameters; 5.1B / 3.6B active without the embedding) and the
Hugging Face checkpoints (65.3 GB / 13.8 GB of safetensors); mechanisms worked by hand.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from blendsim.sim.batch import BatchFeatures
from blendsim.sim.cost import CostModel
from blendsim.sim.deployment import Deployment
from blendsim.sim.engines import get_profile
from blendsim.sim.errors import UserError
from blendsim.sim.hardware import get_hardware
from blendsim.sim.models import PRESETS, WEIGHT_BYTES, ModelSpec
from blendsim.sim.ops import Shapes, op_counts, window_features


def dep(name="gpt-oss-120b", hw="h100-80gb", tp=1, pp=1, model=None, **kw) -> Deployment:
    return Deployment(model or PRESETS[name], get_hardware(hw), tp, pp=pp, **kw)


@pytest.mark.parametrize("name, total, active, ckpt_gb", [("gpt-oss-120b", 116.8, 5.13, 65.3),
                                                           ("gpt-oss-20b", 20.9, 3.61, 13.8)])
def test_sizes_match_the_model_card_and_the_checkpoint(name, total, active, ckpt_gb):
    m = PRESETS[name]
    assert m.params_total / 1e9 == pytest.approx(total, rel=0.005)
    assert (m.params_active - m.embedding_params) / 1e9 == pytest.approx(active, rel=0.01)
    assert m.weight_bytes / 1e9 == pytest.approx(ckpt_gb, rel=0.01)  # MXFP4 experts, the rest BF16
    # the experts at 4.25 bits, the rest at 16
    e = m.routed_expert_params
    assert m.weight_bytes == round(e * WEIGHT_BYTES["mxfp4"] + (m.num_params - e) * 2)
    assert WEIGHT_BYTES["mxfp4"] == pytest.approx(4.25 / 8)


def test_kv_counts_the_full_attention_layers_and_reserves_each_sequence_a_window():
    m = PRESETS["gpt-oss-120b"]
    assert m.full_attention_layers == 18 and m.sliding_layers == 18
    assert m.kv_bytes_per_token == 18 * 2 * 8 * 64 * 2  # K and V of 8 heads of 64, BF16, full layers only
    assert m.window_kv_bytes == 18 * 128 * 2 * 8 * 64 * 2
    full = replace(m, sliding_window=0, sliding_layers=0)
    a, b = dep(model=m, max_seqs=256), dep(model=full, max_seqs=256)
    # the same bytes for KV, less 256 windows; per token half the layers: about twice the tokens
    kv_a, kv_b = a.kv_capacity_bytes, b.kv_capacity_bytes
    assert kv_b - kv_a == pytest.approx(256 * m.window_kv_bytes, rel=1e-9)
    assert a.kv_capacity_tokens == pytest.approx(2 * kv_a / full.kv_bytes_per_token, rel=1e-6)


def test_sliding_window_layers_read_at_most_the_window():
    s = Shapes.of(dep())
    assert (s.swa_layers, s.window, s.layers) == (18, 128, 36)
    # decode: 100 sequences at 4,000 tokens of context: half the layers read 4,000 keys, half 127 (+ itself)
    pairs, pkv, cd = window_features(s, 0, 0, 0, 0, 100, 400_000)
    assert cd == pytest.approx(0.5 * 400_000 + 0.5 * 100 * 127)
    # short contexts are unchanged
    assert window_features(s, 0, 0, 0, 0, 100, 5_000)[2] == pytest.approx(5_000)
    # prefill: 2,048 new tokens after 6,000: full layers see their pairs, window layers <= 128 keys per query
    f = BatchFeatures.from_parts([(0, 2048, 6000, 0)], 0, 0, 1)
    pairs, pkv, _ = window_features(s, f.num_prefill_tokens, 1, f.attn_pairs, f.prefill_kv_tokens, 0, 0)
    assert pairs == pytest.approx(0.5 * f.attn_pairs + 0.5 * 2048 * 128)
    assert pkv == pytest.approx(0.5 * f.prefill_kv_tokens + 0.5 * (2048 + 128))
    # so a long-context decode step costs about half the attention of the same model without windows
    c = CostModel(dep(), "sequential", get_profile("ideal", {}))
    full = CostModel(dep(model=replace(PRESETS["gpt-oss-120b"], sliding_window=0, sliding_layers=0)), "sequential",
                     get_profile("ideal", {}))
    g = BatchFeatures.decode_only(64, 32_000)
    att = {r["op"]: r["time_s"] for r in c.breakdown(g)}["attn_decode"]
    att_full = {r["op"]: r["time_s"] for r in full.breakdown(g)}["attn_decode"]
    assert att == pytest.approx(att_full * (0.5 + 0.5 * 128 / 32_001), rel=0.02)


def test_expert_gemms_stream_mxfp4_and_the_rest_bf16():
    s = Shapes.of(dep())
    assert s.e_w_bytes == pytest.approx(4.25 / 8) and s.w_bytes == 2
    f = BatchFeatures.decode_only(1, 0)
    n = op_counts(s, f)
    h = 2880
    # one token touches its 4 experts: gate/up (2 x 2880 wide) and down, 4.25 bits a weight
    assert n["moe_gate_up"][1] == pytest.approx(4.25 / 8 * h * 5760 * 4 + 2 * (4 * h + 4 * 5760), rel=1e-9)
    assert n["qkv_proj"][1] == pytest.approx(2 * h * (4096 + 1024) + 2 * (h + 5120), rel=1e-9)  # BF16 weights


def test_mxfp4_runs_on_fp4_cores_where_there_are_some():
    from blendsim.sim.timers import RooflineTimer

    for hw, ratio in (("h100-80gb", 1.0), ("a100-80gb", 1.0), ("b200", 4.0)):
        t = RooflineTimer(dep(hw=hw))
        assert t.expert_ratio == pytest.approx(ratio) and t.lowp_ratio == 1.0  # BF16 attention at the 16-bit peak


def test_pipeline_stages_split_the_window_layers():
    d = dep(pp=2)
    assert [Shapes.of(d.at_stage(i)).swa_layers for i in range(2)] == [9, 9]
    assert sum(d.stage_kv_tokens()) > 0


def test_bad_window_fields_are_one_line():
    base = dict(name="x", hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=4, intermediate_size=128,
                vocab_size=100)
    for kw, said in (({"sliding_window": 128}, "come together"), ({"sliding_layers": 4, "sliding_window": 8}, "0..num"),
                     ({"expert_weights": "mxfp4"}, "needs routed experts"), ({"expert_weights": "int3"}, "unknown")):
        with pytest.raises(UserError, match=said):
            ModelSpec(**base, **kw)


def test_simulate_runs_gpt_oss(tmp_path):
    from blendsim import api

    trace = api.make_trace(input_len=[300] * 40, output_len=[200] * 40)
    r = api.simulate(trace, policy="fcfs", model="gpt-oss-20b", hardware="h100-80gb", engine="vllm@0.11")
    assert r.summary["makespan_s"] > 0 and r.summary["model"] == "gpt-oss-20b"


def test_validation_rows_run_and_stay_out_of_the_fit():
    """validation.csv's rows (gpt-oss among them) are cited catalogue rows the shipped parameters were not fitted on."""
    import csv

    from blendsim.fidelity.catalogue import read_catalogue, row_engine_key
    from blendsim.fidelity.suite import SHIPPED_CATALOGUES, SHIPPED_VALIDATION

    every = read_catalogue(SHIPPED_VALIDATION)
    assert all(r.model in PRESETS and r.source and r.note for r in every)
    fitted = {r["id"] for p in SHIPPED_CATALOGUES for r in csv.DictReader(open(p, newline=""))}
    assert not fitted & {r.id for r in every}
    assert all(r.id.startswith(r.engine + "-") for r in every)
    assert sum(r.model.startswith("gpt-oss") for r in every) == 52 + 2  # GPUStack's, and vLLM's FP8 KV-cache blog's
    rows = [r for r in every if r.model.startswith("gpt-oss") and "-gpustack-" in r.id]
    assert len(rows) == 52
    assert sum(r.weights == "bf16" for r in rows) == 52  # attention, router, LM head; the preset's experts MXFP4
    assert sum("async_scheduling=1" in row_engine_key(r) for r in rows) == 12 + 16


@pytest.mark.parametrize("name, layers, experts", [("gpt-oss-120b", 36, 128), ("gpt-oss-20b", 24, 32)])
def test_the_hugging_face_config_equals_the_preset(tmp_path, name, layers, experts):
    """openai/gpt-oss-*/config.json's fields (layer_types alternate sliding and full attention, even layers
    sliding; quantization_config mxfp4 leaves attention, router, embedding and LM head unconverted)."""
    import json

    from blendsim.sim.models import load_hf_config

    cfg = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
           "num_hidden_layers": layers, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
           "intermediate_size": 2880, "num_local_experts": experts, "num_experts_per_tok": 4, "vocab_size": 201088,
           "sliding_window": 128, "attention_bias": True, "max_position_embeddings": 131072,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "_name_or_path": name,
           "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
           "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
               "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = load_hf_config(p)
    assert m.fingerprint() == PRESETS[name].fingerprint(), (m.to_dict(), PRESETS[name].to_dict())
    cfg["layer_types"] = ["full_attention"] * 3
    p.write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="one attention type per layer"):
        load_hf_config(p)


def test_a_pipeline_stage_reserves_a_window_for_every_sequence_in_flight():
    """pp virtual engines of max_seqs sequences each run through every stage; each stage holds the windows of its
    own sliding-window layers for all of them: max_seqs x (window KV of all layers / pp) x pp."""
    m = PRESETS["gpt-oss-120b"]
    full = replace(m, sliding_window=0, sliding_layers=0)
    for pp in (1, 2):
        a, b = dep(model=m, pp=pp, max_seqs=256), dep(model=full, pp=pp, max_seqs=256)
        assert b._kv_bytes_per_gpu(1e9, 1e9) - a._kv_bytes_per_gpu(1e9, 1e9) == pytest.approx(256 * m.window_kv_bytes)


def test_fit_errors_count_the_windows():
    with pytest.raises(UserError, match="sliding-window KV"):
        dep(max_seqs=16384).kv_capacity_bytes  # noqa: B018 (the check runs on construction)


def test_a_calibrated_profile_keeps_the_window_in_prefill():
    """A profile's prefill fit prices a sliding-window layer's chunk at the context it keeps, scaled by the pairs it
    computes: a fresh 8,192-token prompt costs those layers ~1/32 of the full causal chunk, in both paths."""
    from blendsim.sim.profile import ProfileTimer
    from tests.test_cost_model import make_profile

    m = PRESETS["gpt-oss-20b"]
    full = replace(m, sliding_window=0, sliding_layers=0)
    t, t_full = (ProfileTimer(make_profile("gpt-oss-20b"), dep(model=x)) for x in (m, full))
    n = 8192
    f = BatchFeatures.from_parts([(0, n, 0, 0)], 0, 0, 1)
    exact, exact_full = (x.op_time("attn_prefill", 0, 0, 1, f) for x in (t, t_full))
    w = n * 128 / (n * (n + 1) / 2)  # the window's share of the causal pairs
    assert float(exact) == pytest.approx(float(exact_full) * (0.5 + 0.5 * w), rel=1e-6)
    pf = t.attn_scalars()[0]
    assert pf(n, 1, f.attn_pairs, f.prefill_kv_tokens) == pytest.approx(float(exact), rel=1e-9)
    g = BatchFeatures.from_parts([(0, 2048, 6000, 0)], 0, 0, 1)
    assert pf(2048, 1, g.attn_pairs, g.prefill_kv_tokens, [(0, 2048, 6000, 0)]) == pytest.approx(
        float(t.op_time("attn_prefill", 0, 0, 1, g)), rel=1e-9)


def test_the_experts_short_k_constant_follows_their_precision():
    from blendsim.sim.timers import GROUPED_K0, RooflineTimer

    t = RooflineTimer(dep(hw="b200"))  # MXFP4 experts on FP4 cores, BF16 attention
    assert t.grouped_k["moe_down"] == pytest.approx(1 + GROUPED_K0["low-precision"] / 2880)
    t = RooflineTimer(dep())  # weight-only MXFP4 on an H100: 16-bit tensor cores
    assert t.grouped_k["moe_down"] == pytest.approx(1 + GROUPED_K0["16-bit"] / 2880)


def test_the_plan_work_bound_stays_below_the_run():
    """T_o at datasheet peaks is a lower bound: a window layer's pairs and the FP4 experts' rate do not inflate it."""
    from blendsim import api
    from blendsim.plan.space import work_bound

    trace = api.make_trace(input_len=[131000] * 4, output_len=[2] * 4)
    for hw in ("b200", "h100-80gb"):
        r = api.simulate(trace, policy="fcfs", model="gpt-oss-20b", hardware=hw, engine="vllm")
        assert work_bound(trace, dep("gpt-oss-20b", hw=hw), 0.0) <= r.summary["makespan_s"]


def test_a_config_without_layer_types_alternates_like_transformers(tmp_path):
    import json

    from blendsim.sim.models import load_hf_config

    cfg = {"model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 24, "num_attention_heads": 64,
           "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 32,
           "num_experts_per_tok": 4, "vocab_size": 201088, "sliding_window": 128, "torch_dtype": "bfloat16"}
    p = tmp_path / "gpt-oss-20b.json"
    p.write_text(json.dumps(cfg))
    m = load_hf_config(p)
    assert (m.sliding_layers, m.sliding_window, m.expert_precision) == (12, 128, "bf16")
