"""The compiled step path (sim/_compiled.py, setup.py): the same results as the pure-Python modules, the
``BLENDSIM_PURE_PYTHON`` switch, and no stale extension module shadowing an edited source."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from blendsim.sim import _compiled
from tests.helpers import stdout_on_both_step_paths

ROOT = Path(__file__).resolve().parents[1]

# every golden case's digests, computed in a fresh interpreter (so the environment decides the step path)
_DIGESTS = """
import json, sys
sys.path.insert(0, {tests!r})
import golden
from blendsim.sim import _compiled
traces = golden.traces()
out = {{name: golden.digest(golden.run_case(key, kw, traces)) for name, key, kw in golden.cases()}}
print(json.dumps({{"status": _compiled.status(), "digests": out}}))
"""


def _run(pure: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != _compiled.ENV}
    if pure:
        env[_compiled.ENV] = "1"
    p = subprocess.run([sys.executable, "-c", _DIGESTS.format(tests=str(ROOT / "tests"))], env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _compiled_built() -> bool:
    env = {k: v for k, v in os.environ.items() if k != _compiled.ENV}
    p = subprocess.run([sys.executable, "-c", "from blendsim.sim import _compiled; print(_compiled.status()['path'])"],
                       env=env, capture_output=True, text=True, timeout=120)
    return p.returncode == 0 and p.stdout.strip() in ("compiled", "mixed")


def test_pure_python_switch_loads_every_source():
    out = subprocess.run([sys.executable, "-c", "import json, importlib; from blendsim.sim import _compiled; "
                          "s = _compiled.status(); print(json.dumps([s['path'], "
                          "[importlib.import_module(m).__file__ for m in _compiled.MODULES]]))"],
                         env={**os.environ, _compiled.ENV: "1"}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    path, files = json.loads(out.stdout)
    assert path == "pure Python"
    assert files and all(f.endswith(".py") for f in files)


def test_golden_digests_identical_compiled_and_pure():
    if not _compiled_built():
        pytest.skip("no compiled step path is built here (pip install without Cython or a C compiler)")
    compiled, pure = _run(pure=False), _run(pure=True)
    assert compiled["status"]["path"] in ("compiled", "mixed")
    assert pure["status"]["path"] == "pure Python"
    stored = json.loads((ROOT / "tests" / "golden_sha256.json").read_text())
    assert compiled["digests"] == pure["digests"] == stored


_RESERVE_RUN = """
import warnings; warnings.filterwarnings("ignore")
import numpy as np, blendsim
from blendsim.sim.models import get_model
r = np.random.default_rng(7); n = int(r.integers(20, 120))
prefixes = [int(x) for x in r.integers(50, 600, 3)]
prompts, p = [], []
for i in range(n):
    path = []
    if r.random() < 0.6:
        k = int(r.integers(0, 3)); path.append((1 + k, prefixes[k]))
    if path and r.random() < 0.15:
        prompts.append(path); p.append(prefixes[k]); continue
    path.append((1000 + i, int(r.integers(1, 1500))))
    prompts.append(path); p.append(sum(l for _, l in path))
d = r.integers(1, 500, n).tolist()
need = max(a + b for a, b in zip(p, d)) + int(r.choice([40, 600, 5000]))
t = blendsim.make_trace(input_len=p, output_len=d, prompts=prompts)
for ff in (True, False):
    s = blendsim.simulate(t, policy="fcfs", model="qwen3-30b-a3b", hardware="h100-80gb", seed=7, fast_forward=ff,
                          kv_capacity_override=need * get_model("qwen3-30b-a3b").kv_bytes_per_token).summary
    print(repr(s["makespan_s"]), s["steps"], s["preemptions"])
