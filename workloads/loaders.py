"""Loaders for the request traces users have: BurstGPT, Azure LLM inference, Vidur/Splitwise, JSONL.

Each returns a :class:`~workloads.trace.Trace`. Traces without prompt content get one unique prompt
per request (no false sharing). Any bad input stops with one :class:`UserError` line naming the file,
the row and the field. CSV rows are counted as *data rows*: 1-based, the header excluded, blank lines
skipped; JSONL lines are *line numbers* of the file, 1-based. A file named ``.gz``, ``.bz2`` or ``.xz`` is
decompressed (the standard library's gzip, bz2, lzma), and the readers and every check read the same
decompressed text; another compression suffix (``.zip``, ``.zst``, ``.tar.gz``, ...) is refused with one line.

BurstGPT marks failed requests with 0 response tokens (its README); they are skipped and counted in
``trace.meta["skipped_failed"]`` (the CLI prints the count): every failed row of the file, or, where ``limit`` stopped
the reading at its N-th request, the failed rows before that one. ``limit`` keeps the first N requests that are
loaded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from blendsim.sim.errors import UserError
from blendsim.sim.io import check_csv_aligned, input_stream, loads_strict, plain_stem, read_input
from blendsim.workloads.jsonl import check_text, json_object, jsonl_lines, short_repr
from blendsim.workloads.trace import MAX_TIME_S, MAX_TOKENS, TOO_LATE, TOO_LONG

FORMATS = ("burstgpt", "azure", "vidur", "jsonl", "mooncake", "hashed", "trace")


def load(path: str | Path, fmt: str, limit: int | None = None, **hashed_options):
    """Load ``path`` in format ``fmt`` (one of :data:`FORMATS`); the trace's ``meta["name"]`` is the file's
    stem (``x`` for ``x.csv`` and ``x.csv.gz``). ``mooncake`` and ``hashed`` (block-hash JSONL) take :func:`blendsim.workloads.hashed.load_hashed`'s options."""
    loaders = {"burstgpt": load_burstgpt, "azure": load_azure, "vidur": load_vidur, "jsonl": load_jsonl,
               "trace": load_blendsim}
    if fmt not in loaders and fmt not in ("mooncake", "hashed"):
        raise UserError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be at least 1, got {limit}")
    if fmt in ("mooncake", "hashed"):
        from blendsim.workloads.hashed import load_hashed

        trace = load_hashed(path, fmt, limit=limit, **hashed_options)
    else:
        given = [k for k, v in hashed_options.items() if v is not None]
        if given:
            raise UserError(f"--{given[0].replace('_', '-')} applies to --format mooncake or hashed, not {fmt}")
        trace = loaders[fmt](path, limit)
    trace.meta.setdefault("name", plain_stem(path))
    trace.validate(str(path))  # every loader's checks name the row first; this guards what they build
    return trace


def load_blendsim(path, limit: int | None = None):
    """A blendsim trace (Parquet, as ``workloads synth`` or ``load`` wrote it): re-read so that ``--limit`` and
    ``--max-context`` / ``--long`` can be applied to it."""
    from blendsim.workloads.trace import read_trace

    trace = read_trace(path)
    if limit is None or limit >= trace.n:
        return trace
    out = trace.take(np.arange(limit))
    out.meta = trace.part_meta()
    return out


_ZONE = r"\d:\d{2}(?::\d{2}(?:\.\d*)?)?\s*(?:Z|UTC|[+-]\d{2}(?::?\d{2})?)$"  # a time of day, then a zone


