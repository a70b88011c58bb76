"""Specs: parameter counts, KV bytes, HuggingFace config loading, hardware and deployment checks.

Every expected number is worked out by hand from the architecture (hidden H, layers L, heads, KV
heads, head dim d, MLP width I, vocabulary V) and written out, never read back from the code.
"""

from __future__ import annotations

import json

import pytest

from blendsim.sim.deployment import Deployment
from blendsim.sim.errors import UserError
from blendsim.sim.hardware import GiB, HardwareSpec, get_hardware
from blendsim.sim.models import PRESETS, ModelSpec, get_model, load_hf_config

# ---- parameter counts ------------------------------------------------------------------------


def test_llama3_8b_params_by_hand():
    # H 4096, L 32, 32 heads / 8 KV heads of 128, I 14336, V 128256, untied head.
    qkv = 4096 * (4096 + 2 * 8 * 128)  # 25,165,824
    o = 4096 * 4096  # 16,777,216
    gate_up = 4096 * 2 * 14336  # 117,440,512
    down = 14336 * 4096  # 58,720,256
    layer = qkv + o + gate_up + down + 2 * 4096  # two RMSNorm weights: 218,112,000
    total = 128256 * 4096 + 32 * layer + 4096 + 128256 * 4096  # embed + layers + final norm + head
    assert total == 8_030_261_248
    m = get_model("llama-3-8b")
    assert m.layer_linear_params == qkv + o + gate_up + down == 218_103_808
    assert m.num_params == total
    assert m.weight_bytes == 2 * total  # bf16


def test_llama2_7b_params_by_hand():
    # MHA: 32 KV heads, I 11008, V 32000.
    layer = 4096 * 3 * 4096 + 4096 * 4096 + 4096 * 2 * 11008 + 11008 * 4096 + 2 * 4096
    total = 2 * 32000 * 4096 + 32 * layer + 4096
    assert total == 6_738_415_616
    assert get_model("llama-2-7b").num_params == total


def test_qwen25_7b_params_by_hand():
    # H 3584, L 28, 28 heads / 4 KV heads of 128, I 18944, V 152064, q/k/v biases, untied head.
    qkv_out = 3584 + 2 * 4 * 128  # 4608
    layer = 3584 * qkv_out + 3584 * 3584 + 3584 * 2 * 18944 + 18944 * 3584 + qkv_out + 2 * 3584
    total = 2 * 152064 * 3584 + 28 * layer + 3584
    assert total == 7_615_616_512
    assert get_model("qwen2.5-7b").num_params == total


def test_opt13b_params_by_hand():
    # H 5120, L 40, MHA 40 heads, plain MLP I 20480, V 50272, learned positions (2048), tied head.
    # (Linear biases and LayerNorm biases are not counted: 0.02% of the total.)
    layer = 5120 * 3 * 5120 + 5120 * 5120 + 5120 * 20480 + 20480 * 5120 + 2 * 5120
    total = 50272 * 5120 + 2048 * 5120 + 40 * layer + 5120
    assert total == 12_851_205_120
    assert get_model("opt-13b").num_params == total


@pytest.mark.parametrize(
    "name, published, digits",
    [
        ("llama-3-8b", 8.03, 2),  # sizes as published on the model cards
        ("llama-3-70b", 70.6, 1),
        ("llama-2-7b", 6.74, 2),
        ("qwen2.5-7b", 7.62, 2),
        ("qwen2.5-72b", 72.7, 1),
        ("mistral-7b", 7.24, 2),
        ("opt-13b", 12.85, 2),
    ],
)
def test_param_counts_match_published_sizes(name, published, digits):
    got = PRESETS[name].num_params / 1e9
    # the published figure is the count rounded to its printed precision, plus 5M of slack
    # (Qwen2.5-7B's 7,615,616,512 is listed as 7.62B)
    assert abs(got - published) <= 0.5 * 10 ** -digits + 0.005, (name, got)


