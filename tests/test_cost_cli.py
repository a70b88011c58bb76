"""``blendsim cost``: the JSON shape, operator names, numbers equal to the library's, and user errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.sim.batch import BatchFeatures
from blendsim.sim.build_cost import build_cost_model
from blendsim.sim.deployment import Deployment
from blendsim.sim.hardware import get_hardware
from blendsim.sim.models import get_model
from blendsim.sim.profile import OpFit, Profile, model_shape

LAYER_OPS = ["qkv_proj", "rope", "kv_write", "attn_prefill", "attn_decode", "o_proj", "norm", "gate_up_proj", "act",
             "down_proj"]
MODEL_OPS = ["embedding", "lm_head", "allreduce"]


def invoke(*args: str):
    return CliRunner().invoke(get_app(), ["cost", *args])


def cost_json(*args: str) -> dict:
    r = invoke(*args, "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_json_shape_and_operator_names():
    out = cost_json("--model", "llama-3-8b", "--hardware", "a100-80gb", "--prefill-tokens", "512",
                    "--decode-seqs", "64", "--context", "1024")
    for key in ("step_time_s", "compute_s", "memory_s", "other_s", "comm_s", "overhead_s", "layers", "mode", "engine",
                "cost_model", "per_layer", "whole_model"):
        assert key in out, key
    assert out["layers"] == 32 and out["mode"] == "sequential" and out["engine"] == "ideal"
    assert out["cost_model"] == "roofline"
    assert [r["op"] for r in out["per_layer"]] == LAYER_OPS
    assert [r["op"] for r in out["whole_model"]] == MODEL_OPS
    for r in out["per_layer"] + out["whole_model"]:
        assert set(r) == {"op", "flops", "bytes", "time_s"}
        assert r["flops"] >= 0 and r["bytes"] >= 0 and r["time_s"] >= 0
    ops = {r["op"]: r for r in out["per_layer"] + out["whole_model"]}
    # 512 prefill tokens + 64 decode tokens through the QKV GEMM (4096 -> 6144)
    assert ops["qkv_proj"]["flops"] == 2 * 576 * 4096 * 6144
    # the chunk finishes its prompt: 64 + 1 rows through the LM head
    assert ops["lm_head"]["flops"] == 2 * 65 * 4096 * 128256
    assert ops["allreduce"]["bytes"] == 0
    # sequential: the step is the sum of its parts
    parts = out["compute_s"] + out["memory_s"] + out["other_s"] + out["comm_s"] + out["overhead_s"]
    assert out["step_time_s"] == pytest.approx(parts, rel=1e-12)


def test_json_numbers_equal_the_library():
    out = cost_json("--model", "qwen2.5-7b", "--hardware", "h100-80gb", "--tp", "2", "--mode", "overlap",
                    "--decode-seqs", "256", "--context", "2048", "--engine", "vllm")
    # --engine vllm is the vllm engine profile (sim.engines): its overhead, CUDA graphs, fitted efficiencies
    c = build_cost_model(Deployment(get_model("qwen2.5-7b"), get_hardware("h100-80gb"), 2), "overlap", "vllm")
    sc = c.cost(BatchFeatures.decode_only(256, 2048))
    assert out["step_time_s"] == pytest.approx(sc.time_s, rel=1e-12)
    assert (out["compute_s"], out["memory_s"], out["overhead_s"]) == pytest.approx(
        (sc.compute_s, sc.memory_s, sc.overhead_s), rel=1e-12)
    assert out["mode"] == "overlap" and out["engine"] == "vllm" and out["layers"] == 28
    ar = next(r for r in out["whole_model"] if r["op"] == "allreduce")
    assert ar["bytes"] == 2 * 256 * 3584 * 2 * 28 and ar["time_s"] > 0
    assert out["comm_s"] > 0
    assert out["step_time_s"] <= out["compute_s"] + out["memory_s"] + out["other_s"] + out["comm_s"] + out["overhead_s"]


def test_table_output_mentions_every_operator():
    r = invoke("--model", "opt-13b", "--decode-seqs", "8", "--context", "100")
    assert r.exit_code == 0, r.output
    for op in LAYER_OPS + MODEL_OPS:
        assert op in r.stdout
    assert "step" in r.stdout and "sequential" in r.stdout


def test_hf_config_path_as_model(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
           "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    a = cost_json("--model", str(tmp_path), "--decode-seqs", "32", "--context", "500")
    b = cost_json("--model", "llama-3-8b", "--decode-seqs", "32", "--context", "500")
    assert a["step_time_s"] == b["step_time_s"]


def make_profile(model: str = "llama-3-8b") -> Profile:
    """A one-operator profile (decode attention, bilinear in batch and context)."""
    fit = OpFit(op="attn_decode", vars=("batch", "context"), terms=[[0, 0], [1, 0], [1, 1]], coef=[5e-6, 2e-6, 8e-4],
                scale=[64.0, 4096.0], domain=[[1, 1024], [16, 32768]])
    return Profile(model=model, model_shape=model_shape(get_model(model)), dtype="bf16", tp=1,
                   ops={"attn_decode": fit})


def test_profile_option_and_note(tmp_path):
    path = make_profile().save(tmp_path / "p.json")
    r = invoke("--profile", str(path), "--decode-seqs", "64", "--context", "2048", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["cost_model"] == "profile"
    attn = next(x for x in out["per_layer"] if x["op"] == "attn_decode")
    assert attn["time_s"] == pytest.approx(5e-6 + 2e-6 * 1 + 8e-4 * 1 * 0.5, rel=1e-12)  # batch 64/64, ctx 2048/4096
    assert r.stderr.count("note:") == 1 and "o_proj" in r.stderr
    # a profile made for another model is refused in one line
    other = make_profile(model="llama-2-7b").save(tmp_path / "q.json")
    r = invoke("--profile", str(other), "--decode-seqs", "64")
    assert r.exit_code == 2
    assert r.stderr.count("\n") == 1 and "fitted for model 'llama-2-7b'" in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "gpt-5", "--decode-seqs", "4"], "unknown model 'gpt-5'"),
        (["--hardware", "tpu-v5", "--decode-seqs", "4"], "unknown hardware 'tpu-v5'"),
        (["--mode", "fast", "--decode-seqs", "4"], "unknown mode 'fast'"),
        (["--engine", "trt", "--decode-seqs", "4"], "unknown engine 'trt'"),
        (["--tp", "3", "--decode-seqs", "4"], "--tp 3 does not divide"),
        (["--decode-seqs", "0"], "give --prefill-tokens and/or --decode-seqs"),
        (["--decode-seqs", "4", "--context", "-1"], "must be >= 0"),
        (["--model", "llama-3-70b", "--decode-seqs", "4"], "does not fit on a100-80gb"),
        (["--profile", "/nonexistent/p.json", "--decode-seqs", "4"], "no such profile"),
    ],
)
def test_user_errors_exit_2_with_one_line(args, message):
    r = invoke(*args)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("blendsim: error: ")
    assert r.stderr.count("\n") == 1, r.stderr
    assert message in r.stderr
    assert "Traceback" not in r.output


def test_engine_overrides_change_only_that_profiles_overhead():
    """``--engine vllm:fixed_s=A`` prices kernels exactly as ``--engine vllm`` and adds A of overhead."""
    args = ("--model", "llama-3-8b", "--hardware", "h100-80gb", "--prefill-tokens", "300", "--context", "200",
            "--decode-seqs", "100")
    base = cost_json(*args, "--engine", "vllm")
    one = cost_json(*args, "--engine", "vllm:fixed_s=0.001")
    two = cost_json(*args, "--engine", "vllm:fixed_s=0.002")
    parts = ("compute_s", "memory_s", "other_s", "comm_s")
    assert [one[k] for k in parts] == [two[k] for k in parts] == [base[k] for k in parts]
    assert one["cost_model"] == two["cost_model"] == base["cost_model"] == "roofline+fitted"
    assert two["overhead_s"] - one["overhead_s"] == pytest.approx(0.001, abs=1e-15)
    assert (one["engine"], two["engine"]) == ("vllm:fixed_s=0.001", "vllm:fixed_s=0.002")
    assert base["per_layer"] == one["per_layer"] and base["whole_model"] == one["whole_model"]


def test_a_step_no_replica_can_hold_is_priced_with_a_note():
    r = CliRunner().invoke(get_app(), ["cost", "--decode-seqs", "1000000", "--context", "1000"])
    assert r.exit_code == 0 and "more than one replica's" in " ".join(r.output.split()), r.output
    r = CliRunner().invoke(get_app(), ["cost", "--decode-seqs", "64", "--context", "1000"])
    assert r.exit_code == 0 and "more than one replica's" not in r.output


def test_expert_skew_on_a_dense_model_is_said_to_change_nothing():
    plain = cost_json("--decode-seqs", "8", "--context", "100")
    r = invoke("--decode-seqs", "8", "--context", "100", "--expert-skew", "0.5", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == plain
    assert "note: --expert-skew 0.5: llama-3-8b has no routed experts; it changes nothing" in r.stderr
    import blendsim  # the Python API says the same

    assert ("--expert-skew 0.5: llama-3-8b has no routed experts; it changes nothing"
            in blendsim.cost(decode_seqs=8, context=100, expert_skew=0.5)["notes"])
    moe = invoke("-m", "mixtral-8x7b", "--tp", "2", "--decode-seqs", "8", "--context", "100", "--expert-skew", "0.5")
    assert moe.exit_code == 0, moe.output
    assert "changes nothing" not in moe.stderr


@pytest.mark.parametrize("engine, usable", [("ideal", "72.0"), ("sglang", "66.9"), ("sglang@0.5", "70.0"),
                                            ("sglang@0.4", "70.4"), ("trtllm", "80.0")])
def test_cost_sizes_memory_with_the_engines_settings_as_simulate_does(tmp_path, engine, usable):
    """A model that does not fit is told with the same figures by `cost` and `simulate` on each engine (its KV
    fraction, and TensorRT-LLM's of the memory the weights leave)."""
    from blendsim.workloads.trace import from_columns, write_trace

    path = write_trace(from_columns(input_len=[64] * 4, output_len=[8] * 4), tmp_path / "t.parquet")
    args = ["-m", "llama-3-70b", "--hardware", "a100-80gb", "--engine", engine]
    cost = invoke(*args, "--decode-seqs", "1")
    sim = CliRunner().invoke(get_app(), ["simulate", str(path), *args, "-o", str(tmp_path / "run")])
    assert cost.exit_code == sim.exit_code == 2, (cost.output, sim.output)
    said = cost.output.strip().splitlines()[-1]
    assert said == sim.output.strip().splitlines()[-1]
    assert f"GiB per GPU, {usable} GiB usable" in said


def test_cost_takes_the_step_limits_its_memory_message_names():
    """`cost` says "--token-budget / --max-seqs ... lower them" where the engine's largest step leaves no room: those
    options are cost's too, and with them the step is priced as simulate would run it. (vLLM: its memory fraction holds
    its activations; SGLang's holds weights and KV only, so its step never crowds out the weights.)"""
    args = ["-m", "llama-3-70b", "--weights", "fp8", "--engine", "vllm", "--decode-seqs", "1"]
    r = invoke(*args, "--token-budget", "16384", "--max-seqs", "4096")
    assert r.exit_code == 2 and "--token-budget 16384 / --max-seqs 4096" in r.output and "lower them" in r.output
    ok = invoke(*args, "--token-budget", "2048", "--max-seqs", "256", "--json")
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["step_time_s"] > 0
    bad = invoke("--decode-seqs", "1", "--token-budget", "0")
    assert bad.exit_code == 2 and "--token-budget" in bad.output


def test_the_header_names_experts_kept_in_their_own_precision():
    """--weights sets the dense GEMMs; gpt-oss's routed experts stay MXFP4 and the header says so."""
    from typer.testing import CliRunner

    from blendsim.cli import get_app

    r = CliRunner().invoke(get_app(), ["cost", "-m", "gpt-oss-20b", "--hardware", "h100-80gb", "--weights", "bf16",
                                       "--decode-seqs", "8", "--context", "100"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "weights bf16 (experts mxfp4), KV bf16" in r.output
    r = CliRunner().invoke(get_app(), ["cost", "--decode-seqs", "8", "--context", "100"], env={"COLUMNS": "200"})
    assert "(weights bf16, KV bf16)" in r.output


@pytest.mark.parametrize("args", [
    ("--mode", "overlap"),
    ("--mode", "overlap", "--engine", "nanoflow"),
    ("--mode", "overlap", "-m", "llama-3-70b", "--tp", "4"),
    ("--engine", "vllm", "--tp", "2"),
])
def test_the_printed_step_adds_up(args):
    """The text line under the table is the equation the cost model uses: in overlap mode the longer of compute
    and memory plus kappa of the shorter (a plain sum there would overstate the step), plus the collectives' share."""
    import re

    base = ("--prefill-tokens", "2048", "--decode-seqs", "256", "--context", "1024", *args)
    r = CliRunner().invoke(get_app(), ["cost", *base], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    line = next(x for x in r.stdout.splitlines() if x.startswith("step "))
    step = float(re.match(r"step ([\d.]+) ms", line).group(1))
    terms = re.findall(r"(?:\+ |= )(?:([\d.]+) x )?[a-z]+ ([\d.]+)", line)
    total = sum(float(k or 1) * float(v) for k, v in terms)
    assert total == pytest.approx(step, abs=0.01 * len(terms)), line


def test_a_context_beyond_the_models_is_noted():
    """As simulate refuses such a request: priced, with a note (llama-3-8b: 131,072 tokens)."""
    from blendsim.cli import get_app

    r = CliRunner().invoke(get_app(), ["cost", "--decode-seqs", "1", "--context", "200000"])
    assert r.exit_code == 0 and "note: a context of 200,001 tokens is beyond llama-3-8b's 131,072" in r.stderr
    r = CliRunner().invoke(get_app(), ["cost", "--decode-seqs", "1", "--context", "2000"])
    assert r.exit_code == 0 and "beyond" not in r.stderr


@pytest.mark.parametrize("model,tokens", [("mixtral-8x7b", 8192), ("qwen3-30b-a3b", 4096), ("mixtral-8x7b", 256)])
def test_expert_rows_a_round_off_above_a_tile_multiple_do_not_cost_a_tile_more(model, tokens):
    """Review of 1 Dec 2026 (second): the routing skew's pick probabilities sum to k +- 1 ulp, so an expert's mean
    rows (T x k / E, here a multiple of the 128-row tile whenever every expert is touched) came out
    256.00000000000003 at some skews and were padded to 384: the step's price went up, down, up as the skew rose,
    with the same FLOPs and bytes."""
    import blendsim

    times = [blendsim.cost(model=model, hardware="h100-80gb", tp=2, prefill_tokens=tokens, expert_skew=sk,
                           token_budget=tokens)["step_time_s"] for sk in (0.0, 0.01, 0.05, 0.25, 0.5, 1.0)]
    assert max(times) == pytest.approx(min(times), rel=1e-12), times
