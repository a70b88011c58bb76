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


def test_version_names_the_step_path():
    env = {**os.environ, _compiled.ENV: "1"}
    out = subprocess.run([sys.executable, "-c", "from blendsim.cli import main; main(['--version'])"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "step path: pure Python" in out.stdout and _compiled.ENV in out.stdout


# ---- the finder's decision, on a throw-away module with a stand-in extension file (never loaded) ----------
@pytest.fixture
def fake_module(tmp_path, monkeypatch, capsys):
    py = tmp_path / "fakestep.py"
    py.write_text("X = 1\n")
    ext = tmp_path / ("fakestep" + importlib.machinery.EXTENSION_SUFFIXES[0])
    ext.write_bytes(b"not really a shared object")
    monkeypatch.setattr(_compiled, "MODULES", ("fakepkg.fakestep",))
    monkeypatch.setattr(_compiled, "_warned", False)
    monkeypatch.delenv(_compiled.ENV, raising=False)
    finder = _compiled._Finder()
    finder.manifest = {"fakepkg.fakestep": {"file": ext.name, "source_sha256": _compiled.source_digest(py)}}
    return finder, py, tmp_path


def _loader(finder, path) -> type:
    return type(finder.find_spec("fakepkg.fakestep", [str(path)]).loader)


def test_current_build_loads_the_extension(fake_module, capsys):
    finder, py, d = fake_module
    assert _loader(finder, d) is importlib.machinery.ExtensionFileLoader
    assert capsys.readouterr().err == ""


def test_edited_source_runs_as_python_with_one_warning(fake_module, capsys):
    finder, py, d = fake_module
    py.write_text("X = 2  # edited after the build\n")
    assert _loader(finder, d) is importlib.machinery.SourceFileLoader
    assert _loader(finder, d) is importlib.machinery.SourceFileLoader
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "changed since it was compiled" in err[0] and "fakestep.py" in err[0]


def test_edited_pxd_counts_as_a_changed_source(fake_module, capsys):
    finder, py, d = fake_module
    py.with_suffix(".pxd").write_text("cdef int y\n")
    assert _loader(finder, d) is importlib.machinery.SourceFileLoader


def test_extension_missing_from_the_manifest_runs_as_python(fake_module, capsys):
    finder, py, d = fake_module
    finder.manifest = {}
    assert _loader(finder, d) is importlib.machinery.SourceFileLoader
    assert "not from this build" in capsys.readouterr().err


def test_switch_wins_over_a_current_build(fake_module, monkeypatch):
    finder, py, d = fake_module
    monkeypatch.setenv(_compiled.ENV, "1")
    assert _loader(finder, d) is importlib.machinery.SourceFileLoader
    monkeypatch.setenv(_compiled.ENV, "0")
    assert _loader(finder, d) is importlib.machinery.ExtensionFileLoader


def test_other_modules_are_left_alone(fake_module):
    finder, py, d = fake_module
    assert finder.find_spec("fakepkg.other", [str(d)]) is None
    assert finder.find_spec("blendsim.sim.metrics", None) is None


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
