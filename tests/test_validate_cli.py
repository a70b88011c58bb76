"""``blendsim validate`` on CPU with the tiny model: outputs, faults, and calibrated accuracy."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from blendsim.cli.kit import UserErrorGroup as _Group
from blendsim.workloads.trace import write_trace


def _app(*registers) -> typer.Typer:
    """A blendsim app with only the given commands (other areas' work in progress cannot break it)."""
    app = typer.Typer(cls=_Group, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
    for register in registers:
        register(app)

    @app.command("version", hidden=True)
    def _version():
        """A second command keeps typer from collapsing the app into one command."""

    return app


def _validate_app():
    from blendsim.cli.validate import register

    return _app(register)


def _invoke(*args):
    return CliRunner().invoke(_validate_app(), ["validate", *map(str, args)])


def _groups_trace(groups: int, per_group: int, seed: int = 0, prefix: int = 128):
    """Requests in shuffled order, ``per_group`` of each sharing a ``prefix``-token segment (the trace of
    ``benchmarks/bench_validate_cpu.py``, which holds the replay's accuracy target)."""
    from tests.helpers import load_benchmark

    return load_benchmark("bench_validate_cpu").groups_trace(groups, per_group, seed, prefix)


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "t.parquet"
    write_trace(_groups_trace(2, 3, prefix=48), path)
    return path


def test_validate_two_policies_end_to_end(small_trace, tmp_path):
    out = tmp_path / "val"
    r = _invoke(small_trace, "--policies", "sarathi,vllm", "--token-budget", "128", "--repeats", "1",
                "--op-every", "3", "-o", out, "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)  # progress lines of a slow run go to stderr
    assert s["status"] == "complete" and s["attention_backend"] == "torch_sdpa"
    steps = pq.read_table(out / "steps.parquet").to_pydict()
    for p in ("sarathi", "vllm"):
        sim = json.loads((out / "sim" / p / "summary.json").read_text())
        mine = [i for i, q in enumerate(steps["policy"]) if q == p]
        assert s["policies"][p]["steps"] == len(mine) == sim["steps"]  # every simulated step ran
        assert s["policies"][p]["complete"]
        np.testing.assert_allclose(sum(steps["predicted_s"][i] for i in mine), sim["makespan_s"], rtol=1e-9)
        assert all(steps["measured_s"][i] > 0 for i in mine)
        e = s["policies"][p]
        assert set(e["op_class_error"]) == {"gemm", "attention", "other"}
        assert e["end_to_end"]["tokens"] == sim["input_tokens"] + sim["output_tokens"]
        assert (out / "sim" / p / "schedule.parquet").exists()
    # sarathi recomputes the shared prefixes (no prefix caching): more prefill tokens than vllm
    pre = {p: sum(steps["num_prefill_tokens"][i] for i, q in enumerate(steps["policy"]) if q == p)
           for p in ("sarathi", "vllm")}
    assert pre["sarathi"] > pre["vllm"]
    sp = s["speedup"]["vllm"]
    assert s["speedup_base"] == "sarathi" and sp["speedup_pred"] > 1.0 and sp["over"] == "the whole trace"
    assert sp["speedup_err"] == pytest.approx(sp["speedup_pred"] / sp["speedup_meas"] - 1)
    # complete replays: the predicted speedup is the simulator's own, whole-trace one
    sims = {p: json.loads((out / "sim" / p / "summary.json").read_text()) for p in ("sarathi", "vllm")}
    assert sp["speedup_pred"] == pytest.approx(sims["vllm"]["throughput_tok_s"] / sims["sarathi"]["throughput_tok_s"],
                                               rel=1e-9)
    ops = pq.read_table(out / "ops.parquet").to_pydict()
    assert {"qkv_proj", "attn_prefill", "lm_head", "norm"} <= set(ops["op"])
    assert pq.read_table(out / "steps.parquet").num_rows == len(steps["step"])


def test_validate_max_steps_and_table(small_trace, tmp_path):
    r = _invoke(small_trace, "--policy", "fcfs", "--max-steps", "4", "--repeats", "1", "-o", tmp_path / "v")
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())  # the table wraps with the console width
    assert "predicted vs measured" in text and "replayed steps only" in text
    assert "…" not in r.output and max(map(len, r.output.splitlines())) <= 80  # piped: 80 columns, nothing cut
    assert "policy" in r.output and "tput err" in r.output, r.output
    s = json.loads((tmp_path / "v" / "summary.json").read_text())
    assert s["policies"]["fcfs"]["steps"] == 4 and not s["policies"]["fcfs"]["complete"]


def test_validate_refuses_a_schedule_that_does_not_fit(small_trace, tmp_path):
    r = _invoke(small_trace, "--device-memory-gb", "0.05", "-o", tmp_path / "v")
    assert r.exit_code == 2
    assert "needs" in r.output and "KV blocks" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "v").exists()


def test_the_memory_plan_is_the_peak_of_the_schedule(small_trace, tmp_path):
    """Exactly the schedule's peak KV (plus weights and the largest step) is asked for: one byte less is
    refused before anything runs, that much is enough."""
    from blendsim.real_backend.replay import load_schedule, peak_blocks
    from blendsim.sim.errors import UserError
    from blendsim.sim.prefix_tree import PrefixTree
    from blendsim.validate import ValidateConfig, need_bytes, run_validation, simulate
    from blendsim.workloads.trace import read_trace

    trace = read_trace(small_trace)
    cfg = ValidateConfig(max_steps=3, repeats=1)
    res, _cm, dep = simulate(trace, cfg, "fcfs", "cpu")
    sch = load_schedule(res.schedule)
    peak = peak_blocks(sch.events[0], trace, PrefixTree(trace), sch.block_size, sch.capacity_blocks, 3)
    assert 0 < peak < sch.capacity_blocks
    tokens = max(res.steps[0]["num_tokens"])
    need = need_bytes(dep.model, peak, sch.block_size, tokens, tokens, False)
    with pytest.raises(UserError, match=f"{peak} KV blocks"):
        run_validation(small_trace, ValidateConfig(max_steps=3, repeats=1, device_memory_bytes=need - 1), tmp_path / "a")
    assert not (tmp_path / "a").exists()
    s = run_validation(small_trace, ValidateConfig(max_steps=3, repeats=1, device_memory_bytes=need), tmp_path / "b")
    assert s["policies"]["fcfs"]["steps"] == 3


def test_validate_without_a_gpu(small_trace, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    r = _invoke(small_trace, "--device", "cuda", "-o", tmp_path / "v")
    assert r.exit_code == 2 and "no CUDA device" in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("field,value,msg", [("model_shape", {"hidden_size": 4096}, "fitted for model"),
                                            ("dtype", "bf16", "fitted for dtype")])
def test_validate_refuses_a_profile_of_another_model(small_trace, tmp_path, field, value, msg):
    from blendsim.sim.models import get_model
    from blendsim.sim.profile import SCHEMA, SCHEMA_VERSION, model_shape

    prof = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "model": "tiny",
            "model_shape": model_shape(get_model("tiny")), "dtype": "fp32", "tp": 1, "ops": {}}
    if field == "model_shape":
        prof["model_shape"] = {**prof["model_shape"], **value}
    else:
        prof[field] = value
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    r = _invoke(small_trace, "--profile", path, "-o", tmp_path / "v")
    assert r.exit_code == 2 and msg in r.output and len(r.output.strip().splitlines()) == 1


def _fail_at(monkeypatch, step: int, exc: BaseException) -> None:
    """The replay (not the warm-up) raises ``exc`` when its executor reaches ``step`` executed steps."""
    import blendsim.real_backend.replay as rp

    replay = rp.replay

    def failing_replay(ex, events, max_steps=None, on_step=None):
        execute = ex.execute

        def failing(batch, time_ops=None):
            if len(ex.records) == step:
                raise exc
            return execute(batch, time_ops)

        ex.execute = failing
        return replay(ex, events, max_steps, on_step)

    monkeypatch.setattr(rp, "replay", failing_replay)


def test_out_of_memory_mid_run_stops_cleanly_with_what_was_measured(small_trace, tmp_path, monkeypatch):
    import torch

    _fail_at(monkeypatch, 5, torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    out = tmp_path / "v"
    r = _invoke(small_trace, "--policies", "fcfs,dfs", "--repeats", "1", "-o", out)
    assert r.exit_code == 1
    assert "out of memory" in r.output and "partial results" in r.output
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "stopped" and "out of memory" in s["reason"]
    assert s["policies"]["fcfs"]["steps"] == 5 and s["policies"]["dfs"]["steps"] == 0
    assert pq.read_table(out / "steps.parquet").num_rows == 5
    # a stopped folder is a validation folder: a new run may replace it
    monkeypatch.undo()
    assert _invoke(small_trace, "--max-steps", "2", "--repeats", "1", "-o", out).exit_code == 0


def test_a_stopped_run_never_replaces_a_complete_validation(small_trace, tmp_path, monkeypatch):
    out = tmp_path / "v"
    assert _invoke(small_trace, "--max-steps", "3", "--repeats", "1", "-o", out).exit_code == 0
    before = (out / "summary.json").read_bytes()
    _fail_at(monkeypatch, 2, KeyboardInterrupt())
    r = _invoke(small_trace, "--repeats", "1", "-o", out)
    assert r.exit_code == 1 and "keeps its complete validation" in r.output
    assert (out / "summary.json").read_bytes() == before  # the complete result is kept
    s = json.loads((tmp_path / "v.stopped" / "summary.json").read_text())
    assert s["status"] == "stopped" and s["reason"] == "interrupted" and s["policies"]["fcfs"]["steps"] == 2
    # a folder of something else at OUT.stopped is left alone: the measurements go to OUT.stopped-2
    (tmp_path / "v.stopped" / "summary.json").rename(tmp_path / "v.stopped" / "mine.json")
    assert _invoke(small_trace, "--repeats", "1", "-o", out).exit_code == 1
    assert (tmp_path / "v.stopped" / "mine.json").exists()
    assert json.loads((tmp_path / "v.stopped-2" / "summary.json").read_text())["status"] == "stopped"
    (tmp_path / "v.stopped" / "mine.json").rename(tmp_path / "v.stopped" / "summary.json")
    # the next stopped run replaces the stopped one, and a complete run still replaces the complete one
    assert _invoke(small_trace, "--repeats", "1", "-o", out).exit_code == 1
    monkeypatch.undo()
    assert _invoke(small_trace, "--max-steps", "2", "--repeats", "1", "-o", out).exit_code == 0
    assert json.loads((out / "summary.json").read_text())["policies"]["fcfs"]["steps"] == 2


def test_validate_refuses_to_overwrite_another_folder(small_trace, tmp_path):
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "notes.txt").write_text("mine")
    r = _invoke(small_trace, "-o", tmp_path / "v")
    assert r.exit_code == 2 and "not a blendsim validation folder" in r.output
    assert (tmp_path / "v" / "notes.txt").read_text() == "mine"


# ---- calibrated accuracy --------------------------------------------------------------------
def _blendsim(*args) -> subprocess.CompletedProcess:
    """Run the installed command line in its own process, as a user does: the timings then come from a
    fresh interpreter, not from the test process after hundreds of other tests."""
    cmd = [sys.executable, "-c", "from blendsim.cli import main; main()", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory):
    """A quick CPU profile of the tiny model, made with ``blendsim calibrate``."""
    path = tmp_path_factory.mktemp("profile") / "p.json"
    r = _blendsim("calibrate", "--device", "cpu", "--model", "tiny", "--quick", "-o", path)
    assert r.returncode == 0, r.stderr
    return path


def _replay_medians(trace, profile, out, runs: int, capsys) -> list[float]:
    medians = []
    for k in range(runs):
        r = _blendsim("validate", trace, "--policy", "vllm", "--token-budget", "512", "--profile", profile,
                      "-o", out / f"val{k}", "--json")
        assert r.returncode == 0, r.stderr
        p = json.loads(r.stdout)["policies"]["vllm"]
        e = p["step_error"]
        assert e["steps"] >= 40
        medians.append(e["median_abs_err"])
        with capsys.disabled():
            print(f"\ncalibrated CPU validation {k + 1}/{runs}: {e['steps']} steps, median |err| "
                  f"{e['median_abs_err']:.3f}, p90 {e['p90_abs_err']:.3f}, mean {e['mean_err']:+.3f}, by kind "
                  f"{ {n: round(v['median_abs_err'], 3) for n, v in e['by_kind'].items()} }, classes "
                  f"{ {n: round(v['total_err'], 3) for n, v in p['op_class_error'].items()} }, "
                  f"throughput err {p['end_to_end']['throughput_err']:+.3f}")
    return medians


def test_calibrated_simulator_replays_cpu_step_times(cpu_profile, tmp_path, capsys):
    """A quick CPU profile of the tiny model drives a replay that times every step and reports finite,
    positive errors. How close those are (median step error under 15%) is a target of
    ``benchmarks/bench_validate_cpu.py``, not of this test: it depends on how steady the host's speed is
    (a shared host drifts 10-30% between processes), and a busy CI machine must not fail a correct change."""
    trace = tmp_path / "t.parquet"
    write_trace(_groups_trace(4, 6), trace)
    (m,) = _replay_medians(trace, cpu_profile, tmp_path / "a", 1, capsys)
    assert np.isfinite(m) and 0 <= m < 5  # a profile in the wrong units would be off by orders of magnitude


def test_a_hard_stop_keeps_the_last_checkpoint(small_trace, tmp_path, monkeypatch):
    """A process killed mid-run (here: SystemExit, which nothing catches) leaves the last checkpoint."""
    from blendsim.validate import ValidateConfig, run_validation

    _fail_at(monkeypatch, 4, SystemExit(9))
    out = tmp_path / "v"
    with pytest.raises(SystemExit):
        run_validation(small_trace, ValidateConfig(repeats=1, checkpoint_s=0.0), out)
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "running" and s["policies"]["fcfs"]["steps"] == 4
    assert pq.read_table(out / "steps.parquet").num_rows == 4
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no half-written folder left


@pytest.mark.gpu
def test_validate_on_cuda(small_trace, tmp_path):
    """On a GPU: the fastest attention backend, NVML samples, efficiency against measured peaks."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    out = tmp_path / "v"
    r = _invoke(small_trace, "--device", "cuda", "--dtype", "bf16", "--hardware", "h100-80gb", "--block-size", "16",
                "-o", out, "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["attention_backend"] in ("flash_attn", "flashinfer", "torch_sdpa") and s["clock"] == "cuda events"
    assert s["peaks"]["mem_bandwidth"] > 1e11 and s["peaks"]["matmul_flops"] > 1e13
    p = s["policies"]["fcfs"]
    assert p["complete"] and 0 <= p["host_bound_fraction"] <= 1
    assert set(p["efficiency"]) >= {"peaks", "decode"}
    if s["nvml"] == "sampling":
        assert s["nvml_summary"]["samples"] > 0 and (out / "nvml.parquet").exists()


def test_policy_and_policies_together_are_refused(small_trace, tmp_path):
    r = _invoke(small_trace, "--policy", "dfs", "--policies", "fcfs", "-o", tmp_path / "v")
    assert r.exit_code == 2 and "not both" in r.output and not (tmp_path / "v").exists()


@pytest.mark.parametrize("threads", ["0", "-1"])
def test_no_threads_is_refused(small_trace, tmp_path, threads):
    r = _invoke(small_trace, "--threads", threads, "-o", tmp_path / "v")
    assert r.exit_code == 2 and f"--threads must be at least 1, got {threads}" in r.output
    assert not (tmp_path / "v").exists()


def test_a_long_policy_name_folds_and_no_figure_is_cut(small_trace, tmp_path):
    pol = tmp_path / "a_rather_long_policy_file_name_of_mine.py"
    pol.write_text("import numpy as np\nimport blendsim\n\n\nclass Mine(blendsim.Policy):\n"
                   "    def rank(self):\n        return np.arange(self.ctx.trace.n)\n")
    r = _invoke(small_trace, "--policies", f"fcfs,{pol}:Mine", "--repeats", "1", "--max-steps", "3",
                "-o", tmp_path / "v")
    assert r.exit_code == 0, r.output
    rows = [x for x in r.output.splitlines() if x.startswith("fcfs ")]
    assert rows and rows[0].rstrip().endswith("%") and "…" not in r.output  # the last figure whole
    assert sum(x.count("%") for x in r.output.splitlines()[:12]) >= 14  # both rows' seven percentages


def test_a_speedup_between_a_complete_and_a_cut_replay_counts_tokens_one_way(small_trace, tmp_path):
    """One replay complete, the other cut at --max-steps: both throughputs count the computed tokens of the
    replayed steps (not the whole trace's tokens for one and the computed ones for the other), and say so."""
    r = _invoke(small_trace, "--policies", "vllm,sarathi", "--token-budget", "128", "--max-steps", "4", "--repeats", "1", "-o",
                tmp_path / "v", "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    done = {p: s["policies"][p]["complete"] for p in ("vllm", "sarathi")}
    sp = s["speedup"]["sarathi"]
    if all(done.values()):
        pytest.skip("both replays fit in 3 steps here")
    assert sp["over"].startswith("computed tokens a second over each replay's steps")
    assert sp["speedup_err"] == pytest.approx(sp["speedup_pred"] / sp["speedup_meas"] - 1)
