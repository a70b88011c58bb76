"""``blendsim report`` / ``blendsim.reports.render.write_report``: every figure type from real fixture runs and
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
from blendsim.reports.render import write_report
from blendsim.reports.steps import binned
from blendsim.sweep import check_spec, make_backend, run_sweep
from blendsim.sweep.grid import SweepSpec

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
    dep = "llama-3-8b_a100-80gb_overlap_tp1_pp1_ep1_x1_w_bf16_kv_bf16"  # the full deployment (issue 28)
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
        f"heatmap-{p}-vs-random-llama-3-8b_a100-80gb_overlap_tp1_pp1_ep1_x1_w_bf16_kv_bf16" for p in ("dfs", "fcfs")]


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


def test_a_trace_without_sharing_has_no_fraction_of_s_o_and_stays_out_of_its_mean(tmp_path):
    """s_o = 0: sharing_frac_of_opt is null with a note (was 1.0, 0 / 0 read as 100%), shown as – in the table and
    left out of "mean of s_o" (which it inflated)."""
    from blendsim.workloads.trace import unique_prompts
    from tests.helpers import random_trace

    shared = random_trace(np.random.default_rng(5), n=40)
    rng = np.random.default_rng(9)
    alone = unique_prompts(rng.integers(1, 300, 40), rng.integers(1, 80, 40))
    shared.meta["name"], alone.meta["name"] = "shared", "alone"
    runs = [_simulate(t, p, tmp_path / "runs" / f"{t.meta['name']}-{p}") for t in (shared, alone) for p in ("dfs", "fcfs")]
    s = json.loads((runs[2] / "summary.json").read_text())
    assert s["optimal_sharing_ratio"] == 0 and s["sharing_frac_of_opt"] is None
    assert "sharing_frac_of_opt is null" in s["sharing_frac_of_opt_note"]
    assert json.loads((runs[0] / "summary.json").read_text())["sharing_frac_of_opt"] > 0
    page = write_report(runs, tmp_path / "rep")
    side = pd.read_csv(page.parent / "policies.csv").set_index(["group", "label"])["sharing_frac_of_opt"]
    assert side.loc["alone"].isna().all() and side.loc["shared"].notna().all()
    summ = pd.read_csv(page.parent / "policy_summary.csv").set_index("policy")["sharing_frac_of_opt"]
    assert summ.loc["fcfs"] == pytest.approx(side.loc[("shared", "fcfs")], rel=1e-12)


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


# ---- issue 18: baseline, like with like, online workloads, tables; issue 14: bad summaries -------------------

def _copy_runs(sweep_dir: Path, dst: Path, keep) -> Path:
    """A folder of the sweep's run directories for which ``keep(workload, policy)`` holds."""
    import shutil

    res = pd.read_parquet(sweep_dir / "results.parquet")
    dst.mkdir()
    for _, r in res.iterrows():
        if keep(r["workload"], r["policy"]):
            shutil.copytree(sweep_dir / r["run_dir"], dst / f"{r['workload']}-{r['policy']}")
    return dst


def test_the_report_says_which_baseline_and_why(report, sweep_dir, tmp_path):
    md = (report.parent / "report.md").read_text()
    assert "Speedups are over **dfs** (choose another with `--baseline POLICY`" in md and "the default" in md
    runs = _copy_runs(sweep_dir, tmp_path / "runs", lambda w, p: p != "dfs" and w == "d0.9-s0.15")
    text = (write_report([runs], tmp_path / "b").parent / "report.md").read_text()
    first = text.index("Speedups are over **fcfs**")
    assert "picked only because it comes first by name (no --baseline was given and no dfs run" in text
    assert text.index("--baseline POLICY", first) < text.index("picked only", first)
    text = (write_report([runs], tmp_path / "c", baseline="random").parent / "report.md").read_text()
    assert "Speedups are over **random**" in text and "given with --baseline" in text


