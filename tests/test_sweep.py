"""``blendsim sweep``: grid parsing, an end-to-end grid, determinism across --jobs, resume after a kill
or an interruption, failed cells, and user errors (one line, exit 2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.sim.errors import UserError
from blendsim.sweep import assemble_results, check_spec, make_backend, parse_values, run_sweep
from blendsim.sweep.grid import SweepSpec

GRID = ["--recipe", "blendserve", "--densities", "0.9,1.2", "--sharing", "0.15:0.35:0.2", "--policies", "dfs,random",
        "--requests", "400", "--seed", "3"]
N_CELLS = 8


def sweep(*args: str):
    return CliRunner().invoke(get_app(), ["sweep", *args])


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The grid swept once, uninterrupted, one cell at a time."""
    d = tmp_path_factory.mktemp("ref") / "sweep"
    r = sweep(*GRID, "--jobs", "1", "-o", str(d))
    assert r.exit_code == 0, r.output
    return d


def done_cells(d: Path) -> int:
    return len(list((d / "runs").glob("*/*/*/*/summary.json"))) if (d / "runs").exists() else 0


# ---- grid values ----------------------------------------------------------------------------
def test_ranges_are_inclusive_and_exact_with_decimal_steps():
    dens = parse_values("0.80:1.40:0.05", "--densities")
    assert len(dens) == 13 and dens[0] == 0.8 and dens[-1] == 1.4 and dens[1] == 0.85 and dens[7] == 1.15
    assert parse_values("0.05:0.45:0.10", "--sharing") == (0.05, 0.15, 0.25, 0.35, 0.45)
    assert parse_values("0:1:0.3", "x") == (0.0, 0.3, 0.6, 0.9)  # a step that misses stop stops before it
    assert parse_values("1.2, 0.8,0.80", "x") == (0.8, 1.2)
    assert parse_values("1.1", "x") == (1.1,)


@pytest.mark.parametrize("bad", ["a:b:c", "1:2", "1:0:0.1", "0.1:1:0", "0.1:1:-0.1", "", ",", "1,x", "nan", "1:2:3:4"])
def test_bad_range_strings_are_user_errors(bad):
    with pytest.raises(UserError, match="--densities"):
        parse_values(bad, "--densities")


# ---- end to end -----------------------------------------------------------------------------
def test_small_grid_end_to_end(reference):
    d = reference
    table = pq.read_table(d / "results.parquet")
    assert table.num_rows == N_CELLS
    rows = table.to_pylist()
    assert [(r["grid_density"], r["grid_sharing"], r["policy"]) for r in rows] == [
        (dd, s, p) for dd in (0.9, 1.2) for s in (0.15, 0.35) for p in ("dfs", "random")]
    assert table.column_names[:7] == ["workload", "model", "hardware", "grid_density", "grid_sharing", "policy", "run_dir"]
    for r in rows:
        run = d / r["run_dir"]
        summary = json.loads((run / "summary.json").read_text())
        for k, v in summary.items():  # every summary key is a column with the run's own value
            # non-scalars (the KV tiers' prefix_hit_tokens) are JSON text in results.parquet
            assert r[k] == (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v), (r["run_dir"], k)
        assert (run / "steps.parquet").exists() and (run / "requests.parquet").exists()
        assert json.loads((run / "cell.json").read_text())["workload"] == r["workload"]
        assert abs(r["compute_density"] / r["grid_density"] - 1) < 0.02  # the recipe hit the grid point
        assert abs(r["optimal_sharing_ratio"] / r["grid_sharing"] - 1) < 0.02
        assert r["model"] == "llama-3-8b" and r["hardware"] == "a100-80gb" and r["seed"] == 3
    # one trace per workload, shared by its policy cells
    assert sorted(p.name for p in (d / "traces").rglob("*.parquet")) == [
        "d0.9-s0.15.parquet", "d0.9-s0.35.parquet", "d1.2-s0.15.parquet", "d1.2-s0.35.parquet"]
    by_w = {}
    for r in rows:
        by_w.setdefault(r["workload"], set()).add((r["n_requests"], r["input_tokens"], r["output_tokens"]))
    assert all(len(v) == 1 for v in by_w.values())
    marker = json.loads((d / "sweep.json").read_text())
    assert marker["settings"]["requests"] == 400 and marker["grid"]["policies"] == ["dfs", "random"]


