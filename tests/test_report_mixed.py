"""``report --mixed`` (new-user review): a speedup is over the baseline run priced on the same engine, never across
engines, and a baseline run with no other policy beside it shows no speedup (it was 1.000x on every row of a
report of one policy on three engines) and the report says why in one line, on the page and on stderr."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.workloads.trace import write_trace
from tests.helpers import random_trace


def cli(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """fcfs and dfs, each on vllm and on ideal, one run directory each."""
    d = tmp_path_factory.mktemp("mixed")
    trace = d / "t.parquet"
    write_trace(random_trace(np.random.default_rng(21), n=30), trace)
    for pol in ("fcfs", "dfs"):
        for eng in ("vllm", "ideal"):
            r = cli("simulate", trace, "--policy", pol, "--model", "llama-3-8b", "--hardware", "a100-80gb",
                    "--offline", "--engine", eng, "-o", d / f"{pol}_{eng}" / "run")
            assert r.exit_code == 0, r.output
    return d


def _tput(d, name):
    import json

    return json.loads((d / name / "run" / "summary.json").read_text())["throughput_tok_s"]


def test_one_policy_on_several_engines_shows_no_speedup_and_says_why(runs, tmp_path):
    r = cli("report", runs / "fcfs_vllm" / "run", runs / "fcfs_ideal" / "run", "--mixed", "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    rep = tmp_path / "rep"
    md, page = (rep / "report.md").read_text(), (rep / "index.html").read_text()
    assert "1.000×" not in md and "1.000×" not in page  # was the speedup of every row and of the summary
    side = pd.read_csv(rep / "policies.csv")
    assert "speedup" not in side or side["speedup"].isna().all()
    summary = pd.read_csv(rep / "policy_summary.csv")
    assert summary[["speedup_geomean", "speedup_min", "speedup_max"]].isna().all().all()
    why = "No speedup is shown for 2 fcfs run(s) with no other policy beside them on the same engine"
    assert why in md and why in page and "compare their tok/s" in md
    err = [x for x in r.stderr.splitlines() if "no speedup is shown" in x]
    assert len(err) == 1 and err[0].startswith("note: no speedup is shown for 2 fcfs run(s)")
    assert sorted(side["throughput_tok_s"]) == sorted([_tput(runs, "fcfs_vllm"), _tput(runs, "fcfs_ideal")])


def test_a_mixed_report_pairs_each_run_with_the_baseline_on_its_own_engine(runs, tmp_path):
    # given as one folder (one input): dfs ran twice on the workload, which was refused as ambiguous
    r = cli("report", runs, "--mixed", "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    side = pd.read_csv(tmp_path / "rep" / "policies.csv")
    sp = dict(zip(side["engine"] + "/" + side["label"].str.partition(" ")[0], side["speedup"], strict=True))
    for eng in ("vllm", "ideal"):
        assert sp[f"{eng}/fcfs"] == pytest.approx(_tput(runs, f"fcfs_{eng}") / _tput(runs, f"dfs_{eng}"), rel=1e-12)
        assert sp[f"{eng}/dfs"] == 1.0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "workload, deployment and engine" in md and "No speedup is shown" not in md
    # given one directory each, the same pairs (the inputs do not decide which baseline a run is over)
    r = cli("report", *(runs / f"{p}_{e}" / "run" for p in ("dfs", "fcfs") for e in ("vllm", "ideal")),
            "--mixed", "-o", tmp_path / "rep2")
    assert r.exit_code == 0, r.output
    side2 = pd.read_csv(tmp_path / "rep2" / "policies.csv")
    assert sorted(side2["speedup"]) == pytest.approx(sorted(side["speedup"]), rel=1e-12)


def test_a_mixed_report_never_divides_across_engines(runs, tmp_path):
    # dfs only on vllm, fcfs only on ideal: fcfs [ideal] over dfs [vllm] was shown as fcfs's speedup
    r = cli("report", runs / "dfs_vllm" / "run", runs / "fcfs_ideal" / "run", "--mixed", "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    side = pd.read_csv(tmp_path / "rep" / "policies.csv")
    assert "speedup" not in side or side["speedup"].isna().all()
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "without a dfs run on its engine, left out of its row" in md
    assert "No speedup is shown for 1 dfs run(s)" in md


def test_a_lone_baseline_in_a_plain_report_shows_no_speedup(runs, tmp_path):
    r = cli("report", runs / "dfs_vllm" / "run", "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "1.000×" not in md
    assert "No speedup is shown for 1 dfs run(s) with no other policy beside them on the same workload and " \
           "deployment: a run over itself is 1 by definition." in md
    assert "across engines" not in md.split("No speedup is shown")[1].split("\n")[0]
