"""Python API, round 6: a policy class and the ``file.py:Class`` naming it are one policy in a sweep."""

from __future__ import annotations

import importlib.util
import sys
import warnings

import blendsim


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # as an import of the file would
    spec.loader.exec_module(mod)
    return mod


def test_a_class_and_its_file_spec_run_once_labelled_as_written(tmp_path, monkeypatch):
    (tmp_path / "mine.py").write_text("import blendsim\n\nclass LongFirst(blendsim.Policy):\n"
                                      "    def rank(self):\n        return -self.ctx.trace.input_len\n")
    monkeypatch.chdir(tmp_path)
    mod = _load(tmp_path / "mine.py", "mine_policy_r6")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = blendsim.sweep(tmp_path / "sw", densities=[1.0], sharing=[0.2], requests=400, jobs=1,
                             policies=[mod.LongFirst, "mine.py:LongFirst", "fcfs"])
    assert sorted(out.results["policy"]) == ["fcfs", "mine.py:LongFirst"]  # once each, not an absolute path
    assert sorted(p.name for p in (tmp_path / "sw" / "runs").glob("*/*/*/*")) == ["fcfs", "mine.py_LongFirst"]


def test_a_class_outside_the_working_folder_keeps_its_absolute_path(tmp_path, monkeypatch):
    src = tmp_path / "lib"
    src.mkdir()
    (src / "far.py").write_text("import blendsim\n\nclass Far(blendsim.Policy):\n"
                                "    def rank(self):\n        return self.ctx.trace.input_len\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    mod = _load(src / "far.py", "far_policy_r6")
    from blendsim.api import _policy_spec

    assert _policy_spec(mod.Far) == f"{(src / 'far.py').resolve().as_posix()}:Far"
