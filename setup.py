"""Build the optional compiled step path: the per-step modules, compiled by Cython as they are.

Everything else about the package is in pyproject.toml. The modules listed in ``sim/_compiled.py``
(``MODULES``) are plain Python; Cython compiles each one in pure-Python mode, with the types in the ``.pxd``
beside it where there is one, into an extension module of the same name next to the ``.py``. The build is
optional, module by module: without Cython or a C compiler (or with ``BLENDSIM_PURE_PYTHON=1`` set while
installing) pip still installs the package, and the pure-Python modules run. The build records each
module's source digest in ``sim/_compiled_manifest.json``; ``blendsim.sim._compiled`` loads a compiled
module only while its source still has that digest (an edited ``.py`` runs as Python until the next build).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
PACKAGE_DIRS = {"blendsim.sim": "sim", "blendsim.policies": "policies", "blendsim.workloads": "workloads",
                "blendsim": "blendsim"}
# The interpreter's own rules, never the faster but inexact C ones: a compiled module computes exactly what
# its Python source does (annotations are documentation here, not C types; division and indexing as Python).
DIRECTIVES = {"language_level": 3, "annotation_typing": False, "cdivision": False, "boundscheck": True,
              "wraparound": True, "infer_types": False, "binding": True, "embedsignature": False}


def compiled_modules() -> dict[str, str]:
    """``blendsim.sim._compiled.MODULES`` (read without importing the package): module name -> source path."""
    tree = ast.parse((ROOT / "sim" / "_compiled.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "MODULES" for t in node.targets):
            names = ast.literal_eval(node.value)
            break
    else:
        raise RuntimeError("sim/_compiled.py: no MODULES")
    out = {}
    for name in names:
        pkg, _, mod = name.rpartition(".")
        out[name] = f"{PACKAGE_DIRS[pkg]}/{mod}.py"
    return out


def source_digest(py: Path) -> str:
    """The digest the loader checks: the ``.py`` and its ``.pxd`` (when there is one)."""
    sys.path.insert(0, str(ROOT / "sim"))
    try:
        from _compiled import source_digest as digest  # the loader's own rule, so the two cannot disagree
    finally:
        sys.path.pop(0)
    return digest(py)


class OptionalBuildExt(build_ext):
    """Cythonize and compile each listed module; one that fails is left to run as Python (one line)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:  # compile the modules side by side (pip passes no -j)
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        if os.environ.get("BLENDSIM_PURE_PYTHON", "") not in ("", "0"):
            self._say("BLENDSIM_PURE_PYTHON is set: not building the compiled step path")
            self.extensions = []
        else:
            try:
                from Cython.Build import cythonize
            except ImportError:
                self._say("Cython is not installed: the pure-Python step path will run")
                self.extensions = []
            else:
                for e in self.extensions:  # every module first: a .pxd may cimport another module's
                    self._stage(e)
                self.extensions = [e for e in self.extensions if self._cythonize(e, cythonize)]
        inplace, self.inplace = self.inplace, 0
        built_at = {e.name: Path(self.get_ext_fullpath(e.name)) for e in self.extensions}
        self.inplace = inplace
        for e in self.extensions:  # an extension module older than its C is rebuilt, or gone if that fails
            f = built_at[e.name]
            if f.exists() and f.stat().st_mtime < Path(e.sources[0]).stat().st_mtime:
                f.unlink()
        try:
            super().run()  # optional extensions: one that fails to compile is reported and skipped
        except Exception as e:  # no compiler at all: every module runs as Python
            self._say(f"compiling failed ({type(e).__name__}: {e}); the pure-Python step path will run")
        manifest = {}
        for e in self.extensions:
            if built_at[e.name].exists():
                manifest[e.name] = {"file": built_at[e.name].name, "source_sha256": e.source_sha256}
            elif self.inplace:
                Path(self.get_ext_fullpath(e.name)).unlink(missing_ok=True)
        out = Path(self.get_ext_fullpath("blendsim.sim._compiled_manifest")).with_name("_compiled_manifest.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"cython": self._cython_version(), "modules": manifest}, indent=1,
                                  sort_keys=True) + "\n")
        self._say(f"compiled {len(manifest)} of {len(compiled_modules())} step-path modules")

    def _stage(self, ext: Extension) -> None:
        """Copy ``ext``'s .py (and .pxd) to build/cython/<package path>/, so Cython sees the module's full
        name and finds its .pxd."""
        src = ROOT / ext.py_source
        stage = ROOT / "build" / "cython" / Path(*ext.name.split(".")[:-1])
        stage.mkdir(parents=True, exist_ok=True)
        for d in [stage, *stage.parents]:  # package markers up to build/cython
            if d == ROOT / "build" / "cython":
                break
            (d / "__init__.py").touch()
        for suffix in (".py", ".pxd"):
            f = src.with_suffix(suffix)
            target = stage / f.name
            if f.is_file():
                if not target.is_file() or target.read_bytes() != f.read_bytes():
                    shutil.copyfile(f, target)  # copied only when changed: Cython redoes only that module
            elif target.exists():
                target.unlink()
        ext.staged = stage / src.name

    def _cythonize(self, ext: Extension, cythonize) -> bool:
        """Translate the staged module to C; False (with one line) when Cython refuses it."""
        src = ROOT / ext.py_source
        ext.source_sha256 = source_digest(src)
        try:
            staged = Extension(ext.name, [str(ext.staged)])
            (c_ext,) = cythonize([staged], compiler_directives=DIRECTIVES, quiet=True, force=self.force,
                                 language_level=3)
        except Exception as e:
            self._say(f"{ext.name} not compiled (Cython: {type(e).__name__}); its Python module will run")
            return False
        ext.sources = c_ext.sources
        return True

    @staticmethod
    def _cython_version() -> str | None:
        try:
            import Cython

            return Cython.__version__
        except ImportError:
            return None

    @staticmethod
    def _say(msg: str) -> None:
        print(f"blendsim build: {msg}", file=sys.stderr)


def extensions() -> list[Extension]:
    out = []
    for name, path in compiled_modules().items():
        ext = Extension(name, [path], optional=True)
        ext.py_source = path
        out.append(ext)
    return out


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
