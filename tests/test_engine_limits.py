"""Engine batch limits by device and entry point (vLLM >= 0.9), and the flags a catalogue row's command states."""

from dataclasses import replace
from pathlib import Path

import pytest

from blendsim.fidelity.catalogue import Row, engine_flags, engine_settings, engine_version_key, serves
from blendsim.fidelity.runner import deployment_for
from blendsim.policies.registry import resolve_policy
from blendsim.runner import RunConfig, engine_config
from blendsim.sim.engines import get_profile
from blendsim.sim.hardware import get_hardware


def _row(engine="vllm", version="vLLM v0.11.0 (V1 engine); server command: vllm serve Qwen/Qwen3-14B",
         hardware="h100-80gb", requests=1000, model="qwen3-14b"):
    return Row(id="t", source="s", model=model, hardware=hardware, gpus=1, tp=1, pp=1, ep=1, weights="", kv_dtype="",
               engine=engine, engine_version=version, policy="", workload="const:128/128", requests=requests,
               metric="total_tok_s", scope="system", value=1.0, note="", folder=Path("."), line=2)


@pytest.mark.parametrize("hw, serve, budget, seqs", [
    ("h100-80gb", False, 16384, 1024), ("h100-80gb", True, 8192, 1024), ("h200", False, 16384, 1024),
    ("b200", True, 8192, 1024), ("mi300x", False, 16384, 1024),
    ("a100-80gb", False, 8192, 256), ("a100-80gb", True, 2048, 256), ("l40s", False, 8192, 256), ("l40s", True, 2048, 256),
])
def test_vllm_v1_limits_by_device_and_entry_point(hw, serve, budget, seqs):
    # vllm/engine/arg_utils.py from 0.9 (PRs #17073, #17885): >= 70 GiB and not an A100 -> 1024 sequences, 16384 / 8192
    # tokens (offline / API server); others 256 sequences, 8192 / 2048 tokens
    s = get_profile("vllm@0.11", {}).scheduler_for(get_hardware(hw), serve)
    assert (s["token_budget"], s["max_seqs"]) == (budget, seqs)


def test_engines_without_device_rules_keep_their_scheduler():
    for key in ("vllm@0.6", "sglang@0.4", "trtllm@1.0", "deepspeed-fastgen"):
        p = get_profile(key, {})
        for hw in ("a100-80gb", "h100-80gb"):
            assert p.scheduler_for(get_hardware(hw), True) == p.scheduler


def test_simulate_uses_the_offline_limits_of_its_gpu():
    fcfs = resolve_policy("fcfs").cls
    h100 = engine_config(RunConfig(engine="vllm", hardware="h100-80gb"), fcfs)
    a100 = engine_config(RunConfig(engine="vllm", hardware="a100-80gb"), fcfs)
    assert (h100.token_budget, h100.max_seqs) == (16384, 1024)
    assert (a100.token_budget, a100.max_seqs) == (8192, 256)
    # an explicit option still wins
    mine = engine_config(RunConfig(engine="vllm", hardware="h100-80gb", max_seqs=64), fcfs)
    assert mine.max_seqs == 64


def test_row_flags_are_read():
    r = _row(version="vLLM v0.11.0 (V1 engine); server command: vllm serve X -tp 4 --max-num-batched-tokens 16384 "
                     "--gpu-memory-utilization 0.85 --no-enable-prefix-caching")
    assert engine_flags(r) == {"token_budget": 16384, "gpu_memory_utilization": 0.85, "prefix_caching": False}
    r = _row(engine="sglang", version="SGLang v0.4.1, launch_server --tp 8 --mem-fraction-static 0.8 "
                                      "--chunked-prefill-size 4096 --max-running-requests 512 --disable-radix-cache")
    assert engine_flags(r) == {"gpu_memory_utilization": 0.8, "token_budget": 4096, "max_seqs": 512,
                               "prefix_caching": False}
    r = _row(version="vLLM v0.10.0, benchmark_throughput.py; --max-num-batched-tokens 131072 --max-num-seqs = num prompts",
             requests=3200)
    assert engine_flags(r) == {"token_budget": 131072, "max_seqs": 3200}
    assert not serves(r)
    assert engine_flags(_row(version="vLLM v0.6.0, --num-scheduler-steps 10")) == {}
    # argparse takes a prefix: the SGLang v0.2 blog's 405B script launches with --disable-radix and --mem-frac
    r = _row(engine="sglang", version="SGLang v0.2 (python -m sglang.launch_server --tp 8 --quant fp8 --disable-radix "
                                      "--mem-frac 0.88)")
    assert engine_flags(r) == {"gpu_memory_utilization": 0.88, "prefix_caching": False}
    # trtllm-build's limits, as a TensorRT-LLM row's engine build states them
    r = _row(engine="trtllm", version="TensorRT-LLM v0.10 (Triton r24.06), engine built with --max_batch_size 512 "
                                      "--max_num_tokens 8192")
    assert engine_flags(r) == {"max_seqs": 512, "token_budget": 8192}
    assert engine_version_key(r) == "trtllm@0.10"


