"""The Trace: one row per request, stored as Parquet with a schema version.

A prompt is either a list of token ids or a path of shared segments ``[(segment_id, length), ...]``
(synthetic prompts: two requests that name the same segment share those tokens). Both are held in memory
as one CSR array of *units*: a token is a unit of length 1 whose symbol is its id; a segment is a unit
whose symbol is ``SEGMENT_BASE + segment_id``. The prefix tree and the caches work on units, so both
forms feed the same code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.errors import UserError
from sim.io import read_parquet

SCHEMA_VERSION = 1
SEGMENT_BASE = 1 << 40  # unit symbols at or above this are segments, below are token ids
MAX_TOKEN_ID = (1 << 31) - 1


@dataclass(eq=False)
class Trace:
    """A pool of requests, column-wise (numpy arrays of length ``n``).

    Arrays are not copied on construction; treat a Trace as immutable and derive new ones with
    :meth:`take`.
    """

    ids: np.ndarray  # object array of str: request ids
    input_len: np.ndarray  # int64, p: prompt tokens
    output_len: np.ndarray  # int64, d: tokens the engine generates (the truth)
    unit_offsets: np.ndarray  # int64, n+1: request i's prompt units are [offsets[i], offsets[i+1])
    unit_sym: np.ndarray  # int64: token id, or SEGMENT_BASE + segment id
    unit_len: np.ndarray  # int64: 1 for a token, the segment's length for a segment
    output_len_hint: np.ndarray | None = None  # int64, -1 where unknown
    arrival_s: np.ndarray | None = None  # float64, 0 for offline
    ttft_slo_s: np.ndarray | None = None  # float64, NaN where none
    tbt_slo_s: np.ndarray | None = None
    jct_slo_s: np.ndarray | None = None
    source: np.ndarray | None = None  # object array of str labels
    meta: dict = field(default_factory=dict)  # how the trace was made (recipe, seed, file)

    def __post_init__(self) -> None:
        n = len(self.input_len)
        if self.output_len_hint is None:
            self.output_len_hint = np.full(n, -1, dtype=np.int64)
        if self.arrival_s is None:
            self.arrival_s = np.zeros(n, dtype=np.float64)
        for f in ("ttft_slo_s", "tbt_slo_s", "jct_slo_s"):
            if getattr(self, f) is None:
                setattr(self, f, np.full(n, np.nan))
        if self.source is None:
            self.source = np.full(n, "", dtype=object)

    # ---- basic views ----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.input_len)

    @property
    def n(self) -> int:
        return len(self.input_len)

    @property
    def has_arrivals(self) -> bool:
        return bool(np.any(self.arrival_s > 0))

    @property
    def has_slos(self) -> bool:
        return bool(
            np.any(np.isfinite(self.ttft_slo_s)) or np.any(np.isfinite(self.tbt_slo_s))
            or np.any(np.isfinite(self.jct_slo_s))
        )

    def units(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.unit_offsets[i], self.unit_offsets[i + 1]
        return self.unit_sym[a:b], self.unit_len[a:b]

    def prompt_repr(self, i: int) -> list:
        """Request ``i``'s prompt: a list of token ids, or a list of ``(segment_id, length)``."""
        sym, ln = self.units(i)
        if len(sym) and sym[0] >= SEGMENT_BASE:
            return [(int(s - SEGMENT_BASE), int(x)) for s, x in zip(sym, ln)]
        return [int(s) for s in sym]

    def take(self, idx) -> Trace:
        """A new trace of the rows ``idx`` (in that order)."""
        idx = np.asarray(idx, dtype=np.int64)
        starts, ends = self.unit_offsets[idx], self.unit_offsets[idx + 1]
        counts = ends - starts
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        gather = np.repeat(starts - offsets[:-1], counts) + np.arange(offsets[-1])
        return Trace(
            ids=self.ids[idx], input_len=self.input_len[idx], output_len=self.output_len[idx],
            unit_offsets=offsets, unit_sym=self.unit_sym[gather], unit_len=self.unit_len[gather],
            output_len_hint=self.output_len_hint[idx], arrival_s=self.arrival_s[idx],
            ttft_slo_s=self.ttft_slo_s[idx], tbt_slo_s=self.tbt_slo_s[idx], jct_slo_s=self.jct_slo_s[idx],
            source=self.source[idx], meta=dict(self.meta),
        )

    def head(self, k: int) -> Trace:
        return self.take(np.arange(min(k, self.n)))

    def offline(self) -> Trace:
        """The same requests, all released at t=0."""
        t = self.take(np.arange(self.n))
        t.arrival_s = np.zeros(self.n)
        return t

    def validate(self, where: str = "trace") -> None:
        """Check invariants; raise :class:`UserError` naming the first bad row (1-based) and field."""
        n = self.n
        for name in ("output_len", "unit_offsets"):
            if name == "unit_offsets" and len(self.unit_offsets) != n + 1:
                raise UserError(f"{where}: prompt offsets do not match the number of rows")
            if name == "output_len" and len(self.output_len) != n:
                raise UserError(f"{where}: output_len has {len(self.output_len)} rows, expected {n}")
        _first_bad(where, "input_len", self.input_len < 1, "must be a positive integer", self.input_len)
        _first_bad(where, "output_len", self.output_len < 1, "must be a positive integer", self.output_len)
        hint = self.output_len_hint
        _first_bad(where, "output_len_hint", (hint != -1) & (hint < 1), "must be positive when given", hint)
        arr = self.arrival_s
        _first_bad(where, "arrival_s", ~np.isfinite(arr) | (arr < 0), "must be a finite time >= 0", arr)
        for f in ("ttft_slo_s", "tbt_slo_s", "jct_slo_s"):
            v = getattr(self, f)
            _first_bad(where, f, ~np.isnan(v) & ~(v > 0), "must be positive when given", v)
        counts = np.diff(self.unit_offsets)
        prompt_len = np.add.reduceat(self.unit_len, self.unit_offsets[:-1]) if len(self.unit_len) else None
        if prompt_len is not None:
            prompt_len = np.where(counts > 0, prompt_len, 0)
            _first_bad(where, "input_len", prompt_len != self.input_len,
                       "does not equal the prompt's length", self.input_len, other=prompt_len)
        _first_bad(where, "prompt", counts == 0, "is empty", counts)
        # a segment id must mean the same tokens everywhere: same length in every row
        seg = self.unit_sym >= SEGMENT_BASE
        if seg.any():
            sym, ln = self.unit_sym[seg], self.unit_len[seg]
            order = np.lexsort((ln, sym))
            s, l_ = sym[order], ln[order]
            clash = np.flatnonzero((s[1:] == s[:-1]) & (l_[1:] != l_[:-1]))
            if len(clash):
                unit_pos = np.flatnonzero(seg)[order[clash[0] + 1]]
                row = int(np.searchsorted(self.unit_offsets, unit_pos, side="right") - 1)
                raise UserError(
                    f"{where}: row {row + 1}, field prompt_segments: segment {int(s[clash[0]] - SEGMENT_BASE)} "
                    f"has length {int(l_[clash[0] + 1])} here but {int(l_[clash[0]])} elsewhere"
                )
            _first_bad(where, "prompt_segments", ln < 1, "has a segment of length < 1",
                       ln, rows=np.searchsorted(self.unit_offsets, np.flatnonzero(seg), side="right") - 1)

    # ---- summary --------------------------------------------------------------------------
    def summary(self) -> dict:
        return {
            "requests": int(self.n),
            "input_tokens": int(self.input_len.sum()),
            "output_tokens": int(self.output_len.sum()),
            "mean_input_len": float(self.input_len.mean()) if self.n else 0.0,
            "mean_output_len": float(self.output_len.mean()) if self.n else 0.0,
            "sources": {str(k): int(v) for k, v in zip(*np.unique(self.source.astype(str), return_counts=True))},
            "has_arrivals": self.has_arrivals,
            "has_slos": self.has_slos,
        }


