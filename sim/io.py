"""Small file helpers: atomic writes, so a failed run never leaves half a file behind."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from blendsim.sim.errors import UserError


def umask() -> int:
    """The process's file-mode creation mask (read without changing it where Linux allows)."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_output_file(path: str | Path, inputs=()) -> Path:
    """Fail now, with one line, when ``path`` cannot become a file (a folder is there, a parent is a file, the
    place is read-only, or it is one of the ``inputs``); before the work whose result it will hold."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a folder; give a file name to write")
    for i in inputs or ():
        if i is not None and Path(i).exists() and path.exists() and path.resolve() == Path(i).resolve():
            raise UserError(f"{path}: is the input {i}; give the output another name")
    probe = path.parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise UserError(f"{path}: {probe} is not a folder")
    try:  # a read-only place fails now, not after the work
        fd, tmp = tempfile.mkstemp(prefix=".blendsim-probe.", dir=probe)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise UserError(f"{path}: cannot write there ({e.strerror or e})") from None
    return path


@contextlib.contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path beside ``path``; rename it into place only if the block succeeds.

    The file gets the mode any new file gets (0666 less the umask), not mkstemp's private 0600.
    """
    path = check_output_file(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise UserError(f"{path}: cannot write there ({e.strerror or e})") from None
    os.close(fd)
    try:
        yield Path(tmp)
        try:
            os.chmod(tmp, 0o666 & ~umask())
            os.replace(tmp, path)
        except OSError as e:
            raise UserError(f"{path}: cannot write ({e.strerror or e})") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def staging_dir(final: str | Path) -> Path:
    """A new hidden folder beside ``final`` (its parents created) to fill and then rename into place."""
    final = Path(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
        os.chmod(tmp, 0o777 & ~umask())  # mkdtemp's 0700 would hide the results from their readers
        return tmp
    except OSError as e:
        raise UserError(f"{final}: cannot write there ({e.strerror or e})") from None


def _contains(outer: Path, inner: Path) -> bool:
    return outer == inner or outer in inner.parents


def refuse_unsafe_dir(final: str | Path, inputs=()) -> Path:
    """Refuse, with one line, an output folder whose replacement would take what the command did not make:
    the current folder or one above it (``-o .``), or an input file or a folder holding one."""
    final = Path(final)
    where = final.resolve()
    cwd = Path.cwd().resolve()
    if _contains(where, cwd):
        what = "the current folder" if where == cwd else f"a folder above the current one ({cwd})"
        raise UserError(f"{final}: is {what}; give the name of a new folder to write")
    for i in inputs or ():
        if i is not None and _contains(where, Path(i).resolve()):
            raise UserError(f"{final}: holds the input {i}; give the name of a new folder to write")
    return final


def _is_own(folder: Path, own) -> bool:
    if own is None:
        return False
    if callable(own):
        return bool(own(folder))
    return all((folder / name).exists() for name in ([own] if isinstance(own, str) else own))


# Every output folder blendsim writes records the files it put there, so that a later command replaces the
# folder only when nothing else is in it: a marker file alone (index.html, summary.json) is no proof, another
# tool's folder may hold one, and a user may add notes or figures to a run or report folder.
MANIFEST = "blendsim-files.json"


def _entries(folder: Path) -> tuple[list[str], list[str]]:
    """Every file (or link) under ``folder`` and every folder, as relative POSIX paths, the record excluded."""
    files, dirs = [], []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_dir() and not p.is_symlink():
            dirs.append(rel)
        elif rel != MANIFEST:
            files.append(rel)
    return files, dirs


def write_manifest(folder: str | Path, kind: str) -> Path:
    """Record every file now under ``folder`` as blendsim's (``kind``: what wrote it)."""
    folder = Path(folder)
    files, _ = _entries(folder)
    return write_json(folder / MANIFEST, {"kind": kind, "files": files})


def add_to_manifest(folder: str | Path, names) -> None:
    """Add files blendsim wrote into an already recorded ``folder`` (relative names) to its record."""
    folder = Path(folder)
    doc = read_json(folder / MANIFEST, "blendsim file record")
    write_json(folder / MANIFEST, {**doc, "files": sorted({*doc.get("files", []), *names})})


def foreign_entries(folder: str | Path) -> list[str] | None:
    """What under ``folder`` blendsim's record does not list (files, and folders holding no recorded file),
    or ``None`` when the folder has no readable record."""
    folder = Path(folder)
    try:
        doc = json.loads((folder / MANIFEST).read_text())
        mine = set(doc["files"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    files, dirs = _entries(folder)
    parents = {q.as_posix() for f in mine for q in Path(f).parents if q != Path(".")}
    return [f for f in files if f not in mine] + [d for d in dirs if d not in parents]


def check_own_file(path: str | Path, own, what: str) -> Path:
    """Fail, with one line, when ``path`` exists and ``own(path)`` says it is no ``what``: a command replaces only a
    file of its own kind, never a user's."""
    path = Path(path)
    if path.exists() and not path.is_dir() and not own(path):
        raise UserError(f"{path}: exists and is not a {what}; choose another name (nothing was replaced)")
    return path


def json_value(path: str | Path, *keys):
    """The value at ``keys`` in the JSON file ``path``; None when the file is unreadable or has no such value."""
    try:
        node = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    for k in keys:
        node = node.get(k) if isinstance(node, dict) else None
    return node


def check_own_files(folder: str | Path) -> None:
    """Fail, with one line, unless every entry of ``folder`` is one blendsim recorded writing there."""
    folder = Path(folder)
    extra = foreign_entries(folder)
    if extra is None:
        raise UserError(f"{folder}: has no record of what blendsim wrote there ({MANIFEST}: another tool's "
                        f"folder, or an older blendsim's); choose another -o, or move it away")
    if extra:
        more = f" and {len(extra) - 3} more" if len(extra) > 3 else ""
        raise UserError(f"{folder}: holds what blendsim did not write ({', '.join(extra[:3])}{more}); move "
                        f"{'it' if len(extra) == 1 else 'them'} out, or choose another -o")


def check_output_dir(final: str | Path, what: str, own=None, inputs=()) -> Path:
    """Fail now, with one line, unless ``final`` can become an output folder of kind ``what``: absent, empty,
    or one ``own`` recognises (a marker file name, names, or a predicate) -- never the current folder, one
    above it, or a folder holding an input (:func:`refuse_unsafe_dir`), never a file, never one holding anything
    its record (:data:`MANIFEST`) does not list; and writable."""
    final = refuse_unsafe_dir(final, inputs)
    if final.exists() or final.is_symlink():
        if not final.is_dir():
            raise UserError(f"{final}: exists and is not a folder; give the name of a folder to write")
        if any(final.iterdir()):
            if not _is_own(final, own):
                raise UserError(f"{final}: exists and is not a {what}; choose another -o")
            check_own_files(final)
    staging_dir(final).rmdir()
    return final


@contextlib.contextmanager
def atomic_dir(final: str | Path, own=None, what: str = "blendsim output folder"):
    """Yield an empty staging folder beside ``final``; it replaces ``final`` only if the block succeeds, and is
    removed if the block fails. An earlier ``final`` is replaced only when it is empty or of the writer's own
    kind (``own``: see :func:`check_output_dir`) and holds only what blendsim recorded writing there (the staging
    folder's files are recorded in :data:`MANIFEST` before it moves into place), never when it is the current
    folder, one above it or not a folder: nothing the command did not make is removed."""
    import shutil

    final = check_output_dir(final, what, own)
    tmp = staging_dir(final)
    try:
        yield tmp
        write_manifest(tmp, what)
        old = None
        if final.exists() and final.is_dir() and any(final.iterdir()):
            check_own_files(final)  # again: the user may have added something while the command ran
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old.", dir=final.parent))
            try:
                final.rename(old / "x")
            except OSError:  # a folder that cannot move: a mount point (docker -v, NFS), or immutable
                old.rmdir()
                try:
                    for entry in list(final.iterdir()):  # blendsim's own output only (checked above): replaced here
                        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
                except OSError as e:
                    raise UserError(f"{final}: cannot write ({e.strerror or e})") from None
                _fill(final, tmp)  # the output goes into it, file by file
                return
        try:
            tmp.rename(final)
        except OSError as e:
            if old is not None:
                (old / "x").rename(final)
            raise UserError(f"{final}: cannot write ({e.strerror or e})") from None
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fill(final: Path, tmp: Path) -> None:
    """Move the staging folder's entries into the empty folder ``final`` (which cannot itself be replaced), the
    manifest last, so a folder with a manifest is complete; then remove the staging folder."""
    import shutil

    entries = sorted(tmp.iterdir(), key=lambda p: p.name == MANIFEST)
    try:
        for entry in entries:  # shutil.move: a mount point is another file system, where a rename cannot go
            shutil.move(str(entry), str(final / entry.name))
    except OSError as e:
        raise UserError(f"{final}: cannot write ({e.strerror or e})") from None
    tmp.rmdir()


def check_writable(final: str | Path) -> Path:
    """Fail now, with one line, if ``final`` could not be written later (before hours of work)."""
    refuse_unsafe_dir(final)
    staging_dir(final).rmdir()
    return Path(final)


def write_json(path: str | Path, obj) -> Path:
    """Write ``obj`` as sorted, indented JSON, atomically (equal objects give equal bytes)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, allow_nan=False, default=_default) + "\n")
    return Path(path)


def _default(o):
    import numpy as np

    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_parquet(path: Path, what: str, missing: str | None = None):
    """The whole Parquet file as a pyarrow Table, or one line: ``missing`` when there is no file
    (default "no such <what>"), "not a readable <what>" when it is no Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.exists():
        raise UserError(f"{path}: {missing or 'no such ' + what}")
    try:
        # NOTE: ParquetFile rather than read_table: read_table imports pandas (a quarter of a second of
        # start-up for every command)
        return pq.ParquetFile(path).read()
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path}: not a readable {what} ({str(e).splitlines()[0]})") from None


# Compressed inputs: the stdlib decompresses these by the name's last suffix, and every reader and every check of
# a file reads what it gives (pandas and pyarrow would guess by the name on their own, and read more kinds than
# the checks could follow).
_DECOMPRESS = {".gz": ("gzip", "gzip"), ".bz2": ("bz2", "bzip2"), ".xz": ("lzma", "xz")}
_NOT_READ = (".zip", ".zst", ".zstd", ".tar", ".tgz", ".tbz", ".tbz2", ".txz", ".7z", ".rar", ".lz4", ".lzma", ".lz",
             ".br", ".z", ".sz", ".snappy")


def compressed_suffix(path: Path, what: str = "") -> str | None:
    """The suffix of a compressed ``path`` that blendsim reads (.gz, .bz2, .xz), None for a plain file; one line for a
    name that says another compression or an archive (.zip, .zst, .tar.gz, ...)."""
    suffixes = [s.lower() for s in Path(path).suffixes]
    last = suffixes[-1] if suffixes else ""
    if last in _NOT_READ or (last in _DECOMPRESS and len(suffixes) > 1 and suffixes[-2] == ".tar"):
        kind = ".tar" + last if last in _DECOMPRESS else last
        raise UserError(f"{what}{path}: a {kind} file is not read (blendsim decompresses .gz, .bz2 and .xz files "
                        "only); decompress it first")
    return last if last in _DECOMPRESS else None


def plain_suffix(path: str | Path) -> str:
    """``path``'s suffix (lower case) once a compression suffix (.gz, .bz2, .xz) is taken off: ``.csv`` for
    ``x.csv.gz``."""
    path = Path(path)
    last = path.suffix.lower()
    return Path(path.stem).suffix.lower() if last in _DECOMPRESS else last


def plain_stem(path: str | Path) -> str:
    """``path``'s stem once a compression suffix (.gz, .bz2, .xz) is taken off: ``x`` for ``x.csv.gz``, as for
    ``x.csv`` (a loaded trace is named by it)."""
    path = Path(path)
    return Path(path.stem).stem if path.suffix.lower() in _DECOMPRESS else path.stem


def decompress_errors() -> tuple:
    """What reading a compressed file that is not what its name says raises (gzip, bz2, lzma, zlib)."""
    import lzma
    import zlib

    return (OSError, EOFError, lzma.LZMAError, zlib.error)


def not_compressed(path: Path, e: BaseException, what: str = "") -> UserError:
    """The one line for a file that its compression suffix misnames (or that was cut off)."""
    suffix = Path(path).suffix.lower()
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return UserError(f"{what}{path}: not readable as {_DECOMPRESS[suffix][1]} data, as its {suffix} name says "
                     f"({reason}); decompress or rename it")


def open_input(path: str | Path, what: str = ""):
    """``path`` opened for reading bytes, decompressed when its name ends in .gz, .bz2 or .xz (one line for another
    compression suffix). Opening errors (no file, a folder) raise as OSError; a misnamed file's raise as it is read
    (:func:`decompress_errors`, :func:`not_compressed`)."""
    import importlib

    path = Path(path)
    suffix = compressed_suffix(path, what)
    if suffix is None:
        return path.open("rb")
    return importlib.import_module(_DECOMPRESS[suffix][0]).open(path, "rb")


def read_input(path: str | Path, what: str = ""):
    """What a CSV reader and every check of the file read: ``path`` itself for a plain file, the decompressed bytes
    of a .gz, .bz2 or .xz file (one line when it is not what its name says; another compression suffix is refused).
    Opening errors (no file, a folder) raise as OSError."""
    path = Path(path)
    if compressed_suffix(path, what) is None:
        return path
    with open_input(path, what) as fh:
        try:
            return fh.read()
        except decompress_errors() as e:
            raise not_compressed(path, e, what) from None


def input_stream(source):
    """A binary stream over :func:`read_input`'s result (a path, or the decompressed bytes)."""
    import io

    return io.BytesIO(source) if isinstance(source, bytes) else Path(source).open("rb")


def check_csv_aligned(path: Path, df, what: str = "", source=None) -> None:
    """UserError when pandas read ``path``'s data rows with more fields than its header: it then takes the first
    column as an index and shifts every column by one, silently. Names the first such row (a trailing comma on
    every row does it too). ``source``: what the reader read (:func:`read_input`), else ``path`` read again, through
    its decompressor when its name says it is compressed: the text pandas read, not its compressed bytes."""
    import csv
    import io

    import pandas as pd

    if isinstance(df.index, pd.RangeIndex):
        return
    source = read_input(path, what) if source is None else source
    with io.TextIOWrapper(input_stream(source), encoding="utf-8", errors="replace", newline="") as fh:
        rows = csv.reader(fh)
        n = len(next(rows, []))
        i = 0
        for r in rows:
            if not r or (len(r) == 1 and not r[0].strip()):
                continue  # a blank line: pandas skips it, and data rows are counted without them
            i += 1
            if len(r) > n:
                trailing = " (a trailing comma?)" if len(r) == n + 1 and not r[-1].strip() else ""
                raise UserError(f"{what}{path}: data row {i} has {len(r)} fields{trailing}, the header {n}")
    raise UserError(f"{what}{path}: its data rows have more fields than its header")


class DuplicateKey(ValueError):
    """A JSON object naming one key twice (Python's json keeps the last silently)."""


def _unique_keys(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise DuplicateKey(f"key {key!r} appears twice in one object")
    return out


def json_column(e, line: str) -> int:
    """The 1-based column of JSON error ``e`` on the one-record ``line`` it parsed: a record cut off mid-write
    ends at its line's end, where the parser (past the newline) would say column 1 of the next line."""
    return min(e.pos, len(line.rstrip("\r\n"))) + 1


def loads_strict(text: str):
    """``json.loads``, refusing an object that names a key twice (:class:`DuplicateKey`, a ValueError): a file
    where one field is given twice is a mistake, not a choice of the last value. About twice the parse time of
    plain ``json.loads``; the block-hash trace loaders, which read millions of small lines, run it only on a line
    whose count of ``:`` exceeds its object's keys (a key given twice, or a colon inside a string, a nested
    object)."""
    return json.loads(text, object_pairs_hook=_unique_keys)


def read_json(path: str | Path, what: str = "file") -> dict:
    path = Path(path)
    try:
        return loads_strict(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: no such {what}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read {what}: {e}") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: corrupt {what}: invalid JSON at line {e.lineno}, column {e.colno}") from None
    except (RecursionError, ValueError) as e:  # nesting too deep; an integer of over 4,300 digits
        raise UserError(f"{path}: corrupt {what}: {str(e).splitlines()[0][:120]}") from None
