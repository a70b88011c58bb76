"""The Python API (``import blendsim``): the same runs, files and one-line errors as the commands, and
the docs' examples (docs/api.md, docs/writing-a-policy.md, the README's Python API section) executed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import blendsim
from blendsim.cli import get_app
from blendsim.sim.errors import UserError
from blendsim.workloads.trace import write_trace
from tests.helpers import random_trace

ROOT = Path(__file__).resolve().parents[1]
TINY = {"model": "tiny", "hardware": "cpu"}


def invoke(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


@pytest.fixture
def trace_file(tmp_path):
    return write_trace(random_trace(np.random.default_rng(3), n=30, arrivals=True, slos=True), tmp_path / "t.parquet")


# ---- the issue's one-liner, from a fresh interpreter ------------------------------------------------
def test_the_one_liner_runs_and_import_stays_light(tmp_path):
    trace = blendsim.synthesize("blendserve", requests=300, density=1.1, sharing=0.3, seed=0)
    blendsim.write_trace(trace, tmp_path / "t.parquet")
    code = ("import sys, blendsim; light = 'numpy' not in sys.modules; "
            "r = blendsim.simulate(blendsim.load_trace('t.parquet'), policy='dfs', model='llama-3-8b', "
            "hardware='a100-80gb'); print(r.summary['throughput_tok_s'], len(r.requests), light)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    tput, n, light = out.stdout.split()
    assert float(tput) > 0 and int(n) == 300 and light == "True"


# ---- simulate: the command's run, as objects and as files --------------------------------------------
def test_simulate_matches_the_command_byte_for_byte(trace_file, tmp_path):
    cli_dir = tmp_path / "cli"
    r = invoke("simulate", trace_file, "--policy", "dfs", "--model", "tiny", "--hardware", "cpu", "--replicas", "2",
               "--no-prefix-retain", "--opt", "heavier_first=true", "--record-schedule", "-o", cli_dir)
    assert r.exit_code == 0, r.output
    res = blendsim.simulate(trace_file, policy="dfs", replicas=2, prefix_retain=False,
                            options={"heavier_first": True}, record_schedule=True, **TINY)
    cli_summary = json.loads((cli_dir / "summary.json").read_text())
    assert len(cli_summary["trace_sha256"]) == 64  # both record which trace file made the run
    assert res.summary == cli_summary
    api_dir = res.write(tmp_path / "api")
    for name in ("summary.json", "steps.parquet", "requests.parquet", "schedule.parquet"):
        assert (api_dir / name).read_bytes() == (cli_dir / name).read_bytes(), name
    pd.testing.assert_frame_equal(res.steps, pd.read_parquet(cli_dir / "steps.parquet"))
    pd.testing.assert_frame_equal(res.requests, pd.read_parquet(cli_dir / "requests.parquet"))
    assert len(res.schedule) > 0 and set(res.steps["replica"]) == {0, 1}
    assert len(res.requests) == 30 and res.summary["replicas"] == 2 and res.summary["prefix_retain"] is False
    # what set the run is in its summary: the options given, as the policy read them, and the step mix
    assert res.summary["policy_options"] == {"heavier_first": True}
    assert (res.summary["mix"], res.summary["round_tokens"]) == ("decode-first", 0)
    plain = blendsim.simulate(trace_file, policy="dfs", **TINY).summary
    assert "policy_options" not in plain
    assert "dfs" in repr(res)


def test_simulate_takes_a_trace_object_and_its_defaults_are_the_issue_s(trace_file):
    from blendsim.workloads.trace import read_trace

    a = blendsim.simulate(read_trace(trace_file), policy="fcfs", **TINY)
    b = blendsim.simulate(str(trace_file), policy="fcfs", **TINY)
    assert "trace_sha256" not in a.summary  # no file, no digest
    assert a.summary == {k: v for k, v in b.summary.items() if k != "trace_sha256"}
    b.write(trace_file.parent / "run")
    other = blendsim.simulate(write_trace(read_trace(trace_file).head(5), trace_file.parent / "t5.parquet"),
                              policy="fcfs", **TINY)
    with pytest.raises(blendsim.BlendsimError, match="holds a run of another trace"):
        other.write(trace_file.parent / "run")
    other.write(trace_file.parent / "run", force=True)
    d = blendsim.simulate(trace_file, model="tiny", hardware="cpu")
    assert d.summary["policy"] == "dfs"  # the API's default policy (the command's is fcfs)
    assert blendsim.Result is type(d)


# ---- one exception type, the command's line ------------------------------------------------------------
CASES = [
    ({"policy": "nope"}, ["--policy", "nope"], "unknown policy 'nope'"),
    ({"model": "gpt-9"}, ["--model", "gpt-9"], "gpt-9"),
    ({"hardware": "tpu"}, ["--hardware", "tpu"], "tpu"),
    ({"replicas": 0}, ["--replicas", "0"], "--replicas must be >= 1"),
    ({"seed": -1}, ["--seed", "-1"], "seed"),
    ({"mode": "fast"}, ["--mode", "fast"], "fast"),
    ({"options": {"bogus": "1"}}, ["--opt", "bogus=1"], "bogus"),
    ({"policy": "./missing.py:X"}, ["--policy", "./missing.py:X"], "no such file ./missing.py"),
]


@pytest.mark.parametrize(("api_kw", "cli_args", "needle"), CASES)
def test_errors_raise_blendsim_error_with_the_command_s_line(trace_file, tmp_path, api_kw, cli_args, needle):
    kw = {**TINY, "policy": "fcfs", **api_kw}  # the command's default policy
    with pytest.raises(blendsim.BlendsimError) as e:
        blendsim.simulate(trace_file, **kw)
    r = invoke("simulate", trace_file, *(["--model", "tiny"] if "model" not in api_kw else []),
               *(["--hardware", "cpu"] if "hardware" not in api_kw else []), *cli_args, "-o", tmp_path / "o")
    assert r.exit_code == 2
    assert r.stderr.strip() == f"blendsim: error: {e.value}"
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_bad_trace_and_unknown_options_are_one_line_errors(tmp_path):
    assert blendsim.BlendsimError is UserError
    missing = tmp_path / "none.parquet"
    with pytest.raises(blendsim.BlendsimError) as e:
        blendsim.load_trace(missing)
    r = invoke("simulate", missing, "-o", tmp_path / "o")
    assert r.exit_code == 2 and r.stderr.strip() == f"blendsim: error: {e.value}"
    with pytest.raises(blendsim.BlendsimError, match="unknown option.*tokens_budget"):
        blendsim.simulate(random_trace(np.random.default_rng(0), n=3), tokens_budget=5, **TINY)
    with pytest.raises(blendsim.BlendsimError, match="expected a blendsim Trace"):
        blendsim.simulate([1, 2, 3], **TINY)
    with pytest.raises(blendsim.BlendsimError, match="give format="):
        blendsim.load_trace(tmp_path / "x.csv")


# ---- traces ---------------------------------------------------------------------------------------------
def test_load_trace_formats_and_limit(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text("\n".join(json.dumps({"prompt_token_ids": [1, 2, 3, i + 4], "output_len": 5}) for i in range(4)) + "\n")
    t = blendsim.load_trace(p)
    assert t.n == 4 and list(t.input_len) == [4] * 4
    assert blendsim.load_trace(p, format="jsonl", limit=2).n == 2
    write_trace(t, tmp_path / "t.parquet")
    assert blendsim.load_trace(tmp_path / "t.parquet", limit=3).n == 3
    with pytest.raises(blendsim.BlendsimError, match="unknown format 'csvv'"):
        blendsim.load_trace(p, format="csvv")
    h = tmp_path / "h.jsonl"  # a block-hash trace takes the CLI's --block-size as block_size=
    h.write_text("\n".join(json.dumps({"input_length": 40, "hash_ids": [1, 2, 3], "output_length": 5})
                           for _ in range(3)) + "\n")
    assert list(blendsim.load_trace(h, format="hashed", block_size=16).input_len) == [40] * 3
    with pytest.raises(blendsim.BlendsimError, match="unknown option 'bogus'"):
        blendsim.load_trace(h, format="hashed", bogus=1)
    with pytest.raises(blendsim.BlendsimError, match="applies to --format mooncake or hashed"):
        blendsim.load_trace(p, format="jsonl", block_size=16)


def test_synthesize_is_the_command_s_trace(tmp_path):
    out = tmp_path / "s.parquet"
    r = invoke("workloads", "synth", "blendserve", "--requests", "200", "--density", "1.1", "--sharing", "0.3",
               "--seed", "5", "-o", out)
    assert r.exit_code == 0, r.output
    t = blendsim.synthesize("blendserve", requests=200, density=1.1, sharing=0.3, seed=5)
    blendsim.write_trace(t, tmp_path / "api.parquet")
    assert (tmp_path / "api.parquet").read_bytes() == out.read_bytes()
    with pytest.raises(blendsim.BlendsimError, match="unknown option"):
        blendsim.synthesize("blendserve", request=5)


def test_make_trace_checks_its_columns():
    t = blendsim.make_trace(input_len=[3, 2], output_len=[1, 1], prompts=[[(1, 2), (2, 1)], [(1, 2)]])
    assert t.n == 2
    with pytest.raises(blendsim.BlendsimError, match="row 2.*input_len"):
        blendsim.make_trace(input_len=[3, 5], output_len=[1, 1], prompts=[[(1, 2), (2, 1)], [(1, 2)]])


# ---- cost -------------------------------------------------------------------------------------------------
def test_cost_is_the_command_s_json():
    args = ["--model", "tiny", "--hardware", "cpu", "--prefill-tokens", "300", "--decode-seqs", "8", "--context",
            "100", "--mode", "overlap", "--engine", "vllm"]
    r = invoke("cost", *args, "--json")
    assert r.exit_code == 0, r.output
    c = blendsim.cost("tiny", "cpu", prefill_tokens=300, decode_seqs=8, context=100, mode="overlap", engine="vllm")
    assert {k: v for k, v in c.items() if k != "notes"} == json.loads(r.stdout)
    with pytest.raises(blendsim.BlendsimError) as e:
        blendsim.cost("tiny", "cpu")
    r = invoke("cost", "--model", "tiny", "--hardware", "cpu")
    assert r.exit_code == 2 and r.stderr.strip() == f"blendsim: error: {e.value}"


# ---- sweep ------------------------------------------------------------------------------------------------
def test_sweep_is_the_command_s_sweep(tmp_path):
    grid = ["--densities", "1.0", "--sharing", "0.1,0.3", "--policies", "dfs,random", "--requests", "200"]
    r = CliRunner().invoke(get_app(), ["sweep", *grid, "--jobs", "1", "-o", str(tmp_path / "cli")])
    assert r.exit_code == 0, r.output
    out = blendsim.sweep(tmp_path / "api", densities=[1.0], sharing="0.1,0.3", policies=["dfs", "random"],
                         requests=200, jobs=1)
    assert (tmp_path / "api" / "results.parquet").read_bytes() == (tmp_path / "cli" / "results.parquet").read_bytes()
    assert len(out.results) == 4 and set(out.results["policy"]) == {"dfs", "random"}
    again = blendsim.sweep(tmp_path / "api", densities=[1.0], sharing="0.1,0.3", policies="dfs,random",
                           requests=200, jobs=1)
    assert again.outcome.skipped == 4 and again.outcome.ran == 0
    with pytest.raises(blendsim.BlendsimError, match="unknown policy 'nope'"):
        blendsim.sweep(tmp_path / "bad", densities=[1.0], sharing=[0.1], policies=["nope"], requests=50, jobs=1)
    from blendsim.sweep import SweepSpec  # the package is still the package

    assert callable(blendsim.sweep) and SweepSpec.__name__ == "SweepSpec"


# ---- the docs' examples ---------------------------------------------------------------------------------
def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def readme_api_section() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"^## Python API\n(.*?)(?=^## )", text, flags=re.S | re.M)
    assert m, "README has no '## Python API' section"
    return m.group(1)


def run_blocks(blocks: list[str], cwd: Path, monkeypatch) -> dict:
    """Execute ``blocks`` in order in one namespace from ``cwd`` (which sees the repo's docs/), then
    call every ``test_*`` function they define."""
    (cwd / "docs").symlink_to(ROOT / "docs")
    monkeypatch.chdir(cwd)
    ns: dict = {"__name__": "docs_example"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"<block {i + 1}>", "exec"), ns)  # noqa: S102 (the docs' own code)
    for name, fn in list(ns.items()):
        if name.startswith("test_") and callable(fn):
            fn()
    return ns


@pytest.mark.parametrize("doc", ["docs/api.md", "docs/writing-a-policy.md", "README.md"])
def test_the_docs_python_examples_run(doc, tmp_path, monkeypatch, capsys):
    text = readme_api_section() if doc == "README.md" else (ROOT / doc).read_text()
    blocks = python_blocks(text)
    assert blocks, f"{doc} has no python example"
    ns = run_blocks(blocks, tmp_path, monkeypatch)
    if doc == "docs/api.md":
        assert (tmp_path / "runs" / "dfs" / "summary.json").exists()
        assert "unknown policy 'nope'" in capsys.readouterr().out
    if doc == "docs/writing-a-policy.md":
        assert any(k.startswith("test_") for k in ns)


def test_the_policy_walkthrough_shows_the_example_file_whole():
    blocks = python_blocks((ROOT / "docs/writing-a-policy.md").read_text())
    assert (ROOT / "docs/examples/shortest_prompt_first.py").read_text() in blocks


def test_the_api_warns_about_a_dominating_critical_path_as_the_cli_does(tmp_path):
    """Issue 28 item 6: a tail-dominated run says so in Result.notes and as a Python warning."""
    import warnings

    import blendsim

    trace = blendsim.make_trace(input_len=[100] * 20 + [50], output_len=[10] * 20 + [4000])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = blendsim.simulate(trace, policy="fcfs")
    assert any("critical path" in n for n in r.notes)
    assert any("critical path" in str(w.message) for w in caught)
    big = blendsim.make_trace(input_len=[100] * 200, output_len=[50] * 200)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = blendsim.simulate(big, policy="fcfs")
    assert not any("critical path" in n for n in r.notes) and not caught


def test_a_report_tells_runs_of_one_policy_apart_by_their_options(trace_file, tmp_path):
    """Two runs of dfs, one with --opt heavier_first=true: the report labels them by the option, not by folder."""
    from blendsim.reports.inputs import load_inputs

    a = blendsim.simulate(trace_file, policy="dfs", **TINY).write(tmp_path / "plain")
    b = blendsim.simulate(trace_file, policy="dfs", options={"heavier_first": True}, **TINY).write(tmp_path / "opt")
    labels = set(load_inputs([a, b]).runs["label"])
    assert labels == {"dfs", "dfs[heavier_first=true]"}  # as sweep and plan name it


@pytest.mark.parametrize("opts, msg", [
    (["heavier_first=1", "heavier_first=0"], "--opt heavier_first is given twice"),
    (["=1"], "no name before '='"),
])
def test_an_option_given_twice_or_without_a_name_is_one_line(trace_file, tmp_path, opts, msg):
    args = [a for o in opts for a in ("--opt", o)]
    r = invoke("simulate", trace_file, "--policy", "dfs", "--model", "tiny", "--hardware", "cpu", *args,
               "-o", tmp_path / "r")
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("opt, msg", [("relocate=-1", "expected a value in [0, inf]"),
                                      ("split_threshold=-5", "expected a value in [-1, inf]")])
def test_blendserve_refuses_option_values_its_help_does_not_define(trace_file, opt, msg):
    from blendsim.sim.errors import UserError

    with pytest.raises(UserError, match=re.escape(msg)):
        blendsim.simulate(trace_file, policy="blendserve", options=dict([opt.split("=")]), **TINY)


def test_a_policy_may_add_to_the_summary_but_not_replace_the_runs_figures(trace_file, tmp_path):
    """summary_extra() returning makespan_s or policy_sha256 would fake a measured figure or the provenance."""
    import numpy as np

    from blendsim.sim.errors import UserError

    class Adds(blendsim.Policy):
        name = "adds"

        def rank(self):
            return np.arange(self.ctx.trace.n)

        def summary_extra(self):
            return {"adds_rounds": 3}

    class Fakes(Adds):
        name = "fakes"

        def summary_extra(self):
            return {"makespan_s": -1.0, "policy_sha256": "0" * 64}

    class FakesOptions(Adds):
        name = "fakes-options"

        def summary_extra(self):
            return {"policy_options": {"heavier_first": True}}  # as if --opt had been given

    assert blendsim.simulate(trace_file, policy=Adds, **TINY).summary["adds_rounds"] == 3
    with pytest.raises(UserError, match=r"summary_extra\(\) returns 'makespan_s', 'policy_sha256'"):
        blendsim.simulate(trace_file, policy=Fakes, **TINY)
    with pytest.raises(UserError, match="'policy_options'"):
        blendsim.simulate(trace_file, policy=FakesOptions, **TINY)


def test_make_trace_names_an_unknown_column():
    from blendsim.sim.errors import UserError

    with pytest.raises(UserError, match="make_trace\\(\\): unknown column\\(s\\) foo; .* arrival_s"):
        blendsim.make_trace(input_len=[3], output_len=[2], foo=[1])


def test_the_critical_path_warning_points_at_the_callers_line():
    import warnings

    trace = blendsim.make_trace(input_len=[10] * 3, output_len=[2000, 5, 5])  # one request is the whole makespan
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        blendsim.simulate(trace, policy="fcfs", **TINY)
    hits = [w for w in got if "critical path" in str(w.message)]
    assert hits and hits[0].filename == __file__


def test_policies_shows_a_users_own_policy_file(tmp_path):
    pol = tmp_path / "mine.py"
    pol.write_text("import numpy as np\nimport blendsim\n\n\nclass Mine(blendsim.Policy):\n"
                   "    options = {'k': (3, 'a number')}\n\n    def rank(self):\n"
                   "        return np.arange(self.ctx.trace.n)\n")
    r = invoke("policies", f"{pol}:Mine")
    assert r.exit_code == 0 and "k = 3" in r.output, r.output
    r = invoke("policies", "nope")
    assert r.exit_code == 2 and "path/to/file.py:ClassName" in r.output


@pytest.mark.parametrize("opt, value, msg", [
    ("heavier_first", 1.5, "option heavier_first: expected true/false, got 1.5"),
    ("heavier_first", None, "option heavier_first: expected true/false, got None"),
    ("heavier_first", float("nan"), "option heavier_first: expected true/false, got nan"),
    ("heavier_first", 2, "option heavier_first: expected true/false, got 2"),
    ("heavier_first", -1, "option heavier_first: expected true/false, got -1"),
    ("sample", True, "option sample: expected a number, got True"),
    ("sample", None, "option sample: expected a number, got None"),
    # a text option takes text (a number as the command line would give its digits), not None, a list or a switch
    ("warmup", None, "option warmup: expected text, got None"),
    ("warmup", ["barrier"], "option warmup: expected text, got ['barrier']"),
    ("warmup", True, "option warmup: expected text, got True"),
])
def test_options_from_python_are_checked_as_the_command_line_checks_them(trace_file, opt, value, msg):
    """A switch takes True or False (or the command line's words), a number no bool: bool(1.5) and int(True)
    would quietly run another configuration than the one asked for."""
    from blendsim.sim.errors import UserError

    policy = "dfs" if opt == "heavier_first" else "blendserve"
    with pytest.raises(UserError, match=re.escape(msg)):
        blendsim.simulate(trace_file, policy=policy, options={opt: value}, **TINY)
    for ok in ([{"heavier_first": np.bool_(False)}, {"heavier_first": 1}, {"heavier_first": np.int64(0)}]
               if opt == "heavier_first" else [{"sample": 0.5}]):  # 0 and 1 as the command line's "0" and "1"
        assert blendsim.simulate(trace_file, policy=policy, options=ok, **TINY).summary["makespan_s"] > 0


def test_blendsim_sweep_shows_the_functions_signature():
    import inspect

    from blendsim.api import sweep

    assert inspect.signature(blendsim.sweep) == inspect.signature(sweep)
    assert "densities" in str(inspect.signature(blendsim.sweep))