# ---- CSV formats --------------------------------------------------------------------------
def load_burstgpt(path, limit: int | None = None):
    """BurstGPT CSV: ``Timestamp`` (s), ``Request tokens``, ``Response tokens`` (optional ``Model``, ``Total
    tokens``).

    ``Model`` is read as text, by either reader (so ``--limit`` does not change a label): each request's
    source is ``burstgpt/<Model>``, or ``burstgpt`` where the cell is empty. A request's ``Total tokens``, where the
    column is there, must be its request + response tokens, and the timestamps must not go backwards (BurstGPT's
    files are in time order): either is refused, naming the row, as an edited or mismatched file."""
    path = Path(path)
    nrows = None if limit is None else 2 * limit + 1000
    while True:  # with a limit, read only as many rows as the first `limit` successes need
        df = _read_csv(path, ("Timestamp", "Request tokens", "Response tokens"), nrows, text_columns=("Model",))
        resp = _ints(path, df, "Response tokens", minimum=0)
        ok = resp > 0  # failures have 0 response tokens
        rows = np.flatnonzero(ok)
        if nrows is None or len(rows) >= limit or len(df) < nrows:
            break
        nrows *= 4
    if limit is not None:
        rows = rows[:limit]
    if not len(rows):
        raise UserError(f"{path}: no successful requests (every row has 0 Response tokens)")
    sub = df.iloc[rows]
    p = _ints(path, sub, "Request tokens", minimum=1, rows=rows)
    t = _times(path, sub, "Timestamp", rows=rows)
    if "Total tokens" in sub:  # each field's own checks first, then what they say together
        total = _numbers(path, sub, "Total tokens", rows)  # a number (up to twice MAX_TOKENS) equal to the sum
        off = np.flatnonzero(total != p + resp[rows])
        if len(off):
            i = int(off[0])
            _fail(path, rows[i], "Total tokens", f"{_fmt(total[i])} is not Request tokens + Response tokens "
                  f"({p[i]} + {resp[rows[i]]} = {p[i] + resp[rows[i]]})")
    back = np.flatnonzero(np.diff(t) < 0)
    if len(back):
        i = int(back[0]) + 1
        _fail(path, rows[i], "Timestamp", f"{_fmt(t[i])} is before data row {int(rows[i - 1]) + 1}'s {_fmt(t[i - 1])} "
              f"(BurstGPT files are in time order: an edited or merged file; sort it by Timestamp)")
    source = np.full(len(rows), "burstgpt", dtype=object)
    if "Model" in sub:
        import pandas as pd

        # text in both readers (pyarrow told so; pandas reads every column as text), an empty cell ""
        which, names = pd.factorize(sub["Model"].fillna(""), use_na_sentinel=False)
        source = np.array([f"burstgpt/{m}" if m != "" else "burstgpt" for m in names], dtype=object)[which]
    # the failures among the rows read up to the last kept one when --limit stopped the reading there; else all
    skipped = int(np.count_nonzero(~ok[: rows[-1] + 1] if limit is not None and len(rows) == limit else ~ok))
    return _trace(p, resp[rows], t - t.min(), rows, source,
                  {"loader": "burstgpt", "file": str(path), "skipped_failed": skipped, "limit": limit})


def load_azure(path, limit: int | None = None):
    """Azure LLM inference trace CSV: ``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``."""
    import pandas as pd

    path = Path(path)
    df = _read_csv(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), limit, text_columns=("TIMESTAMP",))
    p = _ints(path, df, "ContextTokens", minimum=1)
    d = _ints(path, df, "GeneratedTokens", minimum=1)
    raw = df["TIMESTAMP"].astype(str).str.strip()
    # a time zone on some rows only is ambiguous (local time of where?); offsets that differ are not
    zoned = raw.str.contains(_ZONE, regex=True).to_numpy()
    if zoned.any() and not zoned.all():
        i = int(np.flatnonzero(zoned != zoned[0])[0])
        _fail(path, i, "TIMESTAMP", f"{raw.iloc[i]!r} {'has' if zoned[i] else 'lacks'} a time zone but data row 1 "
              f"{'does' if zoned[0] else 'does not'} (give every row one, or none)")
    ts = pd.to_datetime(raw, format="ISO8601", errors="coerce", utc=bool(zoned[0]))
    # a date alone reads as its midnight: hours off the rows that give a time, in silence
    timeless = np.flatnonzero(~raw.str.contains(r"\d:\d\d", regex=True).to_numpy() & ts.notna().to_numpy())
    if len(timeless):
        _fail(path, timeless[0], "TIMESTAMP", f"{raw.iloc[timeless[0]]!r} is a date without a time of day")
    bad = np.flatnonzero(ts.isna().to_numpy())
    if len(bad):
        _fail(path, bad[0], "TIMESTAMP", f"{raw.iloc[bad[0]]!r} is not a date and time")
    t = (ts - ts.min()).dt.total_seconds().to_numpy()
    late = np.flatnonzero(t > MAX_TIME_S)
    if len(late):
        _fail(path, late[0], "TIMESTAMP", f"{raw.iloc[late[0]]!r} is over {MAX_TIME_S:.0e} s after the first "
              "(MAX_TIME_S)")
    rows = np.arange(len(df))
    return _trace(p, d, t, rows, np.full(len(df), "azure", dtype=object),
                  {"loader": "azure", "file": str(path), "limit": limit})