# ---- KV bytes per token ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, expected",
    [
        ("llama-3-8b", 2 * 8 * 128 * 32 * 2),  # K and V x 8 KV heads x 128 x 32 layers x bf16 = 131,072
        ("llama-2-7b", 2 * 32 * 128 * 32 * 2),  # MHA: 524,288
        ("qwen2.5-7b", 2 * 4 * 128 * 28 * 2),  # 57,344
        ("opt-13b", 2 * 40 * 128 * 40 * 2),  # fp16: 819,200
        ("llama-3-70b", 2 * 8 * 128 * 80 * 2),  # 327,680
    ],
)
def test_kv_bytes_per_token(name, expected):
    assert PRESETS[name].kv_bytes_per_token == expected


def test_kv_bytes_follow_dtype():
    m = get_model("llama-3-8b", dtype="fp8")
    assert m.kv_bytes_per_token == 2 * 8 * 128 * 32 * 1
    assert get_model("llama-3-8b", dtype="fp32").weight_bytes == 4 * 8_030_261_248


# ---- ModelSpec validation --------------------------------------------------------------------


def test_modelspec_rejects_bad_shapes():
    with pytest.raises(UserError, match="not a multiple of num_kv_heads"):
        ModelSpec("bad", 4096, 32, 32, 6, 14336, 32000)
    with pytest.raises(UserError, match="hidden_size must be positive"):
        ModelSpec("bad", 0, 32, 32, 8, 14336, 32000)
    with pytest.raises(UserError, match="unknown dtype"):
        ModelSpec("bad", 4096, 32, 32, 8, 14336, 32000, dtype="int3")
    with pytest.raises(UserError, match="give head_dim"):
        ModelSpec("bad", 4000, 32, 48, 8, 14336, 32000)


def test_get_model_unknown_name_is_user_error(tmp_path):
    with pytest.raises(UserError, match="unknown model 'nope'"):
        get_model("nope")
    with pytest.raises(UserError, match="unknown dtype"):
        get_model("llama-3-8b", dtype="fp4")
    with pytest.raises(UserError, match="no config.json"):
        get_model(str(tmp_path))  # a folder without config.json


# ---- HuggingFace config.json ------------------------------------------------------------------

LLAMA3_CFG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "rope_theta": 500000.0,
}


def _write(tmp_path, cfg, name="config.json"):
    p = tmp_path / name
    p.write_text(json.dumps(cfg) if not isinstance(cfg, str) else cfg)
    return p


def test_hf_llama_config_equals_preset(tmp_path):
    p = _write(tmp_path, LLAMA3_CFG)
    m = load_hf_config(p)
    ref = get_model("llama-3-8b")
    for f in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size",
              "head_dim", "gated_mlp", "rope", "dtype", "tie_word_embeddings"):
        assert getattr(m, f) == getattr(ref, f), f
    assert m.num_params == 8_030_261_248
    # a folder holding config.json works too, through get_model
    assert get_model(str(tmp_path)).num_params == 8_030_261_248


def test_hf_qwen2_and_opt_layouts(tmp_path):
    qwen = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
            "num_hidden_layers": 28, "num_key_value_heads": 4, "vocab_size": 152064,
            "max_position_embeddings": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    m = load_hf_config(_write(tmp_path, qwen, "qwen.json"))
    assert m.qkv_bias and m.gated_mlp and m.head_dim == 128
    assert m.num_params == 7_615_616_512
    opt = {"model_type": "opt", "hidden_size": 5120, "ffn_dim": 20480, "num_attention_heads": 40,
           "num_hidden_layers": 40, "vocab_size": 50272, "max_position_embeddings": 2048, "torch_dtype": "float16"}
    o = load_hf_config(_write(tmp_path, opt, "opt.json"))
    assert (o.gated_mlp, o.rope, o.tie_word_embeddings, o.dtype) == (False, False, True, "fp16")
    assert o.num_params == 12_851_205_120


