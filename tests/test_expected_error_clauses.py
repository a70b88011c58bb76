"""The expected-error line's clauses (new-user review): a wider group holding the same runs as this engine on this
deployment is not said twice, a profile that is another's under an older name quotes that one's runs and says so,
and this engine's absence on this deployment is stated as the engine's and the deployment's are."""

from __future__ import annotations

import os

import numpy as np
import pytest
from typer.testing import CliRunner

import blendsim.fidelity.expected as B
import blendsim.sim.expected as X
from blendsim.cli import get_app
from blendsim.fidelity.catalogue import read_catalogue
from blendsim.workloads.trace import write_trace
from tests.helpers import random_trace
from tests.test_expected_error import ROWS, _result
from tests.test_fidelity import _write


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return B.build(_result(), read_catalogue(_write(tmp_path_factory.mktemp("cat"), ROWS)), "sha")


def test_a_profile_whose_runs_are_all_on_this_deployment_is_said_once(table):
    # trtllm@0.13's 4 runs are all on h100-80gb TP8 (and that deployment's are all its): one clause, not three
    line = X.expected_line("trtllm@0.13", "h100-80gb TP8", table)
    assert "5.0% over 4 runs of trtllm@0.13 on h100-80gb TP8 (p90 8.8%); 10% over all 8" in line
    assert line.count("over 4 runs") == 1 and "on any GPU" not in line and "with any engine" not in line
    assert [g["scope"] for g in X.groups("trtllm@0.13", "h100-80gb TP8", table)] == ["profile_deployment", "all"]
    # a profile with runs elsewhere keeps its wider clause
    assert "25% over 4 runs of vllm@0.5 on any GPU" in X.expected_line("vllm@0.5", "a100-80gb TP8", table)


def test_no_run_of_this_engine_on_this_deployment_is_said(table):
    line = X.expected_line("trtllm@0.13", "a100-80gb TP8", table)
    body = line[len(X.HEAD):]
    assert body.startswith("no published run of trtllm@0.13 on a100-80gb TP8; 20% over 3 runs on a100-80gb TP8 "
                           "with any engine")
    # implied by the engine's or the deployment's own absence: not said again
    line = X.expected_line("sglang@0.4", "b200 TP1", table)
    assert "no published run of sglang@0.4; no published run on b200 TP1; 10% over all 8" in line
    assert "sglang@0.4 on b200" not in line
    assert "no published run of vllm@0.5 on b200" not in X.expected_line("vllm@0.5", "b200 TP1", table)


def test_a_profile_under_an_older_name_quotes_the_runs_it_prices_as():
    # vllm-v0@0.6 is vllm@0.6 (fit_as) under V0's name: same fitted loop, scheduler and every other parameter
    assert X.priced_as("vllm-v0@0.7") == "vllm@0.6" and X.priced_as("vllm-v0") == "vllm@0.6"
    assert X.priced_as("vllm-v0@0.5") == "vllm@0.5"
    # its own runs, one changed parameter, or a shared loop with another scheduler: no one else's runs
    for key in ("vllm@0.7.2", "vllm@0.6", "nanoflow", "trtllm@0.8", "vllm-v0@0.6:fixed_s=0.01", "ideal", "nope"):
        assert X.priced_as(key) is None, key
    v0, v = X.of_engine("vllm-v0@0.7", "a100-80gb", 1), X.of_engine("vllm@0.7.2", "a100-80gb", 1)
    assert v0["profile"] == "vllm-v0@0.6" and v["profile"] == "vllm@0.6"
    assert v0["line"] == X.HEAD + "vllm-v0@0.6 prices as vllm@0.6; " + v["line"][len(X.HEAD):]
    assert "no published run of vllm-v0" not in v0["line"]
    assert {k: v0[k] for k in ("scope", "of", "n", "loso_median", "profile_runs")} == \
        {k: v[k] for k in ("scope", "of", "n", "loso_median", "profile_runs")}


def test_simulate_says_it_at_80_columns(tmp_path, monkeypatch):
    monkeypatch.setitem(os.environ, "COLUMNS", "80")
    trace = tmp_path / "t.parquet"
    write_trace(random_trace(np.random.default_rng(3), n=20), trace)
    r = CliRunner().invoke(get_app(), ["simulate", str(trace), "--model", "llama-3-8b", "--hardware", "a100-80gb",
                                       "--offline", "--engine", "vllm-v0@0.7", "-o", str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    # the summary wraps at 80 columns; a note is one stderr line whatever its length (as every note is)
    assert max(len(x.rstrip()) for x in lines if not x.startswith("note: ")) <= 80
    said = " ".join(" ".join(lines).split())
    assert "expected error (median |error|" in said and "vllm-v0@0.6 prices as vllm@0.6; " in said
