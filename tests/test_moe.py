"""Mixture-of-experts and multi-head latent attention in the cost model, worked by hand.

One layer of Mixtral-8x7B and of DeepSeek-V3 at 1 and 4,096 tokens (FP8 weights, bf16 activations:
a GEMM of M rows, K inputs, N outputs does 2 M K N FLOPs and moves K x N weights once per expert it
runs for, M x K inputs and M x N outputs in bf16); experts touched by T tokens under top-k of E uniform
routing: E (1 - (1 - k/E)^T).
"""

from __future__ import annotations

import json
from functools import cache

import numpy as np
import pytest

from blendsim.sim.batch import BatchFeatures, features_arrays
from blendsim.sim.cost import CostModel
from blendsim.sim.deployment import Deployment
from blendsim.sim.engines import get_profile
from blendsim.sim.errors import UserError
from blendsim.sim.hardware import get_hardware
from blendsim.sim.models import PRESETS, get_model, load_hf_config
from blendsim.sim.ops import Shapes, expert_pick_probabilities

ONE = BatchFeatures.decode_only(1, 0)  # one token, no context
BIG = BatchFeatures.prefill_only(4096)  # 4,096 new tokens


@cache
def dep(model: str, hw: str = "h100-80gb", tp: int = 1, ep: int = 1, weights: str | None = "fp8",
        kv: str | None = None, skew: float = 0.0) -> Deployment:
    return Deployment(get_model(model, weights=weights, kv_dtype=kv), get_hardware(hw), tp, ep=ep, expert_skew=skew,
                      kv_capacity_override=10**12)


def rows(d: Deployment, f) -> dict:
    return {r["op"]: r for r in CostModel(d).breakdown(f)}


# ---- parameters -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, total, active, tol",
    [  # published sizes: Mistral's Mixtral blog (46.7B / 12.9B), the Qwen3 model cards (30.5B / 3.3B,
       # 235B / 22B), Meta's Llama 4 cards (17B active; 109B / 400B total, Scout's including its ~1B vision
       # encoder), the DeepSeek-V3 report (671B / 37B, the 14B MTP module not counted)
        ("mixtral-8x7b", 46.7, 12.9, 0.05),
        ("qwen3-30b-a3b", 30.5, 3.3, 0.06),
        ("qwen3-235b-a22b", 235.0, 22.0, 0.2),
        ("llama-4-scout", 108.0, 17.0, 1.0),
        ("llama-4-maverick", 400.0, 17.0, 1.0),
        ("deepseek-v3", 671.0, 37.0, 0.6),
    ],
)
def test_total_and_active_parameters_match_published_sizes(name, total, active, tol):
    m = PRESETS[name]
    assert m.params_total / 1e9 == pytest.approx(total, abs=max(tol, 0.01 * total))
    assert m.params_active / 1e9 == pytest.approx(active, abs=tol)


def test_mixtral_params_by_hand():
    m = PRESETS["mixtral-8x7b"]
    attn = 4096 * (4096 + 2 * 1024) + 4096 * 4096
    expert = 3 * 4096 * 14336
    layer = attn + 4096 * 8 + 8 * expert + 2 * 4096  # + router + 8 experts + two norms
    assert m.params_total == 2 * 32000 * 4096 + 32 * layer + 4096
    assert m.params_active == m.params_total - 32 * 6 * expert


def test_deepseek_v3_params_by_hand():
    m = PRESETS["deepseek-v3"]
    h = 7168
    attn = h * 1536 + 1536 * 128 * 192 + h * 576 + 512 * 128 * 256 + 128 * 128 * h + 1536 + 512 + 2 * h
    dense = 3 * h * 18432
    moe_block = h * 256 + 256 * 3 * h * 2048 + 3 * h * 2048
    assert (m.dense_layers, m.moe_layers) == (3, 58)
    assert m.params_total == 2 * 129280 * h + 61 * attn + 3 * dense + 58 * moe_block + h
    assert m.params_active == m.params_total - 58 * 248 * 3 * h * 2048


