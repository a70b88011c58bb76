"""Engine profiles (sim/engines.py): CUDA-graph padding, scheduler defaults, --engine everywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.policies.registry import get_policy
from blendsim.runner import RunConfig, engine_config, run_simulation, scheduler_settings
from blendsim.sim.batch import BatchFeatures
from blendsim.sim.build_cost import build_cost_model
from blendsim.sim.deployment import make_deployment
from blendsim.sim.efficiency import Efficiency, EfficiencyTimer
from blendsim.sim.engines import PROFILES, default_graph_sizes, get_profile, graph_pad, graph_size
from blendsim.sim.errors import UserError
from blendsim.workloads.trace import from_columns


@pytest.mark.parametrize("n, cap, size", [(1, 512, 1), (2, 512, 2), (3, 512, 4), (5, 512, 8), (9, 512, 16),
                                          (250, 512, 256), (257, 512, 512), (513, 512, 513), (700, 8192, 768),
                                          (40, 0, 40), (99, 100, 100), (150, 160, 152)])
def test_graph_sizes(n, cap, size):
    sizes = default_graph_sizes(cap) if cap else ()
    assert graph_pad(n, sizes) == size == graph_size(n, sizes)


@pytest.mark.parametrize("engine, hardware, tp, n, size", [
    ("vllm@0.8", "h100-80gb", 1, 260, 264),  # V1: every multiple of 8 up to 512
    ("vllm@0.8", "h100-80gb", 1, 513, 513),  # eager above
    ("vllm@0.5", "h100-80gb", 1, 250, 256), ("vllm@0.5", "h100-80gb", 1, 257, 257),
    ("trtllm@1.0", "h100-80gb", 1, 40, 64), ("trtllm@1.0", "h200", 1, 600, 1024),  # perf-overview's list
    ("trtllm@1.0", "h200", 1, 2049, 4096), ("trtllm@0.13", "h100-80gb", 1, 600, 600),  # 0.13's engine: eager
    ("sglang@0.4", "h100-80gb", 8, 150, 152), ("sglang@0.4", "h100-80gb", 8, 161, 161),
    ("sglang@0.5.3", "h100-80gb", 1, 260, 260), ("sglang@0.5.3", "h100-80gb", 8, 260, 272),  # 256 / 512 by TP
    ("sglang@0.5.3", "h100-80gb", 1, 10, 12), ("sglang@0.5.3", "b200", 1, 500, 512), ("sglang@0.5.3", "b200", 1, 530, 530),
    ("sglang@0.5", "h100-80gb", 1, 170, 170), ("sglang@0.5", "h200", 1, 170, 176),
])
def test_each_engine_pads_to_its_own_capture_sizes(engine, hardware, tp, n, size):
    from blendsim.sim.hardware import get_hardware

    assert get_profile(engine).graph_size(n, get_hardware(hardware), tp) == size


def test_decode_steps_are_priced_at_their_cuda_graph_size():
    dep = make_deployment("llama-3-8b", "h100-80gb")
    cm = build_cost_model(dep, "sequential", "vllm")
    assert cm.graph_cap == PROFILES["vllm"].cuda_graph_max
    ctx = 1000
    t3 = cm.step(3, 0, 0, 0, 0, 3, 3 * ctx, 3)[0]
    t4 = cm.step(4, 0, 0, 0, 0, 4, 3 * ctx, 4)[0]
    ovh = get_profile("vllm").per_seq_s
    # same GEMMs (4 rows), same attention work; one sequence less of per-sequence overhead and of
    # the 4th sequence's query/attention launch difference only
    assert t3 == pytest.approx(t4 - ovh, rel=2e-3)
    # cost() and cost_many() price the same padded step
    f = BatchFeatures.decode_only(3, ctx)
    assert cm.cost(f).time_s == pytest.approx(cm.step(3, 0, 0, 0, 0, 3, 3 * ctx, 3)[0], rel=1e-12)
    # a step with prefill is never padded
    assert cm.step(5, 2, 1, 3, 2, 3, 3 * ctx, 4)[0] < cm.step(8, 2, 1, 3, 2, 3, 3 * ctx, 4)[0]


def test_profile_defaults_sit_between_the_policy_and_explicit_options():
    fcfs = get_policy("fcfs")
    eng = engine_config(RunConfig(policy="fcfs", engine="trtllm"), fcfs)
    for k, v in PROFILES["trtllm"].scheduler.items():
        assert getattr(eng, k) == v
    eng = engine_config(RunConfig(policy="fcfs", engine="trtllm", token_budget=512, max_seqs=7), fcfs)
    assert (eng.token_budget, eng.max_seqs) == (512, 7)
    # on an engine without them the policy's declared settings hold
    eng = engine_config(RunConfig(policy="vllm", engine="ideal"), get_policy("vllm"))
    assert (eng.token_budget, eng.max_seqs) == (8192, 256)


def test_policy_settings_apply_over_the_engines_and_are_printed():
    eng, notes = scheduler_settings(RunConfig(policy="sarathi", engine="vllm"), get_policy("sarathi"))
    assert (eng.token_budget, eng.max_seqs, eng.prefix_caching) == (512, 128, False)
    assert "sarathi: token_budget 512 (policy) over vllm's 8192" in notes
    assert "sarathi: max_seqs 128 (policy) over vllm's 256" in notes
    _eng, notes = scheduler_settings(RunConfig(policy="batchllm", engine="sglang"), get_policy("batchllm"))
    assert "batchllm: max_seqs 0 = no cap (policy) over sglang's 4096" in notes  # 0 is no cap, said so
    # an engine without prefix caching: a policy that orders for reuse gets it, with a note ...
    eng, notes = scheduler_settings(RunConfig(policy="dfs", engine="trtllm"), get_policy("dfs"))
    assert eng.prefix_caching and "dfs: prefix_caching on (the policy orders for prefix reuse) over trtllm's off" in notes
    # ... others are told what the engine changes
    eng, notes = scheduler_settings(RunConfig(policy="fcfs", engine="trtllm"), get_policy("fcfs"))
    assert not eng.prefix_caching and notes == ["trtllm: prefix_caching off (engine): fcfs reuses no cached prefix (--prefix-cache, or "
                                                 "prefix_caching=True from Python, turns it on)"]
    # and turning it off by hand is refused in one line
    for p in ("dfs", "blendserve", "batchllm", "e2"):
        with pytest.raises(UserError, match=f"policy {p} orders requests for prefix reuse"):
            scheduler_settings(RunConfig(policy=p, prefix_caching=False), get_policy(p))
    # nothing to say when the policy declares nothing and the engine keeps the defaults
    assert scheduler_settings(RunConfig(policy="fcfs"), get_policy("fcfs"))[1] == []


def test_a_policy_keeps_its_ordering_on_any_engine():
    # two groups sharing prefixes, interleaved in the trace: dfs groups them on every engine
    n = 40
    prompts = [[(i % 2, 256), (100 + i, 16)] for i in range(n)]
    trace = from_columns(input_len=[272] * n, output_len=[4] * n, prompts=prompts)
    for engine in PROFILES:
        r = run_simulation(trace, RunConfig(policy="dfs", engine=engine, hardware="h100-80gb", max_seqs=4))
        order = r.requests["admit_s"].argsort(kind="stable")
        groups = [i % 2 for i in order.tolist()]
        switches = sum(a != b for a, b in zip(groups, groups[1:]))
        assert switches == 1, engine


def test_fitted_overhead_and_efficiencies_are_applied():
    params = {"engine": {"trtllm": {"fixed_s": 2e-3}}, "hardware": {"h100-80gb": {"gemm_eff": 0.5}},
              "regime": {"trtllm": {"h100-80gb": {"mem_eff": 0.6}}}}
    prof = get_profile("trtllm", params)
    assert prof.fixed_s == 2e-3 and prof.per_seq_s == PROFILES["trtllm"].per_seq_s
    eff = Efficiency.lookup(params, "trtllm", "h100-80gb")
    assert (eff.gemm_eff, eff.mem_eff, eff.attn_mem_eff) == (0.5, 0.6, None)
    dep = make_deployment("llama-3-8b", "h100-80gb")
    base, t = EfficiencyTimer(dep, Efficiency()), EfficiencyTimer(dep, eff)
    assert t.gemm_rate == pytest.approx(base.gemm_rate * 0.5 / dep.hardware.compute_efficiency)
    assert t.bw == pytest.approx(base.bw * 0.6 / dep.hardware.memory_efficiency)


def test_simulate_cli_takes_an_engine_profile(tmp_path):
    trace = tmp_path / "t.parquet"
    runner = CliRunner()
    res = runner.invoke(get_app(), ["workloads", "synth", "batchllm", "--prefix-len", "64", "--distinct-len", "16",
                                    "--share-degree", "2", "--requests", "16", "-o", str(trace)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(get_app(), ["simulate", str(trace), "--engine", "trtllm", "--hardware", "h100-80gb",
                                    "-o", str(tmp_path / "run"), "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["engine"] == "trtllm" and s["cost_model"] == "roofline+fitted"


def test_hardware_presets_name_the_devices_they_match():
    from blendsim.sim.hardware import PRESETS, GiB, preset_for_device

    assert preset_for_device("NVIDIA A100-SXM4-80GB", 80 * GiB) == "a100-80gb"
    assert preset_for_device("NVIDIA A100-SXM4-40GB", 40 * GiB) == "a100-40gb"  # same name, memory decides
    assert preset_for_device("NVIDIA H100 PCIe", 80 * GiB) == "h100-pcie"  # the longer name wins
    assert preset_for_device("NVIDIA H100 80GB HBM3", 80 * GiB) == "h100-80gb"
    assert preset_for_device("NVIDIA H200", 141 * GiB) == "h200" and preset_for_device("NVIDIA H20") == "h20"
    assert preset_for_device("Tesla T4", 16 * GiB) is None
    for h in PRESETS.values():
        for d in h.device_names:
            assert d == d.lower() and preset_for_device(f"NVIDIA {d.upper()}", h.memory_bytes) == h.name


def test_operator_lists_derive_from_one_table():
    from blendsim.sim import ops
    from blendsim.sim.profile import OP_VARS

    t = ops.OP_TABLE
    assert set(ops.OPS) == set(t) and set(OP_VARS) == {k for k, o in t.items() if o.vars}
    assert set(ops.ALL_GEMM_OPS) == {k for k, o in t.items() if o.kind == "gemm"}
    assert set(ops.MOE_GEMMS) <= set(ops.MOE_OPS) and set(ops.LOWP_GEMMS) <= set(ops.ALL_GEMM_OPS)
    assert ops.GEMM_OPS == ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")


def test_vllm_05_behind_its_api_server_pays_the_servers_share_of_the_loop():
    from blendsim.sim.engines import get_profile
    from blendsim.sim.errors import UserError

    off, srv = get_profile("vllm@0.5"), get_profile("vllm@0.5:serve=1")
    assert srv.serve and not off.serve
    # the vLLM 0.6.0 blog's profile of 0.5.3 behind its server: API server 33%, engine loop 29% of the time
    assert srv.overhead(100, 2000) == pytest.approx(off.overhead(100, 2000) * (1 + 33 / 29))
    # 0.6 put the server in its own process: the entry point changes nothing there
    assert get_profile("vllm@0.6:serve=1").overhead(100, 2000) == pytest.approx(get_profile("vllm@0.6").overhead(100, 2000))
    # V1's limits by entry point follow the flag
    h100 = make_deployment("llama-3-8b", "h100-80gb").hardware
    assert get_profile("vllm@0.8:serve=1").scheduler_for(h100)["token_budget"] == 8192
    assert get_profile("vllm@0.8").scheduler_for(h100)["token_budget"] == 16384
    with pytest.raises(UserError, match="serve must be 0"):
        get_profile("vllm@0.5:serve=2")


def test_a_catalogue_row_behind_the_server_runs_the_served_profile():
    from blendsim.fidelity.catalogue import Row, row_engine_key

    def row(ver):
        return Row(id="x", source="s", model="llama-3-8b", hardware="h100-80gb", gpus=1, tp=1, pp=1, ep=1,
                   weights="bf16", kv_dtype="bf16", engine="vllm", engine_version=ver, policy="", workload="const:8/8",
                   requests=10, metric="req_s", scope="system", value=1.0, note="", folder=Path("."), line=2)

    assert row_engine_key(row("vLLM v0.5.3, defaults; OpenAI server driven by benchmark_serving.py")) == "vllm@0.5:serve=1"
    assert row_engine_key(row("vLLM v0.5.3, benchmark_throughput.py")) == "vllm@0.5"


@pytest.mark.parametrize("engine, model, hardware, lo, hi", [
    ("sglang@0.4", "llama-3.1-8b", "h100-80gb", 2048, 2048),  # a 128K context: the pool's floor
    ("sglang@0.4", "llama-2-7b", "a100-80gb", 4096, 4096),  # 4K context: the pool's ceiling in 0.4
    ("sglang@0.3", "llama-2-7b", "a100-80gb", 5120, 5120),  # and in 0.3
    ("sglang@0.2", "llama-2-7b", "a100-80gb", 8_000, 30_000),  # 0.2: no ceiling
])
def test_sglang_runs_as_many_requests_as_its_request_pool_holds(engine, model, hardware, lo, hi):
    import blendsim

    trace = from_columns(input_len=[64] * 8, output_len=[4] * 8)
    r = blendsim.simulate(trace, "fcfs", model=model, hardware=hardware, engine=engine)
    assert lo <= r.summary["max_seqs"] <= hi
    mine = blendsim.simulate(trace, "fcfs", model=model, hardware=hardware, engine=engine, max_seqs=77)
    assert mine.summary["max_seqs"] == 77  # an explicit cap wins


def test_tensorrt_llm_pads_to_the_runs_max_batch_above_its_last_listed_size():
    dep = make_deployment("llama-3-8b", "h100-80gb", max_seqs=1536, max_batched_tokens=8192)
    sizes = get_profile("trtllm@1.0").graph_sizes_for(dep)
    assert sizes[-3:] == (512, 1024, 1536)  # 2048 and above give way to the executor's 1,536
    assert graph_size(1100, sizes) == 1536 and graph_size(1000, sizes) == 1024
    assert get_profile("vllm@0.8").graph_sizes_for(dep)[-1] == 512  # vLLM keeps its own list


def test_a_graph_cap_override_holds_on_every_device():
    from blendsim.sim.hardware import get_hardware

    h100 = get_hardware("h100-80gb")
    assert get_profile("sglang@0.5.3").graph_sizes(h100, 8)[-1] == 512  # by memory and TP
    assert get_profile("sglang@0.5.3:cuda_graph_max=128").graph_sizes(h100, 8)[-1] == 128
    assert get_profile("sglang@0.5.3:cuda_graph_max=0").graph_sizes(h100, 8) == ()
    assert get_profile("vllm@0.8:cuda_graph_max=1024").graph_sizes(h100, 1)[-2:] == (512, 1024)


def test_the_engines_table_shows_what_a_profile_leaves_to_blendsims_defaults():
    """`ideal` sets no scheduler field: its runs take blendsim's defaults (a 2,048-token budget, prefix caching
    on), and the table and `engines ideal` say so rather than "-" and "no"."""
    from blendsim.cli import get_app
    from blendsim.sim.engines import get_profile, scheduler_left_open
    from blendsim.sim.seq import EngineConfig

    assert scheduler_left_open(get_profile("ideal")) == {"token_budget": EngineConfig().token_budget, "max_seqs": 0,
                                                         "block_size": 16, "prefix_caching": True}
    assert scheduler_left_open(get_profile("vllm@0.5")) == {}  # it sets all four
    rows = json.loads(CliRunner().invoke(get_app(), ["engines", "ideal", "--json"]).stdout)
    assert "token_budget=2048" in rows["scheduler_left_open"] and "prefix_caching=True" in rows["scheduler_left_open"]
    table = CliRunner().invoke(get_app(), ["engines"], env={"COLUMNS": "200"}).stdout
    ideal = next(ln for ln in table.splitlines() if ln.split()[:1] == ["ideal"]).split()
    assert ideal[3:6] == ["2048", "-", "yes"], ideal