def load_vidur(path, limit: int | None = None):
    """Vidur / Splitwise processed CSV: ``num_prefill_tokens``, ``num_decode_tokens`` and ``arrived_at`` (s).

    Vidur's length-only traces (no ``arrived_at``) load as offline requests (all at t = 0). Arrival times start at
    the earliest one (t = 0), as the other CSV loaders' and the block-hash loaders' do (a JSONL trace's
    ``arrival_s`` and a blendsim trace's are kept as given): rows out of time order keep their order in the file.
    """
    path = Path(path)
    df = _read_csv(path, ("num_prefill_tokens", "num_decode_tokens"), limit)
    p = _ints(path, df, "num_prefill_tokens", minimum=1)
    d = _ints(path, df, "num_decode_tokens", minimum=1)
    t = np.zeros(len(df))
    if "arrived_at" in df:
        t = _times(path, df, "arrived_at")
        t = t - t.min() if len(t) else t
    return _trace(p, d, t, np.arange(len(df)), np.full(len(df), "vidur", dtype=object),
                  {"loader": "vidur", "file": str(path), "limit": limit, "has_arrivals": "arrived_at" in df})


def _read_csv(path: Path, required: tuple[str, ...], limit: int | None = None, text_columns: tuple[str, ...] = ()):
    """The CSV as a DataFrame; pyarrow's multi-threaded reader first, pandas (all text) to diagnose.
    ``text_columns``: read as text by pyarrow too (the pandas path reads every column as text).

    NOTE: pyarrow reads a 1.4M-row BurstGPT file in ~2 s but reports bad rows without their numbers;
    whenever it cannot parse a file cleanly (or a limit asks for the first rows only) the slower
    text path runs, and the checks below then name the data row and field. A compressed file is
    decompressed once (:func:`blendsim.sim.io.read_input`), and both readers and every check read those bytes.
    """
    import pandas as pd

    try:
        with path.open("rb") as fh:
            fh.read(1)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        src = read_input(path)  # the path, or a compressed file's decompressed bytes
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None
    _check_header(path, src)
    # pyarrow reads 0x10 as 16 where the text path refuses it: a file with a hexadecimal cell takes the text path,
    # which names its row and field, so the answer never depends on --limit
    df = _read_arrow(src, text_columns) if limit is None and not _has_hex_cell(src) else None
    if df is None:
        try:
            df = pd.read_csv(input_stream(src) if isinstance(src, bytes) else src, nrows=limit, dtype=str,
                             keep_default_na=False, compression=None)
        except pd.errors.EmptyDataError:
            raise UserError(f"{path}: the file is empty") from None
        except pd.errors.ParserError as e:
            raise UserError(f"{path}: malformed CSV ({_first_line(e)})") from None
        except UnicodeDecodeError:
            raise UserError(f"{path}: {_undecodable(src)}") from None
        check_csv_aligned(path, df, source=src)
    stripped = [str(c).strip() for c in df.columns]
    if len(set(stripped)) == len(stripped):  # "Timestamp, Request tokens": spaces after the commas are not the name
        df.columns = stripped
    missing = [c for c in required if c not in df.columns]
    if missing:
        found = ", ".join(map(repr, map(str, df.columns[:8])))  # quoted: a stray space or case shows
        raise UserError(f"{path}: missing column {missing[0]!r} (found: {found})")
    if len(df) == 0:
        raise UserError(f"{path}: no data rows after the header")
    return df


def _check_header(path: Path, src) -> None:
    """One line for a column named twice (which of the two a loader would read is a guess). ``src``: what the
    readers read (the path, or the decompressed bytes)."""
    import csv
    import io
    from collections import Counter

    with io.TextIOWrapper(input_stream(src), newline="", encoding="utf-8", errors="replace") as fh:
        header = next((r for r in csv.reader(fh) if r), [])  # pandas skips blank lines before the header too
    twice = [c for c, n in Counter(h.strip() for h in header).items() if n > 1 and c]
    if twice:
        raise UserError(f"{path}: column {twice[0]!r} appears twice in the header")