# ---- experts touched --------------------------------------------------------------------------------------------


def test_expected_experts_touched_uniform():
    s = Shapes.of(dep("mixtral-8x7b"))
    assert s.experts_touched(1) == pytest.approx(2.0, rel=1e-12)  # top-2 of 8: exactly two
    assert s.experts_touched(2) == pytest.approx(8 * (1 - 0.75**2), rel=1e-12)  # 3.5
    assert s.experts_touched(4096) == pytest.approx(8.0, rel=1e-12)  # all eight
    d = Shapes.of(dep("deepseek-v3"))
    assert d.experts_touched(1) == pytest.approx(8.0, rel=1e-12)
    assert d.experts_touched(64) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 64), rel=1e-12)  # 221.0
    assert np.allclose(d.experts_touched(np.array([1, 64])), [8.0, 256 * (1 - (31 / 32) ** 64)])


def test_skewed_routing_touches_fewer_experts():
    q = expert_pick_probabilities(128, 8, 1.2)
    assert q.sum() == pytest.approx(8.0) and q.max() <= 1.0 and np.all(np.diff(q) <= 1e-12)
    for E, k, skew in [(8, 8, 50.0), (8, 2, 3.0), (128, 8, 1e6), (16, 1, 100.0)]:
        q = expert_pick_probabilities(E, k, skew)
        assert q.sum() == pytest.approx(k) and q.max() <= 1.0 + 1e-12 and q.min() >= 0, (E, k, skew)
    u, z = Shapes.of(dep("qwen3-30b-a3b")), Shapes.of(dep("qwen3-30b-a3b", skew=1.2))
    assert z.experts_touched(1) == pytest.approx(8.0)  # one token still picks k distinct experts
    assert z.experts_touched(64) < 0.8 * u.experts_touched(64)
    assert rows(dep("qwen3-30b-a3b", skew=1.2), BatchFeatures.decode_only(64, 0))["moe_gate_up"]["bytes"] < \
        rows(dep("qwen3-30b-a3b"), BatchFeatures.decode_only(64, 0))["moe_gate_up"]["bytes"]


# ---- one MoE layer by hand ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("f, T, touched", [(ONE, 1, 2.0), (BIG, 4096, 8.0)])
def test_mixtral_moe_layer_by_hand(f, T, touched):
    r = rows(dep("mixtral-8x7b"), f)
    h, inter, A = 4096, 14336, 2 * T  # each token goes to 2 experts
    assert set(r) >= {"router", "moe_combine", "moe_gate_up", "moe_act", "moe_down"}
    assert not {"gate_up_proj", "down_proj", "shared_gate_up", "a2a"} & set(r)  # no dense MLP, no shared expert
    assert r["router"]["flops"] == 2 * T * h * 8
    assert r["router"]["bytes"] == 2 * (h * 8 + T * h) + 4 * T * 8
    assert r["moe_gate_up"]["flops"] == pytest.approx(2 * A * h * 2 * inter, rel=1e-12)
    # FP8 weights of the experts touched: 1 byte each; bf16 rows in and out
    assert r["moe_gate_up"]["bytes"] == pytest.approx(touched * h * 2 * inter + 2 * (A * h + A * 2 * inter), rel=1e-12)
    assert r["moe_down"]["flops"] == pytest.approx(2 * A * inter * h, rel=1e-12)
    assert r["moe_down"]["bytes"] == pytest.approx(touched * inter * h + 2 * (A * inter + A * h), rel=1e-12)
    assert r["moe_act"]["flops"] == pytest.approx(4 * A * inter, rel=1e-12)
    assert r["moe_combine"]["bytes"] == pytest.approx(2 * (A * h + T * h), rel=1e-12)
    assert r["moe_gate_up"]["layers"] == 32
    # the expert weights read: 2 of 8 experts for one token, all 8 for 4,096
    weights_read = (r["moe_gate_up"]["bytes"] - 2 * (A * h + A * 2 * inter)
                    + r["moe_down"]["bytes"] - 2 * (A * inter + A * h))
    assert weights_read / (3 * h * inter) == pytest.approx({1: 2.0, 4096: 8.0}[T], rel=1e-12)


