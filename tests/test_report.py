"""``blendsim report`` / ``reports.render.write_report``: every figure type from real fixture runs and
a validation directory in ``blendsim validate``'s format, table numbers equal to the runs', the
per-step downsampling, latency columns, and user errors (one line, exit 2)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.sweep import check_spec, make_backend, run_sweep
from blendsim.sweep.grid import SweepSpec
from reports.render import write_report
from reports.steps import binned

POLICIES = ("dfs", "fcfs", "random")


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    """A real 2 x 2 grid swept with three policies at 400 requests."""
    spec = check_spec(SweepSpec("blendserve", (0.9, 1.2), (0.15, 0.35), POLICIES, ("llama-3-8b",), ("a100-80gb",),
                                requests=400, mode="overlap"))
    d = tmp_path_factory.mktemp("report") / "sweep"
    out = run_sweep(spec, d, make_backend("local", 1))
    assert out.ran == 12 and not out.failures
    return d


@pytest.fixture(scope="module")
def validation_dir(tmp_path_factory) -> Path:
    """A validation folder as ``blendsim validate`` writes it (real_backend/results.py): summary.json of
    kind blendsim.validation, steps.parquet with predicted_s and measured_s, and an ops.parquet that
    has those columns too but is not the step table."""
    d = tmp_path_factory.mktemp("val") / "val"
    d.mkdir()
    n = 50
    meas = np.linspace(0.01, 0.2, n)
    err = np.tile([-0.2, -0.1, 0.0, 0.1, 0.3], n // 5)  # predicted / measured - 1, per step
    steps = pa.table({"policy": ["fcfs"] * 25 + ["dfs"] * 25, "replica": [0] * n, "step": list(range(25)) * 2,
                      "kind": ["decode"] * n, "predicted_s": meas * (1 + err), "measured_s": meas})
    pq.write_table(steps, d / "steps.parquet")
    pq.write_table(pa.table({"op": ["qkv_proj"] * 3, "predicted_s": [1.0, 1.0, 1.0], "measured_s": [9.0, 9.0, 9.0]}),
                   d / "ops.parquet")
    (d / "summary.json").write_text(json.dumps({
        "kind": "blendsim.validation", "model": "tiny", "hardware": "cpu", "status": "complete",
        "policies": {"fcfs": {"end_to_end": {"throughput_err": 0.04}}, "dfs": {"end_to_end": {"throughput_err": 0.06}}}}))
    return d


@pytest.fixture(scope="module")
def report(sweep_dir, validation_dir, tmp_path_factory) -> Path:
    return write_report([sweep_dir, validation_dir], tmp_path_factory.mktemp("out") / "rep")


def report_cli(*args: str):
    return CliRunner().invoke(get_app(), ["report", *args])


def test_every_figure_type_is_rendered_and_embedded(report):
    d = report.parent
    assert report.name == "index.html"
    figs = sorted(p.stem for p in (d / "figures").glob("*.png"))
    dep = "llama-3-8b_a100-80gb_overlap"
    assert figs == sorted([f"throughput-{dep}-0", f"sharing-{dep}-0", f"heatmap-fcfs-vs-dfs-{dep}",
                           f"heatmap-random-vs-dfs-{dep}", "steps", "validation-0"])
    page = report.read_text()
    assert page.count('src="data:image/png;base64,') == len(figs)
    assert not re.search(r'(src|href)="(https?:)?//', page) and "<script" not in page and "<link" not in page
    md = (d / "report.md").read_text()
    assert all(f"figures/{f}.png" in md for f in figs)
    for f in ("policies.csv", "policy_summary.csv", "validation.csv"):
        assert (d / f).exists()


def test_side_by_side_numbers_are_the_runs(report, sweep_dir):
    side = pd.read_csv(report.parent / "policies.csv")
    res = pd.read_parquet(sweep_dir / "results.parquet")
    assert len(side) == len(res) == 12
    for _, r in side.iterrows():
        run = res[(res["workload"] == r["group"]) & (res["policy"] == r["label"])].iloc[0]
        base = res[(res["workload"] == r["group"]) & (res["policy"] == "dfs")].iloc[0]
        assert r["throughput_tok_s"] == pytest.approx(run["throughput_tok_s"], rel=1e-12)
        assert r["speedup"] == pytest.approx(run["throughput_tok_s"] / base["throughput_tok_s"], rel=1e-12)
        assert r["frac_of_opt"] == pytest.approx(run["frac_of_opt"], rel=1e-12)
        assert r["cost_model"] == "roofline" and r["mode"] == "overlap"
        assert Path(r["run_path"]) == sweep_dir / run["run_dir"]
    assert list(side["label"][:3]) == ["dfs", "fcfs", "random"]  # baseline first
    summ = pd.read_csv(report.parent / "policy_summary.csv").set_index("policy")
    for p in POLICIES:
        sp = side[side["label"] == p]["speedup"]
        assert summ.loc[p, "speedup_geomean"] == pytest.approx(float(np.exp(np.log(sp).mean())), rel=1e-12)
    assert "latency mean (s)" not in (report.parent / "report.md").read_text()  # offline runs: no latency columns


def test_validation_table_uses_the_step_table(report):
    v = pd.read_csv(report.parent / "validation.csv").set_index("policy")
    assert list(v.index) == ["dfs", "fcfs"] and (v["steps"] == 25).all()
    assert v.loc["fcfs", "median_abs_err"] == pytest.approx(0.1)
    assert v.loc["fcfs", "p90_abs_err"] == pytest.approx(0.3)
    assert v.loc["dfs", "mean_err"] == pytest.approx(0.02)
    assert v.loc["dfs", "throughput_err"] == 0.06 and v.loc["dfs", "model"] == "tiny"


def test_baseline_choice_changes_speedups(sweep_dir, tmp_path):
    page = write_report([sweep_dir], tmp_path / "r", baseline="random")
    side = pd.read_csv(page.parent / "policies.csv")
    assert (side[side["label"] == "random"]["speedup"] == 1.0).all()
    assert sorted(p.stem for p in (page.parent / "figures").glob("heatmap-*")) == [
        "heatmap-dfs-vs-random-llama-3-8b_a100-80gb_overlap", "heatmap-fcfs-vs-random-llama-3-8b_a100-80gb_overlap"]


def test_binned_downsampling():
    x, mean, lo, hi = binned(np.arange(10.0), bins=5)
    assert list(x) == [0.5, 2.5, 4.5, 6.5, 8.5] and list(mean) == [0.5, 2.5, 4.5, 6.5, 8.5]
    assert lo[0] == pytest.approx(0.1) and hi[0] == pytest.approx(0.9)
    x, mean, _, _ = binned(np.array([3.0, 1.0, 2.0]), bins=400)  # short runs: every step its own bin
    assert list(x) == [0, 1, 2] and list(mean) == [3.0, 1.0, 2.0]
    x, mean, _, _ = binned(np.ones(100_003), bins=400)
    assert len(x) == 400 and np.all(mean == 1.0)


def _simulate(trace, policy: str, d: Path) -> Path:
    from blendsim.runner import RunConfig, run_simulation, write_run

    return write_run(run_simulation(trace, RunConfig(policy=policy, model="tiny", hardware="cpu")), d)


def test_loose_run_dirs_with_latency(tmp_path):
    """Runs written by ``simulate`` (the demo's shape): one workload, latency/SLO columns, no heatmap."""
    from tests.helpers import random_trace

    trace = random_trace(np.random.default_rng(5), n=30, arrivals=True, slos=True)
    runs = [_simulate(trace, p, tmp_path / "runs" / p) for p in ("fcfs", "dfs")]
    page = write_report(runs, tmp_path / "rep")
    side = pd.read_csv(page.parent / "policies.csv")
    assert side["group"].nunique() == 1 and list(side["label"]) == ["dfs", "fcfs"]
    for c in ("latency_mean_s", "ttft_mean_s", "slo_attainment", "goodput_tok_s"):
        assert side[c].notna().all(), c
    s = json.loads((runs[0] / "summary.json").read_text())
    assert side.set_index("label").loc["fcfs", "slo_attainment"] == pytest.approx(s["slo_attainment"])
    assert "SLO met" in (page.parent / "report.md").read_text()
    assert not list((page.parent / "figures").glob("heatmap-*"))
    again = write_report([tmp_path / "runs"], tmp_path / "rep")  # a folder of runs; rewrites its own report
    assert pd.read_csv(again.parent / "policies.csv").equals(side)


def test_cli_writes_to_the_default_folder(sweep_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = report_cli(str(sweep_dir), "--steps-workload", "d0.9-s0.35", "--steps-policies", "dfs,random")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "reports" / "generated" / "sweep" / "index.html").exists()
    assert "d0.9-s0.35" in (tmp_path / "reports" / "generated" / "sweep" / "report.md").read_text()


@pytest.mark.parametrize("extra, expect", [
    (["--baseline", "nope"], "--baseline 'nope': no run of that policy"),
    (["--steps-workload", "d9-s9"], "--steps-workload 'd9-s9': no such workload"),
    (["--steps-policies", "dfs,nope"], "--steps-policies: nope not run on"),
])
def test_bad_options_are_one_line(sweep_dir, tmp_path, extra, expect):
    r = report_cli(str(sweep_dir), *extra, "-o", str(tmp_path / "r"))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and expect in r.stderr, r.stderr
    assert not (tmp_path / "r").exists()


def test_bad_inputs_are_one_line(sweep_dir, tmp_path):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    cases = [([str(tmp_path / "missing")], "no such directory"), ([str(tmp_path / "file.txt")], "not a directory"),
             ([str(tmp_path / "empty")], "not a sweep, run or validation directory"),
             ([str(sweep_dir), "-o", str(tmp_path / "mine")], "not a blendsim report directory")]
    for args, expect in cases:
        r = report_cli(*args, *([] if "-o" in args else ["-o", str(tmp_path / "r")]))
        assert r.exit_code == 2 and r.stderr.count("\n") == 1 and expect in r.stderr, (args, r.stderr)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_binned_percentiles_match_numpy():
    v = np.random.default_rng(1).random(10_007)
    _, _, lo, hi = binned(v, bins=37)
    edges = np.unique(np.linspace(0, len(v), 38).astype(np.int64))
    spans = list(zip(edges[:-1], edges[1:], strict=True))
    assert np.allclose(lo, [np.percentile(v[a:b], 10) for a, b in spans], rtol=0, atol=1e-12)
    assert np.allclose(hi, [np.percentile(v[a:b], 90) for a, b in spans], rtol=0, atol=1e-12)