def _first_bad(where, field_name, mask, what, values, rows=None, other=None) -> None:
    bad = np.flatnonzero(mask)
    if len(bad):
        i = int(bad[0])
        row = int(rows[i]) if rows is not None else i
        extra = f" ({other[i]})" if other is not None else ""
        v = values[i]
        v = v.item() if isinstance(v, np.generic) else v  # -3, not np.int64(-3)
        raise UserError(f"{where}: row {row + 1}, field {field_name}: {v!r} {what}{extra}")


# ---- builders -----------------------------------------------------------------------------
def from_columns(
    *,
    input_len,
    output_len,
    prompts: list | None = None,
    ids=None,
    **optional,
) -> Trace:
    """Build a trace from Python columns.

    ``prompts[i]`` is a list of token ids, a list of ``(segment_id, length)`` pairs, or None (a unique
    prompt of ``input_len[i]`` tokens is made, so no false sharing). Without ``prompts`` every prompt is
    unique.
    """
    input_len = np.asarray(input_len, dtype=np.int64)
    output_len = np.asarray(output_len, dtype=np.int64)
    n = len(input_len)
    if prompts is None:
        prompts = [None] * n
    counts = np.empty(n, dtype=np.int64)
    syms: list[int] = []
    lens: list[int] = []
    next_unique = _unique_segment_start(prompts)
    for i, pr in enumerate(prompts):
        if pr is None:
            syms.append(SEGMENT_BASE + next_unique)
            lens.append(int(input_len[i]))
            next_unique += 1
            counts[i] = 1
        elif len(pr) and isinstance(pr[0], (tuple, list)):
            for sid, ln in pr:
                syms.append(SEGMENT_BASE + int(sid))
                lens.append(int(ln))
            counts[i] = len(pr)
        else:
            syms.extend(int(t) for t in pr)
            lens.extend([1] * len(pr))
            counts[i] = len(pr)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    if ids is None:
        ids = np.array([str(i) for i in range(n)], dtype=object)
    else:
        ids = np.array([str(x) for x in ids], dtype=object)
    return Trace(ids=ids, input_len=input_len, output_len=output_len, unit_offsets=offsets,
                 unit_sym=np.array(syms, dtype=np.int64), unit_len=np.array(lens, dtype=np.int64),
                 **{k: _opt_array(k, v) for k, v in optional.items()})