@pytest.mark.parametrize("f, T, touched", [(ONE, 1, 8.0), (BIG, 4096, 256.0)])
def test_deepseek_v3_moe_layer_by_hand(f, T, touched):
    r = rows(dep("deepseek-v3"), f)
    h, inter, A = 7168, 2048, 8 * T
    assert r["router"]["flops"] == 2 * T * h * 256
    assert r["moe_gate_up"]["flops"] == pytest.approx(2 * A * h * 2 * inter, rel=1e-12)
    assert r["moe_gate_up"]["bytes"] == pytest.approx(touched * h * 2 * inter + 2 * (A * h + A * 2 * inter), rel=1e-9)
    assert r["moe_down"]["bytes"] == pytest.approx(touched * inter * h + 2 * (A * inter + A * h), rel=1e-9)
    # the shared expert: a 2048-wide dense MLP over every token
    assert r["shared_gate_up"]["flops"] == 2 * T * h * 2 * inter
    assert r["shared_gate_up"]["bytes"] == h * 2 * inter + 2 * (T * h + T * 2 * inter)
    assert r["shared_down"]["flops"] == 2 * T * inter * h
    assert r["moe_act"]["flops"] == pytest.approx(4 * (A * inter + T * inter), rel=1e-12)
    # three dense-first layers keep the 18,432-wide MLP
    assert r["gate_up_proj"]["layers"] == 3 and r["moe_down"]["layers"] == 58
    assert r["gate_up_proj"]["flops"] == 2 * T * h * 2 * 18432


@pytest.mark.parametrize("name", ["mixtral-8x7b", "qwen3-30b-a3b", "qwen3-235b-a22b", "llama-4-scout",
                                  "llama-4-maverick", "deepseek-v3"])
def test_one_token_step_costs_two_flops_per_active_parameter(name):
    """A 1-token step multiplies the token by every active weight once (2 FLOPs each); the embedding is a
    lookup (no FLOPs), so FLOPs ~ 2 x (active - embedding); norms, activation and attention add little."""
    m = PRESETS[name]
    total = sum(r["flops"] * r["layers"] for r in CostModel(dep(name)).breakdown(ONE))
    assert total == pytest.approx(2 * (m.params_active - m.embedding_params), rel=0.002)
    assert total == pytest.approx(2 * m.params_active, rel=0.1)  # qwen3-30b-a3b: embedding 9% of active


# ---- expert parallelism ------------------------------------------------------------------------------------------


def test_expert_parallel_all_to_all_by_hand():
    d = dep("mixtral-8x7b", tp=8, ep=8)
    s = Shapes.of(d)
    assert (s.e_inter, len(s.expert_q)) == (14336, 1)  # one whole expert per GPU
    f = BatchFeatures.decode_only(64, 100)
    r = rows(d, f)
    A = 64 * 2 / 8  # 16 assignments land on each GPU
    assert r["moe_gate_up"]["flops"] == pytest.approx(2 * A * 4096 * 2 * 14336, rel=1e-12)
    # FP8 experts on FP8 tensor cores: dispatch FP8 tokens (1 byte), combine in bf16 (2)
    assert r["a2a"]["bytes"] == pytest.approx((1 + 2) * A * 4096 * 7 / 8, rel=1e-12)
    hw = get_hardware("h100-80gb")
    assert r["a2a"]["time_s"] == pytest.approx(2 * hw.link_latency_s + r["a2a"]["bytes"] / hw.link_bandwidth, rel=1e-12)
    # the MoE layers' MLP all-reduce gives way to the all-to-all: 2 x 32 - 32 all-reduces are left
    assert r["allreduce"]["bytes"] == 2 * 64 * 4096 * 32
    # without --ep each expert is split 8 ways and every GPU sees every assignment
    r1 = rows(dep("mixtral-8x7b", tp=8), f)
    assert r1["moe_gate_up"]["flops"] == pytest.approx(2 * 128 * 4096 * 2 * 14336 / 8, rel=1e-12)
    assert "a2a" not in r1 and r1["allreduce"]["bytes"] == 2 * 64 * 4096 * 64