def _undecodable(src) -> str:
    """Where the first bytes that are not UTF-8 text are (``data row N`` counted as the other errors count, blank
    lines skipped; or the header) in ``src`` (the path, or the decompressed bytes)."""
    row = -1  # -1: the header is still to come
    with input_stream(src) as fh:
        for line in fh:
            if not line.strip():
                continue
            row += 1
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                where = "the header" if row == 0 else f"data row {row}"
                return f"{where}: not UTF-8 text (byte {line[e.start]:#04x} at column {e.start + 1})"
    return "not UTF-8 text"


def _has_hex_cell(src) -> bool:
    """Whether a CSV (its bytes, or its path) has a cell that starts as a hexadecimal number (``0x1F``)."""
    import re

    data = src if isinstance(src, bytes) else Path(src).read_bytes()
    if b"0x" not in data and b"0X" not in data:  # a byte search first: the pattern's scan is ~30x slower
        return False
    return re.search(rb"(?:^|,)[ \t\"]*[+-]?0[xX][0-9a-fA-F]", data, re.M) is not None


def _read_arrow(src, text_columns: tuple[str, ...] = ()):
    import pyarrow as pa
    import pyarrow.csv as pcsv

    try:
        # no cell is read as null (pyarrow's default would take "", "nan", "NA" and "null" alike): an empty or "NA" cell
        # leaves its column text, whose check names it as the text path does, and "nan" stays a number that is none
        table = pcsv.read_csv(pa.BufferReader(src) if isinstance(src, bytes) else src,
                              convert_options=pcsv.ConvertOptions(column_types=dict.fromkeys(text_columns, pa.string()),
                                                                  null_values=[], strings_can_be_null=False))
    except (pa.ArrowInvalid, UnicodeDecodeError, OSError):
        return None
    types = table.schema.types
    if table.num_rows == 0 or any(pa.types.is_null(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
                                  for t in types):
        return None  # a binary column is one with bytes that are not UTF-8: the text path names the row
    return table.to_pandas()


def _numbers(path: Path, df, col: str, rows=None) -> np.ndarray:
    import pandas as pd

    if pd.api.types.is_numeric_dtype(df[col]) and not pd.api.types.is_bool_dtype(df[col]):
        x = df[col].to_numpy(dtype=np.float64, na_value=np.nan)
        bad = np.flatnonzero(~np.isfinite(x))
        if len(bad):  # an empty cell makes the column text (_read_arrow): a NaN here is a cell that says nan
            i = int(bad[0])
            _fail(path, i if rows is None else rows[i], col, "'nan' is not a number" if np.isnan(x[i])
                  else f"{x[i]} is not finite")
        return x
    raw = df[col].astype(str).str.strip()
    x = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(x))
    if len(bad):
        i = int(bad[0])
        what = "is missing" if raw.iloc[i] == "" else f"{raw.iloc[i]!r} is not a number" if np.isnan(x[i]) \
            else f"{raw.iloc[i]!r} is not a finite number"
        _fail(path, i if rows is None else rows[i], col, what)
    return x


def _ints(path: Path, df, col: str, minimum: int, rows=None) -> np.ndarray:
    """Whole numbers in [minimum, MAX_TOKENS] (checked as floats, before any cast could wrap)."""
    x = _numbers(path, df, col, rows)
    bad = np.flatnonzero((x != np.floor(x)) | (x < minimum) | (x > MAX_TOKENS))
    if len(bad):
        i = int(bad[0])
        what = "must be a whole number" if x[i] != np.floor(x[i]) else f"must be >= {minimum}" if x[i] < minimum \
            else TOO_LONG
        _fail(path, i if rows is None else rows[i], col, f"{_fmt(x[i])} {what}")
    return x.astype(np.int64)


# the latest time a trace file may give: Unix time in seconds is ~1.8e9 today; the loaders start a trace at its first
MAX_CLOCK_S = 1e12