def test_rerun_skips_finished_cells_and_reassembles_the_same_bytes(reference, tmp_path):
    ref = (reference / "results.parquet").read_bytes()
    before = {p: p.stat().st_mtime_ns for p in (reference / "runs").rglob("summary.json")}
    r = sweep(*GRID, "--jobs", "1", "-o", str(reference))
    assert r.exit_code == 0, r.output
    assert f"0 cell(s) simulated, {N_CELLS} already done" in r.stdout
    assert {p: p.stat().st_mtime_ns for p in (reference / "runs").rglob("summary.json")} == before
    assert (reference / "results.parquet").read_bytes() == ref
    (reference / "results.parquet").unlink()
    assemble_results(reference)  # from the run directories alone
    assert (reference / "results.parquet").read_bytes() == ref


def test_same_bytes_with_a_process_pool(reference, tmp_path):
    r = sweep(*GRID, "--jobs", "2", "-o", str(tmp_path / "s"))
    assert r.exit_code == 0, r.output
    assert (tmp_path / "s" / "results.parquet").read_bytes() == (reference / "results.parquet").read_bytes()


def test_resume_after_killing_the_sweep(reference, tmp_path):
    """SIGKILL the whole sweep (driver and workers) after its first cell; the rerun finishes the rest."""
    d = tmp_path / "s"
    cmd = [sys.executable, "-c", "from blendsim.cli import main; main()", "sweep", *GRID, "--jobs", "2", "-o", str(d)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while done_cells(d) < 1 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # the pool's workers die asynchronously: one may finish an in-flight write after the driver is reaped, so count
    # the done cells only once the whole process group is gone
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.01)
    killed_at = done_cells(d)
    assert 1 <= killed_at < N_CELLS, f"the sweep was not stopped mid-way ({killed_at} cells done)"
    assert not (d / "results.parquet").exists()
    r = sweep(*GRID, "--jobs", "2", "-o", str(d))
    assert r.exit_code == 0, r.output
    assert f"{N_CELLS - killed_at} cell(s) simulated, {killed_at} already done" in r.stdout
    assert (d / "results.parquet").read_bytes() == (reference / "results.parquet").read_bytes()
    assert not [p for p in d.rglob(".*")]  # no temporaries left behind


