"""The sweep directory on disk: its marker file, finished cells, and atomic installs.

Everything a sweep writes appears atomically: a trace file is renamed into place, a run directory
(``write_run``'s files plus ``cell.json``) is built in a hidden temporary folder beside its final
place and renamed there. A killed sweep therefore leaves finished cells intact, unfinished cells
absent, and at most some hidden ``.name.*`` temporaries, which the next sweep removes.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from blendsim.sim.errors import UserError
from blendsim.sim.io import MANIFEST, add_to_manifest, check_own_files, read_json, write_json
from blendsim.sim.io import staging_dir as io_staging_dir

MARKER = "sweep.json"
SCHEMA = 1


def check_sweep_dir(sweep_dir: Path, spec, resume: bool) -> dict | None:
    """Refuse a path that is no sweep directory, or a sweep made with other settings (unless
    ``resume`` is off). Returns the existing sweep.json, if any. Changes nothing on disk."""
    d = Path(sweep_dir)
    marker = d / MARKER
    if d.exists() and not d.is_dir():
        raise UserError(f"{d}: exists and is not a directory; choose another -o")
    if d.exists() and any(d.iterdir()) and not marker.exists():
        raise UserError(f"{d}: exists and is not a blendsim sweep directory (no {MARKER}); choose another -o")
    old = read_marker(d) if marker.exists() else None
    new = _jsonable(spec.settings())
    if old is not None and resume and old["settings"] != new:
        was = old["settings"]
        keys = [k for k in sorted(set(new) | set(was)) if was.get(k) != new.get(k)]
        if keys == ["fixed_trace"] and not (was.get("fixed_trace") and new.get("fixed_trace")):
            # the models or GPUs listed changed the default: say which flag keeps the folder's
            there = (f"one trace per grid point, made for {was['fixed_trace']} (--fixed-trace)" if was.get("fixed_trace")
                     else "a trace per grid point, model and GPU (--trace-per-model)")
            flag = "--fixed-trace" if was.get("fixed_trace") else "--trace-per-model"
            raise UserError(f"{d}: its cells ran {there}; this sweep's --models/--hardware make the other the default: "
                            f"add {flag} to resume it (its finished cells are kept), or use another -o")
        if "simulator" in keys:  # made by another blendsim (or before folders recorded theirs)
            raise UserError(f"{d}: its cells were simulated by another version of blendsim (its simulator, policies or "
                            f"trace code differ), and a table of both versions' figures would compare neither; use "
                            f"another -o, or --no-resume to start over (which removes its finished cells)")
        diff = "; ".join(f"{k}: {_shown(was.get(k))} there, {_shown(new.get(k))} now" for k in keys)
        raise UserError(f"{d}: was swept with other settings ({diff}); use another -o, or --no-resume to "
                        f"start over (which removes its finished cells)")
    return old


def _shown(v) -> str:
    """A sweep setting in a mismatch message: ``None`` (not given) as "the default"."""
    return "the default" if v is None else repr(v)


def open_sweep_dir(sweep_dir: Path, spec, resume: bool) -> dict:
    """Create or reopen ``sweep_dir`` for ``spec``; return the sweep.json written.

    A reopened sweep must have been made with the same settings (recipe, requests, mode, engine,
    seed, recipe options); its grid, policies, models and hardware may grow. ``resume=False`` starts
    over: earlier cells, traces and results are removed.
    """
    d = Path(sweep_dir)
    old = check_sweep_dir(d, spec, resume)
    if old is not None and not resume:
        _check_removable(d)
        for sub in ("runs", "traces"):
            shutil.rmtree(d / sub, ignore_errors=True)
        for f in ("results.parquet", "failures.json"):
            (d / f).unlink(missing_ok=True)
        old = None
    grid = {"densities": list(spec.densities), "sharing": list(spec.sharing), "policies": list(spec.policies),
            "models": [spec.model_names.get(m, m) for m in spec.models], "hardware": list(spec.hardware)}
    if old is not None:  # union, so the marker describes every cell the directory may hold
        grid = {k: _union(old["grid"].get(k, []), v, sort=k in ("densities", "sharing", "models"))
                for k, v in grid.items()}
    doc = {"schema_version": SCHEMA, "kind": "blendsim-sweep", "settings": _jsonable(spec.settings()), "grid": grid}
    write_json(d / MARKER, doc)
    clean_stale(d)
    return doc


def _check_removable(d: Path) -> None:
    """Fail, with one line, if starting over would remove what the sweep did not write: under runs/ anything
    outside its recorded run folders (or unrecorded inside one), under traces/ anything but its trace files."""
    foreign = []
    temps = _own_temporaries(d)

    def temporary(p: Path) -> bool:  # a killed sweep's own leftovers go with the rest
        return any(t == p or t in p.parents for t in temps)

    runs = d / "runs"
    if runs.exists():
        recorded = [m.parent for m in runs.rglob(MANIFEST) if not temporary(m)]
        for p in sorted(runs.rglob("*")):
            if temporary(p):
                continue
            if p.is_dir() and not p.is_symlink():
                if not any(r == p or r in p.parents or p in r.parents for r in recorded):
                    foreign.append(p)
            elif not any(r in p.parents for r in recorded):
                foreign.append(p)
        for r in recorded:
            try:
                check_own_files(r)
            except UserError as e:
                raise UserError(f"{e}; --no-resume removes only what the sweep wrote: nothing was removed") from None
    traces = d / "traces"
    if traces.exists():
        foreign += [p for p in sorted(traces.rglob("*"))
                    if not p.is_dir() and not temporary(p) and not _own_trace(p.relative_to(traces))]
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise UserError(f"{d}: --no-resume would remove what the sweep did not write "
                        f"({', '.join(str(p.relative_to(d)) for p in foreign[:3])}{more}); move it out first")


def read_marker(sweep_dir: Path) -> dict:
    doc = read_json(Path(sweep_dir) / MARKER, "sweep marker")
    if not isinstance(doc, dict) or doc.get("kind") != "blendsim-sweep" or "settings" not in doc:
        raise UserError(f"{Path(sweep_dir) / MARKER}: not a blendsim sweep marker")
    if int(doc.get("schema_version", 0)) > SCHEMA:
        raise UserError(f"{Path(sweep_dir) / MARKER}: sweep schema {doc['schema_version']} is newer than "
                        f"this blendsim ({SCHEMA})")
    return doc


# A trace the sweep writes: traces/<model>/<hardware>/d<density>-s<sharing>[-seed<k>].parquet (grid.Workload)
_TRACE = re.compile(r"d[0-9.e+-]+-s[0-9.e+-]+(-seed\d+)?\.parquet")
# What a killed sweep leaves: tempfile's names for its staging folders and files, ``.NAME.XXXXXXXX`` (sim.io
# staging_dir, ``.NAME.old.XXXXXXXX`` when it replaced a run) and ``.NAME.XXXXXXXX.tmp`` (sim.io atomic_path)
_TEMP_DIR = re.compile(r"\..+\.[a-z0-9_]{8}")
_SPILL_DIR = re.compile(r"\.blendsim-steps-[a-z0-9_]{8}")  # sim.engine.StepLog's spill folder
_TEMP_FILE = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp|\.blendsim-probe\.[a-z0-9_]{8}")  # + sim.io's writability probe
_RUN_FILES = {"summary.json", "steps.parquet", "requests.parquet", "schedule.parquet", "cell.json", MANIFEST}


def _own_trace(rel: Path) -> bool:
    return len(rel.parts) == 3 and bool(_TRACE.fullmatch(rel.name))


def _own_temporary(p: Path) -> bool:
    """A staging file or folder of the sweep's own: named as tempfile names them, and a folder holding nothing but
    what the sweep stages there (a run's own files in ``run/``, a replaced run in ``x/``, a running cell's spilled
    step log in ``.blendsim-steps-*/``, their temporaries)."""
    from blendsim.sim.engine import StepLog

    if p.is_symlink():
        return False
    if p.is_file():
        return bool(_TEMP_FILE.fullmatch(p.name))
    if not (p.is_dir() and _TEMP_DIR.fullmatch(p.name)):
        return False
    for q in p.rglob("*"):
        if q.is_symlink():
            return False
        if q.is_dir():
            if not (q.name in ("run", "x") or _TEMP_DIR.fullmatch(q.name) or _SPILL_DIR.fullmatch(q.name)):
                return False
        elif not (q.name in _RUN_FILES or _TEMP_FILE.fullmatch(q.name)
                  or (_SPILL_DIR.fullmatch(q.parent.name) and q.name in StepLog.COLUMNS)):
            return False
    return True


def _own_temporaries(sweep_dir: Path) -> list[Path]:
    """The hidden staging leftovers of the sweep's own under runs/ and traces/ (:func:`_own_temporary`)."""
    d = Path(sweep_dir)
    return [p for sub in ("runs", "traces") if (d / sub).exists() for p in sorted((d / sub).rglob(".*"))
            if _own_temporary(p)]


