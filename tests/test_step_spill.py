"""A step log spilled to disk as the run goes (run_simulation(spill_dir=...)) gives the same results: the same
summary, step, request and schedule tables as a log kept in memory, and the same steps.parquet bytes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import golden  # noqa: E402

TRACES = golden.traces()
CASES = {name: (key, kw) for name, key, kw in golden.cases()}
PICK = ["fcfs-shared", "dfs-timed-2rep", "sarathi-alone", "vllm-shared-small-kv", "blendserve-shared",
        "e2-timed-2rep", "vllm-shared-schedule"]


@pytest.fixture
def tiny_spills(monkeypatch):
    """Offer a spill every 8 steps and spill from 16 rows; row groups of 20 rows: many spills and row groups
    that straddle spills and replicas on a small trace."""
    from blendsim.sim import engine, rundir

    monkeypatch.setattr(engine, "CHECK_MASK", 7)
    monkeypatch.setattr(engine, "SPILL_ROWS", 16)
    monkeypatch.setattr(rundir, "STEP_ROW_GROUP", 20)


def _run(name, spill_dir=None, **extra):
    from blendsim.runner import RunConfig, run_simulation

    key, kw = CASES[name] if isinstance(name, str) else name
    return run_simulation(TRACES[key], RunConfig(model="llama-3-8b", hardware="a100-80gb", **{**kw, **extra}),
                          spill_dir=spill_dir)


@pytest.mark.parametrize("name", PICK)
def test_spilled_log_gives_the_same_tables(name, tiny_spills, tmp_path):
    from blendsim.sim.engine import SpilledColumns

    kept = _run(name)
    spilled = _run(name, spill_dir=tmp_path)
    assert any(isinstance(c, SpilledColumns) for c in spilled.steps)  # it did spill
    assert golden.digest(spilled) == golden.digest(kept)


@pytest.mark.parametrize("name", ["dfs-timed-2rep", "fcfs-shared"])
def test_spilled_steps_parquet_is_byte_identical(name, tiny_spills, tmp_path):
    import pyarrow.parquet as pq

    from blendsim.sim.rundir import steps_table, write_run

    kept = _run(name)
    spilled = _run(name, spill_dir=tmp_path / "spill")
    write_run(spilled, tmp_path / "a")
    # the reference: the whole table written at once, cut in the same row groups
    pq.write_table(steps_table(kept), tmp_path / "ref.parquet", compression="zstd", row_group_size=20)
    assert (tmp_path / "a" / "steps.parquet").read_bytes() == (tmp_path / "ref.parquet").read_bytes()
    assert pq.ParquetFile(tmp_path / "a" / "steps.parquet").metadata.num_row_groups > 2
    write_run(kept, tmp_path / "b")
    for f in ("summary.json", "requests.parquet"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()


def test_default_row_groups_match_write_table(tmp_path):
    """Unpatched: the streamed file is byte-identical to pq.write_table's (pyarrow's default row group)."""
    import numpy as np
    import pyarrow.parquet as pq

    from blendsim.sim import engine
    from blendsim.sim.rundir import RunResult, steps_table, write_steps

    n = 2_300_000  # three row groups of pyarrow's default 1Mi rows
    rng = np.random.default_rng(0)
    logs = []
    for rows in (n - 300_000, 300_000):
        log = engine.StepLog(spill_dir=tmp_path)
        log.extend(**{c: (rng.random(rows) if c in log.FLOATS else rng.integers(0, 9, rows)) for c in log.COLUMNS})
        log.spill()
        log.extend(**{c: np.arange(5) for c in log.COLUMNS})  # a tail in memory
        logs.append(log)
    res = RunResult({}, [log.cols for log in logs], {}, None, [])
    write_steps(res, tmp_path / "s.parquet")
    pq.write_table(steps_table(res), tmp_path / "ref.parquet", compression="zstd")
    assert (tmp_path / "s.parquet").read_bytes() == (tmp_path / "ref.parquet").read_bytes()


def test_spill_folder_is_removed_with_the_log(tmp_path):
    import gc

    import numpy as np

    from blendsim.sim import engine

    log = engine.StepLog(spill_dir=tmp_path)
    log.extend(**{c: np.arange(3) for c in log.COLUMNS})
    log.spill()
    assert len(log) == 3 and log.last_t_end() == 2.0
    cols = log.cols
    assert list(cols["num_tokens"]) == [0, 1, 2] and cols.rows("dt_s", 1, 3).tolist() == [1.0, 2.0]
    assert len(list(tmp_path.iterdir())) == 1
    del log, cols
    gc.collect()
    assert list(tmp_path.iterdir()) == []


def test_pipeline_spills(tiny_spills, tmp_path):
    kept = _run(("shared", {"policy": "fcfs"}), pp=2)
    spilled = _run(("shared", {"policy": "fcfs"}), pp=2, spill_dir=tmp_path)
    assert golden.digest(spilled) == golden.digest(kept)


def test_a_sweep_cell_spills_its_step_log_and_writes_the_same_run(tiny_spills, tmp_path, monkeypatch):
    """Each sweep cell spills its step log to disk as it runs (a large cell's log would otherwise fill the
    worker's memory) and still writes the same run files as one that keeps it in memory."""
    import tempfile

    from blendsim.sim import engine, rundir
    from blendsim.sweep import SweepSpec, check_spec, make_backend, run_sweep

    monkeypatch.setattr(rundir, "STEP_ROW_GROUP", 1024 * 1024)  # the shipped row groups: identical bytes expected
    folders = []
    real_mkdtemp = tempfile.mkdtemp

    def spy(*a, **k):
        folders.append(k.get("prefix"))
        return real_mkdtemp(*a, **k)

    spec = check_spec(SweepSpec("blendserve", (1.2,), (0.35,), ("dfs",), ("llama-3-8b",), ("a100-80gb",),
                                requests=200, seed=3))
    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    spilled = run_sweep(spec, tmp_path / "a", make_backend("local", 1))
    assert ".blendsim-steps-" in folders  # the cell's log spilled
    monkeypatch.setattr(engine, "SPILL_ROWS", 1 << 40)
    kept = run_sweep(spec, tmp_path / "b", make_backend("local", 1))
    assert spilled.results.read_bytes() == kept.results.read_bytes()
    runs_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a" / "runs").rglob("*.parquet"))
    runs_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b" / "runs").rglob("*.parquet"))
    assert runs_a and runs_a == runs_b
    for rel in runs_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