def _times(path: Path, df, col: str, rows=None) -> np.ndarray:
    """Seconds >= 0 (at most MAX_CLOCK_S: Unix times load) that span at most MAX_TIME_S."""
    x = _numbers(path, df, col, rows)
    ok = (x >= 0) & (x <= MAX_CLOCK_S)
    first = float(x[ok].min()) if ok.any() else 0.0
    bad = np.flatnonzero(~ok | (x - first > MAX_TIME_S))
    if len(bad):
        i = int(bad[0])
        what = ("must be >= 0 seconds" if x[i] < 0 else
                f"is more seconds than any clock reads ({MAX_CLOCK_S:.0e}){': milliseconds? give seconds' * bool(x[i] <= 1e15)}"
                if x[i] > MAX_CLOCK_S else f"is {_fmt(x[i] - first)} s after the first, which {TOO_LATE}")
        _fail(path, i if rows is None else rows[i], col, f"{_fmt(x[i])} {what}")
    return x


def _fail(path: Path, index: int, field: str, what: str):
    raise UserError(f"{path}: data row {int(index) + 1}, field {field}: {what}")


def _fmt(v: float) -> str:
    return str(int(v)) if v == np.floor(v) and abs(v) < 1e15 else repr(float(v))


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__


def _trace(p, d, arrival, rows, source, meta):
    from blendsim.workloads.trace import unique_prompts

    t = unique_prompts(p, d, ids=(np.asarray(rows) + 1).astype(str).astype(object),
                       arrival_s=arrival, source=source)
    t.meta = {k: v for k, v in meta.items() if v is not None}
    return t


# ---- JSONL --------------------------------------------------------------------------------
_OPTIONAL_FLOATS = ("arrival_s", "ttft_slo_s", "tbt_slo_s", "jct_slo_s")
_JSONL_FIELDS = ("id", "prompt_token_ids", "output_len", "output_len_hint", *_OPTIONAL_FLOATS, "source")


