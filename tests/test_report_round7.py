"""Reports and sweeps (review of 30 Nov 2026): a policy run in two inputs on one workload gets its speedup over its
own input's baseline whatever the order of the inputs, traces of other sizes at one grid point get heatmaps of
their own, a sweep's missing cells are said, a removed cell folder is not read from a stale table, the folder of an
interrupted demo is its own, a changed --models default names the flag, and the demo table is never cut."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from blendsim.cli import get_app
from tests.helpers import one_line_error


def _cli(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


def _sweep(out, *extra, requests=300):
    r = _cli("sweep", "--densities", "1.1", "--sharing", "0.3", "--requests", requests, "-q", "--policies",
             "dfs,blendserve", "-o", out, *extra)
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def two_sweeps(tmp_path_factory):
    d = tmp_path_factory.mktemp("two")
    return _sweep(d / "A"), _sweep(d / "E", "--engine-of", "blendserve"), d


def test_a_policy_in_two_inputs_is_over_its_own_input_s_baseline_in_either_order(two_sweeps):
    a, e, d = two_sweeps
    tables = []
    for i, order in enumerate(((a, e), (e, a))):
        r = _cli("report", *order, "-o", d / f"rep{i}")
        assert r.exit_code == 0, r.output
        t = pd.read_csv(d / f"rep{i}" / "policies.csv").set_index("label")["speedup"].sort_index()
        tables.append(t)
    pd.testing.assert_series_equal(tables[0], tables[1])
    assert tables[0][f"dfs ({a})"] == 1.0 and tables[0][f"dfs ({e})"] == 1.0
    summary = pd.read_csv(d / "rep0" / "policy_summary.csv")
    assert set(summary.iloc[:, 0]) == {f"dfs ({a})", f"dfs ({e})", f"blendserve ({a})", f"blendserve ({e})"}


def test_traces_of_other_sizes_at_one_grid_point_get_heatmaps_of_their_own(tmp_path):
    small, big = _sweep(tmp_path / "S"), _sweep(tmp_path / "B", requests=1200)
    r = _cli("report", small, big, "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    md = (tmp_path / "rep" / "report.md").read_text()
    assert md.count("Throughput of blendserve over dfs per grid point") == 2 and "traces #2" in md


def test_a_sweep_s_missing_cells_are_said_and_a_removed_cell_is_not_read(tmp_path):
    s = _sweep(tmp_path / "S")
    shutil.rmtree(s / "runs" / "llama-3-8b" / "a100-80gb" / "d1.1-s0.3" / "blendserve")
    r = _cli("report", s, "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    assert "1 of its 2 cells finished (1 not run yet" in r.output
    side = pd.read_csv(tmp_path / "rep" / "policies.csv")
    assert list(side["label"]) == ["dfs"]
    assert "1 of its 2 cells finished" in (tmp_path / "rep" / "report.md").read_text()


def test_a_changed_models_default_names_the_flag_that_resumes(tmp_path):
    _cli("sweep", "--densities", "1.1", "--sharing", "0.3", "--requests", 300, "-q", "--policies", "fcfs",
         "-m", "llama-3-8b,qwen2.5-7b", "-o", tmp_path / "M")
    r = _cli("sweep", "--densities", "1.1", "--sharing", "0.3", "--requests", 300, "-q", "--policies", "fcfs",
             "-m", "llama-3-8b", "-o", tmp_path / "M")
    one_line_error(r, "add --fixed-trace to resume it")


def test_an_interrupted_demo_s_folder_is_its_own(tmp_path, monkeypatch):
    import blendsim.runner as runner
    from blendsim.demo import run_demo

    real, calls = runner.run_simulation, []

    def stop_after_one(*a, **k):
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(runner, "run_simulation", stop_after_one)
    with pytest.raises(KeyboardInterrupt):
        run_demo(tmp_path / "D", requests=2000, echo=lambda *a: None)
    recorded = json.loads((tmp_path / "D" / "blendsim-files.json").read_text())["files"]
    assert "trace.parquet" in recorded and any(f.startswith("runs/fcfs/") for f in recorded)
    monkeypatch.setattr(runner, "run_simulation", real)
    out = run_demo(tmp_path / "D", requests=2000, echo=lambda *a: None)  # the rerun takes the folder back
    assert out["report"].exists()


def test_the_demo_table_is_never_cut_on_a_narrow_terminal():
    from blendsim.reports.terminal import print_demo_table

    s = {"throughput_tok_s": 10293.4, "makespan_s": 1526.2, "prefix_sharing_ratio": 0.32, "sharing_frac_of_opt": 0.914,
         "preemptions": 0, "t_opt_s": 900.0, "t_critical_s": 10.0, "t_reference_s": 1100.0}
    c = Console(width=60, record=True, highlight=False)
    print_demo_table({"fcfs": s, "dfs": {**s, "throughput_tok_s": 10135.0}}, "dfs", c)
    text = c.export_text()
    assert "…" not in text and "10,293" in text and "1.016×" in text
