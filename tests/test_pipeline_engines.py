"""Pipeline stages only on engines (and releases) that run them as their profiles price them (sim.engines
``pipeline_unmodelled``): one line everywhere a deployment meets an engine -- simulate, cost, sweep, the API, fidelity
rows -- and plan leaves such deployments out of its space."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import blendsim
from blendsim.cli import get_app
from blendsim.sim.engines import PROFILES, VERSIONS, get_profile, pipeline_unmodelled
from blendsim.sim.errors import UserError
from blendsim.workloads.trace import from_columns, write_trace
from tests.helpers import one_line_error

REFUSED = {
    "deepspeed-fastgen": "tensor parallelism only",
    "nanoflow": "tensor parallelism only",
    "sglang@0.2": "overlapped scheduler off",
    "sglang@0.3": "overlapped scheduler off",
    "sglang@0.4": "overlapped scheduler off",
    "sglang": "overlapped scheduler off",
    "vllm@0.5.0": "arrived in vLLM 0.5.1",
    "vllm@0.5.3": "add serve=1",
    "vllm-v0@0.5": "add serve=1",
    "vllm@0.6": "asynchronous output processing off",
    "vllm@0.6:serve=1": "asynchronous output processing off",
    "vllm@0.7": "asynchronous output processing off",
    "vllm@0.8.0": "on its V0 engine",
    "vllm@0.8.3": "on its V0 engine",
}
PRICED = ["ideal", "trtllm", "trtllm@0.8", "trtllm@0.13", "trtllm@1.0", "vllm@0.5.1:serve=1", "vllm@0.5:serve=1",
          "vllm@0.8", "vllm@0.8.4", "vllm@0.10", "vllm", "vllm@0.10:async_scheduling=1"]


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_an_engine_that_runs_no_pipeline_stages_says_why(key):
    assert REFUSED[key] in pipeline_unmodelled(get_profile(key, {}))


@pytest.mark.parametrize("key", PRICED)
def test_an_engine_whose_pipeline_stages_are_modelled_passes(key):
    assert pipeline_unmodelled(get_profile(key, {})) == ""


def test_every_engine_and_release_is_either_priced_or_refused_with_a_reason():
    for key in [*PROFILES, *(f"{n}@{v}" for n, v in VERSIONS if v)]:
        why = pipeline_unmodelled(get_profile(key, {}))
        assert why == "" or (len(why) > 40 and "\n" not in why), key


def _trace(tmp_path):
    path = tmp_path / "t.parquet"
    rng = np.random.default_rng(0)
    write_trace(from_columns(input_len=rng.integers(50, 400, 40), output_len=rng.integers(5, 60, 40)), path)
    return path


def _cli(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


@pytest.mark.parametrize("engine, needle", [("deepspeed-fastgen", "DeepSpeed-MII"), ("vllm@0.5", "serve=1"),
                                            ("sglang@0.4", "disable_overlap_schedule")])
def test_simulate_cost_and_sweep_refuse_pipeline_stages_in_one_line(tmp_path, engine, needle):
    t = _trace(tmp_path)
    common = ["--model", "llama-3-8b", "--hardware", "a100-80gb", "--tp", 2, "--pp", 2, "--engine", engine]
    one_line_error(_cli("simulate", t, *common, "--policy", "fcfs", "-o", tmp_path / "run"), "--pp 2", needle)
    assert not (tmp_path / "run").exists()
    one_line_error(_cli("cost", *common, "--decode-seqs", 8, "--context", 500), needle)
    sweep = ["sweep", "--models", "llama-3-8b", "--hardware", "a100-80gb", "--tp", 2, "--pp", 2, "--engine", engine,
             "--requests", 50, "-o", tmp_path / "sweep"]
    one_line_error(_cli(*sweep), needle)
    assert not (tmp_path / "sweep").exists()
    # one stage: every engine runs it
    r = _cli("simulate", t, *common[:6], "--engine", engine, "--policy", "fcfs", "-o", tmp_path / "one")
    assert r.exit_code == 0, r.output


def test_the_python_api_refuses_as_the_cli_does():
    trace = from_columns(input_len=[100, 200] * 20, output_len=[10, 20] * 20)
    with pytest.raises(UserError, match="with --pp 2: NanoFlow"):
        blendsim.simulate(trace, model="llama-3-8b", hardware="a100-80gb", tp=1, pp=2, engine="nanoflow")
    with pytest.raises(UserError, match="vllm@0.8.2 with --pp 2"):
        blendsim.cost(model="llama-3-8b", hardware="a100-80gb", pp=2, engine="vllm@0.8.2", decode_seqs=4)
    r = blendsim.simulate(trace, model="llama-3-8b", hardware="a100-80gb", tp=1, pp=2, engine="vllm@0.5:serve=1")
    assert r.summary["makespan_s"] > 0


def test_plan_leaves_pipeline_stages_of_such_an_engine_out_and_says_so(tmp_path):
    t = _trace(tmp_path)
    r = _cli("plan", t, "--model", "llama-3-8b", "--hardware", "a100-80gb", "--deadline", "1h",
             "--engines", "nanoflow,trtllm", "--policies", "fcfs", "--max-pp", 2, "--max-gpus", 2, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    # TP1 x PP2 (one replica of two GPUs) for nanoflow: left out; trtllm's is simulated
    assert out["pruned"] == {"on an engine without modelled pipeline stages": 1}
    assert out["candidates"] == 8 and out["simulated"] == 7  # TP1 x1/x2, TP2 x1, TP1xPP2 x1, for each engine
    assert not any(p["pp"] == 2 and p["engine"] == "nanoflow" for p in out["pareto"])


def test_engines_says_whether_pipeline_stages_are_modelled():
    r = _cli("engines", "nanoflow")
    assert r.exit_code == 0 and "pipeline_stages" in r.output and "refused" in r.output
    r = _cli("engines", "trtllm")
    assert r.exit_code == 0 and "modelled (--pp)" in r.output


def test_a_catalogue_row_is_checked_at_the_release_it_states(tmp_path):
    from blendsim.fidelity.catalogue import COLUMNS
    from blendsim.fidelity.suite import load_suite

    def row(rid, version):
        r = {c: "" for c in COLUMNS}
        r.update(id=rid, source="s", model="llama-3-8b", hardware="h100-80gb", gpus="2", tp="1", pp="2", engine="vllm",
                 engine_version=version, workload="const:128/128", requests="40", metric="output_tok_s",
                 scope="system", value="1000")
        return ",".join(r[c] for c in COLUMNS)

    cat = tmp_path / "c.csv"
    cat.write_text(",".join(COLUMNS) + "\n" + row("old", "vLLM v0.8.2") + "\n" + row("new", "vLLM v0.8.5") + "\n")
    suite = load_suite(cat, {})
    assert "vLLM 0.8.2 runs pipeline stages on its V0 engine" in suite.reasons["old"]
    assert "new" in suite.pricers


def test_a_calibrated_profile_is_checked_at_the_release_its_header_names(tmp_path):
    from blendsim.sim.engines import PARAMS_FILE

    p = json.loads(PARAMS_FILE.read_text())
    p["profile"] = {"kind": "blendsim-engine-profile", "engine": "vllm", "version": "0.8.2", "hardware": "h100-80gb"}
    f = tmp_path / "v082.json"
    f.write_text(json.dumps(p))
    one_line_error(_cli("cost", "--engine", f, "--pp", 2, "--decode-seqs", 8, "--context", 256),
                   "vLLM 0.8.2 runs pipeline stages on its V0 engine")
    p["profile"]["version"] = "0.5.3"
    f.write_text(json.dumps(p))
    one_line_error(_cli("cost", "--engine", f, "--pp", 2, "--decode-seqs", 8, "--context", 256),
                   "only behind its API server", "calibrate it on runs behind the server")


@pytest.mark.parametrize("engine, shared", [("vllm@0.8", True), ("vllm@0.5:serve=1", False), ("trtllm", False)])
def test_vllm_v1_keeps_one_sequence_cap_for_its_micro_batches(engine, shared):
    # V1's one scheduler bounds every micro-batch in flight by max_num_seqs; V0 (a Scheduler per virtual engine) and
    # TensorRT-LLM (max_batch_size per micro-batch) give each its own
    from blendsim.policies.registry import resolve_policy
    from blendsim.runner import RunConfig, scheduler_settings

    cls = resolve_policy("fcfs").cls
    one, _ = scheduler_settings(RunConfig(policy="fcfs", model="llama-3-70b", hardware="h100-80gb", tp=4,
                                          engine=engine), cls)
    two, notes = scheduler_settings(RunConfig(policy="fcfs", model="llama-3-70b", hardware="h100-80gb", tp=4, pp=2,
                                              engine=engine), cls)
    assert two.max_seqs == (one.max_seqs // 2 if shared else one.max_seqs) and one.max_seqs > 0
    assert any("one scheduler" in n for n in notes) == shared


def test_a_shared_sequence_cap_below_the_micro_batches_is_refused_and_a_remainder_is_said(tmp_path):
    """Review of 1 Dec 2026 (second): max_seqs 1 on vLLM V1 with --pp 2 ran one sequence in each micro-batch (two in
    flight, 1.94x faster than --pp 1), and a cap of 3 lost a seat without a word."""
    from blendsim.policies.registry import resolve_policy
    from blendsim.runner import RunConfig, scheduler_settings

    cls = resolve_policy("fcfs").cls
    base = dict(policy="fcfs", model="llama-3-8b", hardware="h100-80gb", engine="vllm@0.8")
    with pytest.raises(UserError, match="max_seqs 1 .* --pp 2: .* use a max_seqs of at least 2"):
        scheduler_settings(RunConfig(**base, pp=2, max_seqs=1), cls)
    three, notes = scheduler_settings(RunConfig(**base, pp=2, max_seqs=3), cls)
    assert three.max_seqs == 1 and any("1 of the cap unused" in n for n in notes), notes
    t = _trace(tmp_path)
    one_line_error(_cli("simulate", t, "-m", "llama-3-8b", "--hardware", "h100-80gb", "--engine", "vllm@0.8",
                        "--pp", 2, "--max-seqs", 1, "--policy", "fcfs", "-o", tmp_path / "run"),
                   "max_seqs 1", "at least 2")
    assert not (tmp_path / "run").exists()