def test_expert_parallel_errors_are_one_line():
    hw = get_hardware("h100-80gb")
    with pytest.raises(UserError, match="--ep 2: llama-3.1-8b has no experts"):
        Deployment(get_model("llama-3.1-8b"), hw, 2, ep=2)
    with pytest.raises(UserError, match="--ep 4 must divide --tp 2"):
        Deployment(get_model("mixtral-8x7b"), hw, 2, ep=4, kv_capacity_override=10**9)
    with pytest.raises(UserError, match="--ep 16 does not divide mixtral-8x7b's 8 experts"):
        Deployment(get_model("mixtral-8x7b"), hw, 16, ep=16, kv_capacity_override=10**9)
    with pytest.raises(UserError, match="expert skew"):
        Deployment(get_model("mixtral-8x7b"), hw, 2, expert_skew=float("nan"), kv_capacity_override=10**9)


# ---- fast paths agree --------------------------------------------------------------------------------------------

FEATS = [ONE, BIG, BatchFeatures.from_parts([(0, 256, 512, 0)], 100, 150_000, 100),
         BatchFeatures.from_parts([(0, 1000, 0, 0), (1, 24, 4000, 0)], 7, 9_000, 8),
         BatchFeatures.decode_only(300, 2000)]


@pytest.mark.parametrize("d", [dep("mixtral-8x7b", tp=2, ep=2), dep("qwen3-30b-a3b", skew=0.8),
                               dep("llama-4-maverick", hw="h200", tp=8), dep("deepseek-v3", hw="h200", tp=8),
                               dep("deepseek-v3", hw="b200", tp=8, ep=8, weights="fp4", kv="fp8"),
                               # gpt-oss: MXFP4 experts beside BF16 attention, sliding-window layers (contexts past
                               # the window below)
                               dep("gpt-oss-120b", weights=None), dep("gpt-oss-20b", hw="a100-80gb", weights=None),
                               dep("gpt-oss-120b", hw="b200", tp=2, weights=None)])
@pytest.mark.parametrize("mode", ["sequential", "overlap"])
def test_step_and_cost_many_equal_cost(d, mode):
    c = CostModel(d, mode, get_profile("vllm", {}))
    for f in FEATS:
        ref = c.cost(f)
        t, comp, mem = c.step(f.num_tokens, f.num_prefill_tokens, f.num_prefill_seqs, f.attn_pairs,
                              f.prefill_kv_tokens, f.num_decode, f.decode_ctx_sum, f.num_logits)
        assert (t, comp, mem) == pytest.approx((ref.time_s, ref.compute_s, ref.memory_s), rel=1e-9)
    many = c.cost_many(features_arrays(**{k: [getattr(f, k) for f in FEATS] for k in (
        "num_tokens", "num_prefill_tokens", "num_prefill_seqs", "attn_pairs", "prefill_kv_tokens", "num_decode",
        "decode_ctx_sum", "num_logits")}))
    assert many["time_s"] == pytest.approx([c.cost(f).time_s for f in FEATS], rel=1e-9)
    ctx = np.array([1000, 5000, 20000])
    t, comp, mem = c.decode_many(32, ctx)
    ref = [c.cost(BatchFeatures(32, 0, 0, 0, 0, 32, int(x), 32)) for x in ctx]
    assert t == pytest.approx([r.time_s for r in ref], rel=1e-9)
    assert comp == pytest.approx([r.compute_s for r in ref], rel=1e-9)


