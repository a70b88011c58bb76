"""Which step path runs: the Cython-compiled modules, or their pure-Python sources.

The per-step modules in :data:`MODULES` are plain Python, and the Python is the reference. ``pip install``
also compiles them with Cython where it can (``setup.py``): an extension module beside each ``.py``, with
the digest of the source it was built from recorded in ``_compiled_manifest.json``. :func:`install` (run
when ``blendsim.sim`` is first imported) puts a finder first on ``sys.meta_path`` that decides, for all of them at once:

* ``BLENDSIM_PURE_PYTHON`` set (not ``0``): the ``.py`` files;
* every module has an extension module built from its source as it is now (the digests match): the extension
  modules;
* otherwise the ``.py`` files, all of them -- and when an extension module exists but its source changed since
  it was built (an edit in an editable install), one warning line on stderr says so, instead of the old build
  silently shadowing the edit.

:func:`status` says what ran (``blendsim --version`` prints it). Both paths give byte-identical results
(``tests/test_compiled.py`` runs the golden cases under each).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader, SourceFileLoader
from importlib.util import spec_from_file_location
from pathlib import Path

# the per-step modules that setup.py compiles (chosen by measurement: see README, Performance)
MODULES = (
    "blendsim.sim.scheduler",
    "blendsim.sim.kv",
    "blendsim.sim.engine",
    "blendsim.sim.seq",
    "blendsim.sim.batch",
    "blendsim.sim.cost",
    "blendsim.sim.timers",
    "blendsim.sim.prefix_tree",
)
ENV = "BLENDSIM_PURE_PYTHON"
MANIFEST = Path(__file__).with_name("_compiled_manifest.json")

_loaded: dict[str, str] = {}  # module -> "compiled" or why its Python source ran
_warned = False


def source_digest(py: Path) -> str:
    """SHA-256 of a module's ``.py`` and, when there is one, the ``.pxd`` that types it."""
    h = hashlib.sha256(Path(py).read_bytes())
    pxd = Path(py).with_suffix(".pxd")
    if pxd.is_file():
        h.update(b"\0pxd\0" + pxd.read_bytes())
    return h.hexdigest()


def forced_pure() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def _manifest() -> dict:
    try:
        return json.loads(MANIFEST.read_text()).get("modules", {})
    except (OSError, ValueError, AttributeError):
        return {}


class _Finder:
    """Meta-path finder for :data:`MODULES` only; every other import is left to the usual finders. It decides
    once, at the first of them, for all of them together: a compiled module may use another's C types, so a
    compiled scheduler never runs beside a Python cache or the reverse."""

    def __init__(self):
        self.manifest = _manifest()
        self.decision: tuple[str | None, dict] | None = None  # (why Python runs, or None; module -> extension)

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname not in MODULES or not path:
            return None
        leaf = fullname.rpartition(".")[2]
        d = next((Path(p) for p in path if (Path(p) / f"{leaf}.py").is_file()), None)
        if d is None:
            return None  # not where we look: let the usual machinery report it
        if self.decision is None:
            self.decision = self._decide(d)
        why, exts = self.decision
        _loaded[fullname] = why or "compiled"
        if why is None:
            ext = exts[fullname]
            return spec_from_file_location(fullname, ext, loader=ExtensionFileLoader(fullname, str(ext)))
        py = d / f"{leaf}.py"
        return spec_from_file_location(fullname, py, loader=SourceFileLoader(fullname, str(py)))

    def _decide(self, d: Path) -> tuple[str | None, dict]:
        """(None, extension files) when every module has a current extension module, else (why, {})."""
        if forced_pure():
            return f"{ENV} set", {}
        exts, missing = {}, []
        for m in MODULES:
            leaf = m.rpartition(".")[2]
            ext = next((f for f in (d / (leaf + s) for s in EXTENSION_SUFFIXES) if f.is_file()), None)
            if ext is None:
                missing.append(leaf)
            else:
                exts[m] = ext
        if not exts:
            return "not compiled", {}
        if missing:  # the build could not compile these (and said so): all run as Python
            return f"not compiled: {', '.join(missing)}", {}
        for m, ext in exts.items():
            py = d / f"{m.rpartition('.')[2]}.py"
            entry = self.manifest.get(m)
            if entry is None or entry.get("file") != ext.name:
                _warn(f"{ext.name} is not from this build of blendsim: the step path runs as Python")
                return "compiled modules not from this build", {}
            if entry.get("source_sha256") != source_digest(py):
                _warn(f"{py} changed since it was compiled: the step path runs as Python "
                      "(rebuild: pip install -e .)")
                return f"{py.name} changed since it was compiled", {}
        return None, exts


def _warn(msg: str) -> None:
    global _warned
    if not _warned:  # one line per process, for the first stale module
        _warned = True
        print(f"blendsim: warning: {msg}", file=sys.stderr)


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def status() -> dict:
    """``{"path": "compiled" | "pure Python" | "mixed", "modules": {module: "compiled" or why not}}`` for the
    step-path modules (importing them, so the answer is what a run would use)."""
    import importlib

    for m in MODULES:
        importlib.import_module(m)
    mods = {m: _loaded.get(m, "loaded before blendsim.sim._compiled was installed") for m in MODULES}
    n = sum(v == "compiled" for v in mods.values())
    path = "compiled" if n == len(mods) else "pure Python" if n == 0 else "mixed"
    return {"path": path, "modules": mods}


def describe() -> str:
    """One line: which step path runs, and why when not compiled."""
    s = status()
    n = sum(v == "compiled" for v in s["modules"].values())
    if s["path"] == "compiled":
        return f"step path: compiled (Cython, {n} modules)"
    reasons = sorted({v for v in s["modules"].values() if v != "compiled"})
    return f"step path: {s['path']} ({n} of {len(s['modules'])} modules compiled; {'; '.join(reasons)})"