def test_averages_pair_each_policy_with_the_baseline(sweep_dir, tmp_path):
    """fcfs on all four workloads, dfs (the baseline) on one: fcfs's row covers that one workload only."""
    one = "d0.9-s0.15"
    runs = _copy_runs(sweep_dir, tmp_path / "runs", lambda w, p: p == "fcfs" or (p == "dfs" and w == one))
    page = write_report([runs], tmp_path / "r")
    summ = pd.read_csv(page.parent / "policy_summary.csv").set_index("policy")
    res = pd.read_parquet(sweep_dir / "results.parquet").set_index(["workload", "policy"])["throughput_tok_s"]
    assert summ.loc["fcfs", "n"] == 1 and summ.loc["dfs", "n"] == 1
    assert summ.loc["fcfs", "speedup_geomean"] == pytest.approx(res[(one, "fcfs")] / res[(one, "dfs")], rel=1e-12)
    assert summ.loc["fcfs", "throughput_tok_s"] == pytest.approx(res[(one, "fcfs")], rel=1e-12)
    md = (page.parent / "report.md").read_text()
    assert "fcfs also ran on 3 workload(s) without a dfs run, left out of its row" in md
    runs2 = _copy_runs(sweep_dir, tmp_path / "runs2", lambda w, p: w in (one, "d1.2-s0.35") and (p != "random" or w == one))
    summ2 = pd.read_csv(write_report([runs2], tmp_path / "r2").parent / "policy_summary.csv").set_index("policy")
    assert list(summ2.loc[["dfs", "fcfs", "random"], "n"]) == [2, 2, 1] and "throughput_tok_s" not in summ2  # unlike rows: no mean throughput


def test_online_workloads_are_compared_by_latency(tmp_path):
    from tests.helpers import random_trace

    trace = random_trace(np.random.default_rng(8), n=30, arrivals=True)  # arrivals, no SLOs
    runs = [_simulate(trace, p, tmp_path / "runs" / p) for p in ("fcfs", "dfs")]
    page = write_report(runs, tmp_path / "rep")
    md = (page.parent / "report.md").read_text()
    sections = re.findall(r"^## (.+)$", md, flags=re.M)
    assert sections[0] == "Online workloads: latency" and "Policies across workloads" not in sections
    first = md.split("\n## ")[1]
    for head in ("lat. mean s", "p50 s", "p99 s", "TTFT s", "TBT ms"):
        assert f"| {head} |" in first or f" {head} |" in first, head
    assert "of T_o" not in first and "speedup" not in first and "SLO met" not in md
    assert "no SLO attainment or goodput" in first
    html_page = page.read_text()
    assert html_page.index("Online workloads: latency") < html_page.index("Prefix sharing")
    assert (page.parent / "figures" / f"latency-{side_group(page)}.png").exists()


def side_group(page: Path) -> str:
    from blendsim.reports.figures import _slug

    return _slug(pd.read_csv(page.parent / "policies.csv")["group"].iloc[0])


def test_tables_fit_and_markdown_escapes_headers(report):
    md = (report.parent / "report.md").read_text()
    assert "median \\|err\\|" in md and "| median |err| |" not in md
    page = report.read_text()
    side = page.split("<h2>Policies side by side</h2>")[1].split("</table>")[0]
    assert "run directory" not in side and "/runs/" not in side  # run directories moved to a footnote
    assert "<details><summary>12 run directories</summary>" in page
    assert "docs/DESIGN.md" in page


def test_report_warns_about_critical_path(report, sweep_dir):
    res = pd.read_parquet(sweep_dir / "results.parquet")
    dominated = (res["t_critical_s"] >= 0.5 * res["makespan_s"]).sum()
    md = (report.parent / "report.md").read_text()
    assert ("dominated by the critical path" in md or "dominated by its critical path" in md) == bool(dominated)