def from_segment_arrays(input_len, output_len, seg_offsets, seg_ids, seg_lens, **optional) -> Trace:
    """Vectorised builder for synthetic traces: CSR segment paths."""
    n = len(input_len)
    ids = optional.pop("ids", None)
    if ids is None:
        ids = np.arange(n).astype(str).astype(object)
    return Trace(ids=ids, input_len=np.asarray(input_len, dtype=np.int64),
                 output_len=np.asarray(output_len, dtype=np.int64),
                 unit_offsets=np.asarray(seg_offsets, dtype=np.int64),
                 unit_sym=SEGMENT_BASE + np.asarray(seg_ids, dtype=np.int64),
                 unit_len=np.asarray(seg_lens, dtype=np.int64),
                 **{k: _opt_array(k, v) for k, v in optional.items()})


def unique_prompts(input_len, output_len, first_segment: int = 0, **optional) -> Trace:
    """Every request gets a prompt of its own (one fresh segment): nothing is falsely shared."""
    n = len(input_len)
    return from_segment_arrays(input_len, output_len, np.arange(n + 1),
                               first_segment + np.arange(n), np.asarray(input_len), **optional)


def concat(traces: list[Trace], meta: dict | None = None) -> Trace:
    """Rows of several traces, one after another (ids are kept; segment ids must not clash)."""
    offs, pos = [np.zeros(1, dtype=np.int64)], 0
    for t in traces:
        offs.append(t.unit_offsets[1:] + pos)
        pos += t.unit_offsets[-1]
    cat = lambda f: np.concatenate([getattr(t, f) for t in traces])  # noqa: E731
    return Trace(ids=cat("ids"), input_len=cat("input_len"), output_len=cat("output_len"),
                 unit_offsets=np.concatenate(offs), unit_sym=cat("unit_sym"), unit_len=cat("unit_len"),
                 output_len_hint=cat("output_len_hint"), arrival_s=cat("arrival_s"),
                 ttft_slo_s=cat("ttft_slo_s"), tbt_slo_s=cat("tbt_slo_s"), jct_slo_s=cat("jct_slo_s"),
                 source=cat("source"), meta=meta or {})


def _unique_segment_start(prompts) -> int:
    top = -1
    for pr in prompts:
        if pr and isinstance(pr[0], (tuple, list)):
            top = max(top, max(int(s) for s, _ in pr))
    return top + 1 + (1 << 30)  # far from user segment ids


def _opt_array(name: str, v):
    if v is None:
        return None
    if name in ("source", "ids"):
        return np.asarray([str(x) for x in v], dtype=object)
    if name == "meta":
        return v
    if name == "output_len_hint":
        return np.asarray(v, dtype=np.int64)
    return np.asarray(v, dtype=np.float64)