"""


def test_a_finish_after_a_reserve_refusal_runs_alike_on_both_paths_and_under_fast_forward():
    # pure Python kept admission blocked after a finish when the last refusal was the reserve rule's alone, and
    # fast-forward then checked a need the finish had made stale (the refused request's expected output is the
    # mean of finished ones): one step more than step by step and than the compiled path (125.9023 s, 21,332 steps
    # against 125.8986 s, 21,331)
    compiled, pure = (out.split() for out in stdout_on_both_step_paths(_RESERVE_RUN))
    for lines in (compiled, pure):
        assert lines[:3] == lines[3:]  # fast-forward as step by step
    assert compiled == pure


def test_version_names_the_step_path():
    env = {**os.environ, _compiled.ENV: "1"}
    out = subprocess.run([sys.executable, "-c", "from blendsim.cli import main; main(['--version'])"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "step path: pure Python" in out.stdout and _compiled.ENV in out.stdout


# ---- the finder's decision, on throw-away modules with stand-in extension files (never loaded) -------------
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


@pytest.fixture
def fake_modules(tmp_path, monkeypatch):
    """Two step modules, each with a stand-in extension module and a manifest entry for its current source;
    returns a function making a fresh finder (it decides once, at its first import)."""
    for leaf in ("fakestep", "fakekv"):
        (tmp_path / f"{leaf}.py").write_text(f"X = {leaf!r}\n")
        (tmp_path / (leaf + SUFFIX)).write_bytes(b"not really a shared object")
    monkeypatch.setattr(_compiled, "MODULES", ("fakepkg.fakestep", "fakepkg.fakekv"))
    monkeypatch.setattr(_compiled, "_warned", False)
    monkeypatch.delenv(_compiled.ENV, raising=False)
    manifest = {f"fakepkg.{leaf}": {"file": leaf + SUFFIX, "source_sha256": _compiled.source_digest(tmp_path / f"{leaf}.py")}
                for leaf in ("fakestep", "fakekv")}

    def finder():
        f = _compiled._Finder()
        f.manifest = manifest
        return f

    return finder, tmp_path


def _loaders(finder, d) -> list:
    return [type(finder.find_spec(f"fakepkg.{leaf}", [str(d)]).loader) for leaf in ("fakestep", "fakekv")]


EXT, SRC = importlib.machinery.ExtensionFileLoader, importlib.machinery.SourceFileLoader


def test_current_build_loads_the_extensions(fake_modules, capsys):
    finder, d = fake_modules
    assert _loaders(finder(), d) == [EXT, EXT]
    assert capsys.readouterr().err == ""


def test_one_edited_source_runs_every_module_as_python_with_one_warning(fake_modules, capsys):
    finder, d = fake_modules
    (d / "fakekv.py").write_text("X = 2  # edited after the build\n")
    f = finder()
    assert _loaders(f, d) == [SRC, SRC]
    assert _loaders(f, d) == [SRC, SRC]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "changed since it was compiled" in err[0] and "fakekv.py" in err[0]


def test_edited_pxd_counts_as_a_changed_source(fake_modules, capsys):
    finder, d = fake_modules
    (d / "fakestep.pxd").write_text("cdef int y\n")
    assert _loaders(finder(), d) == [SRC, SRC]


def test_a_module_the_build_could_not_compile_runs_everything_as_python(fake_modules, capsys):
    finder, d = fake_modules
    (d / ("fakekv" + SUFFIX)).unlink()
    f = finder()
    assert _loaders(f, d) == [SRC, SRC]
    assert f.decision[0] == "not compiled: fakekv"
    assert capsys.readouterr().err == ""  # the build said so already


def test_extension_missing_from_the_manifest_runs_as_python(fake_modules, capsys):
    finder, d = fake_modules
    f = finder()
    f.manifest = {}
    assert _loaders(f, d) == [SRC, SRC]
    assert "not from this build" in capsys.readouterr().err


def test_switch_wins_over_a_current_build(fake_modules, monkeypatch):
    finder, d = fake_modules
    monkeypatch.setenv(_compiled.ENV, "1")
    assert _loaders(finder(), d) == [SRC, SRC]
    monkeypatch.setenv(_compiled.ENV, "0")
    assert _loaders(finder(), d) == [EXT, EXT]


def test_other_modules_are_left_alone(fake_modules):
    finder, d = fake_modules
    f = finder()
    assert f.find_spec("fakepkg.other", [str(d)]) is None
    assert f.find_spec("blendsim.sim.metrics", None) is None


def test_build_list_is_the_loader_list():
    """setup.py compiles exactly the modules the loader knows (it reads MODULES from sim/_compiled.py)."""
    import ast

    src = (ROOT / "setup.py").read_text()
    assert "compiled_modules()" in src
    tree = ast.parse((ROOT / "sim" / "_compiled.py").read_text())
    names = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", None) == "MODULES" for t in n.targets))
    assert tuple(names) == _compiled.MODULES
    for name in names:
        pkg, _, leaf = name.rpartition(".")
        assert (ROOT / {"blendsim.sim": "sim"}[pkg] / f"{leaf}.py").is_file()
