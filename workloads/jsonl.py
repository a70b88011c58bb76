"""Reading a JSONL file line by line, for the loaders of JSONL traces (``loaders.load_jsonl`` and the
block-hash formats of ``hashed``): both read through here, so neither loader module imports the other's
helpers."""

from __future__ import annotations

from pathlib import Path

from blendsim.sim.errors import UserError


def jsonl_lines(path: Path):
    """(line number, text) of each non-blank line of a UTF-8 JSONL file (a byte-order mark is allowed, as
    for CSVs); a missing, unreadable or undecodable file ends in one line naming it."""
    try:
        fh = path.open("r", encoding="utf-8-sig")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: cannot read (it is a directory, not a JSONL file)") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    with fh:
        try:
            for lineno, line in enumerate(fh, start=1):
                if line.strip():
                    yield lineno, line
        except UnicodeDecodeError:
            raise UserError(f"{path}: not a UTF-8 text file (undecodable bytes)") from None


__all__ = ["jsonl_lines"]
