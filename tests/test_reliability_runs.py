"""Issue 14 (reliability), the run side: finished runs are never thrown away, bad options and usage
errors end in one line, interrupted sweeps exit promptly and quietly, run directories are not replaced
by mistake (CPU)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app, main
from blendsim.policies.registry import policy_names
from blendsim.runner import RunConfig, run_simulation, write_run
from blendsim.sim.errors import UserError
from blendsim.workloads.trace import from_columns, write_trace
from tests.helpers import random_trace


def invoke(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


def strict_json(path):
    """Parse JSON refusing Infinity / NaN (what Python's json module accepts and no other parser does)."""
    def refuse(name):
        raise AssertionError(f"{path}: {name} is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


# ---- item 1: infinite compute density -------------------------------------------------------
@pytest.mark.parametrize("policy", policy_names())
def test_one_token_outputs_give_a_valid_summary(policy, tmp_path):
    # every output is one token: no decode step reads KV, Mem = 0 and rho = Comp / 0
    trace = from_columns(input_len=[3, 40, 17], output_len=[1, 1, 1])
    r = run_simulation(trace, RunConfig(policy=policy, model="tiny", hardware="cpu"))
    d = write_run(r, tmp_path / "run")
    s = strict_json(d / "summary.json")
    assert s["compute_density"] is None and s["n_requests"] == 3 and s["makespan_s"] > 0


def test_blendserve_with_more_replicas_than_requests(tmp_path):
    trace = from_columns(input_len=[30, 50], output_len=[5, 9])
    r = run_simulation(trace, RunConfig(policy="blendserve", model="tiny", hardware="cpu", replicas=4))
    s = strict_json(write_run(r, tmp_path / "run") / "summary.json")
    rho = s["blendserve"]["rho_rt_replicas"]
    assert len(rho) == 4 and None in rho and all(x is None or math.isfinite(x) for x in rho)


def test_blendserve_whose_output_sample_holds_only_one_token_outputs(tmp_path):
    trace = from_columns(input_len=[30, 50, 20, 10], output_len=[1, 1, 1, 1])
    r = run_simulation(trace, RunConfig(policy="blendserve", model="tiny", hardware="cpu",
                                        options={"sample": "0.5"}))
    s = strict_json(write_run(r, tmp_path / "run") / "summary.json")
    assert s["blendserve"]["rho_root"] is None


def test_simulate_cli_on_the_issue_reproducer(tmp_path):
    src = tmp_path / "o.jsonl"
    src.write_text('{"prompt_token_ids":[1,2,3],"output_len":1}\n')
    r = invoke("workloads", "load", src, "-f", "jsonl", "-o", tmp_path / "o.parquet")
    assert r.exit_code == 0, r.output
    r = invoke("simulate", tmp_path / "o.parquet", "-o", tmp_path / "r", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["compute_density"] is None
    assert strict_json(tmp_path / "r" / "summary.json")["compute_density"] is None
    r = invoke("simulate", tmp_path / "o.parquet", "-o", tmp_path / "r2")
    assert r.exit_code == 0 and "compute density unbounded" in r.stdout


# ---- items 4 and 5: seeds and option values ------------------------------------------------
@pytest.fixture
def trace_file(tmp_path):
    return write_trace(random_trace(np.random.default_rng(0), n=8), tmp_path / "t.parquet")


def test_negative_seed_is_one_line(trace_file, tmp_path):
    r = invoke("simulate", trace_file, "--policy", "random", "--seed", "-1", "--model", "tiny", "--hardware", "cpu",
               "-o", tmp_path / "r")
    assert r.exit_code == 2 and r.output.strip() == "blendsim: error: --seed must be >= 0, got -1"


@pytest.mark.parametrize("policy,opt", [("accelgen", "gamma=nan"), ("accelgen", "gamma=inf"),
                                        ("accelgen", "max_window=inf"), ("accelgen", "best_effort_slack=-inf"),
                                        ("e2", "th_bal=nan"), ("e2", "window_s=inf"), ("blendserve", "sample=nan")])
def test_non_finite_option_values_are_refused(trace_file, tmp_path, policy, opt):
    r = invoke("simulate", trace_file, "--policy", policy, "--opt", opt, "--model", "tiny", "--hardware", "cpu",
               "-o", tmp_path / "r")
    assert r.exit_code == 2, r.output
    key = opt.split("=")[0]
    assert r.output.strip().splitlines() == [f"blendsim: error: option {key}: expected a finite number, "
                                             f"got {opt.split('=')[1]!r}"]


@pytest.mark.parametrize("policy,opt,says", [
    ("blendserve", "max_rounds=2.5", "option max_rounds: expected a whole number, got '2.5'"),
    ("accelgen", "max_window=0.5", "option max_window: expected a whole number, got '0.5'"),
    ("e2", "pd_threshold=5", "option pd_threshold: a prefix-hit ratio, must be in [0, 1], got 5.0"),
    ("e2", "window_s=0", "option window_s: must be > 0, got 0.0"),
    ("e2", "groups=0", "option groups: must be >= 1, got 0"),
    ("e2", "quota_unit=0", "option quota_unit: must be >= 1, got 0"),
    ("accelgen", "gamma=-1", "option gamma: must be >= 0, got -1.0"),
    ("accelgen", "pivot_tol=1", "option pivot_tol: must be < 1, got 1.0"),
])
def test_an_option_out_of_its_range_is_named_alone(trace_file, tmp_path, policy, opt, says):
    """A count takes whole numbers only, and each option out of its range is named by itself, not in a list."""
    r = invoke("simulate", trace_file, "--policy", policy, "--opt", opt, "--model", "tiny", "--hardware", "cpu",
               "-o", tmp_path / "r")
    assert r.exit_code == 2, r.output
    assert r.output.strip().splitlines()[-1] == f"blendsim: error: {says}"


def test_an_infinite_default_may_be_given_again(trace_file, tmp_path):
    # accelgen's best_effort_slack defaults to inf (no deadline): saying so explicitly is fine
    r = invoke("simulate", trace_file, "--policy", "accelgen", "--opt", "best_effort_slack=inf", "--model", "tiny",
               "--hardware", "cpu", "-o", tmp_path / "r")
    assert r.exit_code == 0, r.output


# ---- item 6: messages that name the option ---------------------------------------------------
def test_a_huge_token_budget_names_the_option(trace_file, tmp_path):
    r = invoke("simulate", trace_file, "--token-budget", str(10**12), "-o", tmp_path / "r")
    assert r.exit_code == 2 and r.output.startswith("blendsim: error: --token-budget 1000000000000")
    assert len(r.output.strip().splitlines()) == 1


def test_a_huge_block_size_names_the_option(trace_file, tmp_path):
    r = invoke("simulate", trace_file, "--block-size", str(10**9), "-o", tmp_path / "r")
    assert r.exit_code == 2 and r.output.startswith("blendsim: error: --block-size 1000000000:")
    assert "--tp" not in r.output and "smaller --block-size" in r.output


@pytest.mark.parametrize("argv,where", [
    (["simulate", "t.parquet", "--tp", "abc", "-o", "r"], "simulate: Invalid value for '--tp'"),
    (["workloads", "load", "x.jsonl", "-f", "jsonl", "--limit", "0", "-o", "x.parquet"],
     "workloads load: Invalid value for '--limit'"),
    (["workloads", "synth", "nope", "-o", "x.parquet"], "workloads synth: No such command 'nope'"),
    (["sweep", "--nope"], "sweep: No such option: --nope"),
])
def test_usage_errors_are_one_line(argv, where, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"blendsim: error: {where}"), err


def test_main_exit_codes(trace_file, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:  # a UserError inside a command: one line, exit 2
        main(["simulate", str(trace_file), "--policy", "nope", "-o", str(tmp_path / "r")])
    assert e.value.code == 2 and capsys.readouterr().err.startswith("blendsim: error: unknown policy 'nope'")
    with pytest.raises(SystemExit) as e:
        main(["simulate", str(trace_file), "--model", "tiny", "--hardware", "cpu", "-o", str(tmp_path / "r")])
    assert e.value.code == 0


def test_run_config_refuses_a_block_size_no_replica_holds():
    trace = from_columns(input_len=[3], output_len=[2])
    with pytest.raises(UserError, match="--block-size"):
        run_simulation(trace, RunConfig(model="tiny", hardware="cpu", block_size=10**9))


# ---- item 7: -o does not silently replace another trace's run ----------------------------------
def test_simulate_refuses_to_replace_a_run_of_another_trace(tmp_path):
    a = write_trace(from_columns(input_len=[5, 9], output_len=[3, 4]), tmp_path / "a.parquet")
    b = write_trace(from_columns(input_len=[7], output_len=[2]), tmp_path / "b.parquet")
    run = tmp_path / "run"
    common = ["--model", "tiny", "--hardware", "cpu", "-o", run]
    assert invoke("simulate", a, *common).exit_code == 0
    assert invoke("simulate", a, "--policy", "dfs", *common).exit_code == 0  # same trace: a rerun
    r = invoke("simulate", b, *common)
    assert r.exit_code == 2 and r.output.strip() == (f"blendsim: error: {run}: holds a run of another trace; "
                                                     "choose another folder, or replace it (--force; force=True "
                                                     "from Python)")
    assert strict_json(run / "summary.json")["n_requests"] == 2  # untouched
    r = invoke("simulate", b, *common, "--force")
    assert r.exit_code == 0 and strict_json(run / "summary.json")["n_requests"] == 1


# ---- sweeps: a folder that turns read-only, interrupts ----------------------------------------
SWEEP = ["--recipe", "blendserve", "--densities", "0.9", "--sharing", "0.15", "--policies", "dfs,random",
         "--requests", "300", "--seed", "1"]


def test_sweep_whose_folder_turns_read_only_before_the_results(tmp_path, monkeypatch):
    import blendsim.sweep.driver as driver

    def read_only(d):
        raise PermissionError(13, "Permission denied", str(d / "results.parquet"))

    monkeypatch.setattr(driver, "assemble_results", read_only)
    d = tmp_path / "s"
    r = CliRunner().invoke(get_app(), ["sweep", *SWEEP, "--jobs", "1", "-o", str(d)])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().splitlines() == [
        f"blendsim: error: {d / 'results.parquet'}: cannot write it (Permission denied); the 2 finished cell(s) "
        f"are kept in {d}/runs/ -- make {d} writable and run the same command again"]
    f = json.loads((d / "failures.json").read_text())["failures"]
    assert [x["stage"] for x in f] == ["results assembly"]
    monkeypatch.undo()  # writable again: the rerun assembles the table from the kept cells
    r = CliRunner().invoke(get_app(), ["sweep", *SWEEP, "--jobs", "1", "-o", str(d)])
    assert r.exit_code == 0 and "0 cell(s) simulated, 2 already done" in r.stdout
    assert (d / "results.parquet").exists() and not (d / "failures.json").exists()


def slow_random_cell(spec, cell, trace, sweep_dir):
    """A sweep task (run in a worker) that takes a minute for the random policy's cell."""
    import time

    from blendsim.sweep.tasks import cell_task

    if cell.policy == "random":
        time.sleep(60)
    return cell_task(spec, cell, trace, sweep_dir)


@pytest.mark.parametrize("target", ["main", "group", "term"])
def test_an_interrupted_sweep_exits_promptly_and_quietly(tmp_path, target):
    """SIGINT to the driver alone (e.g. `kill -INT`) or to the whole process group (Ctrl-C), or SIGTERM to
    the driver (`kill PID`, a scheduler's stop), while a cell runs: the command ends within seconds,
    without a traceback, keeps the finished cell, and leaves no worker behind. (Before: the driver waited
    for the running cells at exit - over ten minutes for large ones - and Ctrl-C printed the workers'
    tracebacks; SIGTERM killed the driver alone, leaving its workers running and semaphores leaked.)"""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    d = tmp_path / "s"
    # NOTE: the driver is started as from an interactive shell: a job started in the background of a
    # non-interactive shell (`pytest ... &`) inherits SIGINT ignored, and Python then installs no handler
    code = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "import blendsim.sweep.driver as d; from tests.test_reliability_runs import slow_random_cell; "
            "d.cell_task = slow_random_cell; from blendsim.cli import main; main()")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", code, "sweep", *SWEEP, "--jobs", "2", "-o", str(d)], cwd=root,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        kept = d / "runs" / "llama-3-8b" / "a100-80gb"
        deadline = time.monotonic() + 120
        while not list(kept.glob("*/dfs/summary.json")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        if not list(kept.glob("*/dfs/summary.json")):
            early = proc.communicate(timeout=30) if proc.poll() is not None else ("", "(still running)")
            raise AssertionError(f"the dfs cell never finished (exit {proc.returncode}): {early}")
        time.sleep(0.5)  # the random cell is sleeping in its worker
        t0 = time.monotonic()
        (os.killpg if target == "group" else os.kill)(proc.pid, signal.SIGTERM if target == "term" else signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == (143 if target == "term" else 130) and took < 10, (took, err)
    assert err.strip().splitlines() == [f"blendsim: interrupted; finished cells are kept in {d}/runs/ -- run the "
                                        "same command again to resume"]
    assert list(kept.glob("*/dfs/summary.json")) and not list(kept.glob("*/random/summary.json"))
    time.sleep(1.0)
    ps = subprocess.run(["ps", "-o", "pid=,stat=", "-g", str(proc.pid)], capture_output=True, text=True).stdout
    assert not [ln for ln in ps.splitlines() if "Z" not in ln.split()[1]], ps  # no live worker left


def test_workers_leave_when_their_driver_dies_unreaped():
    """A driver killed outright (SIGKILL) whose parent has not reaped it yet -- a parent reading the
    command's pipes before waiting, as subprocess.communicate does -- is a zombie: it still has a pid, so
    its workers must see that it is gone and exit, or they hold the pipes open and the parent waits forever."""
    import os
    import subprocess
    import sys
    import time

    from blendsim.sweep.tasks import _zombie

    if not os.path.exists(f"/proc/{os.getpid()}/stat"):
        pytest.skip("no /proc: a zombie driver is not detected here")
    driver = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while not _zombie(driver.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _zombie(driver.pid) and not _zombie(os.getpid())  # exited and not waited for; alive
        worker = subprocess.Popen([sys.executable, "-c", "import sys; from blendsim.sweep.tasks import _watch; "
                                   "_watch(int(sys.argv[1]))", str(driver.pid)])
        try:
            assert worker.wait(timeout=30) == 1  # within a second or two of starting to watch
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    finally:
        driver.wait()
    assert not _zombie(driver.pid)  # reaped: gone


@pytest.mark.parametrize("delay", [0.05, 0.2, 0.35, 0.6])
def test_sigterm_at_any_moment_of_a_short_command_ends_it_quietly(delay):
    """SIGTERM while the command starts (its commands mounted, typer building them) or runs: exit 143 (or the
    signal itself, before Python has a handler), never a traceback."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-c", "from blendsim.cli import main; main()", "engines"], cwd=root,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, 143, -signal.SIGTERM), (proc.returncode, err)
    assert "Traceback" not in err, err
