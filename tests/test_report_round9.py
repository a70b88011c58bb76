"""Reports (review of 1 Dec 2026, a researcher comparing policies): a re-run in one folder counts once, several
deployments get a summary row each and are named in the page's first lines and the CSV, --mixed labels runs by
their engine on every workload, one trace under two workload names is said, colours are colour-blind safe and a
built-in policy's own, online-only reports say their engine and settings, admission is a setting a report compares,
and terminal paragraphs carry no trailing blanks."""

from __future__ import annotations

import shutil
import warnings

import pandas as pd
import pytest
from typer.testing import CliRunner

import blendsim
from blendsim.cli import get_app


def _cli(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


@pytest.fixture(scope="module")
def trace():
    return blendsim.synthesize("blendserve", requests=400, seed=1)


def _run(trace, out, policy, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small traces: the critical-path warning
        blendsim.simulate(trace, policy=policy, **kw).write(out)


def test_a_rerun_in_one_folder_counts_once(tmp_path, trace):
    for p in ("dfs", "blendserve"):
        _run(trace, tmp_path / "runs" / p, p)
    shutil.copytree(tmp_path / "runs" / "blendserve", tmp_path / "runs" / "blendserve_again")
    r = _cli("report", tmp_path / "runs", "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    assert "blendserve_again repeats" in r.output and "counted once" in r.output
    summary = pd.read_csv(tmp_path / "rep" / "policy_summary.csv")
    assert sorted(summary["policy"]) == ["blendserve", "dfs"] and (summary["n"] == 1).all()


def test_several_deployments_get_a_summary_row_each_and_are_named(tmp_path, trace):
    for hw in ("a100-80gb", "h100-80gb"):
        for p in ("dfs", "blendserve"):
            _run(trace, tmp_path / "runs" / f"{p}-{hw}", p, hardware=hw)
    r = _cli("report", tmp_path / "runs", "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    summary = pd.read_csv(tmp_path / "rep" / "policy_summary.csv")
    assert len(summary) == 4 and summary["deployment"].nunique() == 2
    for _, g in summary.groupby("deployment"):  # each row's mean throughput is of its own GPU's runs
        assert sorted(g["policy"]) == ["blendserve", "dfs"]
    a100 = summary[summary["deployment"].str.contains("a100")]["throughput_tok_s"]
    h100 = summary[summary["deployment"].str.contains("h100")]["throughput_tok_s"]
    assert a100.max() < h100.min()
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "1 workload(s) on 2 deployments (llama-3-8b/a100-80gb/sequential" in md
    assert "\n|---|---|---:|---:|" in md.split("| deployment | policy | n |", 1)[1][:200]  # text left, numbers right
    side = pd.read_csv(tmp_path / "rep" / "policies.csv")
    assert {"model", "hardware", "tp", "replicas", "weights", "kv_dtype", "deployment"} <= set(side)
    assert sorted(set(side["hardware"])) == ["a100-80gb", "h100-80gb"]


def test_mixed_engines_are_labelled_by_engine_on_every_workload(tmp_path, trace):
    for e in ("ideal", "vllm"):
        for p in ("dfs", "blendserve"):
            _run(trace, tmp_path / "runs" / f"{p}-{e}", p, engine=e)
    r = _cli("report", tmp_path / "runs", "--mixed", "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    labels = set(pd.read_csv(tmp_path / "rep" / "policies.csv")["label"])
    assert labels == {"dfs [ideal]", "dfs [vllm]", "blendserve [ideal]", "blendserve [vllm]"}


def test_one_trace_under_two_workload_names_is_said(tmp_path):
    grid = ["--densities", "1.1", "--sharing", "0.3", "--requests", "300", "-q", "--policies", "dfs,blendserve"]
    assert _cli("sweep", *grid, "-o", tmp_path / "one").exit_code == 0
    assert _cli("sweep", *grid, "--seeds", "2", "-o", tmp_path / "two").exit_code == 0
    r = _cli("report", tmp_path / "one", tmp_path / "two", "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    assert "1 trace(s) are each two workloads here (d1.1-s0.3 and d1.1-s0.3-seed0" in " ".join(r.output.split())


def test_policy_colours_are_colour_blind_safe_and_their_own_in_every_report():
    from blendsim.reports.figures import PALETTE, _styles, colors

    a, b = colors(["dfs", "blendserve", "random"]), colors(["blendserve", "mine.py:Mine", "random"])
    assert a["blendserve"] == b["blendserve"] and a["random"] == b["random"]  # a built-in's colour is its own
    assert b["mine.py:Mine"] not in (a["blendserve"], a["random"]) and set(a.values()) <= set(PALETTE)
    many = ["dfs", "blendserve", "random", "fcfs", "batchllm", "e2", "accelgen", "sarathi", "vllm", "x.py:A",
            "dfs[router=contiguous]", "y.py:B"]
    styles = _styles(many)
    assert len(set(styles.values())) == len(many)  # past nine, colours repeat with a hatch: never one style twice
    assert all(h == "" for p, (_, h) in styles.items() if p in many[:9])


def test_an_online_only_report_says_its_engine_and_its_policies_settings(tmp_path):
    t = blendsim.make_trace(input_len=[300] * 40, output_len=[40] * 40, arrival_s=[0.05 * i for i in range(40)])
    for p in ("fcfs", "e2"):
        _run(t, tmp_path / "runs" / p, p)
    r = _cli("report", tmp_path / "runs", "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    md = (tmp_path / "rep" / "report.md").read_text()
    online = md.split("## Online workloads: latency", 1)[1]
    assert "All runs are priced on one engine: engine ideal" in online
    assert "The policies ran on different scheduler settings (" in online


def test_admission_is_a_setting_a_report_compares(tmp_path, trace):
    for p in ("dfs", "batchllm"):
        _run(trace, tmp_path / "runs" / p, p)
    r = _cli("report", tmp_path / "runs", "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    md = " ".join((tmp_path / "rep" / "report.md").read_text().split())
    assert "batchllm: admission greedy" in md and "dfs: admission reserve" in md and "--admission" in md
    # and a simulate gives every policy one admission rule
    from blendsim.workloads.trace import write_trace

    write_trace(trace, tmp_path / "t.parquet")
    r = _cli("simulate", tmp_path / "t.parquet", "--policy", "batchllm", "--admission", "reserve", "-o", tmp_path / "x")
    assert r.exit_code == 0, r.output
    import json

    assert json.loads((tmp_path / "x" / "summary.json").read_text())["admission"] == "reserve"
    r = _cli("simulate", tmp_path / "t.parquet", "--policy", "dfs", "--admission", "sometimes", "-o", tmp_path / "y")
    assert r.exit_code == 2 and "--admission must be one of reserve, greedy" in r.output, r.output


def test_settings_note_says_no_cap_for_max_seqs_0():
    from blendsim.reports.render import settings_note

    df = pd.DataFrame({"group": ["w", "w"], "label": ["a", "b"], "max_seqs": [0, 256]})
    assert "a: max seqs no cap; b: max seqs 256" in settings_note(df)


def test_terminal_paragraphs_carry_no_trailing_blanks(tmp_path, trace):
    from blendsim.workloads.trace import write_trace

    write_trace(trace, tmp_path / "t.parquet")
    r = _cli("simulate", tmp_path / "t.parquet", "--policy", "dfs", "-o", tmp_path / "run")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert len(lines) > 4 and not [x for x in lines if x != x.rstrip()]
    assert max(map(len, lines)) <= 80


def test_a_run_without_prefix_caching_on_a_shared_trace_is_said(tmp_path, trace):
    for p in ("dfs", "sarathi"):  # sarathi runs with prefix caching off
        _run(trace, tmp_path / "runs" / p, p)
    r = _cli("report", tmp_path / "runs", "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    md = " ".join((tmp_path / "rep" / "report.md").read_text().split())
    assert "sarathi ran without prefix caching on traces that share prefixes" in md
    assert "dfs ran without" not in md


def test_runs_written_before_a_setting_was_recorded_are_not_said_to_differ_in_it(tmp_path, trace):
    import json

    for p in ("dfs", "blendserve"):
        _run(trace, tmp_path / "runs" / p, p)
    s = tmp_path / "runs" / "dfs" / "summary.json"  # as a summary of an older blendsim: no admission fields
    old = {k: v for k, v in json.loads(s.read_text()).items()
           if k not in ("admission", "reserve_ratio", "kv_full", "gpu_memory_utilization")}
    s.write_text(json.dumps(old))
    r = _cli("report", tmp_path / "runs", "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    md = (tmp_path / "rep" / "report.md").read_text()
    head = " ".join(md.split("## Policies side by side")[0].split())
    assert "The policies ran on different scheduler settings" in head  # token budget, block size, rounding
    assert "admission reserve" not in head and "admission nan" not in head
    side = pd.read_csv(tmp_path / "rep" / "policies.csv")
    assert side["pp"].tolist() == [1, 1] if "pp" in side else True


def test_runs_that_differ_only_in_their_tier_settings_are_not_repeats(tmp_path, trace):
    _run(trace, tmp_path / "runs" / "dfs", "dfs", host_kv_gb=20)
    for load in ("stall", "overlap"):  # one result (the tier never loads here), two settings: two runs, not a repeat
        _run(trace, tmp_path / "runs" / f"random-{load}", "random", host_kv_gb=20, kv_load=load)
    r = _cli("report", tmp_path / "runs", "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    assert "repeats" not in r.output
    assert len(pd.read_csv(tmp_path / "rep" / "policies.csv")) == 3


def test_where_t_critical_is_the_larger_bound_simulate_says_how_near_it_the_run_is():
    """Four requests on four replicas: each replica runs one request alone, so the makespan is T_critical, while
    T_o spreads one request's sequential chain over the replicas (metrics audit of 1 Dec 2026: "25% of T_o" read as
    a schedule three quarters from its best)."""
    from blendsim.reports.terminal import run_summary_lines

    t = blendsim.make_trace(input_len=[100] * 4, output_len=[400] * 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = blendsim.simulate(t, policy="fcfs", replicas=4, model="llama-3-8b").summary
    assert s["t_critical_s"] > s["t_opt_s"] and s["frac_of_opt"] < 0.5
    line = " ".join(" ".join(run_summary_lines(s)).split())
    assert "T_critical, the longest request alone" in line and "is the larger bound here: 100.0% of it" in line
    t = blendsim.make_trace(input_len=[100] * 400, output_len=[40] * 400)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = blendsim.simulate(t, policy="fcfs", model="llama-3-8b").summary
    assert s["t_critical_s"] < s["t_opt_s"] and "larger bound" not in " ".join(run_summary_lines(s))
