"""CLI tests of `simulate`, `policies`, `models`, `hardware` and `demo` (CliRunner, CPU)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.workloads.trace import write_trace
from tests.helpers import random_trace

REQUIRED = ("policy", "model", "hardware", "mode", "n_requests", "input_tokens", "output_tokens", "makespan_s",
            "throughput_tok_s", "prefix_sharing_ratio", "optimal_sharing_ratio", "compute_density", "t_opt_s",
            "frac_of_opt", "recomputed_tokens")
ONLINE = ("latency_mean_s", "latency_p99_s", "ttft_mean_s", "tbt_mean_s", "slo_attainment", "goodput_tok_s")


def invoke(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


@pytest.fixture
def trace_file(tmp_path):
    t = random_trace(np.random.default_rng(0), n=30, arrivals=True, slos=True)
    return write_trace(t, tmp_path / "t.parquet")


def test_simulate_writes_the_run_directory(trace_file, tmp_path):
    out = tmp_path / "run"
    r = invoke("simulate", trace_file, "--policy", "dfs", "--model", "tiny", "--hardware", "cpu", "-o", out,
               "--record-schedule", "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert set(REQUIRED) <= set(s) and set(ONLINE) <= set(s)
    assert s == json.loads((out / "summary.json").read_text())
    assert pq.ParquetFile(out / "steps.parquet").metadata.num_rows == s["steps"]
    assert pq.ParquetFile(out / "requests.parquet").metadata.num_rows == 30
    kinds = set(pq.ParquetFile(out / "schedule.parquet").read().column("kind").to_pylist())
    assert {"chunk", "decode", "finish"} <= kinds


def test_cache_flags_reach_the_engine_and_the_summary(trace_file, tmp_path):
    runs = {}
    for name, flags in (("default", []), ("no-retain", ["--no-prefix-retain"]), ("off", ["--no-prefix-cache"])):
        r = invoke("simulate", trace_file, "--model", "tiny", "--hardware", "cpu", "-o", tmp_path / name,
                   "--json", *flags)
        assert r.exit_code == 0, r.output
        runs[name] = json.loads(r.stdout)
    assert (runs["default"]["prefix_caching"], runs["default"]["prefix_retain"]) == (True, True)
    assert (runs["no-retain"]["prefix_caching"], runs["no-retain"]["prefix_retain"]) == (True, False)
    assert runs["off"]["prefix_caching"] is False
    assert runs["off"]["cached_tokens"] == 0
    # an engine that runs without it (vLLM 0.6's default) takes --prefix-cache, as its --enable-prefix-caching
    said = {}
    for name, flags in (("v06", []), ("v06-on", ["--prefix-cache"])):
        r = invoke("simulate", trace_file, "--model", "llama-3-8b", "--engine", "vllm@0.6", "-o", tmp_path / name,
                   "--json", *flags)
        assert r.exit_code == 0, r.output
        runs[name], said[name] = json.loads(r.stdout), r.stderr
    assert runs["v06"]["prefix_caching"] is False and "(--prefix-cache, or prefix_caching=True" in said["v06"]
    assert runs["v06-on"]["prefix_caching"] is True and "prefix_caching off" not in said["v06-on"]


def test_offline_runs_have_no_latency_keys(trace_file, tmp_path):
    from blendsim.workloads.trace import from_columns

    f = write_trace(from_columns(input_len=[10, 20], output_len=[3, 4]), tmp_path / "o.parquet")
    r = invoke("simulate", f, "--model", "tiny", "--hardware", "cpu", "-o", tmp_path / "r", "--json")
    assert r.exit_code == 0, r.output
    assert not set(ONLINE) & set(json.loads(r.stdout))


def test_simulate_prints_a_readable_summary(trace_file, tmp_path):
    r = invoke("simulate", trace_file, "--model", "tiny", "--hardware", "cpu", "-o", tmp_path / "r")
    assert r.exit_code == 0, r.output
    assert "throughput" in r.stdout and "prefix sharing" in r.stdout and "SLO attainment" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--policy", "nope"], "unknown policy 'nope'"),
    (["--model", "nope"], "unknown model 'nope'"),
    (["--hardware", "tpu"], "unknown hardware 'tpu'"),
    (["--mode", "fast"], "unknown mode 'fast'"),
    (["--engine", "trt"], "unknown engine 'trt'"),
    (["--opt", "novalue"], "expected key=value"),
    (["--policy", "dfs", "--opt", "bogus=1"], "has no option(s) bogus"),
    (["--token-budget", "0"], "--token-budget must be >= 1"),
    (["--replicas", "0"], "--replicas must be >= 1"),
    (["--tp", "3"], "does not divide"),
])
def test_bad_options_are_one_line(trace_file, tmp_path, args, message):
    r = invoke("simulate", trace_file, "-o", tmp_path / "r", *args)
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], r.stderr


def test_missing_or_corrupt_trace(tmp_path):
    r = invoke("simulate", tmp_path / "nope.parquet", "-o", tmp_path / "r")
    assert r.exit_code == 2 and "no such file" in r.stderr
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    r = invoke("simulate", bad, "-o", tmp_path / "r")
    assert r.exit_code == 2 and "not a readable Parquet trace" in r.stderr


def _bad_trace(tmp_path, kind):
    import pyarrow as pa

    good = {"input_len": pa.array([10, 20, 30]), "output_len": pa.array([5, 6, 7])}
    path = tmp_path / f"{kind}.parquet"
    if kind == "truncated":
        write_trace(random_trace(np.random.default_rng(1), n=50), path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return path
    cols, meta = dict(good), None
    if kind == "missing-column":
        del cols["output_len"]
    elif kind == "negative":
        cols["input_len"] = pa.array([10, -3, 30])
    elif kind == "text":
        cols["output_len"] = pa.array(["5", "six", "7"])
    elif kind == "newer-schema":
        meta = {b"blendsim.schema_version": b"99"}
    pq.write_table(pa.table(cols).replace_schema_metadata(meta), path)
    return path


@pytest.mark.parametrize("kind, message", [
    ("truncated", "not a readable Parquet trace"),
    ("missing-column", "missing column 'output_len'"),
    ("negative", "row 2, field input_len: -3"),
    ("text", "column 'output_len' must hold integers"),
    ("newer-schema", "schema version 99 is newer"),
])
def test_bad_trace_contents_are_one_line(tmp_path, kind, message):
    r = invoke("simulate", _bad_trace(tmp_path, kind), "--model", "tiny", "--hardware", "cpu", "-o", tmp_path / "r")
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert "Traceback" not in r.output


def test_unreadable_model_config_is_one_line(trace_file, tmp_path):
    cfg = tmp_path / "config.json"
    for content, message in (('{"hidden_size": 4096,', "config.json"), ('{"model_type": "llama"}', "config.json")):
        cfg.write_text(content)
        for cmd in (["simulate", trace_file, "-o", tmp_path / "r"], ["cost", "--decode-seqs", "4"]):
            r = invoke(*cmd, "--model", cfg, "--hardware", "cpu")
            assert r.exit_code == 2, r.output
            lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
            assert len(lines) == 1 and message in lines[0], r.stderr


def test_never_overwrites_a_folder_that_is_not_a_run(trace_file, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    r = invoke("simulate", trace_file, "--model", "tiny", "--hardware", "cpu", "-o", mine)
    assert r.exit_code == 2 and "not a blendsim run directory" in r.stderr
    assert (mine / "notes.txt").read_text() == "precious"


def test_rerun_replaces_an_earlier_run(trace_file, tmp_path):
    out = tmp_path / "r"
    for policy in ("fcfs", "dfs"):
        assert invoke("simulate", trace_file, "--policy", policy, "--model", "tiny", "--hardware", "cpu",
                      "-o", out).exit_code == 0
    assert json.loads((out / "summary.json").read_text())["policy"] == "dfs"


def test_listings():
    for cmd, word in (("policies", "dfs"), ("models", "llama-3-8b"), ("hardware", "a100-80gb")):
        r = invoke(cmd)
        assert r.exit_code == 0 and word in r.stdout


def test_every_command_has_help():
    for cmd in (["simulate"], ["cost"], ["demo"], ["workloads"], ["policies"], ["models"], ["hardware"],
                ["sweep"], ["report"], ["validate"], ["calibrate"], ["calibrate", "show"],
                ["calibrate", "import-vidur"], ["workloads", "synth"], ["workloads", "synth", "blendserve"]):
        r = invoke(*cmd, "--help")
        assert r.exit_code == 0 and "Usage" in r.stdout


def test_demo_runs(tmp_path):
    r = invoke("demo", "--requests", "600", "-o", tmp_path / "demo")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "demo" / "runs" / "dfs" / "summary.json").exists()
    assert "policies side by side" in r.stdout
    page = tmp_path / "demo" / "report" / "index.html"
    assert page.exists() and str(page) in r.stdout.replace("\n", "")


@pytest.mark.parametrize("cmd", ["simulate", "report"])
def test_an_unwritable_output_is_one_line_before_any_work(cmd, trace_file, tmp_path):
    (tmp_path / "a-file").write_text("x")
    run = tmp_path / "run"
    assert invoke("simulate", trace_file, "--model", "tiny", "--hardware", "cpu", "-o", run).exit_code == 0
    args = [trace_file, "--model", "tiny", "--hardware", "cpu"] if cmd == "simulate" else [run]
    r = invoke(cmd, *args, "-o", tmp_path / "a-file" / "out")
    assert r.exit_code == 2, r.output
    assert r.output.strip().count("\n") == 0 and "cannot write there" in r.output, r.output
    assert (tmp_path / "a-file").read_text() == "x"


def test_rounding_beyond_the_token_budget_is_said(trace_file, tmp_path):
    r = invoke("simulate", trace_file, "--model", "tiny", "--hardware", "cpu", "--token-budget", "64",
               "--round-tokens", "128", "-o", tmp_path / "r")
    assert r.exit_code == 0, r.output
    assert "round_tokens 128 exceeds the token budget 64" in " ".join(r.output.split())