def load_jsonl(path, limit: int | None = None):
    """JSON Lines, one request per line: ``prompt_token_ids`` (list of ints) and ``output_len``.

    Optional per line: ``id`` (a string or an integer, unique; a line without one gets its request number,
    from 0), ``arrival_s``, ``output_len_hint``, ``ttft_slo_s``, ``tbt_slo_s``, ``jct_slo_s``, ``source``; any
    other field is refused (a misspelt one would be lost unsaid).
    ``arrival_s`` is kept as given (seconds on the trace's own clock, as a blendsim trace's are: not shifted
    to start at 0), and is on every line or on none (none: offline, all at t = 0). Blank lines are skipped,
    a UTF-8 byte-order mark is allowed and a ``.gz``, ``.bz2`` or ``.xz`` file is decompressed (as for CSVs);
    errors name the file's line number.
    """
    from blendsim.workloads.trace import MAX_TOKEN_ID, Trace

    path = Path(path)
    tokens, cols, ids = [], {k: [] for k in ("output_len", "output_len_hint", *_OPTIONAL_FLOATS, "source")}, []
    seen: dict[str, tuple[int, bool]] = {}  # id -> (line, whether the line gave it)
    lines, timed = [], []
    for lineno, line in jsonl_lines(path):
        if limit is not None and len(tokens) >= limit:
            break
        rec = _record(path, lineno, line, MAX_TOKEN_ID)
        given = "id" in rec
        rid = str(rec["id"] if given else len(ids))
        if rid in seen:
            _repeated_id(path, lineno, rid, given, *seen[rid])
        seen[rid] = (lineno, given)
        lines.append(lineno)
        timed.append(rec.get("arrival_s") is not None)
        tokens.append(rec["prompt_token_ids"])
        ids.append(rid)
        for k in cols:
            cols[k].append(rec.get(k))
    if not tokens:
        raise UserError(f"{path}: the file has no requests")
    if any(timed) and not all(timed):  # a line without one would arrive at t = 0, among timed lines
        first = lines[timed.index(True)]
        raise UserError(f"{path}: line {lines[timed.index(False)]}, field arrival_s: missing (or null) where line "
                        f"{first} has one; give every line one (0 for offline), or none")
    lens = np.array([len(t) for t in tokens], dtype=np.int64)
    offsets = np.zeros(len(tokens) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    sym = np.concatenate([np.asarray(t, dtype=np.int64) for t in tokens])
    opt = {k: np.array([np.nan if v is None else v for v in cols[k]], dtype=np.float64) for k in _OPTIONAL_FLOATS}
    opt["arrival_s"] = np.nan_to_num(opt["arrival_s"], nan=0.0)  # none given: offline, all at t = 0
    hint = np.array([-1 if v is None else v for v in cols["output_len_hint"]], dtype=np.int64)
    source = np.array(["" if v is None else str(v) for v in cols["source"]], dtype=object)
    trace = Trace(ids=np.array(ids, dtype=object), input_len=lens, output_len=np.array(cols["output_len"], dtype=np.int64),
                  unit_offsets=offsets, unit_sym=sym, unit_len=np.ones(len(sym), dtype=np.int64),
                  output_len_hint=hint, source=source, **opt)
    trace.meta = {"loader": "jsonl", "file": str(path), **({"limit": limit} if limit else {})}
    return trace


def _repeated_id(path: Path, lineno: int, rid: str, given: bool, first: int, first_given: bool):
    """One line for a request id seen before: given on both lines, or a line's default (its request number)."""
    fix = "give every line an id, or none"
    if given and first_given:
        raise UserError(f"{path}: line {lineno}, field id: {rid!r} repeats line {first} (request ids must be unique)")
    if given:
        raise UserError(f"{path}: line {lineno}, field id: {rid!r} is the id line {first} gets by default (it has "
                        f"none: its request number, from 0); {fix}")
    # (two lines without one cannot clash: their defaults differ)
    raise UserError(f"{path}: line {lineno}: has no id field, and the id it gets by default ({rid!r}: its request "
                    f"number, from 0) is line {first}'s; {fix}")


def _record(path: Path, lineno: int, line: str, max_token: int) -> dict:
    where = f"{path}: line {lineno}"
    rec = json_object(where, line, loads_strict)
    # NOTE: a misspelt field (ttft_slo for ttft_slo_s) is refused, not dropped: its SLO or hint would vanish unsaid
    unknown = next((k for k in rec if k not in _JSONL_FIELDS), None)
    if unknown is not None:
        raise UserError(f"{where}, field {short_repr(unknown)}: not a field of a jsonl request; the fields are "
                        f"{', '.join(_JSONL_FIELDS)}")
    for key in ("prompt_token_ids", "output_len"):
        if key not in rec:
            raise UserError(f"{where}, field {key}: missing")
    toks = rec["prompt_token_ids"]
    if not isinstance(toks, list) or not toks:
        raise UserError(f"{where}, field prompt_token_ids: must be a non-empty list of token ids")
    if not all(_is_int(t) and 0 <= t <= max_token for t in toks):
        bad = next(t for t in toks if not (_is_int(t) and 0 <= t <= max_token))
        raise UserError(f"{where}, field prompt_token_ids: {short_repr(bad)} is not a token id (0..{max_token})")
    if len(toks) > MAX_TOKENS:
        raise UserError(f"{where}, field prompt_token_ids: {len(toks):,} tokens {TOO_LONG}")
    for key in ("output_len", "output_len_hint"):
        v = rec.get(key)
        if key in rec and not (_is_int(v) and 1 <= v <= MAX_TOKENS):
            raise UserError(f"{where}, field {key}: {short_repr(v)} must be a whole number in 1..{MAX_TOKENS:,} "
                            "(MAX_TOKENS: longer than any model's context)")
    for key in _OPTIONAL_FLOATS:
        v = rec.get(key)
        if v is not None and not (_is_num(v) and (0 <= v if key == "arrival_s" else 0 < v) and v <= MAX_TIME_S):
            bound = "0 <= t" if key == "arrival_s" else "0 < t"
            raise UserError(f"{where}, field {key}: {short_repr(v)} must be a number of seconds, {bound} <= "
                            f"{MAX_TIME_S:.0e} (MAX_TIME_S)")
    if "source" in rec and not isinstance(rec["source"], str):
        raise UserError(f"{where}, field source: must be a string")
    if "id" in rec and not (isinstance(rec["id"], str) or _is_int(rec["id"])):
        raise UserError(f"{where}, field id: {short_repr(rec['id'])} must be a string or an integer")
    for key in ("id", "source"):  # strings the trace writes out as UTF-8
        if isinstance(rec.get(key), str):
            check_text(where, key, rec[key])
    return rec



def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


__all__ = ["FORMATS", "load", "load_azure", "load_blendsim", "load_burstgpt", "load_jsonl", "load_vidur"]