def clean_stale(sweep_dir: Path) -> int:
    """Remove the hidden temporaries a killed sweep left under runs/ and traces/ (:func:`_own_temporaries`); any
    other hidden file or folder there is the user's and stays."""
    n = 0
    for p in _own_temporaries(sweep_dir):
        if p.exists():  # a temporary inside another, already removed
            shutil.rmtree(p) if p.is_dir() else p.unlink()
            n += 1
    return n


def cell_done(sweep_dir: Path, cell, policy_sha: dict | None = None) -> bool:
    """True iff the cell's run directory holds a complete summary.json (and its cell.json), made by the policy's
    current source (``policy_sha``: :func:`policy_sha256` per policy spec, computed here when not given)."""
    d = Path(sweep_dir) / cell.run_relpath()
    try:
        s = json.loads((d / "summary.json").read_text())
        c = json.loads((d / "cell.json").read_text())
    except (OSError, ValueError):
        return False
    from blendsim.policies.option import format_policy

    # a run records its policy's name and the options given apart (summary policy, policy_options): together, the
    # cell's spec as check_spec wrote it (dfs[router=contiguous])
    ran = format_policy(str(s.get("policy")), s.get("policy_options") or {}) if isinstance(s, dict) else None
    return isinstance(s, dict) and "throughput_tok_s" in s and ran == cell.policy and \
        isinstance(c, dict) and c.get("policy") == cell.policy and \
        s.get("policy_sha256") == (policy_sha[cell.policy] if policy_sha is not None else policy_sha256(cell.policy))


