"""No command deletes what it did not write, even inside a folder of its own kind: every output folder records the
files blendsim put there (``sim.io.MANIFEST``), and a later command replaces the folder only when nothing else is
in it. A marker file alone (``index.html``, ``summary.json``) is no proof of ownership."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.sim.errors import UserError
from blendsim.sim.io import MANIFEST, atomic_dir, foreign_entries
from blendsim.workloads.trace import write_trace
from tests.helpers import one_line_error, random_trace


def invoke(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): None if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "t.parquet"
    write_trace(random_trace(np.random.default_rng(1), 40), path)
    return path


def _refused(r, folder: Path, before: dict, *words):
    assert r.exit_code == 2, r.output
    line = one_line_error(r)
    assert str(folder) in line and all(w in line for w in words), line
    assert snapshot(folder) == before


def test_a_run_folder_records_its_files_and_a_rerun_replaces_it(tmp_path, trace):
    run = tmp_path / "run"
    assert invoke("simulate", trace, "-o", run).exit_code == 0
    assert foreign_entries(run) == [] and (run / MANIFEST).exists()
    assert invoke("simulate", trace, "--policy", "dfs", "-o", run).exit_code == 0  # its own: replaced


@pytest.mark.parametrize("added", ["mynotes.txt", "figures/mine.png", "empty_folder/"])
def test_a_rerun_keeps_what_the_user_added_to_a_run_folder(tmp_path, trace, added):
    run = tmp_path / "run"
    assert invoke("simulate", trace, "-o", run).exit_code == 0
    p = run / added
    if added.endswith("/"):
        p.mkdir()
    else:
        p.parent.mkdir(exist_ok=True)
        p.write_text("mine")
    before = snapshot(run)
    _refused(invoke("simulate", trace, "--policy", "dfs", "-o", run), run, before, "did not write",
             added.rstrip("/").split("/")[0])


def test_another_tools_folder_with_a_marker_name_is_never_replaced(tmp_path, trace):
    run = tmp_path / "theirs"
    (run / "data").mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    (run / "data" / "results.csv").write_text("a,b\n")
    before = snapshot(run)
    _refused(invoke("simulate", trace, "-o", run, "--force"), run, before, "no record")
    rep = tmp_path / "site"
    (rep / "css").mkdir(parents=True)
    (rep / "index.html").write_text("<html></html>")
    (rep / "css" / "site.css").write_text("body{}")
    before = snapshot(rep)
    assert invoke("simulate", trace, "-o", tmp_path / "run2").exit_code == 0
    _refused(invoke("report", tmp_path / "run2", "-o", rep), rep, before, "no record")


def test_report_and_fidelity_folders_keep_user_files(tmp_path, trace):
    assert invoke("simulate", trace, "-o", tmp_path / "run").exit_code == 0
    rep = tmp_path / "rep"
    assert invoke("report", tmp_path / "run", "-o", rep).exit_code == 0
    assert invoke("report", tmp_path / "run", "-o", rep).exit_code == 0  # its own: replaced
    (rep / "mynotes.txt").write_text("mine")
    before = snapshot(rep)
    _refused(invoke("report", tmp_path / "run", "-o", rep), rep, before, "mynotes.txt")


def test_the_record_is_checked_again_just_before_the_replacement(tmp_path):
    out = tmp_path / "o"
    with atomic_dir(out, "a.txt") as tmp:
        (tmp / "a.txt").write_text("1")
    with pytest.raises(UserError, match="late.txt"):
        with atomic_dir(out, "a.txt") as tmp:
            (tmp / "a.txt").write_text("2")
            (out / "late.txt").write_text("added while the command ran")
    assert (out / "a.txt").read_text() == "1" and (out / "late.txt").exists()


def test_sweep_no_resume_keeps_what_the_user_added(tmp_path):
    d = tmp_path / "s"
    args = ("sweep", "--requests", "300", "--densities", "1.1", "--sharing", "0.2", "--policies", "fcfs",
            "--jobs", "1", "-o", d)
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    (d / "runs" / "mine").mkdir()
    (d / "runs" / "mine" / "keep").write_text("mine")
    before = snapshot(d)
    r = invoke(*args, "--no-resume")
    assert r.exit_code == 2, r.output
    assert "runs/mine" in one_line_error(r) and snapshot(d) == before
    (d / "runs" / "mine" / "keep").unlink()
    (d / "runs" / "mine").rmdir()
    assert invoke(*args, "--no-resume").exit_code == 0
    cell = next(m.parent for m in (d / "runs").rglob("summary.json"))  # a user file inside a run folder
    (cell / "mine.txt").write_text("mine")
    before = snapshot(d)
    r = invoke(*args, "--no-resume")
    line = one_line_error(r)
    assert r.exit_code == 2 and "mine.txt" in line and snapshot(d) == before
    assert "nothing was removed" in line and "would remove" not in line  # said to a user who gave --no-resume


def test_a_second_demo_into_its_folder_replaces_it_but_not_a_users_file(tmp_path):
    out = tmp_path / "demo"
    assert invoke("demo", "--requests", "400", "-o", out).exit_code == 0
    assert invoke("demo", "--requests", "400", "-o", out).exit_code == 0
    (out / "runs" / "fcfs" / "mynotes.txt").write_text("mine")
    before = snapshot(out)
    r = invoke("demo", "--requests", "400", "-o", out)
    assert r.exit_code == 2 and "mynotes.txt" in one_line_error(r) and snapshot(out) == before


def test_a_failed_demo_leaves_a_folder_a_retry_may_use(tmp_path):
    """A bad option is refused before the folder exists; a demo that fails later (a density out of reach) leaves
    a folder holding nothing but its own record, which a retry takes (was: "not a blendsim demo folder")."""
    out = tmp_path / "demo"
    one_line_error(invoke("demo", "--requests", "5", "-o", out), "--requests must be at least 10")
    assert not out.exists()
    one_line_error(invoke("demo", "--requests", "400", "--density", "5", "-o", out), "density")
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST]
    r = invoke("demo", "--requests", "400", "-o", out)
    assert r.exit_code == 0, r.output
    assert (out / "runs" / "dfs" / "summary.json").exists() and foreign_entries(out) == []


def test_an_interrupted_demo_says_it_replaces_only_what_it_wrote(tmp_path, monkeypatch, capsys):
    import blendsim.demo as demo

    def stop(*a):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "_demo", stop)
    with pytest.raises(KeyboardInterrupt):
        demo.run_demo(tmp_path / "d", requests=400)
    err = capsys.readouterr().err
    assert "run it again to start over in" in err and "replaced" not in err, err

    def wrote(out, record, *a):
        (out / "trace.parquet").write_bytes(b"x")
        record(out / "trace.parquet")
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "_demo", wrote)
    with pytest.raises(KeyboardInterrupt):
        demo.run_demo(tmp_path / "d", requests=400)
    assert "(what it wrote there is replaced)" in capsys.readouterr().err


def test_a_new_trace_replaces_a_trace_but_never_a_users_file(tmp_path):
    mine = tmp_path / "a.parquet"
    mine.write_text("my own notes")
    r = invoke("workloads", "synth", "blendserve", "--requests", "500", "-o", mine)
    assert r.exit_code == 2 and "not a blendsim trace" in one_line_error(r) and mine.read_text() == "my own notes"
    t = tmp_path / "t.parquet"
    for _ in range(2):
        assert invoke("workloads", "synth", "blendserve", "--requests", "500", "-o", t).exit_code == 0


def test_calibrate_never_writes_over_a_users_file(tmp_path):
    mine = tmp_path / "k.json"
    mine.write_text("mine")
    r = invoke("calibrate", "--device", "cpu", "--model", "tiny", "--quick", "-o", mine)
    assert r.exit_code == 2 and "not a blendsim calibration profile" in one_line_error(r) and mine.read_text() == "mine"