def test_moe_decode_is_memory_bound_small_and_compute_bound_large():
    """Per token, a small MoE decode batch pays for the expert weights it reads; a large one amortises them."""
    c = CostModel(dep("qwen3-30b-a3b", weights=None))
    per_tok = [c.cost(BatchFeatures.decode_only(b, 0)).time_s / b for b in (1, 8, 64, 512)]
    assert per_tok[0] > 3 * per_tok[2] and per_tok[2] > per_tok[3]


# ---- config.json ---------------------------------------------------------------------------------------------------

CONFIGS = {
    "mixtral-8x7b": {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
                     "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
                     "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000,
                     "max_position_embeddings": 32768, "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    "qwen3-30b-a3b": {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                      "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4,
                      "head_dim": 128, "num_hidden_layers": 48, "num_experts": 128, "num_experts_per_tok": 8,
                      "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
                      "max_position_embeddings": 40960, "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    "llama-4-maverick": {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"],
                         "torch_dtype": "bfloat16", "text_config": {
                             "model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192,
                             "intermediate_size_mlp": 16384, "num_attention_heads": 40, "num_key_value_heads": 8,
                             "head_dim": 128, "num_hidden_layers": 48, "num_local_experts": 128,
                             "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "vocab_size": 202048,
                             "max_position_embeddings": 1048576, "tie_word_embeddings": False}},
    "deepseek-v3": {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                    "moe_intermediate_size": 2048, "num_attention_heads": 128, "num_key_value_heads": 128,
                    "num_hidden_layers": 61, "first_k_dense_replace": 3, "moe_layer_freq": 1, "n_routed_experts": 256,
                    "n_shared_experts": 1, "num_experts_per_tok": 8, "q_lora_rank": 1536, "kv_lora_rank": 512,
                    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
                    "max_position_embeddings": 163840, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
                    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}},
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_configs_equal_the_presets(tmp_path, name):
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(CONFIGS[name]))
    m = load_hf_config(p)
    assert m.name == name
    assert m.fingerprint() == PRESETS[name].fingerprint(), (m.to_dict(), PRESETS[name].to_dict())


def test_moe_config_errors_name_the_file(tmp_path):
    p = tmp_path / "m.json"
    p.write_text(json.dumps({**CONFIGS["mixtral-8x7b"], "num_experts_per_tok": 9}))
    # the config's own field names, not the spec's (num_experts_per_tok, num_local_experts)
    with pytest.raises(UserError, match=f"{p}: .*num_experts_per_tok must be in 1..num_local_experts \\(8\\)"):
        load_hf_config(p)
    p.write_text(json.dumps({**CONFIGS["qwen3-30b-a3b"], "mlp_only_layers": [0, 99]}))
    with pytest.raises(UserError, match="layer indices must be in 0..47"):
        load_hf_config(p)
    p.write_text(json.dumps({**CONFIGS["deepseek-v3"], "kv_lora_rank": None}))
    with pytest.raises(UserError, match="missing field 'kv_lora_rank'"):
        load_hf_config(p)
    # llama4 reads the experts' width from intermediate_size and the dense one from intermediate_size_mlp: an error
    # about either names the key it came from, each renamed once
    big = {**CONFIGS["llama-4-maverick"]}
    big["text_config"] = {**big["text_config"], "intermediate_size": 2**25}
    p.write_text(json.dumps(big))
    with pytest.raises(UserError, match=r": intermediate_size 33,554,432 is beyond any model"):
        load_hf_config(p)
    big["text_config"] = {**CONFIGS["llama-4-maverick"]["text_config"], "intermediate_size_mlp": 2**25}
    p.write_text(json.dumps(big))
    with pytest.raises(UserError, match=r": intermediate_size_mlp 33,554,432 is beyond any model"):
        load_hf_config(p)
    # fields that leave no layer with experts are named (not the spec's derived moe_layers)
    for name, change, fields in (("deepseek-v3", {"first_k_dense_replace": 100}, "'first_k_dense_replace' and "
                                                                                  "'moe_layer_freq'"),
                                 ("qwen3-30b-a3b", {"decoder_sparse_step": 1000}, "'mlp_only_layers' and "
                                                                                 "'decoder_sparse_step'")):
        p.write_text(json.dumps({**CONFIGS[name], **change}))
        with pytest.raises(UserError, match=f"fields {fields} leave none of the"):
            load_hf_config(p)
    # q_lora_rank null is a direct query projection (DeepSeek-V2-Lite); absent, transformers would take 1536, so
    # no width is guessed
    p.write_text(json.dumps({**CONFIGS["deepseek-v3"], "q_lora_rank": None}))
    assert load_hf_config(p).q_lora_rank == 0
    p.write_text(json.dumps({k: v for k, v in CONFIGS["deepseek-v3"].items() if k != "q_lora_rank"}))
    with pytest.raises(UserError, match="missing field 'q_lora_rank' \\(null for a direct query projection"):
        load_hf_config(p)