def test_hf_config_explicit_head_dim(tmp_path):
    cfg = dict(LLAMA3_CFG, head_dim=256, num_attention_heads=16, num_key_value_heads=4)
    m = load_hf_config(_write(tmp_path, cfg))
    assert (m.q_dim, m.kv_dim) == (16 * 256, 4 * 256)


@pytest.mark.parametrize(
    "cfg, message",
    [
        ("{not json", "not valid JSON (line 1"),
        ("[1, 2]", "expected a JSON object"),
        ({k: v for k, v in LLAMA3_CFG.items() if k != "num_hidden_layers"}, "missing field 'num_hidden_layers'"),
        ({k: v for k, v in LLAMA3_CFG.items() if k != "vocab_size"}, "missing field 'vocab_size'"),
        (dict(LLAMA3_CFG, hidden_size="4096"), "field 'hidden_size' must be an integer"),
        (dict(LLAMA3_CFG, num_key_value_heads=True), "field 'num_key_value_heads' must be an integer"),
        # the config's own field names in a spec error, not the spec's (num_heads, num_kv_heads)
        (dict(LLAMA3_CFG, num_key_value_heads=5), "num_attention_heads (32) is not a multiple of "
                                                  "num_key_value_heads (5)"),
        # fields that size the model are never guessed (transformers' LlamaConfig would take 11008)
        ({k: v for k, v in LLAMA3_CFG.items() if k != "intermediate_size"},
         "missing field 'intermediate_size' (the MLP's inner width)"),
    ],
)
def test_hf_config_errors_are_one_clear_line(tmp_path, cfg, message):
    p = _write(tmp_path, cfg)
    with pytest.raises(UserError) as e:
        load_hf_config(p)
    text = str(e.value)
    assert message in text
    assert "\n" not in text
    if "missing" in message or "JSON" in message or "integer" in message:
        assert str(p) in text  # names the file


def test_hf_config_unreadable_file(tmp_path):
    p = tmp_path / "config.json"
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(UserError, match="cannot read config|not valid JSON"):
        load_hf_config(p)


# ---- hardware ----------------------------------------------------------------------------------


def test_hardware_presets_and_errors():
    a100 = get_hardware("a100-80gb")
    assert a100.peak_flops == 312e12 and a100.memory_bytes == 80 * GiB
    assert a100.mem_bandwidth == pytest.approx(2.039e12, rel=1e-12)
    assert a100.flops_for("fp32") == 19.5e12 and a100.flops_for("bf16") == 312e12
    with pytest.raises(UserError, match="unknown hardware 'tpu-v9'"):
        get_hardware("tpu-v9")
    with pytest.raises(UserError, match="compute_efficiency must be in"):
        a100.with_(compute_efficiency=1.2)
    with pytest.raises(UserError, match="overlap_interference"):
        a100.with_(overlap_interference=-0.1)
    with pytest.raises(UserError, match="peak_flops must be positive"):
        HardwareSpec("x", 0.0, 1e12, GiB)
    # FP32 peak defaults to a sixteenth of the tensor peak
    assert HardwareSpec("x", 160e12, 1e12, GiB).peak_flops_fp32 == 10e12


# ---- deployment: TP and KV capacity ------------------------------------------------------------


