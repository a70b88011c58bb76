"""Block-hash traces: Mooncake's (FAST'25) and the general hashed-block shape (ServeGen, serving logs).

One JSON object per line. Fields read (others are ignored):

* ``input_length`` (required): prompt tokens, a whole number in 1..MAX_TOKENS;
* ``hash_ids`` (required): integer ids of the prompt's blocks of ``block_size`` tokens, in order. The
  last block holds the remainder ``input_length - (n - 1) * block_size`` (``n = ceil(input_length /
  block_size)`` ids, Mooncake's files). ``n = floor(...)`` ids are accepted too (a hasher that skips the
  partial last block): the unhashed tail becomes a segment of its own, shared with nobody;
* ``output_length`` (optional): tokens generated (1..MAX_TOKENS); rows without it are filled from ``--output-len`` or
  sampled from ``--output-from`` and the trace's metadata says which and how many;
* ``timestamp`` (optional, in every row or none): arrival, in ``--time-unit`` s or ms (Mooncake: ms),
  shifted so the first arrival is 0;
* ``request_id`` (optional): the request's id (string or integer), else its line number.

How ids become prompts. A prompt is the path of its blocks as shared segments ``[(segment_id, length),
...]``; the prefix tree, the KV cache and every policy then see the sharing at block granularity. The
tree is a radix tree over these paths, so a block is shared between two requests only where the whole
path up to it is the same: an id names the block *given its prefix*. This is exactly what Mooncake's
ids mean (its trace tooling hashes each block together with its parent's hash, so an id fixes the
prefix; no id of the shared trace appears at two positions or after two different parents), and it is
also the only reuse a KV cache can make of a hasher that hashes blocks alone: a block's KV depends on
everything before it. Ids may be any 64-bit integers (they are renumbered densely). A full block keeps
its id's segment; a partial last block is the segment of its (id, length) pair, so two requests share
a partial block only when both the id and the length agree (``meta["hashed"]["id_length_clashes"]``
counts ids seen with more than one length: a hasher that does not hash content).

``meta["hashed"]`` counts ``blocks`` (every hash id of every row), ``unique_blocks`` (distinct blocks as the
prefix tree holds them: an id *after its whole prefix*, and a partial block with its length; for Mooncake's
chained ids this is the number of distinct ids, while an id seen after two different prefixes counts twice)
and ``unique_block_tokens`` (their tokens, with the unhashed tails): so ``1 - unique_block_tokens / prompt
tokens`` is the file's block-level sharing, what the tree's s_o counts.

Bad input stops with one :class:`UserError` line naming the file's line number and the field: a key given twice
in one object included, as ``--format jsonl`` refuses it (the strict parse runs only on a line whose count of
``:`` exceeds its object's keys, so the common line pays one count). A ``.gz``, ``.bz2`` or ``.xz`` file is
decompressed (:func:`blendsim.workloads.jsonl.jsonl_lines`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from blendsim.sim.errors import UserError
from blendsim.sim.io import loads_strict, plain_stem
from blendsim.workloads.jsonl import check_text, json_object, jsonl_lines, short_repr
from blendsim.workloads.trace import MAX_TIME_S, MAX_TOKENS, TOO_LONG

FORMATS = ("mooncake", "hashed")
MOONCAKE_BLOCK = 512
TIME_UNITS = {"s": 1.0, "ms": 1e-3}
LONG_MODES = ("skip", "truncate")
_I64 = (-(1 << 63), (1 << 63) - 1)
# CSV columns --output-from looks for when none is named (first match wins)
OUTPUT_COLUMNS = ("output_len", "output_length", "output_tokens", "GeneratedTokens", "Response tokens",
                  "num_decode_tokens", "answer_tokens")


def load_hashed(path, fmt: str = "hashed", *, block_size: int | None = None, time_unit: str | None = None,
                output_len: int | None = None, output_from: str | None = None, seed: int = 0,
                limit: int | None = None):
    """Load a block-hash JSONL trace (``fmt``: ``mooncake`` or ``hashed``); see the module docstring."""
    from blendsim.workloads.trace import from_segment_arrays

    path = Path(path)
    if fmt not in FORMATS:
        raise UserError(f"unknown hashed format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "mooncake":
        block_size = MOONCAKE_BLOCK if block_size is None else block_size
        time_unit = "ms" if time_unit is None else time_unit
    if block_size is None:
        raise UserError("--format hashed needs --block-size N (tokens per hashed block: 16 for ServeGen, "
                        "512 for Mooncake)")
    if not 1 <= block_size <= MAX_TOKENS:
        raise UserError(f"--block-size must be a whole number of tokens in 1..{MAX_TOKENS:,} (MAX_TOKENS), "
                        f"got {block_size}")
    if time_unit is not None and time_unit not in TIME_UNITS:
        raise UserError(f"--time-unit {time_unit!r}: choose s or ms")
    if output_len is not None and output_from is not None:
        raise UserError("give --output-len or --output-from, not both")
    if output_len is not None and not 1 <= output_len <= MAX_TOKENS:
        raise UserError(f"--output-len must be in 1..{MAX_TOKENS:,} (MAX_TOKENS), got {output_len}")
    if seed is not None and not 0 <= seed < 2**63:
        raise UserError(f"--seed must be >= 0, got {seed}")
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be at least 1, got {limit}")

    rows = _parse(path, block_size, limit)
    p, n_ids, flat, out, ts, ids, lines = rows
    n = len(p)
    if ts is not None and time_unit is None:
        raise UserError(f"{path}: rows have a timestamp; say its unit with --time-unit s or --time-unit ms")
    d, out_meta = _outputs(path, out, lines, output_len, output_from, seed)

    # ---- blocks -> segments (pandas' hash factorize: no sort of all ids) ------------------
    import pandas as pd

    row_of = np.repeat(np.arange(n), n_ids)
    k_in_row = np.arange(len(flat)) - np.repeat(np.cumsum(n_ids) - n_ids, n_ids)
    blen = np.minimum(block_size, p[row_of] - k_in_row * block_size)
    code, uniq = pd.factorize(flat)  # dense ids in order of first appearance
    seg = code.astype(np.int64)
    full_used = np.bincount(seg[blen == block_size], minlength=len(uniq)) > 0
    part = np.flatnonzero(blen < block_size)  # a partial last block: one segment per (id, length)
    pcode, puniq = pd.factorize(seg[part] * (block_size + 1) + blen[part])
    seg[part] = len(uniq) + pcode
    lengths_per_id = full_used + np.bincount(puniq // (block_size + 1), minlength=len(uniq))
    clashes = int(np.count_nonzero(lengths_per_id > 1))  # ids seen with more than one length
    tail = p - n_ids * block_size  # > 0: an unhashed tail (floor convention)
    has_tail = tail > 0
    counts = n_ids + has_tail
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    total = int(offsets[-1])
    seg_ids = np.empty(total, dtype=np.int64)
    seg_lens = np.empty(total, dtype=np.int64)
    pos = offsets[:-1][row_of] + k_in_row
    seg_ids[pos] = seg
    seg_lens[pos] = blen
    tails = np.flatnonzero(has_tail)
    seg_ids[offsets[tails + 1] - 1] = len(uniq) + len(puniq) + np.arange(len(tails))
    seg_lens[offsets[tails + 1] - 1] = tail[tails]
    unique_blocks = int(full_used.sum()) + len(puniq)  # distinct segments (ids; a partial block with its length)
    unique_tokens = int(full_used.sum()) * block_size + int((puniq % (block_size + 1)).sum())
    # per prefix path, as the tree counts them (the same for chained ids: one cheap round finds no difference)
    unique_blocks, unique_tokens = _distinct_paths(seg, blen, k_in_row, unique_blocks, unique_tokens)

    arrival = None
    if ts is not None:
        # relative times, checked before any arithmetic could overflow (+-1e308 would warn, then blame inf)
        scale = TIME_UNITS[time_unit]
        first = float(ts.min())
        with np.errstate(over="ignore", invalid="ignore"):
            rel = (ts - first) * scale
        late = np.flatnonzero(~np.isfinite(rel) | (rel > MAX_TIME_S))
        if len(late):
            i = int(late[0])
            raise UserError(f"{path}: line {int(lines[i])}, field timestamp: {float(ts[i])!r} is over "
                            f"{MAX_TIME_S:.0e} s after the first ({first!r}; MAX_TIME_S)")
        arrival = rel
    trace = from_segment_arrays(p, d, offsets, seg_ids, seg_lens, ids=ids, arrival_s=arrival,
                                source=np.full(n, fmt, dtype=object))
    trace.meta = {
        "loader": fmt, "file": str(path), "name": plain_stem(path), "block_size": int(block_size),
        **({"time_unit": time_unit} if ts is not None else {}), "output_len": out_meta,
        "hashed": {"blocks": int(len(flat)), "unique_blocks": unique_blocks,
                   "unique_block_tokens": unique_tokens + int(tail[tails].sum()),
                   "unhashed_tails": int(len(tails)), "id_length_clashes": clashes},
        **({"limit": limit} if limit else {}),
    }
    # NOTE: no trace.validate(): every field was checked above and the segments are consistent by
    # construction (full blocks: one length; partial blocks: one segment per (id, length); tails: unique);
    # the tests validate loaded traces. validate() would sort all units again (a third of the time).
    return trace


def _distinct_paths(seg: np.ndarray, blen: np.ndarray, k_in_row: np.ndarray, blocks: int, tokens: int
                    ) -> tuple[int, int]:
    """Distinct blocks as the prefix tree holds them (a block's segment after its whole prefix) and their tokens;
    ``blocks`` and ``tokens`` are the counts per distinct segment, returned as they are when the two agree.

    Chained ids (Mooncake's: an id fixes its prefix) are found by one cheap test: every segment follows one
    segment only (or always starts a row), so by induction its whole prefix is fixed. Otherwise labels by prefix
    doubling: a block's label names the window of ``2**j`` blocks ending at it (a mark for "before the row's
    start"), refined until no label splits; then equal labels are equal whole prefixes."""
    import pandas as pd

    if not len(seg):
        return blocks, tokens
    anc = np.where(k_in_row >= 1, np.arange(len(seg)) - 1, -1)  # the block 2**j before, -1 before the row's start
    up = np.where(anc >= 0, seg[np.maximum(anc, 0)], -1)
    parent = np.full(int(seg.max()) + 1, -2, dtype=np.int64)
    parent[seg] = up  # one of each segment's predecessors: when it is every one's, the ids are chained
    if (parent[seg] == up).all():
        return blocks, tokens
    label, count, m = seg, blocks, int(seg.max()) + 2  # label * m + (up + 1): distinct pairs, distinct codes
    while True:
        up = np.where(anc >= 0, label[np.maximum(anc, 0)], -1)
        new, uniq = pd.factorize(label * m + (up + 1))
        if len(uniq) == count:  # no label split: equal labels are equal prefixes
            break
        label, count, m = new.astype(np.int64), len(uniq), len(uniq) + 1
        anc = np.where(anc >= 0, anc[np.maximum(anc, 0)], -1)
    if label is seg:
        return blocks, tokens
    cm = np.maximum.accumulate(label)  # factorize's codes are in order of first appearance
    first = np.flatnonzero(np.r_[True, cm[1:] > cm[:-1]])
    return int(len(first)), int(blen[first].sum())


def _loads(line: str):
    """``json.loads``; the strict parse (a key given twice) only where the line holds more ``:`` than the object
    has keys: every key of an object is followed by one colon, so a key given twice leaves a colon over (as does a
    colon inside a string, or a nested object: those lines are parsed twice, correctly)."""
    rec = json.loads(line)
    if isinstance(rec, dict) and line.count(":") != len(rec):
        rec = loads_strict(line)
    return rec


def _finite(t) -> bool:
    try:
        return math.isfinite(t)
    except OverflowError:  # an integer beyond float range
        return False


def _parse(path: Path, block_size: int, limit: int | None):
    """The file's rows as columns: p, id counts, all ids (flat), outputs (-1 = none), timestamps, ids."""
    p, n_ids, flat, out, ts, rid, lines = [], [], [], [], [], [], []
    first_ts = None  # (line, has timestamp) of the first row: timestamps are in every row or none
    for lineno, line in jsonl_lines(path):
        if limit is not None and len(p) >= limit:
            break
        where = f"{path}: line {lineno}"
        try:
            rec = _loads(line)
        except (ValueError, RecursionError):
            rec = None
        if type(rec) is not dict:
            rec = json_object(where, line, _loads)  # the one line saying what is wrong with it
        plen = _whole(where, rec, "input_length", required=True)
        hs = rec.get("hash_ids")
        if hs is None:
            raise UserError(f"{where}, field hash_ids: missing")
        if not isinstance(hs, list):
            raise UserError(f"{where}, field hash_ids: must be a list of integer block ids, "
                            f"found {type(hs).__name__}")
        arr = _ids(where, hs, "true" in line or "false" in line)
        ceil_n = -(-plen // block_size)
        if len(hs) != ceil_n and len(hs) != plen // block_size:
            raise UserError(
                f"{where}, field hash_ids: {len(hs)} block ids, but input_length {plen} in "
                f"{block_size}-token blocks needs {ceil_n}"
                + (f" (or {plen // block_size} without the partial last block)" if plen % block_size else "")
                + " (is --block-size right?)")
        d = _whole(where, rec, "output_length", required=False)
        t = rec.get("timestamp")
        if first_ts is None:
            first_ts = (lineno, t is not None)
        if (t is not None) != first_ts[1]:
            has, lacks = (lineno, first_ts[0]) if t is not None else (first_ts[0], lineno)
            raise UserError(f"{where}, field timestamp: line {has} has a timestamp but line {lacks} "
                            "has none (give it in every row or in none)")
        if t is not None and not (type(t) in (int, float) and _finite(t)):
            what = "is not a finite number" if type(t) in (int, float) else "is not a number"
            raise UserError(f"{where}, field timestamp: {short_repr(t)} {what}")
        r = rec.get("request_id")
        if r is not None and (type(r) not in (int, str) or r == ""):
            raise UserError(f"{where}, field request_id: {short_repr(r)} must be a non-empty string or an integer")
        if type(r) is str:
            check_text(where, "request_id", r)
        p.append(plen)
        n_ids.append(len(hs))
        flat.append(arr)
        out.append(-1 if d is None else d)
        ts.append(t)
        rid.append(str(lineno) if r is None else str(r))
        lines.append(lineno)
    if not p:
        raise UserError(f"{path}: the file has no requests")
    ids = np.array(rid, dtype=object)
    uniq, first, counts = np.unique(ids.astype(str), return_index=True, return_counts=True)
    if (counts > 1).any():
        dup = str(uniq[np.flatnonzero(counts > 1)[0]])
        at = [lines[i] for i in np.flatnonzero(ids == dup)[:2]]
        raise UserError(f"{path}: line {at[1]}, field request_id: {dup!r} repeats line {at[0]}'s")
    ts_arr = np.array(ts, dtype=np.float64) if first_ts[1] else None
    return (np.array(p, dtype=np.int64), np.array(n_ids, dtype=np.int64), np.concatenate(flat),
            np.array(out, dtype=np.int64), ts_arr, ids, np.array(lines, dtype=np.int64))


def _ids(where: str, hs: list, maybe_bool: bool) -> np.ndarray:
    """``hash_ids`` as int64; numpy checks the common case, a Python pass names a bad element."""
    try:
        arr = np.array(hs) if hs else np.zeros(0, dtype=np.int64)
        ok = arr.ndim == 1 and arr.dtype.kind == "i"
    except (ValueError, OverflowError):
        ok = False
    if ok and not maybe_bool:
        return arr.astype(np.int64, copy=False)
    for h in hs:  # JSON true/false would pass as 1/0 in a list of ints
        if type(h) is not int or not _I64[0] <= h <= _I64[1]:
            raise UserError(f"{where}, field hash_ids: {h!r} is not an integer block id (64-bit)")
    return arr.astype(np.int64, copy=False)


def _whole(where: str, rec: dict, key: str, required: bool) -> int | None:
    v = rec.get(key)
    if v is None:
        if required:
            raise UserError(f"{where}, field {key}: missing")
        return None
    if type(v) is not int or v < 1:
        raise UserError(f"{where}, field {key}: {short_repr(v)} must be a whole number >= 1")
    if v > MAX_TOKENS:
        raise UserError(f"{where}, field {key}: {short_repr(v)} {TOO_LONG}")
    return v


# ---- missing output lengths -------------------------------------------------------------------
def _outputs(path: Path, out: np.ndarray, lines: np.ndarray, fixed: int | None, sample_from: str | None,
             seed: int) -> tuple[np.ndarray, dict]:
    missing = out < 0
    k = int(missing.sum())
    meta: dict = {"from_file": int(len(out) - k)}
    if not k:
        if sample_from is not None:  # unused here, but a file that is not there is a mistake all the same
            output_lengths(sample_from)
        return out, meta
    if fixed is None and sample_from is None:
        raise UserError(f"{path}: line {int(lines[np.argmax(missing)])} has no output_length ({k:,} of "
                        f"{len(out):,} rows lack one); give --output-len N or --output-from FILE")
    out = out.copy()
    if fixed is not None:
        out[missing] = fixed
        meta.update({"fixed": int(fixed), "filled": k})
    else:
        pool, src = output_lengths(sample_from)
        out[missing] = np.random.default_rng(seed).choice(pool, size=k, replace=True)
        meta.update({"sampled_from": src, "seed": int(seed), "pool": int(len(pool)), "filled": k})
    return out, meta


def output_lengths(spec: str) -> tuple[np.ndarray, str]:
    """Output lengths (>= 1) from ``FILE`` or ``FILE:COLUMN``: a blendsim Parquet trace, a JSONL trace
    (``output_length`` or ``output_len``) or a CSV (COLUMN, else the first of :data:`OUTPUT_COLUMNS`).

    Zero lengths (BurstGPT's failed requests) are left out of the pool. A ``.gz``, ``.bz2`` or ``.xz`` file is
    decompressed (``lengths.csv.gz`` is read as a CSV).
    """
    from blendsim.sim.io import plain_suffix

    path, col = output_from_path(spec)
    if path.is_dir():
        raise UserError(f"--output-from {spec}: is a folder; give a trace or a length file")
    if not path.is_file():
        raise UserError(f"--output-from {spec}: no such file")
    suffix = plain_suffix(path)
    if suffix == ".parquet":
        from blendsim.workloads.trace import read_trace

        if col not in (None, "output_len"):  # a trace's output lengths are its output_len column
            raise UserError(f"--output-from {spec}: a blendsim trace gives its output_len column only; "
                            f"write {path} or {path}:output_len")
        vals = read_trace(path).output_len.astype(np.float64)
        col = "output_len"
    elif suffix in (".jsonl", ".json"):
        vals, col = _jsonl_lengths(path, col)
    else:
        vals, col = _csv_lengths(path, col)
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(~np.isfinite(vals) | (vals != np.floor(vals)) | (vals < 0) | (vals > MAX_TOKENS))
    if len(bad):
        raise UserError(f"--output-from {path}: row {int(bad[0]) + 1}, field {col}: {float(vals[bad[0]])!r} "
                        f"is not a whole number of tokens in 0..{MAX_TOKENS:,} (MAX_TOKENS)")
    pool = vals[vals >= 1].astype(np.int64)
    if not len(pool):
        raise UserError(f"--output-from {path}: column {col} has no length >= 1")
    return pool, f"{path}:{col}"


def output_from_path(spec: str) -> tuple[Path, str | None]:
    """``--output-from FILE[:COLUMN]`` as (FILE, COLUMN or None): a name that exists as given is the file."""
    path, col = Path(spec), None
    if not path.exists() and ":" in spec:
        head, col = spec.rsplit(":", 1)
        path = Path(head)
    return path, col


def _jsonl_lengths(path: Path, col: str | None) -> tuple[np.ndarray, str]:
    """The lengths of the rows that have one (a trace may lack some); read as the trace loaders read a JSONL
    file (UTF-8, a byte-order mark allowed, decompressed by its suffix; JSON Python cannot hold is one line)."""
    vals, keys = [], (col,) if col else ("output_length", "output_len")
    for lineno, line in jsonl_lines(path, "--output-from "):
        where = f"--output-from {path}: line {lineno}"
        rec = json_object(where, line, _loads)
        key = next((k for k in keys if rec.get(k) is not None), None)
        if key is None:
            continue
        col, v = key, rec[key]
        if type(v) not in (int, float) or not _finite(v):
            what = "is not a finite number" if type(v) in (int, float) else "is not a number"
            raise UserError(f"{where}, field {key}: {short_repr(v)} {what}")
        vals.append(v)
    if not vals:
        raise UserError(f"--output-from {path}: no row has {' or '.join(keys)}")
    return np.array(vals, dtype=np.float64), col


def _csv_lengths(path: Path, col: str | None) -> tuple[np.ndarray, str]:
    import pandas as pd

    from blendsim.sim.io import check_csv_aligned, input_stream, read_input

    try:
        src = read_input(path, "--output-from ")  # the path, or a compressed file's decompressed bytes
        df = pd.read_csv(input_stream(src) if isinstance(src, bytes) else src, dtype=str, keep_default_na=False,
                         compression=None)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise UserError(f"--output-from {path}: not a readable CSV ({type(e).__name__})") from None
    except OSError as e:
        raise UserError(f"--output-from {path}: cannot read ({e.strerror or e})") from None
    check_csv_aligned(path, df, "--output-from ", source=src)
    if col is None:
        col = next((c for c in OUTPUT_COLUMNS if c in df.columns), None)
        if col is None:
            raise UserError(f"--output-from {path}: no output-length column ({', '.join(OUTPUT_COLUMNS[:4])}, ...); "
                            f"name one as {path}:COLUMN (found: {', '.join(map(str, df.columns[:8]))})")
    elif col not in df.columns:
        raise UserError(f"--output-from {path}: no column {col!r} (found: {', '.join(map(str, df.columns[:8]))})")
    raw = df[col].str.strip()
    vals = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    bad = np.flatnonzero(np.isnan(vals))
    if len(bad):
        raise UserError(f"--output-from {path}: data row {int(bad[0]) + 1}, field {col}: "
                        f"{raw.iloc[bad[0]]!r} is not a number")
    return vals, col


# ---- requests longer than a context -------------------------------------------------------------
def parse_max_context(value: str) -> tuple[int, str]:
    """``--max-context``: a number of tokens, or a model (preset or config.json) whose context is used."""
    text = str(value).strip()
    if text.isascii() and text.lstrip("+-").replace(".", "", 1).isdigit():  # a number, whole or not
        if not text.lstrip("+").isdigit():  # str.isdigit() also accepts '²' and other digits int() refuses
            raise UserError(f"--max-context must be a whole number of tokens (at least 2) or a model, got {text}")
        n = int(text)
        if n < 2:
            raise UserError(f"--max-context must be at least 2 tokens, got {n}")
        return n, f"{n} tokens"
    from blendsim.sim.models import get_model

    spec = get_model(text)
    return int(spec.max_position_embeddings), f"{spec.name}'s context ({spec.max_position_embeddings} tokens)"


def limit_context(trace, max_context: int, long: str | None, where: str = "trace", what: str | None = None):
    """Requests whose prompt + output exceed ``max_context`` tokens: refused (``long`` None), dropped
    (``skip``) or cut to fit (``truncate``: the output keeps up to ``max_context - 1`` tokens, the prompt
    keeps its head, so its shared prefix; a block cut short becomes a segment of its own, shared only
    with requests cut at the same place). The count goes in ``trace.meta["context_limit"]``."""
    if long is not None and long not in LONG_MODES:
        raise UserError(f"--long {long!r}: choose skip or truncate")
    what = what or f"{max_context} tokens"
    total = trace.input_len + trace.output_len
    over = np.flatnonzero(total > max_context)
    info = {"max_context": int(max_context), "mode": long or "refuse", "requests": int(len(over))}
    if not len(over):
        out = trace.take(np.arange(trace.n))
        out.meta = {**trace.meta, "context_limit": info}
        return out
    i = int(over[0])
    if long is None:
        raise UserError(f"{where}: {len(over):,} of {trace.n:,} requests need more context than {what} (row "
                        f"{i + 1}: prompt {int(trace.input_len[i])} + output {int(trace.output_len[i])}); "
                        "add --long skip to drop them or --long truncate to cut them to fit")
    if long == "skip":
        keep = np.setdiff1d(np.arange(trace.n), over)
        if not len(keep):
            raise UserError(f"{where}: every request needs more context than {what}; --long skip leaves none")
        out = trace.take(keep)
        info["tokens_dropped"] = int(total[over].sum())
    else:
        out = _truncate(trace, max_context)
        info["prompt_tokens_dropped"] = int((trace.input_len - out.input_len).sum())
        info["output_tokens_dropped"] = int((trace.output_len - out.output_len).sum())
    out.meta = {**trace.part_meta(), "context_limit": info}
    out.validate(where)
    return out


def _truncate(trace, N: int):
    from blendsim.workloads.trace import SEGMENT_BASE, Trace

    d = np.minimum(trace.output_len, N - 1)
    p = np.minimum(trace.input_len, N - d)
    off, sym, ln = trace.unit_offsets, trace.unit_sym, trace.unit_len
    counts = np.diff(off)
    row = np.repeat(np.arange(trace.n), counts)
    cs = np.cumsum(ln)
    start = cs - ln - np.repeat(cs[off[:-1]] - ln[off[:-1]], counts)  # tokens before the unit in its row
    keep = start < p[row]
    new_len = np.minimum(ln, p[row] - start)
    cut = keep & (new_len < ln)
    sym = sym.copy()
    if cut.any():  # a cut segment is a new segment, the same one for every (segment, length) cut alike
        pairs = np.stack([sym[cut], new_len[cut]], axis=1)
        _, inv = np.unique(pairs, axis=0, return_inverse=True)
        top = int(sym.max()) if sym.max() >= SEGMENT_BASE else SEGMENT_BASE - 1
        sym[cut] = top + 1 + inv.ravel()
    new_counts = np.bincount(row[keep], minlength=trace.n)
    offsets = np.zeros(trace.n + 1, dtype=np.int64)
    np.cumsum(new_counts, out=offsets[1:])
    return Trace(ids=trace.ids, input_len=p, output_len=d, unit_offsets=offsets, unit_sym=sym[keep],
                 unit_len=new_len[keep], output_len_hint=np.where(trace.output_len_hint < 0, -1,
                                                                  np.minimum(trace.output_len_hint, d)),
                 arrival_s=trace.arrival_s, ttft_slo_s=trace.ttft_slo_s, tbt_slo_s=trace.tbt_slo_s,
                 jct_slo_s=trace.jct_slo_s, source=trace.source, meta=dict(trace.meta))


def context_option(trace, max_context: str | None, long: str | None, where: str):
    """``--max-context`` / ``--long`` of ``workloads load`` applied to a loaded trace (any format)."""
    if max_context is None:
        if long is not None:
            raise UserError("--long needs --max-context N (tokens, or a model whose context is used)")
        return trace
    n, what = parse_max_context(max_context)
    return limit_context(trace, n, long, where, what)


def summary_rows(meta: dict) -> dict:
    """Rows for ``workloads load``'s summary table: what the hashed loader and the context limit did."""
    out = {}
    h, whole = meta.get("hashed") or meta.get("hashed_file"), "hashed" not in meta
    if h:  # a trace cut from the file (--limit of a trace, --max-context) keeps the file's counts, said so
        of = ", whole file" if whole else ""
        out[f"blocks (unique){of}"] = f"{h['blocks']:,} ({h['unique_blocks']:,})"
        if h["unhashed_tails"]:
            out[f"unhashed tails{of}"] = f"{h['unhashed_tails']:,}"
    o = meta.get("output_len", {})
    if o.get("filled"):
        how = f"= {o['fixed']}" if "fixed" in o else f"sampled from {o['sampled_from']} (seed {o['seed']})"
        out["output lengths filled"] = f"{o['filled']:,} {how}"
    c = meta.get("context_limit")
    if c and c["requests"]:
        verb = {"skip": "dropped", "truncate": "truncated"}[c["mode"]]
        out[f"beyond {c['max_context']:,} tokens"] = f"{c['requests']:,} {verb}"
    return out


def direct_sharing(trace_file, block_size: int) -> float:
    """s_o counted directly from a hashed JSONL file, without the prefix tree: 1 - (tokens of distinct
    (id, length) blocks) / prompt tokens. Valid where an id fixes its prefix (Mooncake's chained ids);
    the tests and the benchmark use it to check the tree."""
    seen: set = set()
    total = unique = 0
    with open(trace_file, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            r = json.loads(line)
            plen, hs = r["input_length"], r["hash_ids"]
            total += plen
            for k, h in enumerate(hs):
                block = (h, min(block_size, plen - k * block_size))
                if block not in seen:
                    seen.add(block)
                    unique += block[1]
            unique += max(plen - len(hs) * block_size, 0)  # an unhashed tail is the request's own
    return 1.0 - unique / total


__all__ = ["FORMATS", "LONG_MODES", "MOONCAKE_BLOCK", "context_option", "direct_sharing", "limit_context",
           "load_hashed", "output_from_path", "output_lengths", "parse_max_context", "summary_rows"]
