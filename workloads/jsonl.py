"""Reading a JSONL file line by line, for the loaders of JSONL traces (``loaders.load_jsonl`` and the
block-hash formats of ``hashed``, and ``--output-from`` of a JSONL file): all read through here, so neither
loader module imports the other's helpers."""

from __future__ import annotations

import json
from pathlib import Path

from blendsim.sim.errors import UserError


def _undecodable_line(path: Path, compressed: bool, what: str) -> int | None:
    """The first line of ``path`` that is not UTF-8 (None if none is found)."""
    from blendsim.sim.io import open_input

    try:
        with (open_input(path, what) if compressed else path.open("rb")) as fh:
            for i, raw in enumerate(fh, start=1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError:
                    return i
    except (OSError, UserError, EOFError):
        return None
    return None


def jsonl_lines(path: Path, what: str = ""):
    """(line number, text) of each non-blank line of a UTF-8 JSONL file (a byte-order mark is allowed, as
    for CSVs; a ``.gz``, ``.bz2`` or ``.xz`` file is decompressed, as a CSV is); a missing, unreadable,
    undecodable or misnamed compressed file ends in one line naming it (``what``: a prefix, such as
    ``--output-from ``)."""
    import io

    from blendsim.sim.io import compressed_suffix, decompress_errors, not_compressed, open_input

    path = Path(path)
    compressed = compressed_suffix(path, what) is not None
    try:
        fh = io.TextIOWrapper(open_input(path, what), encoding="utf-8-sig") if compressed else \
            path.open("r", encoding="utf-8-sig")
    except FileNotFoundError:
        raise UserError(f"{what}{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{what}{path}: cannot read (it is a directory, not a JSONL file)") from None
    except OSError as e:
        raise UserError(f"{what}{path}: cannot read ({e.strerror or e})") from None
    with fh:
        lineno = 0
        try:
            for lineno, line in enumerate(fh, start=1):
                if line.strip():
                    yield lineno, line
        except UnicodeDecodeError:  # text is decoded a block at a time: find the line holding the bytes
            bad = _undecodable_line(path, compressed, what) or lineno + 1
            raise UserError(f"{what}{path}: not a UTF-8 text file (undecodable bytes on line {bad})") from None
        except decompress_errors() as e:
            if not compressed:
                raise UserError(f"{what}{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
            raise not_compressed(path, e, what) from None


def json_object(where: str, line: str, loads=json.loads) -> dict:
    """``line`` parsed by ``loads`` as one JSON object; else one line at ``where`` (``file: line N``): invalid JSON
    (with its column), JSON Python cannot hold (an integer of over 4,300 digits, nesting too deep, a key given
    twice to a strict ``loads``), or a value that is not an object."""
    try:
        rec = loads(line)
    except json.JSONDecodeError as e:
        from blendsim.sim.io import json_column

        raise UserError(f"{where}: not valid JSON ({e.msg} at column {json_column(e, line)})") from None
    except (ValueError, RecursionError) as e:  # an integer of over 4,300 digits; nesting too deep; a key twice
        raise UserError(f"{where}: not usable JSON ({str(e).splitlines()[0][:80]})") from None
    if not isinstance(rec, dict):
        raise UserError(f"{where}: expected a JSON object, found {type(rec).__name__}")
    return rec


def check_text(where: str, key: str, text: str) -> str:
    """``text`` (a string field that becomes a trace's string column), or one line when it holds an unpaired
    surrogate: JSON's ``"\\ud800"`` escape, legal JSON syntax but no Unicode character, that no UTF-8 file can
    hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UserError(f"{where}, field {key}: contains an unpaired surrogate (\\u{ord(text[e.start]):04x}); not "
                        "valid Unicode") from None
    return text


def short_repr(v) -> str:
    """``repr(v)``, cut to 60 characters (a 4,000-digit number or a long list stays one short line)."""
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


__all__ = ["check_text", "json_object", "jsonl_lines", "short_repr"]
