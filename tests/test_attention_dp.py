"""Attention data parallelism (``Deployment.attn_dp``, ``--engine NAME:attn_dp=1``): each GPU of the TP group runs
whole attention over its share of the sequences and keeps their KV whole; the experts run over every GPU's tokens."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from blendsim.fidelity.catalogue import Row, attention_dp, row_engine_key
from blendsim.sim.batch import BatchFeatures
from blendsim.sim.build_cost import build_cost_model
from blendsim.sim.deployment import make_deployment
from blendsim.sim.engines import get_profile, trtllm_bench_settings
from blendsim.sim.errors import UserError
from blendsim.sim.ops import ATTN_DP_OPS, Shapes, dp_share, op_counts


def _dep(model="qwen3-235b-a22b", tp=8, ep=8, attn_dp=True, **kw):
    return make_deployment(model, "h200", tp, None, "fp8", "fp8", ep=ep, attn_dp=attn_dp, **kw)


def test_only_a_moe_model_split_over_gpus_on_one_stage_takes_it():
    assert _dep().dp == 8
    assert _dep(attn_dp=False).dp == 1
    assert _dep("qwen3-30b-a3b", tp=1, ep=1).dp == 1  # nothing to split
    assert make_deployment("llama-3.1-70b", "h200", 8, attn_dp=True).dp == 1  # dense: attention stays split
    assert _dep(tp=4, ep=4, pp=2).dp == 4  # within each pipeline stage


def test_each_token_is_stored_once_and_attention_weights_on_every_gpu():
    on, off = _dep(), _dep(attn_dp=False)
    m = on.model
    # Qwen3-235B has 4 KV heads: split 8 ways they are replicated twice; under attention DP a token's KV is whole
    # on one GPU
    assert off.kv_bytes_per_token == 2 * m.kv_bytes_per_token
    assert on.kv_bytes_per_token == m.kv_bytes_per_token
    rep = on.replicated_weight_bytes
    assert rep > 0 and off.replicated_weight_bytes == 0
    assert on.weight_bytes_per_gpu == pytest.approx((m.weight_bytes - rep) / 8 + rep)
    assert on.kv_capacity_tokens > off.kv_capacity_tokens
    # MLA's latent is held by every GPU under TP; once under attention DP
    ds_on, ds_off = _dep("deepseek-v3"), _dep("deepseek-v3", attn_dp=False)
    assert ds_off.kv_bytes_per_token == 8 * ds_on.kv_bytes_per_token


def test_attention_side_operators_see_one_gpus_share_and_the_experts_every_token():
    m = "qwen3-30b-a3b"
    on, off = Shapes.of(_dep(m)), Shapes.of(_dep(m, attn_dp=False))
    whole = Shapes.of(_dep(m, tp=1, ep=1))  # attention as one GPU runs it
    T, D, C = 4096, 4096, 4096 * 900
    f = BatchFeatures(num_tokens=T, num_decode=D, num_logits=D, decode_ctx_sum=C)
    part = BatchFeatures(num_tokens=T / 8, num_decode=D / 8, num_logits=D / 8, decode_ctx_sum=C / 8)
    a, b, w = op_counts(on, f), op_counts(off, f), op_counts(whole, part)
    for op in ("qkv_proj", "o_proj", "attn_decode", "kv_write"):
        assert op in ATTN_DP_OPS
        assert a[op][0] == pytest.approx(w[op][0]) and a[op][1] == pytest.approx(w[op][1])
    for op in ("moe_gate_up", "moe_down", "a2a"):
        assert a[op] == pytest.approx(b[op])
    # no all-reduce around attention; the all-to-all carries every MoE layer (Qwen3-30B has no dense layer)
    assert float(a["allreduce"][1]) == 0.0 and float(b["allreduce"][1]) > 0


def test_without_expert_parallelism_each_layer_gathers_and_scatters_once():
    s = Shapes.of(_dep("deepseek-v3", ep=1))
    f = BatchFeatures(num_tokens=512, num_decode=512, num_logits=512, decode_ctx_sum=512 * 1000)
    _, nbytes, kernels = op_counts(s, f)["allreduce"]
    assert kernels == s.layers  # one all-gather + reduce-scatter (an all-reduce's bytes) a layer
    assert nbytes == pytest.approx(s.dtype_bytes * 512 * s.hidden * s.layers)


@pytest.mark.parametrize("model", ["qwen3-235b-a22b", "deepseek-v3"])
def test_the_engine_fast_path_prices_a_step_as_the_exact_one(model):
    cm = build_cost_model(_dep(model), "sequential", "sglang:attn_dp=1")
    for T, Tp, Np, pairs, pkv, D, Cd in ((1536, 1024, 2, 1024 * 700, 1024, 512, 512 * 800), (256, 0, 0, 0, 0, 256, 256 * 3000),
                                         (1033, 1024, 3, 1024 * 700, 1024, 9, 9 * 800), (3, 0, 0, 0, 0, 3, 3 * 5000)):
        f = BatchFeatures(num_tokens=T, num_prefill_tokens=Tp, num_prefill_seqs=Np, attn_pairs=pairs,
                          prefill_kv_tokens=pkv, num_decode=D, decode_ctx_sum=Cd, num_logits=Np + D)
        fast = cm.step(T, Tp, Np, pairs, pkv, D, Cd, Np + D)[0]
        assert fast == pytest.approx(cm.cost(f).time_s, rel=1e-9)
    for D in (256, 3):
        t = cm.decode_many(D, np.array([D * 3000.0]))[0]
        assert float(t[0]) == pytest.approx(cm.step(D, 0, 0, 0, 0, D, D * 3000, D)[0], rel=1e-9)


def test_the_busiest_gpu_holds_whole_decodes_and_an_even_share_of_prompt_tokens():
    # a sequence decodes where its KV is: 3 decodes over 8 GPUs leave one GPU a whole sequence's attention (not 3/8
    # of one), 9 leave one GPU two, 16 spread evenly
    s = Shapes.of(_dep("qwen3-30b-a3b"))
    one = Shapes.of(_dep("qwen3-30b-a3b", tp=1, ep=1))

    def attn(shapes, n, ctx=1000):
        f = BatchFeatures(num_tokens=n, num_decode=n, num_logits=n, decode_ctx_sum=n * ctx)
        return float(op_counts(shapes, f)["attn_decode"][1])

    assert attn(s, 3) == pytest.approx(attn(one, 1))
    assert attn(s, 9) == pytest.approx(attn(one, 2))
    assert attn(s, 16) == pytest.approx(attn(one, 2))
    assert dp_share(0, 8) == 1 / 8 and dp_share(3, 8) == pytest.approx(1 / 3)
    assert np.allclose(dp_share(np.array([0, 3, 9, 16]), 8), [1 / 8, 1 / 3, 2 / 9, 1 / 8])
    # each GPU chunks its own waiting prompts under its own budget: a step's prompt work is spread evenly
    f = BatchFeatures(num_tokens=8192, num_prefill_tokens=8192, num_prefill_seqs=2, attn_pairs=8 * 1024 * 1025 // 2,
                      prefill_kv_tokens=8192, num_logits=2)
    g = BatchFeatures(num_tokens=1024, num_prefill_tokens=1024, num_prefill_seqs=0.25, attn_pairs=1024 * 1025 // 2,
                      prefill_kv_tokens=1024, num_logits=0.25)
    assert float(op_counts(s, f)["attn_prefill"][0]) == pytest.approx(float(op_counts(one, g)["attn_prefill"][0]))


def test_it_makes_a_large_moe_decode_step_cheaper():
    f = BatchFeatures(num_tokens=2048, num_decode=2048, num_logits=2048, decode_ctx_sum=2048 * 1500)
    on = build_cost_model(_dep(), "sequential", "trtllm:attn_dp=1").cost(f)
    off = build_cost_model(_dep(attn_dp=False), "sequential", "trtllm:attn_dp=0").cost(f)
    assert on.comm_s < off.comm_s and on.time_s < off.time_s


def test_the_engine_field_parses_and_says_what_is_wrong_in_one_line():
    assert get_profile("sglang:attn_dp=1", {}).attn_dp
    assert not get_profile("sglang", {}).attn_dp
    assert get_profile("trtllm@1.0", {}).attn_dp  # perf-overview's MoE runs: enable_attention_dp
    assert not get_profile("trtllm@0.13", {}).attn_dp and not get_profile("trtllm:attn_dp=0", {}).attn_dp
    with pytest.raises(UserError, match="attn_dp must be 0 .off. or 1") as e:
        get_profile("sglang:attn_dp=2", {})
    assert "\n" not in str(e.value)


def _row(text: str) -> Row:
    return Row(id="r", source="s", model="deepseek-v3", hardware="h200", gpus=8, tp=8, pp=1, ep=1, weights="fp8",
               kv_dtype="bf16", engine="sglang", engine_version=text, policy="", workload="const:1/1", requests=1,
               metric="output_tok_s", scope="system", value=1.0, note="", folder=Path("."), line=2)


def test_a_catalogue_row_reads_it_from_its_command():
    on = _row("SGLang v0.5.3; python3 -m sglang.launch_server --tp 8 --dp 8 --enable-dp-attention")
    assert attention_dp(on) and "attn_dp=1" in row_engine_key(on)
    assert attention_dp(_row("trtllm-bench ... llm_options.yml: enable_attention_dp: true"))
    off = _row("SGLang v0.5.3; python3 -m sglang.launch_server --tp 8")
    assert not attention_dp(off) and "attn_dp" not in row_engine_key(off)
    # from 0.4.4 SGLang takes the data-parallel size from --dp (1 turns the flag off); before, the flag set it to tp
    assert not attention_dp(_row("SGLang v0.5.3; python3 -m sglang.launch_server --tp 8 --enable-dp-attention"))
    assert not attention_dp(_row("SGLang v0.5.3; launch_server --tp 8 --dp-size 2 --enable-dp-attention"))
    assert attention_dp(_row("SGLang v0.4.1; launch_server --tp 8 --enable-dp-attention"))


def test_trtllm_bench_sizes_its_limits_as_the_tool_does_and_each_rank_takes_them():
    # TensorRT-LLM's bench/build/tuning.py sizes the batch without attention DP; each rank's executor gets it
    assert trtllm_bench_settings(_dep(), 1000, 1000) == trtllm_bench_settings(_dep(attn_dp=False), 1000, 1000)


def test_a_kernel_profile_refuses_it_in_one_line(tmp_path):
    from blendsim.sim.profile import Profile, ProfileTimer

    dep = _dep()
    prof = Profile(model="qwen3-235b-a22b", model_shape={}, dtype=dep.model.dtype, tp=8, ops={},
                   path=str(tmp_path / "p.json"))
    with pytest.raises(UserError, match="attention data parallelism") as e:
        ProfileTimer(prof, dep)
    assert "\n" not in str(e.value)


def test_a_release_before_its_modelled_attention_dp_is_refused_and_its_rows_run_split():
    with pytest.raises(UserError, match="modelled from 0.4.4") as e:
        get_profile("sglang@0.4.1:attn_dp=1", {})
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="modelled from 0.4.4"):
        get_profile("sglang@0.3:attn_dp=1", {})
    for ok in ("sglang@0.5:attn_dp=1", "sglang@0.4:attn_dp=1", "sglang@0.4.6:attn_dp=1", "sglang:attn_dp=1"):
        assert get_profile(ok, {}).attn_dp  # "0.4" may be 0.4.4 or later
    old = _row("SGLang v0.4.1 (lmsysorg/sglang:dev), launch_server --tp 8 --enable-dp-attention")
    assert attention_dp(old) and "attn_dp" not in row_engine_key(old)
    for text in ("SGLang v0.4.6; launch_server --tp 8 --dp 8 --enable-dp-attention",
                 "v0.4.6; python -m sglang.launch_server --tp 8 --dp-size 8 --enable-dp-attention"):
        key = row_engine_key(_row(text))
        assert "attn_dp=1" in key and get_profile(key, {}).attn_dp
    key = row_engine_key(_row("v0.4.1; python -m sglang.launch_server --enable-dp-attention"))
    assert "attn_dp" not in key


def test_the_experts_grouped_gemm_is_fitted_per_engine_kernel_and_architecture():
    from blendsim.fidelity.fit import free_params
    from blendsim.fidelity.suite import prepare_row
    from blendsim.sim.engines import load_params

    row = dataclasses.replace(_row("TensorRT-LLM ~v1.0, PyTorch backend"), engine="trtllm", model="qwen3-30b-a3b",
                              tp=1, gpus=1, workload="const:128/128", requests=64, kv_dtype="fp8")
    paths = {p.path for p in free_params([(row, prepare_row(row, load_params()))])}
    assert ("regime", "trtllm", "hopper", "moe_eff") in paths and ("arch", "hopper", "moe_eff") not in paths


def test_a_run_records_it():
    from blendsim.runner import pipeline_summary

    assert pipeline_summary(_dep()) == {"attn_dp_gpus": 8}
    assert pipeline_summary(_dep(attn_dp=False)) == {}  # one stage on one node, attention split: unchanged summaries
    assert pipeline_summary(_dep(tp=4, ep=4, pp=2))["attn_dp_gpus"] == 4


def test_each_pipeline_stage_holds_its_own_attention_whole():
    on, off = _dep(tp=4, ep=4, pp=2), _dep(tp=4, ep=4, pp=2, attn_dp=False)
    for i in range(2):
        rep = on._stage_replicated(i)
        assert rep > 0 and off._stage_replicated(i) == 0
        assert on.at_stage(i).weight_bytes_per_gpu == pytest.approx((on.stage_weight_bytes(i) - rep) / 4 + rep)
    assert on.replicated_weight_bytes == pytest.approx(on._stage_replicated(0) + on._stage_replicated(1))
    # Qwen3-235B's 4 KV heads at TP4 are not replicated either way; the attention weights held whole leave less KV
    assert min(on.stage_kv_tokens()) < min(off.stage_kv_tokens())
    assert Shapes.of(on.at_stage(1)).dp == 4


def test_a_sweep_checks_the_fit_as_its_engine_runs_it():
    # trtllm@1.0 runs MoE models attention-data-parallel: attention weights on every GPU, and its limits are each
    # rank's (a larger activation reserve), so the pre-flight check names the memory the cells would need -- what
    # simulate sizes (api.engine_memory_settings) --, not the attention-split figure under default limits
    import re

    from blendsim.api import engine_memory_settings
    from blendsim.sweep import SweepSpec, check_spec

    def need(engine):
        with pytest.raises(UserError, match="does not fit") as e:
            check_spec(SweepSpec("blendserve", (1.0,), (0.2,), ("fcfs",), ("qwen3-235b-a22b",), ("h100-80gb",), 100,
                                 precision={"tp": 4}, engine=engine))
        return float(re.search(r"need ([0-9.]+) GiB", str(e.value)).group(1))

    def direct(**limits):
        with pytest.raises(UserError) as e:
            make_deployment("qwen3-235b-a22b", "h100-80gb", 4, **limits)
        return float(re.search(r"need ([0-9.]+) GiB", str(e.value)).group(1))

    def as_simulate(engine):
        return direct(**engine_memory_settings(engine, "h100-80gb", model="qwen3-235b-a22b", tp=4))

    assert get_profile("trtllm").attn_dp and not get_profile("vllm").attn_dp
    assert need("trtllm") == as_simulate("trtllm") > direct(attn_dp=True) > need("vllm") == as_simulate("vllm")


def test_tensorrt_llm_limits_are_each_ranks_and_sglangs_the_replicas():
    # TensorRT-LLM runs an executor per attention-DP rank, each under max_batch_size / max_num_tokens; SGLang
    # divides its server-wide limits among the ranks. So a replica of eight ranks schedules eight times trtllm's
    from blendsim.policies.registry import resolve_policy
    from blendsim.runner import RunConfig, attn_dp_ranks, scheduler_settings
    from blendsim.sim.hardware import get_hardware

    fcfs = resolve_policy("fcfs").cls

    def limits(engine, model="qwen3-235b-a22b", tp=8, **kw):
        eng, notes = scheduler_settings(RunConfig(engine=engine, model=model, hardware="h200", tp=tp, **kw), fcfs)
        return eng.token_budget, eng.max_seqs, notes

    per = get_profile("trtllm").scheduler
    tb, ms, notes = limits("trtllm")
    assert (tb, ms) == (8 * per["token_budget"], 8 * per["max_seqs"])
    assert any("schedules each attention-DP rank on its own" in n and "on each of its 8 ranks" in n for n in notes)
    assert limits("trtllm", tp=4)[:2] == (4 * per["token_budget"], 4 * per["max_seqs"])
    assert limits("trtllm:attn_dp=0")[:2] == (per["token_budget"], per["max_seqs"])  # attention split
    assert limits("trtllm", model="llama-3.1-70b")[:2] == (per["token_budget"], per["max_seqs"])  # dense
    assert limits("trtllm", tp=1, model="qwen3-30b-a3b")[:2] == (per["token_budget"], per["max_seqs"])
    assert limits("trtllm", token_budget=4096)[0] == 4096  # an explicit option is the replica's, as given
    s = get_profile("sglang").scheduler_for(get_hardware("h200"))
    assert limits("sglang:attn_dp=1")[:2] == (s["token_budget"], s["max_seqs"])
    assert attn_dp_ranks(get_profile("trtllm"), RunConfig(model="no-such-model", tp=8)) == 1  # refused further on


def test_sglang_admits_less_conservatively_with_it():
    # SGLang multiplies schedule_conservativeness by 0.3 under --enable-dp-attention; its first new_token_ratio is
    # 0.7 x that: the reserve admission keeps 0.21 of the running requests' remaining outputs instead of 0.7
    from blendsim.policies.registry import resolve_policy
    from blendsim.runner import RunConfig, scheduler_settings

    fcfs = resolve_policy("fcfs").cls

    def ratio(engine, model="deepseek-v3", **kw):
        eng, notes = scheduler_settings(RunConfig(engine=engine, model=model, hardware="h200", tp=8, **kw), fcfs)
        return eng.reserve_ratio, notes

    own = get_profile("sglang").scheduler["reserve_ratio"]
    r, notes = ratio("sglang:attn_dp=1")
    assert r == pytest.approx(0.3 * own) and any("admits less conservatively" in n for n in notes)
    assert ratio("sglang")[0] == own  # attention split
    assert ratio("sglang:attn_dp=1", model="llama-3.1-70b")[0] == own  # dense: split
    assert ratio("sglang:attn_dp=1", reserve_ratio=0.5)[0] == 0.5  # given: as given
    assert ratio("trtllm")[0] == get_profile("trtllm").scheduler["reserve_ratio"]  # TensorRT-LLM: no such rule