@pytest.mark.parametrize("edit, expect", [
    (lambda s: {"throughput_tok_s": s["throughput_tok_s"]}, "field 'policy' is missing"),
    (lambda s: {**s, "makespan_s": "long"}, "field 'makespan_s' is str 'long', expected a number"),
    (lambda s: {**s, "n_requests": 1.5}, "field 'n_requests' is float 1.5, expected a whole number"),
    (lambda s: {**s, "policy": 3}, "field 'policy' is int 3, expected text"),
    (lambda s: {**s, "latency_mean_s": [1]}, "field 'latency_mean_s' is list [1], expected a number or null"),
    (lambda s: {**s, "makespan_s": -1.0}, "field 'makespan_s' is float -1.0, expected a positive number"),
    (lambda s: {**s, "makespan_s": 0}, "field 'makespan_s' is int 0, expected a positive number"),
    (lambda s: {**s, "throughput_tok_s": -5.0}, "field 'throughput_tok_s' is float -5.0, expected a finite number >= 0"),
    (lambda s: {**s, "throughput_tok_s": float("nan")}, "field 'throughput_tok_s' is float nan, expected a finite"),
    (lambda s: {**s, "preemptions": -2}, "field 'preemptions' is int -2, expected a finite number >= 0"),
])
def test_bad_summary_is_one_line(sweep_dir, tmp_path, edit, expect):
    import shutil

    res = pd.read_parquet(sweep_dir / "results.parquet")
    run = tmp_path / "run"
    shutil.copytree(sweep_dir / res["run_dir"].iloc[0], run)
    s = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps(edit(s)))
    r = report_cli(str(run), "-o", str(tmp_path / "r"))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{run / 'summary.json'}: {expect}" in r.stderr, r.stderr


def test_step_table_without_replica_is_one_line(sweep_dir, tmp_path):
    import shutil

    res = pd.read_parquet(sweep_dir / "results.parquet")
    run = tmp_path / "run"
    shutil.copytree(sweep_dir / res["run_dir"].iloc[0], run)
    t = pq.read_table(run / "steps.parquet")
    pq.write_table(t.drop(["replica"]), run / "steps.parquet")
    r = report_cli(str(run), "-o", str(tmp_path / "r"))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"{run / 'steps.parquet'}: field 'replica' is missing" in r.stderr


# ---- figures: nothing clipped or overlapping, from 1 to 10 workloads and 1 to 9 policies ----------------------

def _drawn_texts(fig) -> list:
    out = list(fig.texts) + [t for lg in fig.legends for t in lg.get_texts()]
    for ax in fig.axes:
        out += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        for axis in (ax.xaxis, ax.yaxis):
            out += [t.label1 for t in axis._update_ticks() if t.label1.get_visible()]
        if ax.get_legend():
            out += ax.get_legend().get_texts()
    return [t for t in out if t.get_visible() and t.get_text().strip()]


def _layout_problems(fig) -> list[str]:
    import itertools

    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [(t.get_text()[:25], t.get_window_extent(r)) for t in _drawn_texts(fig)]
    fb = fig.bbox
    bad = [f"outside: {n!r}" for n, b in boxes if b.x0 < fb.x0 - 1 or b.x1 > fb.x1 + 1 or b.y0 < fb.y0 - 1
           or b.y1 > fb.y1 + 1]
    for (n1, a), (n2, b) in itertools.combinations(boxes, 2):
        if min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1:
            bad.append(f"overlap: {n1!r} / {n2!r}")
    return bad


ALL_POLICIES = ["dfs", "accelgen", "batchllm", "blendserve", "e2", "fcfs", "random", "sarathi", "vllm"]


