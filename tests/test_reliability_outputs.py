"""Issue 22, item 1 (files destroyed) and output paths: no command deletes or replaces what it did not make.

Output folders (``simulate -o``, ``report -o``, ``fidelity -o``, ``Result.write``) that are the current folder,
a folder above it, a folder holding an input, a file, a read-only place or a non-empty folder of another kind
are refused with one line before any work, and the tree is byte-for-byte what it was (listing and hashes
compared). ``fidelity --save`` refuses a folder, a file as parent, a read-only place, and a fit on too few rows.
"""

from __future__ import annotations

import csv
import errno
import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import blendsim
from blendsim.cli import get_app
from blendsim.fidelity.catalogue import COLUMNS
from blendsim.sim.errors import UserError
from blendsim.workloads.trace import write_trace
from tests.helpers import one_line_error, random_trace


def invoke(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


def snapshot(root: Path) -> dict:
    """Every path under ``root`` with its bytes' SHA-256 (folders: None)."""
    out = {}
    for p in sorted(root.rglob("*")):
        out[str(p.relative_to(root))] = None if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def catalogue(path: Path, **kw) -> Path:
    row = {"id": "r", "source": "test", "model": "tiny", "hardware": "cpu", "gpus": 1, "tp": 1, "pp": 1, "ep": 1,
           "weights": "", "kv_dtype": "", "engine": "vllm", "engine_version": "", "policy": "",
           "workload": "const:32/8", "requests": 8, "metric": "output_tok_s", "scope": "system", "value": 100,
           "note": ""}
    row.update(kw)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        w.writerow(row)
    return path


@pytest.fixture
def user_dir(tmp_path):
    """A user's folder: a catalogue, a trace, notes."""
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("my notes")
    catalogue(d / "cat.csv")
    write_trace(random_trace(np.random.default_rng(0), n=6), d / "t.parquet")
    return d


# ---- the reproducers ----------------------------------------------------------------------------
def test_fidelity_out_onto_a_folder_of_the_users_files_is_refused(user_dir, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("years of work")
    before = snapshot(tmp_path)
    one_line_error(invoke("fidelity", user_dir / "cat.csv", "-o", other, "--no-cv"), str(other),
                   "not a blendsim fidelity report folder")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("where", ["catalogue's folder", "its parent"])
def test_fidelity_out_onto_the_catalogues_folder_or_its_parent_is_refused(user_dir, tmp_path, where):
    out = user_dir if where == "catalogue's folder" else tmp_path
    before = snapshot(tmp_path)
    one_line_error(invoke("fidelity", user_dir / "cat.csv", "-o", out, "--no-cv"), "holds the input")
    assert snapshot(tmp_path) == before


def test_out_dot_is_refused_by_fidelity_simulate_and_report(user_dir, tmp_path, monkeypatch):
    # a run folder of the same trace, and a report folder: `-o .` inside them used to empty them
    trace = user_dir / "t.parquet"
    assert invoke("simulate", trace, "-o", tmp_path / "run", "-m", "tiny", "--hardware", "cpu").exit_code == 0
    r = invoke("report", tmp_path / "run", "-o", tmp_path / "rep")
    assert r.exit_code == 0, r.output
    (tmp_path / "run" / "t.parquet").write_bytes(trace.read_bytes())
    before = snapshot(tmp_path)
    monkeypatch.chdir(tmp_path / "run")
    one_line_error(invoke("simulate", "t.parquet", "-o", ".", "-m", "tiny", "--hardware", "cpu"), "current folder")
    one_line_error(invoke("fidelity", user_dir / "cat.csv", "-o", ".", "--no-cv"), "current folder")
    monkeypatch.chdir(tmp_path / "rep")
    one_line_error(invoke("report", tmp_path / "run", "-o", "."), "current folder")
    one_line_error(invoke("report", tmp_path / "run", "-o", ".."), "above the current one")
    assert snapshot(tmp_path) == before


def test_result_write_refuses_the_current_folder(tmp_path, monkeypatch):
    r = blendsim.simulate(random_trace(np.random.default_rng(1), n=4), "fcfs", model="tiny", hardware="cpu")
    r.write(tmp_path / "run")
    monkeypatch.chdir(tmp_path / "run")
    before = snapshot(tmp_path)
    with pytest.raises(blendsim.BlendsimError, match="current folder"):
        r.write(".")
    assert snapshot(tmp_path) == before


def test_refit_save_on_a_catalogue_whose_rows_are_all_skipped_writes_nothing(tmp_path):
    cat = catalogue(tmp_path / "cat.csv", pp=2, gpus=2)  # two cpu "nodes" with no network: skipped
    saved = tmp_path / "params.json"
    saved.write_text('{"engine": {}}\n')
    before = snapshot(tmp_path)
    err = one_line_error(invoke("fidelity", cat, "--refit", "--save", saved, "--no-cv"), f"--save {saved}",
                         "skipped", "nothing was written")
    assert "network" in err
    assert snapshot(tmp_path) == before


def test_refit_save_with_fewer_rows_than_parameters_writes_nothing(tmp_path):
    cat = catalogue(tmp_path / "cat.csv")
    saved = tmp_path / "params.json"
    one_line_error(invoke("fidelity", cat, "--refit", "--save", saved, "--no-cv"), "only 1 runnable row(s)",
                   "free parameters")
    assert not saved.exists()


def test_save_onto_a_folder_a_file_parent_or_the_catalogue_is_refused_before_the_work(tmp_path):
    cat = catalogue(tmp_path / "cat.csv")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    before = snapshot(tmp_path)
    one_line_error(invoke("fidelity", cat, "--refit", "--save", tmp_path), "is a folder")
    one_line_error(invoke("fidelity", cat, "--refit", "--save", blocker / "p.json"), "not a folder")
    one_line_error(invoke("fidelity", cat, "--refit", "--save", cat), "is the input")
    one_line_error(invoke("fidelity", cat, "-o", blocker), "exists and is not a folder")
    assert snapshot(tmp_path) == before


def test_save_into_a_missing_folder_creates_it(tmp_path):
    from tests.test_reliability_files import row, write_cat

    # eight rows: at least one per free parameter (the GPU's efficiencies and, since 26 Nov, the engine's fitted loop)
    cat = write_cat(tmp_path / "cat.csv", [row(id=f"r{i}", workload=f"const:{32 + 16 * i}/{4 + 8 * i}",
                                               value=100 + 50 * i) for i in range(8)])
    saved = tmp_path / "new" / "deeper" / "p.json"
    r = invoke("fidelity", cat, "--refit", "--save", saved, "--no-cv", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(saved.read_text())["fitted_on"]["rows"] == 8


def test_workloads_load_onto_its_own_input_is_refused(tmp_path):
    src = tmp_path / "r.jsonl"
    src.write_text('{"prompt_token_ids": [1, 2], "output_len": 2}\n')
    before = snapshot(tmp_path)
    one_line_error(invoke("workloads", "load", src, "-f", "jsonl", "-o", src), "is the input")
    assert snapshot(tmp_path) == before


def test_demo_refuses_a_folder_of_the_users_files(tmp_path, monkeypatch):
    (tmp_path / "trace.parquet").write_bytes(b"mine")
    before = snapshot(tmp_path)
    one_line_error(invoke("demo", "-o", tmp_path, "--requests", "50"), "not a blendsim demo folder")
    monkeypatch.chdir(tmp_path)
    one_line_error(invoke("demo", "-o", ".", "--requests", "50"), "current folder")
    assert snapshot(tmp_path) == before


def test_save_on_a_read_only_place_is_one_line(tmp_path, monkeypatch):
    cat = catalogue(tmp_path / "cat.csv")
    ro = tmp_path / "ro"
    ro.mkdir()
    _read_only(monkeypatch, ro)
    err = one_line_error(invoke("fidelity", cat, "--refit", "--save", ro / "p.json", "--no-cv"))
    assert "Read-only" in err


def _read_only(monkeypatch, root: Path) -> None:
    """Make creating anything under ``root`` fail as on a read-only file system (the tests run as root, whom
    permission bits do not stop)."""
    real_mkdtemp, real_mkstemp, real_mkdir = tempfile.mkdtemp, tempfile.mkstemp, Path.mkdir

    def under(d) -> bool:
        return d is not None and Path(d).resolve().is_relative_to(root.resolve())

    def mkdtemp(*a, dir=None, **kw):  # noqa: A002
        if under(dir):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_mkdtemp(*a, dir=dir, **kw)

    def mkstemp(*a, dir=None, **kw):  # noqa: A002
        if under(dir):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_mkstemp(*a, dir=dir, **kw)

    def mkdir(self, *a, **kw):
        if under(self) and not self.exists():
            raise OSError(errno.EROFS, "Read-only file system")
        return real_mkdir(self, *a, **kw)

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(Path, "mkdir", mkdir)


# ---- property: any unsafe output path, any writer ------------------------------------------------------------
KINDS = ("dot", "dotdot", "input's folder", "input's parent", "a file", "read-only", "foreign folder",
         "foreign nested", "input file")
WRITERS = ("simulate", "report", "fidelity", "Result.write")


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS), writer=st.sampled_from(WRITERS), junk=st.binary(min_size=0, max_size=40))
def test_unsafe_output_paths_are_refused_and_nothing_is_touched(kind, writer, junk, monkeypatch):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        src = root / "work" / "in"
        src.mkdir(parents=True)
        trace = write_trace(random_trace(np.random.default_rng(0), n=4), src / "t.parquet")
        cat = catalogue(src / "cat.csv")
        run = root / "work" / "run"
        r = blendsim.simulate(trace, "fcfs", model="tiny", hardware="cpu")
        r.write(run)
        (src / "junk.bin").write_bytes(junk)
        (root / "work" / "file").write_bytes(junk)
        foreign = root / "work" / "foreign"
        (foreign / "sub").mkdir(parents=True)
        (foreign / ("sub/x" if kind == "foreign nested" else "x")).write_bytes(junk)
        (root / "work" / "ro").mkdir()
        cwd = src
        out = {"dot": ".", "dotdot": "..", "input's folder": src, "input's parent": src.parent,
               "a file": root / "work" / "file", "read-only": root / "work" / "ro" / "new",
               "foreign folder": foreign, "foreign nested": foreign, "input file": trace}[kind]
        before = snapshot(root)
        with monkeypatch.context() as m:
            m.chdir(cwd)
            if kind == "read-only":
                _read_only(m, root / "work" / "ro")
            if writer == "Result.write":
                with pytest.raises(UserError) as e:
                    r.write(out)
                assert "\n" not in str(e.value)
            else:
                args = {"simulate": ("simulate", trace, "-m", "tiny", "--hardware", "cpu"),
                        "report": ("report", run), "fidelity": ("fidelity", cat, "--no-cv")}[writer]
                one_line_error(invoke(*args, "-o", out))
        assert snapshot(root) == before, (kind, writer)
