"""A comparison has one engine: every policy run as a user would (``simulate`` per policy, then ``report``)
is priced on the same engine profile, and ``report`` refuses runs priced differently unless ``--mixed``."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.sim.engines import DEFAULT_ENGINE
from blendsim.workloads.trace import write_trace
from tests.helpers import random_trace

SIX = ("fcfs", "dfs", "blendserve", "vllm", "batchllm", "e2")


def cli(*args: str):
    return CliRunner().invoke(get_app(), list(args))


def simulate(trace, policy: str, out, *extra: str):
    r = cli("simulate", str(trace), "--policy", policy, "--model", "llama-3-8b", "--hardware", "a100-80gb",
            "--offline", "-o", str(out), *extra)
    assert r.exit_code == 0, r.output
    return r


def test_six_policies_from_simulate_and_report_are_priced_on_one_engine(tmp_path):
    trace = tmp_path / "t.parquet"
    write_trace(random_trace(np.random.default_rng(11), n=60), trace)
    said = {p: simulate(trace, p, tmp_path / "runs" / p).output for p in SIX}
    summaries = {p: json.loads((tmp_path / "runs" / p / "summary.json").read_text()) for p in SIX}
    assert {s["engine"] for s in summaries.values()} == {DEFAULT_ENGINE}
    assert {s["cost_model"] for s in summaries.values()} == {"roofline"}
    # the vllm policy's scheduler settings are declared over the engine's, and printed
    assert "vllm: token_budget 8192 (policy) over ideal's 2048" in said["vllm"]
    r = cli("report", str(tmp_path / "runs"), "-o", str(tmp_path / "rep"))
    assert r.exit_code == 0, r.output
    md = (tmp_path / "rep" / "report.md").read_text()
    assert f"All runs are priced on one engine: engine {DEFAULT_ENGINE}, roofline cost model." in md
    side = pd.read_csv(tmp_path / "rep" / "policies.csv")
    assert sorted(side["label"]) == sorted(SIX)
    # the same six on --engine vllm: every run on vllm, the report says so
    for p in SIX:
        simulate(trace, p, tmp_path / "on-vllm" / p, "--engine", "vllm")
    assert {json.loads((tmp_path / "on-vllm" / p / "summary.json").read_text())["engine"] for p in SIX} == {"vllm"}
    r = cli("report", str(tmp_path / "on-vllm"), "-o", str(tmp_path / "rep-vllm"))
    assert r.exit_code == 0, r.output
    assert ("priced on one engine: engine vllm (modelled by vllm@0.8), roofline+fitted cost model"
            in (tmp_path / "rep-vllm" / "report.md").read_text())


def test_report_refuses_runs_of_two_engines_without_mixed(tmp_path):
    trace = tmp_path / "t.parquet"
    write_trace(random_trace(np.random.default_rng(12), n=30), trace)
    simulate(trace, "fcfs", tmp_path / "runs" / "fcfs")
    simulate(trace, "dfs", tmp_path / "runs" / "dfs", "--engine", "vllm")
    r = cli("report", str(tmp_path / "runs"), "-o", str(tmp_path / "rep"))
    assert r.exit_code == 2
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "priced differently" in err and "--mixed" in err
    r = cli("report", str(tmp_path / "runs"), "-o", str(tmp_path / "rep"), "--mixed")
    assert r.exit_code == 0, r.output
    side = pd.read_csv(tmp_path / "rep" / "policies.csv")
    assert sorted(side["label"]) == ["dfs [vllm]", "fcfs [ideal]"]


def test_a_run_given_twice_is_one_run_and_a_copied_run_gets_its_own_label(tmp_path):
    import shutil

    trace = tmp_path / "t.parquet"
    write_trace(random_trace(np.random.default_rng(13), n=30), trace)
    for p in ("fcfs", "dfs"):
        simulate(trace, p, tmp_path / "runs" / p)
    r = cli("report", str(tmp_path / "runs"), str(tmp_path / "runs" / "dfs"), "-o", str(tmp_path / "rep"))
    assert r.exit_code == 0, r.output
    assert sorted(pd.read_csv(tmp_path / "rep" / "policies.csv")["label"]) == ["dfs", "fcfs"]
    shutil.copytree(tmp_path / "runs", tmp_path / "copy")
    r = cli("report", str(tmp_path / "runs"), str(tmp_path / "copy"), "-o", str(tmp_path / "rep2"))
    assert r.exit_code == 0, r.output
    labels = pd.read_csv(tmp_path / "rep2" / "policies.csv")["label"]
    assert len(labels) == 4 and labels.is_unique


def test_overlap_mode_on_an_engine_that_does_not_overlap_is_said(tmp_path):
    trace = tmp_path / "t.parquet"
    write_trace(random_trace(np.random.default_rng(14), n=20), trace)
    r = simulate(trace, "fcfs", tmp_path / "r", "--engine", "vllm", "--mode", "overlap")
    assert "--mode overlap: vllm" in " ".join(r.output.split()) and "what-if" in r.output
    r = simulate(trace, "fcfs", tmp_path / "n", "--engine", "nanoflow", "--mode", "overlap")
    assert "--mode overlap:" not in r.output
    # cost says it of one step as simulate does of a run
    r = cli("cost", "--prefill-tokens", "100", "--engine", "vllm", "--mode", "overlap", "--json")
    assert "--mode overlap: vllm" in r.stderr and "what-if" in r.stderr
    assert "--mode overlap:" not in cli("cost", "--prefill-tokens", "100", "--engine", "vllm", "--json").stderr


def test_a_report_says_where_its_policies_ran_on_different_scheduler_settings(tmp_path):
    """One engine prices every run, but a policy's declared settings (blendserve: budget 1,024, block 1, rounding
    128) sit over the engine's: the report says which ran on which and the CSV keeps every setting; with one set
    (the same options to each) it says nothing. A blended reference below T_o is no estimate: left blank."""
    trace = tmp_path / "t.parquet"
    write_trace(random_trace(np.random.default_rng(11), n=60), trace)
    for p in ("dfs", "blendserve"):
        simulate(trace, p, tmp_path / "runs" / p, "--engine", "vllm")
    assert cli("report", str(tmp_path / "runs"), "-o", str(tmp_path / "rep")).exit_code == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert ("The policies ran on different scheduler settings (blendserve: token budget 1,024, block size 1, "
            "rounding 128; dfs: token budget 8,192, block size 16, rounding 0)") in md
    side = pd.read_csv(tmp_path / "rep" / "policies.csv").set_index("label")
    assert side.loc["blendserve", "token_budget"] == 1024 and side.loc["dfs", "block_size"] == 16
    summaries = {p: json.loads((tmp_path / "runs" / p / "summary.json").read_text()) for p in ("dfs", "blendserve")}
    below = [p for p, s in summaries.items() if s["t_reference_s"] < s["t_opt_s"]]
    assert (f"\"of ref.\" is left blank for {len(below)} run(s)" in md) == bool(below)
    for p in ("dfs", "blendserve"):
        simulate(trace, p, tmp_path / "same" / p, "--engine", "vllm", "--token-budget", "1024", "--block-size", "1",
                 "--round-tokens", "128")
    assert cli("report", str(tmp_path / "same"), "-o", str(tmp_path / "rep2")).exit_code == 0
    assert "different scheduler settings" not in (tmp_path / "rep2" / "report.md").read_text()
