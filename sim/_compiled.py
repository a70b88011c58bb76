"""Which step path runs: the Cython-compiled modules, or their pure-Python sources.

The per-step modules in :data:`MODULES` are plain Python, and the Python is the reference. ``pip install``
also compiles them with Cython where it can (``setup.py``): an extension module beside each ``.py``, with
the digest of the source it was built from recorded in ``_compiled_manifest.json``. :func:`install` (run
when ``blendsim.sim`` is first imported) puts a finder first on ``sys.meta_path`` that decides, module by module:

* ``BLENDSIM_PURE_PYTHON`` set (not ``0``): the ``.py``;
* an extension module built from the source as it is now (the digest matches): the extension module;
* otherwise the ``.py`` -- and when an extension module exists but its source changed since it was built (an
  edit in an editable install), one warning line on stderr says so, instead of the old build silently
  shadowing the edit.

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
    """Meta-path finder for :data:`MODULES` only; every other import is left to the usual finders."""

    def __init__(self):
        self.manifest = _manifest()

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname not in MODULES or not path:
            return None
        leaf = fullname.rpartition(".")[2]
        for d in path:
            py = Path(d) / f"{leaf}.py"
            if py.is_file():
                break
        else:
            return None  # not where we look: let the usual machinery report it
        ext = next((p for p in (py.with_name(leaf + s) for s in EXTENSION_SUFFIXES) if p.is_file()), None)
        why = self._why_python(fullname, py, ext)
        if why is None:
            _loaded[fullname] = "compiled"
            return spec_from_file_location(fullname, ext, loader=ExtensionFileLoader(fullname, str(ext)))
        _loaded[fullname] = why
        return spec_from_file_location(fullname, py, loader=SourceFileLoader(fullname, str(py)))

    def _why_python(self, fullname: str, py: Path, ext: Path | None) -> str | None:
        """None when the extension module may run, else why the Python source runs instead."""
        if forced_pure():
            return f"{ENV} set"
        if ext is None:
            return "not compiled"
        entry = self.manifest.get(fullname)
        if entry is None or entry.get("file") != ext.name:
            _warn(f"{ext.name} is not from this build of blendsim: running {py.name} as Python")
            return "compiled module not in the build manifest"
        if entry.get("source_sha256") != source_digest(py):
            _warn(f"{py} changed since it was compiled: running it as Python (rebuild: pip install -e .)")
            return "source changed since it was compiled"
        return None


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
    mods = {m: _loaded.get(m, "loaded before blendsim._compiled was installed") for m in MODULES}
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