def _fake_runs(n_work: int, n_pol: int, tmp: Path) -> pd.DataFrame:
    from blendsim.reports.tables import with_speedup

    rows = []
    for w in range(n_work):
        d, s = (0.8, 0.9, 1.0, 1.1, 1.2)[w % 5], (0.05, 0.15, 0.25, 0.35)[w // 5]
        for j, p in enumerate(ALL_POLICIES[:n_pol]):
            run = tmp / f"w{w}" / p
            run.mkdir(parents=True)
            k = np.arange(300, dtype=float)
            pq.write_table(pa.table({"replica": np.zeros(300, np.int64), "compute_s": 0.03 + 0.01 * np.sin(k),
                                     "memory_s": 0.02 + 0.01 * np.cos(k)}), run / "steps.parquet")
            rows.append(dict(group=f"d{d}-s{s}", label=p, policy=p, deployment="llama-3-8b/a100-80gb/overlap",
                             grid_density=d, grid_sharing=s, throughput_tok_s=4000.0 + 90 * j + 10 * w,
                             input_tokens=1e6, output_tokens=3e5, t_opt_s=80.0 + j, t_reference_s=110.0,
                             prefix_sharing_ratio=s - 0.01 * j, optimal_sharing_ratio=s, makespan_s=300.0 + j,
                             latency_p50_s=4.0 + j, latency_mean_s=5.0 + j, latency_p99_s=12.0 + j,
                             ttft_mean_s=0.1 * (j + 1), ttft_p99_s=0.5 * (j + 1), run_path=str(run)))
    return with_speedup(pd.DataFrame(rows), "dfs")


@pytest.mark.parametrize("n_work, n_pol", [(1, 1), (4, 9), (10, 3)])
def test_figures_have_no_clipped_or_overlapping_text(tmp_path, n_work, n_pol):
    """The manual check ran every size from 1 to 10 workloads x 1 to 9 policies; CI keeps three corners."""
    from blendsim.reports import figures as F
    from blendsim.reports import steps as S

    df = _fake_runs(n_work, n_pol, tmp_path)
    order = list(dict.fromkeys(df["label"]))
    figs = F.throughput_bars(df, order) + F.sharing_bars(df, order) + F.speedup_heatmaps(df, "dfs", order)
    figs += F.latency_bars(df[df["group"] == df["group"].iloc[-1]], order)
    if n_work * n_pol > 20:
        figs += S.step_figures(df, df["group"].iloc[0], None, order)
    assert len(figs) >= 2
    for f in figs:
        assert _layout_problems(f.fig) == [], f.name
        F.plt.close(f.fig)


def test_heatmap_centres_on_one_and_marks_ties():
    from blendsim.reports.figures import _heatmap

    m = pd.DataFrame([[1.004, 1.2], [0.9, np.nan]], index=[0.9, 1.1], columns=[0.15, 0.35])
    f = _heatmap(m, "p", "dfs", "dep", 0.2)
    norm = f.fig.axes[0].images[0].norm
    assert norm.vcenter == 1.0 and norm.vmin == pytest.approx(0.8) and norm.vmax == pytest.approx(1.2)
    assert "hatched cells (1 of 3)" in f.caption


def test_every_heatmap_of_a_report_shares_one_colour_scale(tmp_path):
    """Issue 28 item 8: a report's heatmaps had ±17/19/25% scales; equal colours now mean equal speedups,
    and a grid of near-ties stays pale (at least ±3 x NOISE)."""
    from blendsim.reports import figures as F

    df = _fake_runs(4, 4, tmp_path)
    order = list(dict.fromkeys(df["label"]))
    heat = F.speedup_heatmaps(df, "dfs", order)
    assert len(heat) == 3
    spans = {(f.fig.axes[0].images[0].norm.vmin, f.fig.axes[0].images[0].norm.vmax) for f in heat}
    assert len(spans) == 1
    lo, hi = spans.pop()
    shown = df[df["label"] != "dfs"]["speedup"]
    assert hi - 1 == pytest.approx(max(abs(shown - 1).max(), 3 * F.NOISE)) and 1 - lo == pytest.approx(hi - 1)
    for f in heat:
        F.plt.close(f.fig)


def test_simple_report_from_a_table_and_a_figure(tmp_path):
    """The entry point for other commands (a fidelity check): one table, one figure, a CSV."""
    from blendsim.reports.figures import Figure, plt
    from blendsim.reports.render import write_simple_report

    t = pd.DataFrame({"label": ["a", "b"], "throughput_tok_s": [1234.5, 2345.6], "speedup": [1.0, 1.9]})
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    page = write_simple_report(tmp_path / "f", "fidelity", "Two things compared.",
                               [("Numbers", t, [("label", "policy", "s"), ("throughput_tok_s", "tok/s", ",.0f"),
                                                ("speedup", "speedup", ".3f×")]),
                                Figure("line", "A line", "Caption.", fig)], {"numbers.csv": t})
    d = page.parent
    assert (d / "figures" / "line.png").exists() and (d / "numbers.csv").exists()
    md = (d / "report.md").read_text()
    assert md.startswith("# fidelity") and "| a | 1,234 | 1.000× |" in md and "tok/s: throughput" in md
    assert "<title>fidelity</title>" in page.read_text() and "Two things compared." in page.read_text()


def test_step_plots_can_use_time(tmp_path):
    """Issue 28 item 8: per-step plots against the step's end time as well as its index."""
    from blendsim.reports import steps as S
    from blendsim.reports.inputs import load_inputs
    from tests.helpers import random_trace

    trace = random_trace(np.random.default_rng(3), n=40)
    runs = [_simulate(trace, p, tmp_path / "runs" / p) for p in ("fcfs", "dfs")]

    df = load_inputs(runs).runs
    for axis, label in (("step", "step"), ("time", "time (s, end of step)")):
        (f,) = S.step_figures(df, df["group"].iloc[0], None, ["fcfs", "dfs"], axis)
        assert any(a.get_xlabel() == label for a in f.fig.axes)
        if axis == "time":
            xs = f.fig.axes[0].lines[0].get_xdata()
            assert xs[-1] <= df["makespan_s"].max() + 1e-9 and xs[-1] > xs[0]
        S.plt.close(f.fig)


def test_a_throughput_cell_keeps_two_decimals_below_100_as_the_terminal_table_does():
    # requests per second (the vLLM blog's rows: 18.98 req/s) would read 19 as a whole number
    from blendsim.reports.tables import fmt

    assert (fmt(18.98, "tput"), fmt(4282.4, "tput"), fmt(None, "tput")) == ("18.98", "4,282", "–")


def test_a_sweeps_runs_folder_or_part_of_it_is_a_folder_of_runs(sweep_dir):
    """`report SWEEP/runs` (or a model's folder under it): the cells lie four levels down; each keeps its grid
    point, and the sweep's hidden staging leftovers are not runs."""
    from blendsim.reports.inputs import classify, load_inputs

    whole = load_inputs([sweep_dir]).runs
    (sweep_dir / "runs" / ".tmp-left" / "x").mkdir(parents=True)
    (sweep_dir / "runs" / ".tmp-left" / "x" / "summary.json").write_text("{}")
    try:
        for part in (sweep_dir / "runs", sweep_dir / "runs" / "llama-3-8b"):
            assert classify(part) == "runs"
            got = load_inputs([part]).runs
            key = ["workload", "policy"]
            assert sorted(map(tuple, got[key].values.tolist())) == sorted(map(tuple, whole[key].values.tolist()))
            assert list(got.sort_values(key)["throughput_tok_s"]) == list(whole.sort_values(key)["throughput_tok_s"])
    finally:
        import shutil

        shutil.rmtree(sweep_dir / "runs" / ".tmp-left")


def test_a_folder_of_runs_skips_what_is_not_a_run(sweep_dir, validation_dir, tmp_path):
    """Below a folder's own children only a run counts (summary.json beside steps.parquet): another tool's
    summary.json or a validation folder deeper down is not read as a run."""
    import shutil

    from blendsim.reports.inputs import load_inputs

    top = tmp_path / "all"
    shutil.copytree(sweep_dir / "runs", top / "deep" / "runs")
    (top / "deep" / "docs" / "day").mkdir(parents=True)
    (top / "deep" / "docs" / "day" / "summary.json").write_text('{"kind": "something else"}')
    shutil.copytree(validation_dir, top / "deep" / "val")
    (top / "notes").mkdir()  # a child of the folder itself with another tool's summary.json
    (top / "notes" / "summary.json").write_text("{}")
    got = load_inputs([top]).runs
    assert len(got) == len(load_inputs([sweep_dir]).runs)


def test_a_run_folder_missing_its_steps_is_named_not_dropped(tmp_path):
    """A folder of runs with one interrupted (summary.json, no steps.parquet): the report says which, rather than
    report the others as if it were not there; the broken run given alone is named as what it is."""
    import shutil

    from blendsim import api
    from blendsim.reports.render import write_report
    from blendsim.sim.errors import UserError

    trace = api.make_trace(input_len=[50] * 20, output_len=[10] * 20)
    for name in ("a", "b"):
        api.simulate(trace, policy="fcfs", model="tiny", hardware="cpu").write(tmp_path / "runs" / name)
    (tmp_path / "runs" / "b" / "steps.parquet").unlink()
    with pytest.raises(UserError, match=r"runs/b: run folder\(s\) without steps.parquet"):
        write_report([tmp_path / "runs"], tmp_path / "rep")
    with pytest.raises(UserError, match="a run directory without steps.parquet"):
        write_report([tmp_path / "runs" / "b"], tmp_path / "rep")
    shutil.rmtree(tmp_path / "runs" / "b")
    assert write_report([tmp_path / "runs"], tmp_path / "rep").exists()