def test_serve_rows_get_the_api_server_limits():
    h100, a100 = _row(), _row(hardware="a100-80gb")
    assert serves(h100)
    prof = get_profile(engine_version_key(h100), {})
    assert engine_settings(h100, prof, get_hardware("h100-80gb"))["token_budget"] == 8192
    assert engine_settings(a100, prof, get_hardware("a100-80gb"))["token_budget"] == 2048
    assert deployment_for(a100, prof).max_batched_tokens == 2048
    flagged = replace(a100, engine_version=a100.engine_version + " --max-num-batched-tokens 4096")
    assert deployment_for(flagged, prof).max_batched_tokens == 4096  # the row's own flag over the default


def test_trtllm_pytorch_backend_versions():
    # 0.19-0.21 ran trtllm-bench on the PyTorch backend: 0.20 selects trtllm@0.19, whose mechanics are 1.0's
    p = get_profile("trtllm@0.20", {})
    assert p.version == "0.19"
    q = get_profile("trtllm@1.0", {})
    assert (p.scheduler, p.cuda_graph_max, p.kv_of_free, p.overhead_key) == (q.scheduler, q.cuda_graph_max,
                                                                              q.kv_of_free, q.overhead_key)
    assert get_profile("trtllm@0.14", {}).version == "0.13"


def test_a_stated_context_length_sets_vllm_v0s_budget():
    # V0 without chunked prefill packs max(max_model_len, 2048) tokens a step (vllm/config.py SchedulerConfig); chunked
    # prefill turns itself on only above 32,768 tokens, so 32,768 is the budget; V1 and SGLang chunk and keep theirs
    hw = get_hardware("mi300x")
    for version, budget in (("vLLM 0.7.3.dev138 (V0) --max-model-len=32768", 32768),
                            ("vLLM 0.5.3 --max-model-len 1024", 2048),
                            ("vLLM v0.6.0 --num-scheduler-steps 10 --max_model_len 4096", 4096),  # either spelling
                            ("vLLM 0.7.3 --max-model-len 65536", 8192),  # chunked prefill there: not this rule
                            ("vLLM 0.7.3 --max-model-len 32768 --max-num-batched-tokens 4096", 4096),
                            ("vLLM 0.11.0 --max-model-len 32768", 16384)):
        r = _row(version=version, model="deepseek-v3", hardware="mi300x")
        prof = get_profile(engine_version_key(r), {})
        assert engine_settings(r, prof, hw)["token_budget"] == budget, version
    r = _row(engine="sglang", version="SGLang 0.4.2.post4 --max-model-len=32768", hardware="mi300x")
    assert engine_settings(r, get_profile("sglang@0.4", {}), hw)["token_budget"] == get_profile(
        "sglang@0.4", {}).scheduler_for(hw)["token_budget"]


@pytest.mark.parametrize("key, tp, fraction", [
    ("sglang@0.4", 1, 0.88), ("sglang@0.4", 2, 0.87), ("sglang@0.4", 4, 0.85), ("sglang@0.4", 8, 0.81),
    ("sglang@0.4", 16, 0.79), ("sglang@0.3", 8, 0.83), ("sglang@0.3", 4, 0.85), ("sglang@0.2", 1, 0.89),
    ("sglang@0.2", 8, 0.84)])
def test_sglang_kv_fraction_follows_the_tp_degree(key, tp, fraction):
    # srt/server_args.py __post_init__ of each release: mem_fraction_static by TP when none is given
    assert get_profile(key, {}).scheduler_for(get_hardware("h100-80gb"), tp=tp)["gpu_memory_utilization"] == fraction


