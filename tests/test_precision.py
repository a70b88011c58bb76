"""Precisions (weights bf16/fp16/fp8/fp4/int4, KV bf16/fp16/fp8), per-precision hardware peaks, the new
presets, and config.json validation. Expected numbers are worked by hand from the shapes and datasheets."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.sim.batch import BatchFeatures
from blendsim.sim.cost import CostModel
from blendsim.sim.deployment import Deployment
from blendsim.sim.errors import UserError
from blendsim.sim.hardware import PRESETS as HW
from blendsim.sim.hardware import get_hardware
from blendsim.sim.models import PRESETS, SUPPORTED_TYPES, get_model, load_hf_config

L8 = "llama-3.1-8b"


def dep(model=L8, hw="h100-80gb", tp=1, **prec):
    return Deployment(get_model(model, **prec), get_hardware(hw), tp, kv_capacity_override=10**12)


def op(cm: CostModel, f, name: str) -> dict:
    return next(r for r in cm.breakdown(f) if r["op"] == name)


# ---- weight and KV bytes ---------------------------------------------------------------------------


def test_llama31_8b_fp8_halves_the_gemm_weight_bytes():
    bf, f8 = get_model(L8), get_model(L8, weights="fp8")
    gemm = 32 * (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 14336)  # QKV, O, gate+up+down of 32 layers
    assert bf.gemm_weight_params == f8.gemm_weight_params == gemm
    rest = bf.num_params - gemm  # embedding, LM head and norms stay in bf16
    assert bf.weight_bytes == 2 * bf.num_params
    assert f8.weight_bytes == gemm * 1 + rest * 2
    assert (bf.weight_bytes - rest * 2) == 2 * (f8.weight_bytes - rest * 2)  # the GEMM weights: exactly half
    assert 0.5 < f8.weight_bytes / bf.weight_bytes < 0.6  # 9.08 GB vs 16.06 GB in all
    # and what a decode step reads of them: half the QKV weight bytes
    f = BatchFeatures.decode_only(1, 0)
    b16, b8 = op(CostModel(dep()), f, "qkv_proj"), op(CostModel(dep(weights="fp8")), f, "qkv_proj")
    act = 2 * (4096 + 6144)  # one token in and out, bf16 activations
    assert b16["bytes"] - act == 2 * (b8["bytes"] - act) == 2 * 4096 * 6144


@pytest.mark.parametrize("w, bits", [("fp4", 4.5), ("int4", 4 + 20 / 128)])
def test_four_bit_weights_count_their_scales(w, bits):
    m = get_model(L8, weights=w)
    assert m.weight_bytes == round(m.gemm_weight_params * bits / 8 + (m.num_params - m.gemm_weight_params) * 2)


def test_fp8_kv_halves_kv_bytes_and_doubles_capacity():
    bf, f8 = get_model(L8), get_model(L8, kv_dtype="fp8")
    assert bf.kv_bytes_per_token == 2 * 8 * 128 * 32 * 2 == 2 * f8.kv_bytes_per_token
    d16 = Deployment(bf, get_hardware("h100-80gb"))
    d8 = Deployment(f8, get_hardware("h100-80gb"))
    assert d8.kv_capacity_bytes == d16.kv_capacity_bytes
    assert d8.kv_capacity_tokens == int(d16.kv_capacity_bytes // 65536)


def test_memory_left_for_kv_follows_the_weight_precision():
    hw = get_hardware("a100-80gb")
    d16, d8 = Deployment(get_model(L8), hw), Deployment(get_model(L8, weights="fp8"), hw)
    saved = get_model(L8).weight_bytes - get_model(L8, weights="fp8").weight_bytes
    assert d8.kv_capacity_bytes - d16.kv_capacity_bytes == pytest.approx(saved, rel=1e-12)
    # llama-3-70b does not fit one A100 in bf16, but does with int4 weights (~37 GiB)
    with pytest.raises(UserError, match="bf16 weights"):
        Deployment(get_model("llama-3.1-70b"), hw)
    Deployment(get_model("llama-3.1-70b", weights="int4"), hw)


def test_precision_errors_are_one_line():
    with pytest.raises(UserError, match="--weights fp6: use one of bf16, fp16, fp8, fp4, int4"):
        get_model(L8, weights="fp6")
    with pytest.raises(UserError, match="--kv-dtype fp4: use one of bf16, fp16, fp8"):
        get_model(L8, kv_dtype="fp4")


# ---- GEMM peaks per precision --------------------------------------------------------------------------


def test_gemm_precision_per_device():
    h100, a100, b200 = get_hardware("h100-80gb"), get_hardware("a100-80gb"), get_hardware("b200")
    assert [h100.gemm_precision(p) for p in ("bf16", "fp8", "fp4", "int4")] == ["bf16", "fp8", "bf16", "bf16"]
    assert [a100.gemm_precision(p) for p in ("fp8", "fp4")] == ["bf16", "bf16"]  # no FP8 tensor cores
    assert [b200.gemm_precision(p) for p in ("fp8", "fp4")] == ["fp8", "fp4"]
    assert h100.flops_for("fp8") == 1978.9e12 and a100.flops_for("fp8") == 312e12
    assert b200.flops_for("fp4") == 9000e12 and b200.flops_for("bf16") == 2250e12


def test_compute_bound_gemm_runs_at_the_fp8_peak_where_there_is_one():
    f = BatchFeatures.prefill_only(4096)
    flops = 2 * 4096 * 4096 * 14336 * 2  # gate+up GEMM of llama-3.1-8b, 4096 rows (a multiple of the tile)

    def t(hw, **prec):
        return op(CostModel(dep(hw=hw, **prec)), f, "gate_up_proj")

    h16, h8, h4 = t("h100-80gb"), t("h100-80gb", weights="fp8"), t("h100-80gb", weights="int4")
    assert h16["flops"] == h8["flops"] == flops
    # compute-bound: time ~ FLOPs / (peak x 0.70); the p-norm blend adds the (small) memory term
    assert h16["time_s"] == pytest.approx(flops / (989.4e12 * 0.7), rel=0.02)
    assert h8["time_s"] == pytest.approx(flops / (1978.9e12 * 0.7), rel=0.02)
    assert h4["time_s"] == pytest.approx(h16["time_s"], rel=0.02)  # int4: dequantised to 16-bit compute
    a16, a8 = t("a100-80gb"), t("a100-80gb", weights="fp8")
    assert a8["time_s"] == pytest.approx(a16["time_s"], rel=0.01)  # A100: FP8 weights at the BF16 peak
    b4, b8 = t("b200", weights="fp4"), t("b200", weights="fp8")
    assert b4["time_s"] < 0.6 * b8["time_s"]


def test_fp8_decode_is_faster_by_reading_fewer_bytes():
    f = BatchFeatures.decode_only(8, 2000)
    c16 = CostModel(dep()).cost(f)
    c8 = CostModel(dep(weights="fp8", kv_dtype="fp8")).cost(f)
    assert c8.time_s < 0.7 * c16.time_s


def test_every_hardware_preset_cites_its_figures():
    for h in HW.values():
        assert h.source, h.name
        assert h.peak_flops_fp8 == 0 or h.peak_flops_fp8 == pytest.approx(2 * h.peak_flops, rel=0.02), h.name  # L40S: 733 vs 2 x 362
        assert h.peak_flops_fp4 == 0 or h.peak_flops_fp4 == pytest.approx(2 * h.peak_flops_fp8, rel=0.01), h.name
    for name in ("h100-80gb", "h100-pcie", "h200", "h20", "b200", "gb200", "l40s", "mi300x"):
        assert HW[name].peak_flops_fp8 > 0, name
    assert HW["a100-80gb"].peak_flops_fp8 == 0  # Ampere: no FP8 tensor cores


# ---- presets -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, billions",
    [("llama-3.1-8b", 8.03), ("llama-3.1-70b", 70.55), ("llama-3.3-70b", 70.55), ("llama-3.1-405b", 405.85),
     ("llama-2-70b", 68.98), ("qwen3-8b", 8.19)],
)
def test_dense_presets_match_published_sizes(name, billions):
    assert PRESETS[name].num_params / 1e9 == pytest.approx(billions, abs=0.01)
    assert PRESETS[name].source.startswith("HuggingFace config.json of ")


def test_old_preset_names_still_work():
    assert get_model("llama-3-8b").fingerprint() == get_model("llama-3.1-8b").fingerprint()
    for name in ("llama-3-8b", "llama-3-70b", "llama-2-7b", "qwen2.5-7b", "mistral-7b", "opt-13b", "tiny"):
        get_model(name)


# ---- config.json validation and naming ----------------------------------------------------------------------

LLAMA = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
         "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256, "torch_dtype": "bfloat16"}


def _write(path, cfg):
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize(
    "change, message",
    [({"head_dim": -64}, "field 'head_dim' must be >= 1, got -64"),
     ({"max_position_embeddings": 0}, "field 'max_position_embeddings' must be >= 1, got 0"),
     ({"max_position_embeddings": -5}, "field 'max_position_embeddings' must be >= 1"),
     ({"num_key_value_heads": 5}, "is not a multiple of num_key_value_heads (5)"),
     ({"model_type": "falcon"}, "model_type 'falcon' is not supported (supported: llama, mistral"),
     ({"quantization_config": {"quant_method": "bitnet"}}, "give the weight precision with --weights")],
)
def test_config_errors_name_the_file(tmp_path, change, message):
    p = _write(tmp_path / "m.json", {**LLAMA, **change})
    with pytest.raises(UserError) as e:
        load_hf_config(p)
    assert message in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)


def test_supported_types_listed_in_one_line(tmp_path):
    p = _write(tmp_path / "config.json", {**LLAMA, "model_type": "mamba"})
    with pytest.raises(UserError) as e:
        load_hf_config(p)
    assert all(t in str(e.value) for t in SUPPORTED_TYPES)


def test_config_model_is_named_from_its_file_not_its_folder(tmp_path):
    (tmp_path / "cfg").mkdir()
    assert load_hf_config(_write(tmp_path / "cfg" / "llama2-70b.json", LLAMA)).name == "llama2-70b"
    named = {**LLAMA, "_name_or_path": "meta-llama/Llama-3.1-8B"}
    assert load_hf_config(_write(tmp_path / "cfg" / "config.json", named)).name == "meta-llama/Llama-3.1-8B"
    arch = {**LLAMA, "architectures": ["LlamaForCausalLM"]}
    assert load_hf_config(_write(tmp_path / "cfg" / "config.json", arch)).name == "LlamaForCausalLM-8.0B"


def test_quantization_config_sets_the_weight_precision(tmp_path):
    for q, w in [({"quant_method": "fp8"}, "fp8"), ({"quant_method": "awq", "bits": 4}, "int4"),
                 ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "fp4")]:
        assert load_hf_config(_write(tmp_path / "q.json", {**LLAMA, "quantization_config": q})).weights == w


def test_sweep_compares_configs_by_content(tmp_path):
    from blendsim.sweep import SweepSpec, check_spec

    a = _write(tmp_path / "config.json", LLAMA)
    (tmp_path / "b").mkdir()
    b = _write(tmp_path / "b" / "config.json", {**LLAMA, "num_hidden_layers": 16})
    same = _write(tmp_path / "same.json", LLAMA)

    def spec(*models):
        return check_spec(SweepSpec("blendserve", (1.0,), (0.2,), ("dfs",), tuple(map(str, models)), ("a100-80gb",),
                                    100))

    names = spec(a, b).model_names
    assert len(set(names.values())) == 2  # two different configs in one folder tree: two models
    with pytest.raises(UserError, match="two of them are the same model"):
        spec(a, same)


# ---- command line ------------------------------------------------------------------------------------------


def _run(*args):
    return CliRunner().invoke(get_app(), list(args), env={"COLUMNS": "80"})


def test_cost_cli_precision_options():
    r = _run("cost", "-m", L8, "--hardware", "h100-80gb", "--weights", "fp8", "--kv-dtype", "fp8",
             "--decode-seqs", "16", "--context", "1000", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert (out["weights"], out["kv_dtype"], out["dtype"]) == ("fp8", "fp8", "bf16")
    r = _run("cost", "-m", L8, "--weights", "fp6", "--decode-seqs", "1")
    assert r.exit_code == 2 and "--weights fp6" in r.output


@pytest.mark.parametrize("args", [["models"], ["hardware"], ["models", "llama-3.1-8b"], ["hardware", "b200"]])
def test_listings_fit_80_columns(args):
    r = _run(*args)
    assert r.exit_code == 0, r.output
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    assert "…" not in r.stdout


def test_models_json_has_every_derived_field():
    r = _run("models", L8, "--kv-dtype", "fp8", "--json")
    d = json.loads(r.stdout)
    assert d["params_total"] == d["params_active"] == 8_030_261_248
    assert d["kv_bytes_per_token"] == 65536 and d["kv_dtype"] == "fp8"


def _profile(tmp_path):
    from blendsim.sim.profile import OpFit, Profile, model_shape

    fit = OpFit(op="attn_decode", vars=("batch", "context"), terms=[[0, 0], [1, 0]], coef=[5e-6, 2e-6],
                scale=[64.0, 4096.0], domain=[[1, 1024], [16, 32768]])
    p = Profile(model=L8, model_shape=model_shape(get_model(L8)), dtype="bf16", tp=1, ops={"attn_decode": fit})
    return p.save(tmp_path / "p.json")


def test_a_bf16_profile_does_not_price_fp8_runs(tmp_path):
    path = _profile(tmp_path)
    r = _run("cost", "-m", L8, "--profile", str(path), "--weights", "fp8", "--decode-seqs", "4")
    assert r.exit_code == 2 and "measured in bf16, but the run uses --weights fp8" in r.output
    assert len(r.output.strip().splitlines()) == 1
    r = _run("calibrate", "show", str(path), "--weights", "fp8", "--kv-dtype", "bf16")
    assert r.exit_code == 0, r.output
    assert "does not price runs with --weights fp8" in r.stdout
    r = _run("calibrate", "show", str(path), "--kv-dtype", "bf16")
    assert "it prices runs with these precisions" in r.stdout


def test_sweep_passes_precisions_to_every_cell():
    from blendsim.sweep import SweepSpec, check_spec

    spec = check_spec(SweepSpec("blendserve", (1.0,), (0.2,), ("dfs",), ("mixtral-8x7b",), ("h200",), 100,
                                precision={"weights": "fp8", "kv_dtype": "fp8", "tp": 2, "ep": 2}))
    assert spec.run_settings()["weights"] == "fp8" and (spec.run_settings()["tp"], spec.run_settings()["ep"]) == (2, 2)
    assert spec.settings()["precision"] == {"ep": 2, "kv_dtype": "fp8", "tp": 2, "weights": "fp8"}
    with pytest.raises(UserError, match="--ep 2 must divide --tp 1"):  # checked before any cell runs
        check_spec(SweepSpec("blendserve", (1.0,), (0.2,), ("dfs",), ("mixtral-8x7b",), ("h200",), 100,
                             precision={"ep": 2}))
    plain = check_spec(SweepSpec("blendserve", (1.0,), (0.2,), ("dfs",), ("llama-3-8b",), ("h200",), 100))
    assert "precision" not in plain.settings()  # sweeps made before these options still resume


# ---- property: any config.json is refused in one line or priced finitely --------------------------------------

MOE = {"model_type": "deepseek_v3", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64,
       "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 4, "first_k_dense_replace": 1,
       "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4, "q_lora_rank": 64,
       "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "vocab_size": 1000,
       "max_position_embeddings": 4096}
# NOTE: no subnormal floats: a library loaded by other tests may leave the CPU in flush-to-zero mode
VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_subnormal=False),
                   st.text(max_size=5), st.lists(st.integers(-3, 60), max_size=3))


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.sampled_from([LLAMA, MOE]), key=st.sampled_from(sorted(set(LLAMA) | set(MOE) | {"head_dim",
       "mlp_only_layers", "decoder_sparse_step"})), value=VALUES)
def test_malformed_configs_are_refused_or_priced_finitely(tmp_path_factory, base, key, value):
    import math

    p = tmp_path_factory.mktemp("cfg") / "config.json"
    p.write_text(json.dumps({**base, key: value}))
    try:
        m = load_hf_config(p)
    except UserError as e:
        assert "\n" not in str(e) and str(p) in str(e)
        return
    try:
        d = Deployment(m, get_hardware("h100-80gb"), 1, kv_capacity_override=10**12)
    except UserError as e:
        assert "\n" not in str(e)
        return
    for f in (BatchFeatures.decode_only(3, 100), BatchFeatures.prefill_only(64, 32)):
        for r in CostModel(d).breakdown(f):
            assert math.isfinite(r["time_s"]) and r["time_s"] >= 0 and r["flops"] >= 0 and r["bytes"] >= 0, r


@pytest.mark.parametrize("base", [LLAMA, MOE], ids=["llama", "deepseek_v3"])
@pytest.mark.parametrize("value", [2**31, 2**40, 2**62])
def test_huge_config_integers_are_one_line_not_an_overflow_or_oom(tmp_path, base, value):
    """Found by the property test run unseeded: 2**40 layers or experts allocated without end (the test
    process was OOM-killed at 24 GB), 2**62 widths raised OverflowError. Every integer is bounded."""
    for key in sorted(k for k, v in base.items() if isinstance(v, int) and not isinstance(v, bool)):
        p = tmp_path / f"{key}.json"
        p.write_text(json.dumps({**base, key: value}))
        try:
            Deployment(load_hf_config(p), get_hardware("h100-80gb"), 1, kv_capacity_override=10**12)
        except UserError as e:
            assert "\n" not in str(e) and str(p) in str(e), (key, str(e))
            assert value == 2**31 or "beyond any model" in str(e), (key, str(e))
        else:
            assert value == 2**31 and key == "max_position_embeddings", key  # 2**31 positions: allowed


def test_weights_given_by_the_user_override_a_quantization_blendsim_does_not_read(tmp_path):
    from blendsim.sim.models import get_model

    p = _write(tmp_path / "q.json", {**LLAMA, "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}})
    assert get_model(str(p), weights="int4").weights == "int4"
    with pytest.raises(UserError, match="give the weight precision with --weights"):
        get_model(str(p))


def test_a_config_without_model_type_or_with_unknown_layer_types_is_one_line(tmp_path):
    cfg = {k: v for k, v in LLAMA.items() if k != "model_type"}
    p = _write(tmp_path / "n.json", {**cfg, "architectures": ["Qwen3MoeForCausalLM"]})
    with pytest.raises(UserError) as e:
        load_hf_config(p)
    assert str(e.value).startswith(f"{p}: field 'model_type' is missing (architectures: ['Qwen3MoeForCausalLM'])")
    oss = {**LLAMA, "model_type": "gpt_oss", "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 128,
           "layer_types": ["foo"] * 32}
    with pytest.raises(UserError, match="field 'layer_types': unknown attention type 'foo'"):
        load_hf_config(_write(tmp_path / "o.json", oss))