def policy_sha256(spec: str) -> str | None:
    """The SHA-256 of the file a ``path.py:Class`` policy comes from (None for blendsim's own), as a run records it
    (``policy_sha256``): a cell made before its policy file was edited runs again."""
    from blendsim.policies.registry import resolve_policy
    from blendsim.policy_spec import split_policy

    try:
        return resolve_policy(split_policy(spec)[0]).sha256
    except UserError:
        return "unresolved"  # the sweep itself reports it


def install_run(src: Path, sweep_dir: Path, cell) -> Path:
    """Add cell.json to the run directory ``src`` (beside the final place) and rename it into place."""
    final = Path(sweep_dir) / cell.run_relpath()
    write_json(src / "cell.json", cell.label())
    add_to_manifest(src, ["cell.json"])
    if final.exists():  # an unfinished or redone cell: only ever a run folder holding nothing but its own files
        check_own_files(final)
        shutil.rmtree(final)
    src.rename(final)
    return final


def staging_dir(sweep_dir: Path, cell) -> Path:
    """A hidden, empty temporary folder beside the cell's final run directory."""
    return io_staging_dir(Path(sweep_dir) / cell.run_relpath())


def install_files(files: dict[str, bytes], sweep_dir: Path, cell) -> Path:
    """Write a run directory shipped as bytes (a remote worker's) and install it atomically."""
    tmp = staging_dir(sweep_dir, cell)
    try:
        run = tmp / "run"
        run.mkdir()
        for name, data in sorted(files.items()):
            (run / Path(name).name).write_bytes(data)
        out = install_run(run, sweep_dir, cell)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _union(a: list, b: list, sort: bool) -> list:
    out = list(dict.fromkeys([*a, *b]))
    return sorted(out) if sort else out


def _jsonable(obj):
    return json.loads(json.dumps(obj, sort_keys=True))


__all__ = ["MARKER", "cell_done", "policy_sha256", "check_sweep_dir", "clean_stale", "install_files", "install_run", "open_sweep_dir", "read_marker",
           "staging_dir"]