@pytest.mark.parametrize("hw, tp, attn_dp, left_gib", [
    ("h100-80gb", 1, False, 9.5 + 0.5), ("h100-80gb", 8, False, 9.5 + 4), ("a100-80gb", 8, False, 9.5 + 4),
    ("h200", 8, False, 12 + 4), ("h200", 8, True, 12 + 4 + 4), ("b200", 8, False, 32.0), ("l40s", 2, False, 9.5 + 1)])
def test_sglang_05_kv_fraction_from_the_memory_it_leaves(hw, tp, attn_dp, left_gib):
    # the 0.5 series' server_args: mem_fraction_static = (memory - reserved) / memory, reserved by device class and
    # TP x PP, 4 GiB more with attention data parallelism
    h = get_hardware(hw)
    gib = h.memory_bytes / 2**30
    p = get_profile("sglang@0.5:attn_dp=1" if attn_dp else "sglang@0.5", {})
    assert p.scheduler_for(h, tp=tp)["gpu_memory_utilization"] == round((gib - left_gib) / gib, 3)


def test_sglang_static_fraction_holds_weights_and_kv_only():
    # SGLang's pool is mem_fraction_static x memory less the weights: no activation reserve comes out of it, as it
    # does for vLLM, whose fraction covers its profiled activations too
    r = replace(_row(engine="sglang", version="SGLang 0.4.3, launch_server --tp 8", hardware="h200",
                     model="deepseek-v3"), tp=8, gpus=8, weights="fp8")
    dep = deployment_for(r, get_profile("sglang@0.4", {}))
    assert dep.static_fraction and dep.gpu_memory_utilization == 0.81
    per_gpu = dep.hardware.memory_bytes * 0.81 - dep.weight_bytes_per_gpu
    assert dep.activation_reserve_bytes > 2**30
    assert dep.kv_capacity_bytes == pytest.approx(per_gpu * 8)
    vllm = replace(dep, static_fraction=False)
    assert vllm.kv_capacity_bytes == pytest.approx((per_gpu - dep.activation_reserve_bytes) * 8)


def test_simulate_sizes_sglang_kv_by_its_tp():
    fcfs = resolve_policy("fcfs").cls
    one = engine_config(RunConfig(engine="sglang@0.4", hardware="h100-80gb", model="llama-3-70b", tp=1), fcfs)
    eight = engine_config(RunConfig(engine="sglang@0.4", hardware="h100-80gb", model="llama-3-70b", tp=8), fcfs)
    assert (one.gpu_memory_utilization, eight.gpu_memory_utilization) == (0.88, 0.81)


@pytest.mark.parametrize("hw, budget", [("l40s", 8192), ("h100-80gb", 8192), ("h200", 8192), ("b200", 16384),
                                        ("mi300x", 16384)])
def test_sglang_05_chunks_prefill_by_device_memory(hw, budget):
    # the 0.5 series' server_args: chunked_prefill_size 2,048 under 35 GiB, 8,192 under 160 GiB, 16,384 above
    assert get_profile("sglang@0.5", {}).scheduler_for(get_hardware(hw), tp=8)["token_budget"] == budget
    assert get_profile("sglang@0.4", {}).scheduler_for(get_hardware(hw), tp=8)["token_budget"] == 8192


def test_a_trtllm_bench_rows_stated_limits_replace_the_tools_own():
    # trtllm-bench sizes max_batch_size / max_num_tokens from the dataset unless the command gives them (bench/benchmark/
    # utils/general.py get_settings); a row stating them ran under them (was: the tool's sizes, the flags unread)
    from blendsim.fidelity.catalogue import build_workload
    from blendsim.fidelity.runner import simulate_row

    plain = replace(_row(engine="trtllm", version="1.0", model="llama-3.1-8b", requests=40), workload="const:256/32")
    capped = replace(plain, engine_version="1.0 --max_batch_size 4 --max_num_tokens 2048")
    trace = build_workload(plain)
    free, four = simulate_row(plain, trace).makespan_s, simulate_row(capped, trace).makespan_s
    assert four > 4 * free  # ten waves of four requests against one batch of forty