def test_resume_after_an_interruption(reference, tmp_path, monkeypatch):
    """Ctrl-C after two cells: the command says how to resume (exit 130); resuming gives the same table."""
    import blendsim.sweep.driver as driver

    real, calls = driver.cell_task, []

    def flaky(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(driver, "cell_task", flaky)
    d = tmp_path / "s"
    r = sweep(*GRID, "--jobs", "1", "-o", str(d))
    assert r.exit_code == 130 and "run the same command again to resume" in r.stderr
    assert done_cells(d) == 2
    monkeypatch.setattr(driver, "cell_task", real)
    r = sweep(*GRID, "--jobs", "1", "-o", str(d))
    assert r.exit_code == 0, r.output
    assert (d / "results.parquet").read_bytes() == (reference / "results.parquet").read_bytes()


def test_sweep_grows_and_no_resume_starts_over(reference, tmp_path):
    d = tmp_path / "s"
    one = ["--recipe", "blendserve", "--densities", "0.9", "--sharing", "0.15", "--requests", "400", "--seed", "3"]
    assert sweep(*one, "--policies", "dfs", "--jobs", "1", "-o", str(d)).exit_code == 0
    r = sweep(*one, "--policies", "dfs,random", "--jobs", "1", "-o", str(d))  # a new policy: one more cell
    assert r.exit_code == 0 and "1 cell(s) simulated, 1 already done" in r.stdout
    assert pq.read_table(d / "results.parquet").num_rows == 2
    r = sweep(*one, "--policies", "dfs", "--jobs", "1", "--no-resume", "-o", str(d))
    assert r.exit_code == 0 and "1 cell(s) simulated, 0 already done" in r.stdout
    assert pq.read_table(d / "results.parquet").column("policy").to_pylist() == ["dfs"]


def test_unreachable_grid_point_fails_its_cells_only(tmp_path):
    d = tmp_path / "s"
    r = sweep("--densities", "1.0", "--sharing", "0.25,0.97", "--policies", "dfs", "--requests", "400", "--jobs", "1",
              "-o", str(d))
    assert r.exit_code == 2
    line = r.stderr.strip()
    assert "\n" not in line and line.startswith("blendsim: error: 1 of 2 cells failed")
    assert "d1-s0.97" in line and "cannot reach" in line
    assert pq.read_table(d / "results.parquet").column("workload").to_pylist() == ["d1-s0.25"]
    fails = json.loads((d / "failures.json").read_text())["failures"]
    assert [f["cell"] for f in fails] == ["runs/llama-3-8b/a100-80gb/d1-s0.97/dfs"]


def test_engine_of_runs_every_policy_on_one_engine(tmp_path):
    from blendsim.policies.registry import get_policy
    from blendsim.sim.engines import DEFAULT_ENGINE

    eng = get_policy("blendserve").engine_defaults
    d = tmp_path / "s"
    r = sweep("--densities", "1.0", "--sharing", "0.25", "--policies", "dfs,random", "--requests", "400",
              "--engine-of", "blendserve", "--jobs", "1", "-o", str(d))
    assert r.exit_code == 0, r.output
    rows = pq.read_table(d / "results.parquet").to_pylist()
    assert [row["policy"] for row in rows] == ["dfs", "random"]
    for row in rows:
        assert (row["token_budget"], row["block_size"]) == (eng["token_budget"], eng["block_size"])
        assert row["engine"] == DEFAULT_ENGINE  # one engine for every cell
    r = sweep("--densities", "1.0", "--sharing", "0.25", "--engine-of", "nope", "-o", str(tmp_path / "t"))
    assert r.exit_code == 2 and "unknown policy 'nope'" in r.stderr


def test_tp_runs_every_cell_on_that_many_gpus_per_replica(tmp_path):
    """--tp (and the Python API's ``tp``) reaches every cell: the results say so, and TP2 prices the same
    schedule differently from TP1."""
    import warnings

    import blendsim

    args = ("--densities", "1.0", "--sharing", "0.25", "--policies", "dfs", "--requests", "300", "--jobs", "1")
    assert sweep(*args, "-o", str(tmp_path / "tp1")).exit_code == 0
    r = sweep(*args, "--tp", "2", "-o", str(tmp_path / "tp2"))
    assert r.exit_code == 0, r.output
    one, two = (pq.read_table(tmp_path / d / "results.parquet").to_pylist()[0] for d in ("tp1", "tp2"))
    assert (one["tp"], one["gpus"], two["tp"], two["gpus"]) == (1, 1, 2, 2)
    assert two["makespan_s"] != one["makespan_s"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        api = blendsim.sweep(tmp_path / "api", densities=1.0, sharing=0.25, policies="dfs", requests=300, jobs=1, tp=2)
    assert (api.dir / "results.parquet").read_bytes() == (tmp_path / "tp2" / "results.parquet").read_bytes()


def test_a_model_too_big_for_one_gpu_is_synthesised_on_the_cells_gpus(tmp_path):
    """The recipe measures density on a replica of the cells' --tp (x --pp) GPUs: llama-3-70b in 16-bit needs
    more than one A100's memory, so synthesising its trace for one GPU failed every cell."""
    args = ("--densities", "1.0", "--sharing", "0.25", "--policies", "dfs", "--requests", "300", "--jobs", "1",
            "--models", "llama-3-70b")
    r = sweep(*args, "--tp", "4", "-o", str(tmp_path / "tp4"))
    assert r.exit_code == 0, r.output
    row = pq.read_table(tmp_path / "tp4" / "results.parquet").to_pylist()[0]
    assert (row["tp"], row["gpus"], row["model"]) == (4, 4, "llama-3-70b")
    r = sweep(*args, "--tp", "2", "--pp", "2", "-o", str(tmp_path / "pp"))
    assert r.exit_code == 0, r.output
    # qwen2.5-7b's 28 heads split 4 ways but not 8: the recipe's replica takes --tp alone
    r = sweep(*args[:-1], "qwen2.5-7b", "--tp", "4", "--pp", "2", "-o", str(tmp_path / "qwen"))
    assert r.exit_code == 0, r.output


# ---- backends -------------------------------------------------------------------------------
def test_ray_backend_on_a_local_instance(reference, tmp_path):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'blendsim[ray]')")
    r = sweep(*GRID, "--backend", "ray", "--jobs", "2", "-o", str(tmp_path / "s"))
    assert r.exit_code == 0, r.output
    assert (tmp_path / "s" / "results.parquet").read_bytes() == (reference / "results.parquet").read_bytes()


def test_ray_backend_without_ray_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    r = sweep("--backend", "ray", "--densities", "1.0", "--sharing", "0.25", "-o", str(tmp_path / "s"))
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "needs Ray" in r.stderr
    assert not (tmp_path / "s").exists()


def test_library_use_without_the_cli(reference, tmp_path):
    spec = check_spec(SweepSpec("blendserve", (0.9, 1.2), (0.15, 0.35), ("dfs", "random"), ("llama-3-8b",),
                                ("a100-80gb",), requests=400, seed=3))
    seen = []
    out = run_sweep(spec, tmp_path / "s", make_backend("local", 1), progress=lambda k, n: seen.append((k, n)))
    assert (out.ran, out.skipped, out.total, out.failures) == (N_CELLS, 0, N_CELLS, [])
    assert seen[0] == (0, N_CELLS) and seen[-1] == (N_CELLS, N_CELLS)
    assert out.results.read_bytes() == (reference / "results.parquet").read_bytes()


# ---- user errors ----------------------------------------------------------------------------
def _not_a_sweep(tmp_path) -> str:
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    return str(tmp_path / "other")


@pytest.mark.parametrize("args, expect", [
    (["--densities", "0.8:1.4"], "--densities '0.8:1.4'"),
    (["--sharing", "0.3:0.1:0.1"], "stop >= start"),
    (["--policies", "dfs,nope"], "unknown policy 'nope'"),
    (["--recipe", "nope"], "unknown recipe 'nope'"),
    (["--recipe", "batchllm"], "no density and sharing options"),
    (["--models", "gpt-9"], "unknown model 'gpt-9'"),
    (["--hardware", "tpu"], "unknown hardware 'tpu'"),
    (["--mode", "fast"], "--mode 'fast'"),
    (["--engine", "turbo"], "unknown engine 'turbo'"),
    (["--sharing", "0.5,1.5"], "--sharing must be in (0, 1)"),
    (["--recipe-opt", "source=nope"], "--recipe-opt source must be one of"),
    (["--recipe-opt", "colour=red"], "no such option"),
    (["--recipe-opt", "requests=5"], "set it with --requests"),
    (["--recipe-opt", "tp=2"], "--recipe-opt tp: set it with --tp (and --pp)"),  # was: density on TP2, cells on TP1
    (["--tp", "2", "--recipe-opt", "tp=1"], "--recipe-opt tp: set it with --tp"),
    (["--recipe-opt", "colour=red"], "options are source, tolerance\n"),  # tp is no longer offered
    (["--recipe-opt", "novalue"], "--recipe-opt 'novalue': expected key=value"),
    (["--jobs", "0"], "--jobs must be >= 1"),
    (["--tp", "3"], "--tp 3 does not divide llama-3-8b's 32 attention heads"),
    (["--tp", "0"], "--tp must be >= 1"),  # as simulate says it (RunConfig)
    (["--ep", "2"], "--ep 2: llama-3-8b has no experts"),
    (["--backend", "slurm"], "--backend 'slurm'"),
    (["--ray-address", "auto"], "--ray-address needs --backend ray"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, expect):
    r = sweep("--densities", "1.0", "--sharing", "0.25", "--requests", "50", *args, "-o", str(tmp_path / "s"))
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("blendsim: error: ") and expect in r.stderr, r.stderr
    assert not (tmp_path / "s").exists()


def test_sweep_dir_that_is_something_else(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    for target, expect in ((str(f), "is not a directory"), (_not_a_sweep(tmp_path), "not a blendsim sweep directory")):
        r = sweep("--densities", "1.0", "--sharing", "0.25", "-o", target)
        assert r.exit_code == 2 and r.stderr.count("\n") == 1 and expect in r.stderr, r.stderr
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_resuming_with_other_settings_is_refused(reference):
    r = sweep(*[a if a != "3" else "4" for a in GRID], "--jobs", "1", "-o", str(reference))
    assert r.exit_code == 2 and "other settings (seed: 3 there, 4 now)" in r.stderr and "--no-resume" in r.stderr
    r = sweep(*GRID, "--engine", "vllm", "--jobs", "1", "-o", str(reference))  # a setting not given there
    assert r.exit_code == 2 and "(engine: the default there, 'vllm' now)" in r.stderr


def test_a_multi_model_sweep_runs_one_trace_everywhere_by_default(tmp_path):
    """Issue 28 item 2: a model comparison compares one job. Several models: each grid point is synthesised
    once (for the first model and hardware) and every model runs it; --trace-per-model gives each its own."""
    import pandas as pd

    from blendsim.reports.render import write_report

    grid = ["--recipe", "blendserve", "--densities", "1.0", "--sharing", "0.2", "--policies", "dfs",
            "--requests", "300", "--models", "llama-3-8b,qwen3-8b", "--jobs", "1", "--quiet"]
    r = sweep(*grid, "-o", str(tmp_path / "fixed"))
    assert r.exit_code == 0, r.output
    assert "one trace per grid point, synthesised for llama-3-8b/a100-80gb" in r.output
    assert len(list((tmp_path / "fixed" / "traces").rglob("*.parquet"))) == 1
    res = pd.read_parquet(tmp_path / "fixed" / "results.parquet")
    assert res["input_tokens"].nunique() == 1 and res["output_tokens"].nunique() == 1 and len(res) == 2
    assert set(res["trace_for"]) == {"llama-3-8b/a100-80gb"}
    page = write_report([tmp_path / "fixed"], tmp_path / "rep").read_text()
    assert "ran the same trace per workload" in page and "tp1 pp1 ep1 x1 w:bf16 kv:bf16" in page
    r = sweep(*grid, "--trace-per-model", "-o", str(tmp_path / "own"))
    assert r.exit_code == 0, r.output
    assert len(list((tmp_path / "own" / "traces").rglob("*.parquet"))) == 2
    page = write_report([tmp_path / "own"], tmp_path / "rep2").read_text()
    assert "ran its own trace per workload" in page


def test_seed_replicates_give_a_confidence_interval(tmp_path):
    """Issue 28 item 5: --seeds N runs N seeds per grid point; the report shows a 95% CI per policy."""
    import pandas as pd

    from blendsim.reports.render import write_report

    r = sweep("--recipe", "blendserve", "--densities", "1.0", "--sharing", "0.2", "--policies", "dfs,fcfs",
              "--requests", "300", "--seeds", "3", "--jobs", "1", "--quiet", "-o", str(tmp_path / "s"))
    assert r.exit_code == 0, r.output
    res = pd.read_parquet(tmp_path / "s" / "results.parquet")
    assert sorted(res["grid_seed"].unique()) == [0, 1, 2] and len(res) == 6
    assert res.groupby("policy")["seed"].nunique().eq(3).all()  # the policies' seed follows the replicate
    assert res.groupby("grid_seed")["input_tokens"].nunique().eq(1).all() and res["input_tokens"].nunique() == 3
    page = write_report([tmp_path / "s"], tmp_path / "rep")
    spread = pd.read_csv(page.parent / "seed_spread.csv")
    assert set(spread["seeds"]) == {3} and spread["throughput_ci"].gt(0).all()
    assert (spread["speedup_lo"] <= spread["speedup"]).all() and (spread["speedup"] <= spread["speedup_hi"]).all()
    assert "95% confidence intervals" in page.read_text()


def test_sweep_prints_what_each_policy_declares_over_the_engine(tmp_path):
    from typer.testing import CliRunner

    from blendsim.cli import get_app

    r = CliRunner().invoke(get_app(), ["sweep", "--requests", "300", "--densities", "1.1", "--sharing", "0.2",
                                       "--policies", "fcfs,sarathi", "--engine", "vllm@0.6", "--jobs", "1",
                                       "-o", str(tmp_path / "s")])
    assert r.exit_code == 0, r.output
    assert "note: sarathi: token_budget 512 (policy) over vllm@0.6's 8192" in r.stderr  # notes on stderr, as simulate's
    assert "note:" not in r.stdout


def test_resuming_with_an_edited_profile_file_is_refused(tmp_path):
    from blendsim.sim.engines import load_params

    prof = tmp_path / "mine.json"
    params = load_params()
    params["profile"] = {"kind": "blendsim-engine-profile", "engine": "vllm", "version": "0.6"}
    prof.write_text(json.dumps(params))
    args = ["--densities", "1.0", "--sharing", "0.25", "--requests", "300", "--policies", "dfs", "--models", "llama-3-8b",
            "--hardware", "a100-80gb", "--engine", str(prof), "--quiet", "-o", str(tmp_path / "s")]
    first = sweep(*args)
    assert first.exit_code == 0, first.output
    assert sweep(*args).exit_code == 0  # the same file resumes
    params["engine"]["vllm@0.6"] = {"fixed_s": 0.05, "per_seq_s": 1e-6}
    prof.write_text(json.dumps(params))
    r = sweep(*args)
    assert r.exit_code == 2 and "engine_sha256" in r.stderr and "--no-resume" in r.stderr, r.stderr


def test_a_sweep_removes_only_its_own_leftovers_and_never_the_users_files(tmp_path, monkeypatch):
    args = ["--densities", "1.0", "--sharing", "0.25", "--requests", "300", "--policies", "dfs", "--models",
            "llama-3-8b", "--hardware", "a100-80gb", "--quiet", "-o", str(tmp_path / "s")]
    import tempfile

    made, mkdtemp = [], tempfile.mkdtemp  # a cell works inside the sweep folder, none in the system's temporary
    monkeypatch.setattr(tempfile, "mkdtemp", lambda *a, **k: made.append(mkdtemp(*a, **k)) or made[-1])
    assert sweep(*args, "--jobs", "1").exit_code == 0  # in this process, where the spy sees the cells' folders
    assert made and all(Path(m).is_relative_to(tmp_path / "s") for m in made), made  # a killed one leaves its own
    s = tmp_path / "s"
    run_parent = next(p for p in (s / "runs").rglob("dfs") if p.is_dir()).parent
    (s / "traces" / ".notes").write_text("mine")
    (run_parent / ".mine").mkdir()
    (run_parent / ".mine" / "data").write_text("mine")
    left = run_parent / ".dfs.abcd1234"  # a killed sweep's staging folder and temporary trace file
    left.mkdir()
    (left / "summary.json").write_text("{}")
    (left / ".blendsim-steps-k3x_9q0a").mkdir()  # the running cell's spilled step log (sim.engine.StepLog)
    (left / ".blendsim-steps-k3x_9q0a" / "dt_s").write_bytes(b"\0" * 8)
    tmp = next((s / "traces").rglob("*.parquet")).parent / ".d1-s0.25.parquet.que0qxfp.tmp"
    tmp.write_text("")
    assert sweep(*args).exit_code == 0  # a resume
    assert (s / "traces" / ".notes").read_text() == "mine" and (run_parent / ".mine" / "data").read_text() == "mine"
    assert not left.exists() and not tmp.exists()
    r = sweep(*args, "--no-resume")  # starting over would remove the user's files: refused
    assert r.exit_code == 2 and "would remove what the sweep did not write" in r.stderr, r.stderr
    (s / "traces" / ".notes").unlink()
    import shutil

    shutil.rmtree(run_parent / ".mine")
    (s / "traces" / "my_real_trace.parquet").write_bytes(next((s / "traces").rglob("d*.parquet")).read_bytes())
    r = sweep(*args, "--no-resume")
    assert r.exit_code == 2 and "traces/my_real_trace.parquet" in r.stderr, r.stderr
    assert (s / "traces" / "my_real_trace.parquet").exists()


def test_an_edited_policy_file_runs_its_cells_again(tmp_path):
    pol = tmp_path / "mine.py"
    pol.write_text("import numpy as np\nimport blendsim\n\n\nclass Mine(blendsim.Policy):\n"
                   "    def rank(self):\n        return np.argsort(self.ctx.trace.input_len, kind='stable')\n")
    args = ["--densities", "1.0", "--sharing", "0.25", "--requests", "300", "--policies", f"dfs,{pol}:Mine",
            "--models", "llama-3-8b", "--hardware", "a100-80gb", "-o", str(tmp_path / "s")]
    assert "2 cell(s) simulated" in sweep(*args).output
    assert "0 cell(s) simulated, 2 already done" in sweep(*args).output
    pol.write_text(pol.read_text().replace("self.ctx.trace.input_len", "-self.ctx.trace.input_len"))
    assert "1 cell(s) simulated, 1 already done" in sweep(*args).output


def test_two_sweeps_of_one_grid_name_and_other_traces_are_two_workloads_in_a_report(tmp_path):
    import pandas as pd

    for seed in (0, 1):
        r = sweep("--densities", "1.0", "--sharing", "0.25", "--requests", "300", "--policies", "dfs,fcfs", "--models",
                  "llama-3-8b", "--hardware", "a100-80gb", "--seed", str(seed), "--quiet", "-o", str(tmp_path / f"s{seed}"))
        assert r.exit_code == 0, r.output
    r = CliRunner().invoke(get_app(), ["report", str(tmp_path / "s0"), str(tmp_path / "s1"), "-o", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    runs = pd.read_csv(tmp_path / "rep" / "policies.csv")
    assert sorted(set(runs["group"])) == ["d1-s0.25", "d1-s0.25#2"]
    assert sorted(runs["label"]) == ["dfs", "dfs", "fcfs", "fcfs"]
    assert list(runs.loc[runs["label"] == "dfs", "speedup"]) == [1.0, 1.0]  # each dfs its own workload's baseline


def test_two_policies_that_would_share_a_run_folder_are_refused(tmp_path, monkeypatch):
    """sub/mine.py:Mine and sub_mine.py:Mine both name the folder sub_mine.py_Mine: one result would be lost."""
    monkeypatch.chdir(tmp_path)
    body = ("import numpy as np\nimport blendsim\n\n\nclass Mine(blendsim.Policy):\n"
            "    def rank(self):\n        return np.arange(self.ctx.trace.n)\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mine.py").write_text(body)
    (tmp_path / "sub_mine.py").write_text(body)
    r = sweep("--densities", "1.0", "--sharing", "0.25", "--requests", "300", "--policies",
              "sub/mine.py:Mine,sub_mine.py:Mine", "-o", str(tmp_path / "s"))
    assert r.exit_code == 2 and "would share the run folder 'sub_mine.py_Mine'" in r.stderr, r.output
    assert not (tmp_path / "s").exists()
    from blendsim.sim.errors import UserError
    from blendsim.validate import ValidateConfig

    with pytest.raises(UserError, match="would share the run folder"):
        ValidateConfig(policies=("sub/mine.py:Mine", "sub_mine.py:Mine"))
    with pytest.raises(UserError, match="one policy given twice"):  # one file and class written two ways
        ValidateConfig(policies=("./sub_mine.py:Mine", "sub_mine.py:Mine"))


def test_a_policy_failing_in_a_cell_keeps_its_traceback_for_debug(tmp_path):
    """The cell's user code fails in a worker: failures.json keeps the traceback and --debug (BLENDSIM_DEBUG=1)
    prints it before the one-line error, as simulate does."""
    pol = tmp_path / "boom.py"
    pol.write_text("import blendsim\n\n\nclass Boom(blendsim.Policy):\n    def rank(self):\n"
                   "        raise ValueError('boom in my code')\n")
    args = ["sweep", "--densities", "1.0", "--sharing", "0.25", "--requests", "300", "--jobs", "1",
            "--policies", f"{pol}:Boom"]
    r = CliRunner().invoke(get_app(), [*args, "-o", str(tmp_path / "s")])
    assert r.exit_code == 2 and "boom in my code" in r.stderr and "Traceback" not in r.stderr
    failure = json.loads((tmp_path / "s" / "failures.json").read_text())["failures"][0]
    assert "ValueError: boom in my code" in failure["traceback"] and str(pol) in failure["traceback"]
    r = CliRunner().invoke(get_app(), [*args, "-o", str(tmp_path / "d")], env={"BLENDSIM_DEBUG": "1"})
    assert r.exit_code == 2 and "Traceback (most recent call last)" in r.stderr and str(pol) in r.stderr


def test_a_bad_recipe_option_value_is_refused_before_any_cell_naming_recipe_opt(tmp_path):
    d = tmp_path / "s"
    r = sweep("--recipe", "blendserve", "--densities", "1.1", "--sharing", "0.25", "--policies", "dfs",
              "--requests", "400", "--recipe-opt", "source=azure", "-o", str(d))
    assert r.exit_code == 2 and not d.exists(), r.output
    assert r.stderr.strip() == ("blendsim: error: --recipe-opt source must be one of burstgpt, azure-conv, azure-code, "
                                "sharegpt, wildchat, got 'azure'")


def test_a_killed_sweeps_writability_probe_is_cleaned_and_a_users_hidden_file_kept(tmp_path):
    # SIGKILL between sim.io's probe file and its removal left .blendsim-probe.* under traces/ (a flaky resume test)
    from blendsim.sweep.store import clean_stale

    t = tmp_path / "traces" / "llama-3-8b" / "a100-80gb"
    t.mkdir(parents=True)
    (t / ".blendsim-probe.0mxfm08s").write_text("")
    (t / ".mine").write_text("keep")
    assert clean_stale(tmp_path) == 1
    assert sorted(p.name for p in t.iterdir()) == [".mine"]


# ---- a policy's options, replicas and tier settings on every cell ------------------------------
def test_policy_options_and_replicas_reach_every_cell(tmp_path):
    """`--policies 'dfs,dfs[router=contiguous]' --replicas 2`: two policies (each its own cells, folder and row),
    run as `simulate --replicas 2 --opt router=contiguous` would; two spellings of one spec are one cell."""
    out = tmp_path / "s"
    r = sweep("--densities", "1.1", "--sharing", "0.35", "--requests", "600", "--replicas", "2", "-j", "1", "-q",
              "--policies", "dfs,dfs[ router=contiguous ],dfs[router=contiguous]", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert "2 policies = 2 cells" in r.output
    rows = {row["policy"]: row for row in pq.read_table(out / "results.parquet").to_pylist()}
    assert set(rows) == {"dfs", "dfs[router=contiguous]"}
    assert all(row["replicas"] == 2 for row in rows.values())
    assert json.loads(rows["dfs[router=contiguous]"]["policy_options"]) == {"router": "contiguous"}
    assert rows["dfs"]["policy_options"] is None
    assert (out / rows["dfs[router=contiguous]"]["run_dir"] / "summary.json").is_file()
    assert rows["dfs[router=contiguous]"]["run_dir"].endswith("/dfs_router_contiguous")
    # the contiguous split keeps more of the sharing on two replicas than round robin does
    assert rows["dfs[router=contiguous]"]["prefix_sharing_ratio"] > rows["dfs"]["prefix_sharing_ratio"]
    settings = json.loads((out / "sweep.json").read_text())["settings"]
    assert settings["precision"] == {"replicas": 2}
    # run again: both cells are done (a cell's spec is its summary's policy with the options it was given)
    r = sweep("--densities", "1.1", "--sharing", "0.35", "--requests", "600", "--replicas", "2", "-j", "1", "-q",
              "--policies", "dfs,dfs[router=contiguous]", "-o", str(out))
    assert r.exit_code == 0 and "0 cell(s) simulated, 2 already done" in r.output, r.output
    # the same sweep with one replica is another sweep: the folder refuses it instead of mixing the two
    r = sweep("--densities", "1.1", "--sharing", "0.35", "--requests", "600", "-j", "1", "-q",
              "--policies", "dfs,dfs[router=contiguous]", "-o", str(out))
    assert r.exit_code != 0 and "replicas" in r.output, r.output


@pytest.mark.parametrize("policies, words", [
    ("dfs[router=nowhere]", "--policies dfs[router=nowhere]: "),
    ("dfs[speed=1]", "policy 'dfs' has no option(s) speed; it takes: "),
    ("dfs[router]", "expected key=value"),
])
def test_bad_policy_options_stop_the_sweep_before_any_cell(tmp_path, policies, words):
    r = sweep("--densities", "1.1", "--sharing", "0.35", "--requests", "200", "--policies", policies,
              "-o", str(tmp_path / "s"))
    assert r.exit_code == 2 and words in r.output, r.output
    assert not (tmp_path / "s" / "runs").exists()


def test_tier_settings_are_checked_and_reach_the_cells(tmp_path):
    base = ["--densities", "1.1", "--sharing", "0.35", "--requests", "300", "--policies", "dfs", "-j", "1", "-q"]
    r = sweep(*base, "--kv-load", "eventually", "-o", str(tmp_path / "a"))
    assert r.exit_code == 2 and "--kv-load must be one of" in r.output, r.output
    r = sweep(*base, "--host-kv-gb", "20", "--host-link-gbps", "0", "-o", str(tmp_path / "b"))
    assert r.exit_code == 2 and "--host-link-gbps must be a finite number > 0" in r.output, r.output
    r = sweep(*base, "--disk-read-gbps", "3", "-o", str(tmp_path / "c"))  # no tier: said, not silently ignored
    assert r.exit_code == 0 and "--disk-read-gbps: no KV tier" in r.output, r.output
    r = sweep(*base, "--host-kv-gb", "20", "--kv-load", "overlap", "--host-link-gbps", "7.5", "-o", str(tmp_path / "d"))
    assert r.exit_code == 0, r.output
    settings = json.loads((tmp_path / "d" / "sweep.json").read_text())["settings"]
    assert settings["tiers"] == {"host_kv_gb": 20.0, "host_link_gbps": 7.5, "kv_load": "overlap"}
    cell = next((tmp_path / "d" / "runs").glob("*/*/*/*/summary.json"))
    summary = json.loads(cell.read_text())  # the run records what it assumed: the load mode, the link's speed per GPU
    assert (summary["kv_load"], summary["host_link_gbps"]) == ("overlap", 7.5) and "disk_read_gbps" not in summary


def test_the_api_sweep_takes_replicas_and_policy_options(tmp_path):
    import blendsim

    res = blendsim.sweep(tmp_path / "s", densities=1.1, sharing=0.35, requests=300, jobs=1, replicas=2,
                         policies=["dfs[router=contiguous]"])
    df = res.results
    assert list(df["policy"]) == ["dfs[router=contiguous]"] and list(df["replicas"]) == [2]
    with pytest.raises(UserError, match="--replicas must be >= 1"):
        blendsim.sweep(tmp_path / "t", densities=1.1, sharing=0.35, requests=300, replicas=0)


def test_a_sweep_made_by_another_version_is_not_resumed(tmp_path):
    """Cells simulated by another blendsim (another simulator, policy or trace code) are not mixed into one table
    (review of 1 Dec 2026: a resumed sweep held two definitions of peak_kv_blocks); --no-resume starts over."""
    args = ["--densities", "1.1", "--sharing", "0.35", "--requests", "200", "--policies", "dfs", "-j", "1", "-q",
            "-o", str(tmp_path / "s")]
    assert sweep(*args).exit_code == 0
    marker = tmp_path / "s" / "sweep.json"
    m = json.loads(marker.read_text())
    assert len(m["settings"]["simulator"]) == 16
    for old in ("0123456789abcdef", None):  # another version's, or a folder from before folders recorded it
        if old is None:
            del m["settings"]["simulator"]
        else:
            m["settings"]["simulator"] = old
        marker.write_text(json.dumps(m))
        r = sweep(*args)
        assert r.exit_code == 2 and "simulated by another version of blendsim" in " ".join(r.output.split()), r.output
    r = sweep(*args, "--no-resume")
    assert r.exit_code == 0 and "1 cell(s) simulated" in r.output, r.output
