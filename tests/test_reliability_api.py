"""Issue 22: every public argument of the Python API is checked once, at the boundary, with the command line's
checks -- a wrong type or value is a BlendsimError of one line (never TypeError/ValueError from deep inside,
never a silently wrong number); ``offline="no"`` is not true. Also the cost model's bounds (expert skew, NaN
step sizes), the engine-spec message and config.json's quantization groups.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import blendsim
from blendsim.cli import get_app
from blendsim.sim.errors import UserError
from tests.helpers import one_line_error, random_trace

NAN, INF = float("nan"), float("inf")
TINY = {"model": "tiny", "hardware": "cpu"}


def invoke(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


@pytest.fixture(scope="module")
def trace():
    return random_trace(np.random.default_rng(5), n=6)


@pytest.fixture(scope="module")
def result(trace):
    return blendsim.simulate(trace, "fcfs", **TINY)


def one_line(e: BaseException) -> str:
    msg = str(e)
    assert isinstance(e, UserError) and msg and "\n" not in msg, repr(e)
    return msg


# ---- the reproducers ------------------------------------------------------------------------------
CASES = {
    "load_trace(123)": (lambda t, r: blendsim.load_trace(123), "path must be a file path"),
    "simulate tp='2'": (lambda t, r: blendsim.simulate(t, tp="2", **TINY), "--tp must be a whole number"),
    "simulate replicas=2.5": (lambda t, r: blendsim.simulate(t, replicas=2.5, **TINY), "--replicas"),
    "simulate engine=5": (lambda t, r: blendsim.simulate(t, engine=5, **TINY), "--engine"),
    "simulate token_budget=nan": (lambda t, r: blendsim.simulate(t, token_budget=NAN, **TINY), "--token-budget"),
    "simulate seed='x'": (lambda t, r: blendsim.simulate(t, seed="x", **TINY), "--seed"),
    "simulate options='x'": (lambda t, r: blendsim.simulate(t, options="x", **TINY), "--opt"),
    "simulate offline='no'": (lambda t, r: blendsim.simulate(t, offline="no", **TINY), "--offline must be True or False"),
    "simulate policy=5": (lambda t, r: blendsim.simulate(t, policy=5, **TINY), "--policy"),
    "simulate model=None": (lambda t, r: blendsim.simulate(t, model=None, hardware="cpu"), "--model"),
    "simulate progress=5": (lambda t, r: blendsim.simulate(t, progress=5, **TINY), "progress"),
    "simulate replicas=10**9": (lambda t, r: blendsim.simulate(t, replicas=10**9, **TINY), "--replicas must be <= 4,096"),
    "simulate trace=5": (lambda t, r: blendsim.simulate(5, **TINY), "trace: expected"),
    # a KV tier's size or link is a number: True would be a 1 GB tier, '64' a string taken as one
    "simulate host_kv_gb=True": (lambda t, r: blendsim.simulate(t, host_kv_gb=True, **TINY),
                                 "--host-kv-gb must be a finite number >= 0, got True (bool)"),
    "simulate disk_kv_gb='10'": (lambda t, r: blendsim.simulate(t, disk_kv_gb="10", **TINY), "--disk-kv-gb"),
    "simulate host_link_gbps='20'": (lambda t, r: blendsim.simulate(t, host_link_gbps="20", **TINY),
                                     "--host-link-gbps must be a finite number > 0"),
    "cost prefill_tokens='x'": (lambda t, r: blendsim.cost(prefill_tokens="x"), "--prefill-tokens"),
    "cost prefill_tokens=nan": (lambda t, r: blendsim.cost(prefill_tokens=NAN), "--prefill-tokens"),
    "cost prefill_tokens=inf": (lambda t, r: blendsim.cost(prefill_tokens=INF), "--prefill-tokens"),
    "cost context=nan": (lambda t, r: blendsim.cost(decode_seqs=4, context=NAN), "--context"),
    "cost engine=None": (lambda t, r: blendsim.cost(decode_seqs=4, engine=None), "--engine"),
    "cost bogus=1": (lambda t, r: blendsim.cost(bogus=1), "unexpected keyword argument 'bogus'"),
    "cost expert_skew=1100": (lambda t, r: blendsim.cost("mixtral-8x7b", "h100-80gb", decode_seqs=4, tp=2,
                                                         expert_skew=1100), "0..100"),
    "synthesize requests=100.5": (lambda t, r: blendsim.synthesize("batchllm", prefix_len=8, distinct_len=2,
                                                                   share_degree=2, requests=100.5), "--requests"),
    "synthesize requests=10**12": (lambda t, r: blendsim.synthesize("blendserve", requests=10**12), "the limit"),
    "make_trace input_len=[nan]": (lambda t, r: blendsim.make_trace(input_len=[NAN], output_len=[2]), "input_len"),
    "make_trace input_len=['a']": (lambda t, r: blendsim.make_trace(input_len=["a"], output_len=[2]), "input_len"),
    "make_trace output_len=[1e30]": (lambda t, r: blendsim.make_trace(input_len=[3], output_len=[1e30]), "MAX_TOKENS"),
    "make_trace prompts short": (lambda t, r: blendsim.make_trace(input_len=[3, 4], output_len=[2, 2], prompts=[None]),
                                 "prompts"),
    "Result.write(5)": (lambda t, r: r.write(5), "run_dir must be a file path"),
    "Result.write force='no'": (lambda t, r: r.write("x", force="no"), "--force"),
    "write_trace(5, p)": (lambda t, r: blendsim.write_trace(5, "x.parquet"), "trace must be a blendsim Trace"),
    "sweep densities=['a']": (lambda t, r: blendsim.sweep("sw", densities=["a"]), "--densities"),
    "sweep jobs='2'": (lambda t, r: blendsim.sweep("sw", jobs="2"), "--jobs"),
    "sweep requests=2.5": (lambda t, r: blendsim.sweep("sw", requests=2.5, models="tiny", hardware="cpu"),
                           "--requests"),
    "policy_names(5)": (lambda t, r: blendsim.policy_names(5), "policy_names()"),
}


@pytest.mark.parametrize(("call", "needle"), CASES.values(), ids=list(CASES))
def test_wrong_api_arguments_are_one_blendsim_error(trace, result, call, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(blendsim.BlendsimError) as e:
        call(trace, result)
    assert needle in one_line(e.value)
    assert not any(tmp_path.iterdir())  # nothing written


def test_offline_true_and_false_still_work(trace):
    late = blendsim.make_trace(input_len=[5, 6], output_len=[3, 3], arrival_s=[0.0, 100.0])
    on = blendsim.simulate(late, "fcfs", offline=True, **TINY).summary["makespan_s"]
    off = blendsim.simulate(late, "fcfs", offline=False, **TINY).summary["makespan_s"]
    assert on < 100 <= off


# ---- property: any argument of a wrong type or value --------------------------------------------------------
BAD = st.one_of(st.sampled_from([None, "x", "2", "", "no", NAN, INF, -INF, 2.5, -1, 0, 10**30, -(10**30), True,
                                 [], [1], ["a"], {}, {"a": 1}, object(), b"x", Path("nowhere")]),
                st.integers(-3, 3), st.floats(allow_subnormal=False))
SIMULATE = ["policy", "model", "hardware", "tp", "replicas", "mode", "engine", "token_budget", "max_seqs", "block_size",
            "round_tokens", "mix", "prefix_caching", "prefix_retain", "gpu_memory_utilization", "fast_forward",
            "admission", "reserve_ratio", "offline", "seed", "record_schedule", "options", "dtype", "weights",
            "kv_dtype", "ep", "expert_skew", "progress", "profile"]
COST = ["model", "hardware", "prefill_tokens", "decode_seqs", "context", "tp", "mode", "engine", "profile", "dtype",
        "weights", "kv_dtype", "ep", "expert_skew"]
SYNTH = ["prefix_len", "distinct_len", "share_degree", "requests", "output_len", "seed"]
MAKE = ["input_len", "output_len", "prompts", "ids", "arrival_s", "output_len_hint", "ttft_slo_s", "source"]
LOAD = ["path", "format", "limit"]


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(fn=st.sampled_from(["simulate", "cost", "synthesize", "make_trace", "load_trace", "write"]), data=st.data())
def test_any_wrong_api_argument_is_one_blendsim_error_or_runs(trace, result, fn, data, monkeypatch):
    value = data.draw(BAD, label="value")
    with tempfile.TemporaryDirectory() as d, monkeypatch.context() as m:
        m.chdir(d)  # a relative path drawn as an argument lands here
        tpath = blendsim.write_trace(trace, Path(d) / "t.parquet")
        if fn == "simulate":
            name = data.draw(st.sampled_from(SIMULATE), label="name")
            kw = {**TINY, name: value}
            call = lambda: blendsim.simulate(trace, **kw)  # noqa: E731
        elif fn == "cost":
            name = data.draw(st.sampled_from(COST), label="name")
            kw = {"model": "tiny", "hardware": "cpu", "decode_seqs": 2, name: value}
            call = lambda: blendsim.cost(**kw)  # noqa: E731
        elif fn == "synthesize":
            name = data.draw(st.sampled_from(SYNTH), label="name")
            kw = {"prefix_len": 8, "distinct_len": 2, "share_degree": 2, "requests": 4, name: value}
            call = lambda: blendsim.synthesize("batchllm", **kw)  # noqa: E731
        elif fn == "make_trace":
            name = data.draw(st.sampled_from(MAKE), label="name")
            kw = {"input_len": [3, 4], "output_len": [2, 2], name: value}
            call = lambda: blendsim.make_trace(**kw)  # noqa: E731
        elif fn == "load_trace":
            name = data.draw(st.sampled_from(LOAD), label="name")
            kw = {"path": tpath, name: value}
            call = lambda: blendsim.load_trace(**kw)  # noqa: E731
        else:
            name = data.draw(st.sampled_from(["run_dir", "force"]), label="name")
            kw = {"run_dir": Path(d) / "run", name: value}
            call = lambda: result.write(**kw)  # noqa: E731
        try:
            out = call()
        except blendsim.BlendsimError as e:
            one_line(e)
            return
        # accepted: then it was a valid value, and the result is whole
        if fn == "simulate":
            assert out.summary["n_requests"] == trace.n and math.isfinite(out.summary["makespan_s"])
            assert not (name == "offline" and not isinstance(value, bool))
        elif fn == "cost":
            assert math.isfinite(out["step_time_s"]) and out["step_time_s"] > 0
        elif fn in ("synthesize", "make_trace", "load_trace"):
            out.validate("api")


# ---- bounds of the cost model and the engine spec --------------------------------------------------------------
def test_expert_skew_is_bounded_and_pricing_is_monotone_below_the_bound():
    t = [blendsim.cost("qwen3-30b-a3b", "h100-80gb", decode_seqs=64, context=1000, expert_skew=s)["step_time_s"]
         for s in (0, 1, 10, 50, 99, 100)]
    assert all(b <= a for a, b in zip(t, t[1:])), t  # skewed routing reads fewer experts' weights in decode
    one_line_error(invoke("cost", "-m", "qwen3-30b-a3b", "--hardware", "h100-80gb", "--decode-seqs", "4",
                          "--expert-skew", "1100"), "--expert-skew", "0..100")


def test_an_override_on_an_engine_profile_names_the_bad_field():
    err = one_line_error(invoke("cost", "--engine", "trtllm:fixed_s=nan", "--decode-seqs", "1"), "trtllm:fixed_s=nan")
    assert "fixed_s" in err and "unknown engine" not in err


def test_simulate_replicas_beyond_the_limit_is_one_line(tmp_path, trace):
    path = blendsim.write_trace(trace, tmp_path / "t.parquet")
    one_line_error(invoke("simulate", path, "-o", tmp_path / "run", "--replicas", str(10**9), "-m", "tiny",
                          "--hardware", "cpu"), "--replicas must be <= 4,096")


def test_compressed_tensors_config_groups_of_the_wrong_shape_are_one_line(tmp_path):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
           "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
           "vocab_size": 1000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
           "quantization_config": {"quant_method": "compressed-tensors", "config_groups": [1]}}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    one_line_error(invoke("models", p), "config_groups")