# ---- every policy runs on MoE and MLA models -----------------------------------------------------------------------


def _trace(tmp_path):
    from blendsim.workloads.trace import write_trace
    from tests.helpers import random_trace

    t = random_trace(np.random.default_rng(7), n=30, max_out=40)
    p = tmp_path / "t.parquet"
    write_trace(t, p)
    return t, p


def test_every_policy_runs_on_moe_and_mla(tmp_path):
    from blendsim.policies.registry import policy_names
    from blendsim.runner import RunConfig, run_simulation

    trace, _ = _trace(tmp_path)
    for model, hw, tp, ep, w in [("qwen3-30b-a3b", "h100-80gb", 1, 1, None), ("deepseek-v3", "h200", 8, 8, "fp8")]:
        for policy in policy_names():
            cfg = RunConfig(policy=policy, model=model, hardware=hw, tp=tp, ep=ep, weights=w, kv_dtype="fp8")
            s = run_simulation(trace, cfg).summary
            assert s["output_tokens"] == int(trace.output_len.sum()), (model, policy)
            assert (s["weights"], s["kv_dtype"], s["ep"]) == (w or "bf16", "fp8", ep)
            assert s["makespan_s"] > 0 and s["frac_of_opt"] <= 1.0 + 1e-9, (model, policy)