def test_kv_capacity_by_hand_llama3_8b_a100():
    dep = Deployment(get_model("llama-3-8b"), get_hardware("a100-80gb"), 1)
    usable = 80 * GiB * 0.90
    weights = 2 * 8_030_261_248
    # activation reserve: 8192 tokens x ((2 x 14336 + 14336) + 3 x 4096 + 6144) x 2 bytes
    #                     + 1024 sampled rows x 128256 x 4 bytes of float32 logits
    act = 8192 * (3 * 14336 + 3 * 4096 + 6144) * 2 + 1024 * 128256 * 4
    assert dep.activation_reserve_bytes == act
    assert dep.kv_capacity_bytes == pytest.approx(usable - weights - act, rel=1e-12)
    assert dep.kv_capacity_tokens == int((usable - weights - act) // 131072)
    assert dep.num_blocks(16) == dep.kv_capacity_tokens // 16


def test_kv_replicated_when_tp_exceeds_kv_heads():
    # llama-3-70b has 8 KV heads: at tp=16 each KV head lives on two GPUs, so a token costs 2x.
    m = get_model("llama-3-70b")
    d8 = Deployment(m, get_hardware("a100-80gb"), 8)
    d16 = Deployment(m, get_hardware("a100-80gb"), 16, kv_capacity_override=10**9)
    assert d8.kv_bytes_per_token == 327680
    assert d16.kv_bytes_per_token == 2 * 327680
    assert d16.kv_capacity_tokens == 10**9 // (2 * 327680)


def test_deployment_errors():
    m = get_model("llama-3-70b")
    with pytest.raises(UserError, match="does not fit on a100-80gb with tp=1"):
        Deployment(m, get_hardware("a100-80gb"), 1)
    Deployment(m, get_hardware("a100-80gb"), 2)  # 70.6B x 2 bytes / 2 = 70.6 GB per GPU fits 72 GiB
    with pytest.raises(UserError, match="does not divide"):
        Deployment(get_model("llama-3-8b"), get_hardware("a100-80gb"), 3)
    with pytest.raises(UserError, match="at least 1"):
        Deployment(get_model("llama-3-8b"), get_hardware("a100-80gb"), 0)
    with pytest.raises(UserError, match="gpu_memory_utilization"):
        Deployment(get_model("llama-3-8b"), get_hardware("a100-80gb"), 1, gpu_memory_utilization=1.5)


def test_a_config_without_max_position_embeddings_takes_transformers_default(tmp_path):
    # what an engine loading the file through transformers takes (LlamaConfig 2048, Qwen2Config 32768), not a
    # number of blendsim's own
    cfg = {k: v for k, v in LLAMA3_CFG.items() if k != "max_position_embeddings"}
    assert load_hf_config(_write(tmp_path, cfg)).max_position_embeddings == 2048
    assert load_hf_config(_write(tmp_path, dict(cfg, model_type="qwen2"))).max_position_embeddings == 32768


def test_a_null_torch_dtype_is_an_absent_one(tmp_path):
    assert load_hf_config(_write(tmp_path, dict(LLAMA3_CFG, torch_dtype=None))).dtype == "bf16"


def test_moe_activation_reserve_counts_a_gpus_own_expert_rows():
    # with expert parallelism a GPU holds the routed rows of its own experts only: 1/ep of each token's top-k rows
    # (the engines' profiling runs route evenly), each row's intermediate split over the etp = tp / ep GPUs of its
    # expert. Qwen3-235B-A22B: top-8 of 128 experts of width 1,536, hidden 4,096, QKV 9,216, no dense layers
    def act(tp, ep):
        dep = Deployment(get_model("qwen3-235b-a22b"), get_hardware("h200"), tp, ep=ep)
        return dep.activation_reserve_bytes

    def by_hand(tp, ep):
        rows = 8 / ep
        per_token = (3 * 1536 * rows / (tp // ep) + rows * 4096) + 3 * 4096 + 9216 / tp
        return max(8192 * per_token * 2 + 1024 * 151936 * 4 / tp, 512 * 2**20)  # the CUDA-context floor

    for tp, ep in ((8, 1), (8, 2), (8, 8), (4, 4)):
        assert act(tp, ep) == pytest.approx(by_hand(tp, ep), rel=1e-12), (tp, ep)
    assert act(8, 8) < act(8, 2) < act(8, 1)  # the GPUs share the routed rows rather than each holding all of them