# ---- Parquet I/O --------------------------------------------------------------------------
def write_trace(trace: Trace, path: str | Path) -> Path:
    """Write ``trace`` as Parquet (atomically: a temporary file renamed into place)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sim import columns as col
    from sim.io import atomic_path

    path = Path(path)
    n = trace.n
    counts = np.diff(trace.unit_offsets)
    is_seg = np.zeros(n, dtype=bool)
    nonempty = counts > 0
    is_seg[nonempty] = trace.unit_sym[trace.unit_offsets[:-1][nonempty]] >= SEGMENT_BASE
    unit_is_seg = np.repeat(is_seg, counts)

    def csr(rows):
        off = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.where(rows, counts, 0), out=off[1:])
        return off

    tokens = col.list_array(csr(~is_seg), col.to_arrow(trace.unit_sym[~unit_is_seg].astype(np.int32)), ~is_seg)
    seg_values = pa.StructArray.from_arrays(
        [col.to_arrow(trace.unit_sym[unit_is_seg] - SEGMENT_BASE),
         col.to_arrow(trace.unit_len[unit_is_seg].astype(np.int32))], names=["segment_id", "length"])
    segments = col.list_array(csr(is_seg), seg_values, is_seg)
    hint = trace.output_len_hint
    table = col.table({
        "id": col.to_arrow(trace.ids),
        "prompt_tokens": tokens,
        "prompt_segments": segments,
        "input_len": trace.input_len,
        "output_len": trace.output_len,
        "output_len_hint": col.to_arrow(hint, mask=hint < 0),
        "arrival_s": trace.arrival_s,
        "ttft_slo_s": col.to_arrow(trace.ttft_slo_s, mask=np.isnan(trace.ttft_slo_s)),
        "tbt_slo_s": col.to_arrow(trace.tbt_slo_s, mask=np.isnan(trace.tbt_slo_s)),
        "jct_slo_s": col.to_arrow(trace.jct_slo_s, mask=np.isnan(trace.jct_slo_s)),
        "source": col.to_arrow(trace.source).dictionary_encode(),
    })
    table = table.replace_schema_metadata({
        b"blendsim.schema_version": str(SCHEMA_VERSION).encode(),
        b"blendsim.meta": json.dumps(trace.meta, sort_keys=True, default=str).encode(),
    })
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return path


REQUIRED = ("input_len", "output_len")


def read_trace(path: str | Path) -> Trace:
    """Read a trace written by :func:`write_trace` (or any Parquet file with its columns)."""
    import pyarrow as pa

    from sim import columns as col

    path = Path(path)
    # NOTE: sim.columns rather than to_numpy, which imports pandas
    table = read_parquet(path, "Parquet trace", missing="no such file")
    md = table.schema.metadata or {}
    try:
        version = int(md.get(b"blendsim.schema_version", b"1"))
    except ValueError:
        raise UserError(f"{path}: unreadable schema version in the file metadata") from None
    if version > SCHEMA_VERSION:
        raise UserError(f"{path}: trace schema version {version} is newer than this blendsim ({SCHEMA_VERSION})")
    try:
        meta = json.loads(md.get(b"blendsim.meta", b"{}"))
    except json.JSONDecodeError:
        meta = {}
    cols = set(table.column_names)
    for c in REQUIRED:
        if c not in cols:
            raise UserError(f"{path}: missing column {c!r}")
    n = table.num_rows

    def ints(name):
        c = table.column(name)
        if not pa.types.is_integer(c.type):
            raise UserError(f"{path}: column {name!r} must hold integers, found {c.type}")
        if c.null_count:
            row = int(np.flatnonzero(~col.valid_mask(c))[0])
            raise UserError(f"{path}: row {row + 1}, field {name}: missing value")
        return col.to_numpy(c).astype(np.int64)

    def floats(name, default):
        if name not in cols:
            return np.full(n, default, dtype=np.float64)
        c = table.column(name)
        if not (pa.types.is_floating(c.type) or pa.types.is_integer(c.type) or pa.types.is_null(c.type)):
            raise UserError(f"{path}: column {name!r} must hold numbers, found {c.type}")
        return col.to_numpy(c, fill=default).astype(np.float64)

    def strings(name, default):
        if name not in cols:
            return default
        return col.to_numpy(table.column(name), fill="")

    input_len, output_len = ints("input_len"), ints("output_len")
    hint = col.to_numpy(table.column("output_len_hint"), fill=-1).astype(np.int64) \
        if "output_len_hint" in cols else np.full(n, -1, dtype=np.int64)
    ids = strings("id", np.arange(n).astype(str).astype(object))
    source = strings("source", np.full(n, "", dtype=object))

    counts = np.zeros(n, dtype=np.int64)
    has_prompt = np.zeros(n, dtype=bool)
    sym_chunks, len_chunks, owner_chunks = [], [], []
    if "prompt_tokens" in cols:
        valid, lens, flat = col.list_parts(table.column("prompt_tokens"))
        vals = col.to_numpy(flat).astype(np.int64)
        if len(vals) and (vals.min() < 0 or vals.max() > MAX_TOKEN_ID):
            bad = int(np.flatnonzero((vals < 0) | (vals > MAX_TOKEN_ID))[0])
            row = int(np.searchsorted(np.cumsum(lens), bad, side="right"))
            raise UserError(f"{path}: row {row + 1}, field prompt_tokens: token id out of range")
        sym_chunks.append(vals)
        len_chunks.append(np.ones(len(vals), dtype=np.int64))
        owner_chunks.append(np.repeat(np.arange(n), lens))
        counts += lens
        has_prompt |= valid & (lens > 0)
    if "prompt_segments" in cols:
        valid, lens, flat = col.list_parts(table.column("prompt_segments"))
        if (valid & has_prompt).any():
            row = int(np.flatnonzero(valid & has_prompt)[0])
            raise UserError(f"{path}: row {row + 1}: both prompt_tokens and prompt_segments are set")
        if len(flat) and (flat.field("segment_id").null_count or flat.field("length").null_count):
            raise UserError(f"{path}: field prompt_segments: a segment lacks its id or length")
        sid = col.to_numpy(flat.field("segment_id")).astype(np.int64)
        sln = col.to_numpy(flat.field("length")).astype(np.int64)
        if len(sid) and sid.min() < 0:
            row = int(np.repeat(np.arange(n), lens)[np.flatnonzero(sid < 0)[0]])
            raise UserError(f"{path}: row {row + 1}, field prompt_segments: negative segment id")
        sym_chunks.append(SEGMENT_BASE + sid)
        len_chunks.append(sln)
        owner_chunks.append(np.repeat(np.arange(n), lens))
        counts += lens
        has_prompt |= valid & (lens > 0)
    # rows without a prompt: a unique segment each (no false sharing)
    missing = np.flatnonzero(~has_prompt)
    if len(missing):
        used = np.concatenate(sym_chunks) if sym_chunks else np.zeros(0, dtype=np.int64)
        start = int(used.max() - SEGMENT_BASE + 1) if len(used) and used.max() >= SEGMENT_BASE else 0
        start = max(start, 1 << 30)
        sym_chunks.append(SEGMENT_BASE + start + np.arange(len(missing)))
        len_chunks.append(input_len[missing])
        owner_chunks.append(missing)
        counts[missing] = 1
    owner = np.concatenate(owner_chunks) if owner_chunks else np.zeros(0, dtype=np.int64)
    order = np.argsort(owner, kind="stable")
    unit_sym = np.concatenate(sym_chunks)[order] if sym_chunks else np.zeros(0, dtype=np.int64)
    unit_len = np.concatenate(len_chunks)[order] if len_chunks else np.zeros(0, dtype=np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    trace = Trace(
        ids=ids, input_len=input_len, output_len=output_len, unit_offsets=offsets,
        unit_sym=unit_sym, unit_len=unit_len, output_len_hint=hint,
        arrival_s=floats("arrival_s", 0.0), ttft_slo_s=floats("ttft_slo_s", np.nan),
        tbt_slo_s=floats("tbt_slo_s", np.nan), jct_slo_s=floats("jct_slo_s", np.nan),
        source=source, meta=meta,
    )
    trace.validate(str(path))
    return trace


__all__ = [
    "SCHEMA_VERSION", "SEGMENT_BASE", "Trace", "concat", "from_columns", "from_segment_arrays",
    "read_trace", "unique_prompts", "write_trace",
]