@pytest.mark.parametrize("policy", ["dfs", "blendserve", "e2"])
def test_simulate_cli_deepseek_v3_fp8_on_8_h200(tmp_path, policy):
    from typer.testing import CliRunner

    from blendsim.cli import get_app

    _, p = _trace(tmp_path)
    r = CliRunner().invoke(get_app(), ["simulate", str(p), "-p", policy, "-m", "deepseek-v3", "--weights", "fp8",
                                       "--hardware", "h200", "--tp", "8", "-o", str(tmp_path / policy), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert (s["model"], s["weights"], s["tp"]) == ("deepseek-v3", "fp8", 8)
    r = CliRunner().invoke(get_app(), ["simulate", str(p), "-p", policy, "-m", "mixtral-8x7b", "--hardware", "h100-80gb",
                                       "--tp", "2", "--ep", "2", "--expert-skew", "1.0", "-o", str(tmp_path / "m"),
                                       "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["expert_skew"] == 1.0 and json.loads(r.stdout)["ep"] == 2


# ---- multi-head latent attention (DeepSeek) ------------------------------------------------------------------------


def test_deepseek_v3_kv_per_token():
    fp8 = get_model("deepseek-v3", kv_dtype="fp8")
    assert fp8.kv_bytes_per_token == (512 + 64) * 61 * 1 == 35_136  # ~35 KB: latent + rotary key, 61 layers
    assert get_model("deepseek-v3").kv_bytes_per_token == 2 * 35_136  # bf16
    # vLLM keeps the whole latent on every GPU of the tensor-parallel group
    assert dep("deepseek-v3", hw="h200", tp=8, kv="fp8").kv_bytes_per_token == 8 * 35_136


def test_deepseek_v3_fp8_fits_8_h200_not_8_h100():
    m = get_model("deepseek-v3", weights="fp8")
    d = Deployment(m, get_hardware("h200"), 8)
    assert d.weight_bytes_per_gpu / 2**30 == pytest.approx(78.4, abs=0.1)  # 673 GB of weights / 8
    assert d.kv_capacity_tokens > 100_000
    with pytest.raises(UserError) as e:
        Deployment(m, get_hardware("h100-80gb"), 8)
    assert "deepseek-v3 (fp8 weights) does not fit on h100-80gb with tp=8" in str(e.value)
    assert "\n" not in str(e.value)


PREFILL = BatchFeatures.from_parts([(0, 512, 1024, 0)], 0, 0, 1)  # 512 new tokens after 1,024 cached
DECODE = BatchFeatures(num_tokens=64, num_decode=64, decode_ctx_sum=128_000, num_logits=64)


def test_mla_prefill_layer_by_hand():
    """Prefill up-projects every key's latent to 128 heads of 128 (K) + 128 (V) and attends multi-head with
    192-wide queries and keys (128 + 64 rotary) and 128-wide values."""
    r = rows(dep("deepseek-v3", kv="fp8"), PREFILL)
    T, pkv, pairs = 512, 1536, 512 * 1024 + 512 * 513 // 2
    h, H = 7168, 128
    assert r["qkv_proj"]["flops"] == 2 * T * (h * 1536 + 1536 * H * 192 + h * 576)
    assert r["qkv_proj"]["bytes"] == (h * 1536 + 1536 * H * 192 + h * 576) + 2 * T * (h + H * 192 + 576 + 2 * 1536)
    assert r["kv_up_proj"]["flops"] == 2 * pkv * 512 * H * 256
    assert r["kv_up_proj"]["bytes"] == 512 * H * 256 + 2 * pkv * (512 + H * 256)
    assert r["attn_prefill"]["flops"] == 2 * H * (192 + 128) * pairs
    assert r["attn_prefill"]["bytes"] == 2 * T * H * 320 + pkv * (2 * H * 256 + 576)  # q, out; K/V; fp8 latent
    assert r["kv_write"]["bytes"] == 2 * T * 576 + 1 * T * 576
    assert r["o_proj"]["flops"] == 2 * T * H * 128 * h
    assert r["attn_absorb"]["flops"] == 0 and r["attn_decode"]["flops"] == 0


def test_mla_decode_layer_by_hand():
    """Decode absorbs W_UK into the query and W_UV into the output (two batched GEMMs per token) and attends
    over the 576-wide latent directly: scores over 512 + 64, values over 512."""
    r = rows(dep("deepseek-v3", kv="fp8"), DECODE)
    D, keys, H = 64, 128_000 + 64, 128
    assert r["attn_absorb"]["flops"] == 2 * D * H * (128 * 512 + 512 * 128)
    assert r["attn_absorb"]["bytes"] == 2 * H * 512 * 256 + 2 * D * H * (128 + 2 * 512 + 128)
    assert r["attn_decode"]["flops"] == 2 * H * (576 + 512) * keys
    assert r["attn_decode"]["bytes"] == 1 * 576 * keys + 2 * D * H * (576 + 512)  # the fp8 latent, once per key
    assert r["kv_up_proj"]["flops"] == 0
    # what MLA saves: a cached key costs 576 bytes (fp8) to read; 128 heads of K and V in bf16 would cost 65,536


def test_mla_attention_splits_heads_over_tp():
    r1, r8 = rows(dep("deepseek-v3"), DECODE), rows(dep("deepseek-v3", hw="h200", tp=8), DECODE)
    assert r8["attn_decode"]["flops"] == r1["attn_decode"]["flops"] / 8
    assert r8["attn_absorb"]["flops"] == r1["attn_absorb"]["flops"] / 8


def test_deepseek_v2_lite_config_without_q_lora(tmp_path):
    cfg = {"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408,
           "num_attention_heads": 16, "num_key_value_heads": 16, "num_hidden_layers": 27, "first_k_dense_replace": 1,
           "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6, "q_lora_rank": None,
           "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
           "vocab_size": 102400, "max_position_embeddings": 163840, "torch_dtype": "bfloat16",
           "_name_or_path": "deepseek-ai/DeepSeek-V2-Lite"}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    m = load_hf_config(p)
    assert (m.name, m.q_lora_rank, m.moe_layers, m.shared_intermediate_size) == ("deepseek-ai/DeepSeek-V2-Lite", 0,
                                                                                 26, 2816)
    # the model card: 15.7B total, 2.4B activated (without the embedding)
    assert m.params_total / 1e9 == pytest.approx(15.7, abs=0.05)
    assert (m.params_active - m.embedding_params) / 1e9 == pytest.approx(2.4, abs=0.06)
    r = rows(Deployment(m, get_hardware("a100-80gb"), 1), PREFILL)
    assert r["qkv_proj"]["flops"] == 2 * 512 * (2048 * 16 * 192 + 2048 * 576)  # a direct query projection


def test_a_dense_profile_on_a_moe_model_says_what_it_does_not_cover(tmp_path):
    from blendsim.sim.build_cost import build_cost_model
    from blendsim.sim.profile import OpFit, Profile, model_shape

    # Mixtral's attention has Mistral-7B's shapes, so a Mistral profile prices it; its experts are roofline
    fit = OpFit(op="qkv_proj", vars=("tokens",), terms=[[0], [1]], coef=[1e-5, 1e-7], scale=[1.0],
                domain=[[1, 8192]])
    prof = Profile(model="mistral-7b", model_shape=model_shape(get_model("mistral-7b")), dtype="bf16", tp=1,
                   ops={"qkv_proj": fit}, path="p.json")
    c = build_cost_model(dep("mixtral-8x7b", weights=None), profile=prof)
    note = next(n for n in c.notes() if "MoE/MLA" in n)
    assert "router" in note and "moe_gate_up" in note and "qkv_proj" not in note


def test_api_cost_equals_the_command_for_moe():
    from typer.testing import CliRunner

    import blendsim
    from blendsim.cli import get_app

    args = dict(model="mixtral-8x7b", hardware="h100-80gb", tp=2, ep=2, weights="fp8", kv_dtype="fp8",
                decode_seqs=4, context=100)
    c = blendsim.cost(**args)
    r = CliRunner().invoke(get_app(), ["cost", "-m", "mixtral-8x7b", "--hardware", "h100-80gb", "--tp", "2", "--ep", "2",
                                       "--weights", "fp8", "--kv-dtype", "fp8", "--decode-seqs", "4", "--context",
                                       "100", "--json"])
    assert r.exit_code == 0, r.output
    assert {k: v for k, v in c.items() if k != "notes"} == json.loads(r.stdout)
    assert {row["op"]: row["layers"] for row in c["per_layer"]}["moe_gate_up"] == 32


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_engine_profile_cost_models_price_moe_and_mla_consistently(engine):
    """The engine profiles' cost models (fitted efficiencies, CUDA-graph padding) keep step == cost."""
    from blendsim.sim.build_cost import build_cost_model
    from blendsim.sim.engines import PROFILES

    if engine not in PROFILES:
        pytest.skip(f"no engine profile {engine}")
    for d in (dep("deepseek-v3", hw="h200", tp=8, kv="fp8"), dep("mixtral-8x7b", tp=2, ep=2)):
        c = build_cost_model(d, "sequential", engine)
        for f in FEATS:
            ref = c.cost(f)
            t, comp, mem = c.step(f.num_tokens, f.num_prefill_tokens, f.num_prefill_seqs, f.attn_pairs,
                                  f.prefill_kv_tokens, f.num_decode, f.decode_ctx_sum, f.num_logits)
            assert (t, comp, mem) == pytest.approx((ref.time_s, ref.compute_s, ref.memory_s), rel=1e-9)
