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

from blendsim.sim.errors import UserError
from blendsim.sim.io import read_parquet

SCHEMA_VERSION = 1
SEGMENT_BASE = 1 << 40  # unit symbols at or above this are segments, below are token ids
MAX_TOKEN_ID = (1 << 31) - 1
# Bounds on every length and time a trace may hold. No model's context reaches MAX_TOKENS (the longest
# public one, Llama 4 Scout's, is 10M tokens), so a longer prompt or output is a corrupt input, and the
# bound keeps every sum over a trace far inside int64. At MAX_TIME_S (31.7 years) float64 still
# resolves 0.1 us, so step times of microseconds still advance the clock.
MAX_TOKENS = 10_000_000
MAX_TIME_S = 1e9
# Most requests a synthetic recipe makes (BlendServe's workloads hold 400,000; the full BurstGPT log ~5.3M):
# a typo such as requests=10**12 would otherwise ask for terabytes before anything else is checked.
MAX_REQUESTS = 10_000_000
MAX_SEGMENT_ID = (1 << 62) - SEGMENT_BASE  # SEGMENT_BASE + id stays inside int64
TOO_LONG = f"exceeds {MAX_TOKENS:,} tokens (MAX_TOKENS: longer than any model's context)"
TOO_LATE = f"exceeds {MAX_TIME_S:.0e} seconds (MAX_TIME_S)"


_CONSTANT_FILLS = (("output_len_hint", -1, np.int64), ("arrival_s", 0.0, np.float64), ("ttft_slo_s", np.nan, np.float64),
                   ("tbt_slo_s", np.nan, np.float64), ("jct_slo_s", np.nan, np.float64))


def _all_equal(v, fill) -> bool:
    """Whether every value of ``v`` is ``fill`` (NaN: every value NaN), with ``v`` of ``fill``'s kind of dtype."""
    v = np.asarray(v)
    if v.dtype.kind != ("i" if isinstance(fill, int) else "f") or v.dtype.itemsize != 8:
        return False
    if fill != fill:
        return bool(np.isnan(v).all())
    # the same bits as the fill: -0.0 equals 0.0 but is written as itself
    return bool((v == fill).all() and (v.dtype.kind == "i" or not np.signbit(v).any()))


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
        # a column that holds its "none" value everywhere (no hints, all at t=0, no SLOs: every synthetic
        # offline trace) is one read-only value broadcast to n rows, not n copies (40 bytes a request)
        for f, fill, dt in _CONSTANT_FILLS:
            v = getattr(self, f)
            if v is None or (len(v) == n and _all_equal(v, fill)):
                setattr(self, f, np.broadcast_to(np.array(fill, dtype=dt), (n,)))
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

    def readonly(self) -> Trace:
        """The same trace over read-only views of its columns (what a policy sees: writing to one raises, and the
        caller's own arrays stay as they were)."""
        import dataclasses

        def view(a):
            if not isinstance(a, np.ndarray):
                return a
            v = a.view()
            v.flags.writeable = False
            return v

        return dataclasses.replace(self, **{f.name: view(getattr(self, f.name)) for f in dataclasses.fields(self)
                                            if isinstance(getattr(self, f.name), np.ndarray)}, meta=dict(self.meta))

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

    def part_meta(self) -> dict:
        """The meta for a trace cut from this one (fewer requests, shorter ones): a recipe's ``measured`` density
        and sharing were of these requests as they are, so they go; a hashed file's block counts stay, as the
        whole file's (``hashed_file``), not this trace's."""
        out = {k: v for k, v in self.meta.items() if k not in ("measured", "hashed")}
        if "hashed" in self.meta:
            out["hashed_file"] = self.meta["hashed"]
        return out

    def offline(self) -> Trace:
        """The same requests, all released at t=0."""
        import dataclasses

        return dataclasses.replace(self, arrival_s=None, meta=dict(self.meta))  # shares the other columns

    def validate(self, where: str = "trace") -> None:
        """Check every field of every row; raise :class:`UserError` naming the first bad row (1-based) and
        field. Lengths are bounded by :data:`MAX_TOKENS`, times by :data:`MAX_TIME_S`."""
        n = self.n
        for name in ("ids", "output_len", "output_len_hint", "arrival_s", "ttft_slo_s", "tbt_slo_s", "jct_slo_s",
                     "source"):
            if len(getattr(self, name)) != n:
                raise UserError(f"{where}: {name} has {len(getattr(self, name))} rows, expected {n}")
        off = self.unit_offsets
        if len(off) != n + 1 or off[0] != 0 or np.any(np.diff(off) < 0) or off[-1] != len(self.unit_sym) \
                or len(self.unit_len) != len(self.unit_sym):
            raise UserError(f"{where}: prompt offsets do not match the number of rows")
        for f in ("input_len", "output_len"):
            v = getattr(self, f)
            _first_bad(where, f, v < 1, "must be a positive integer", v)
            _first_bad(where, f, v > MAX_TOKENS, TOO_LONG, v)
        hint = self.output_len_hint
        _first_bad(where, "output_len_hint", (hint != -1) & (hint < 1), "must be positive when given", hint)
        _first_bad(where, "output_len_hint", hint > MAX_TOKENS, TOO_LONG, hint)
        arr = self.arrival_s
        _first_bad(where, "arrival_s", ~np.isfinite(arr) | (arr < 0), "must be a finite time >= 0", arr)
        _first_bad(where, "arrival_s", arr > MAX_TIME_S, TOO_LATE, arr)
        for f in ("ttft_slo_s", "tbt_slo_s", "jct_slo_s"):
            v = getattr(self, f)
            _first_bad(where, f, ~np.isnan(v) & ~(v > 0), "must be positive when given", v)
            _first_bad(where, f, ~np.isnan(v) & (v > MAX_TIME_S), TOO_LATE, v)
        self._validate_ids(where)
        counts = np.diff(off)
        _first_bad(where, "prompt", counts == 0, "is empty", counts)
        owner = np.repeat(np.arange(n), counts)
        seg = self.unit_sym >= SEGMENT_BASE
        tok = ~seg
        _first_bad(where, "prompt_tokens", tok & ((self.unit_sym < 0) | (self.unit_sym > MAX_TOKEN_ID)),
                   f"is not a token id (0..{MAX_TOKEN_ID})", self.unit_sym, rows=owner)
        _first_bad(where, "prompt_tokens", tok & (self.unit_len != 1), "is a token length other than 1",
                   self.unit_len, rows=owner)
        _first_bad(where, "prompt_segments", seg & (self.unit_len < 1), "has a segment of length < 1",
                   self.unit_len, rows=owner)
        _first_bad(where, "prompt_segments", seg & (self.unit_len > MAX_TOKENS), TOO_LONG, self.unit_len, rows=owner)
        if n:
            mixed = np.minimum.reduceat(seg, off[:-1]) != np.maximum.reduceat(seg, off[:-1])
            _first_bad(where, "prompt", mixed, "mixes token ids and segments", counts)
            prompt_len = np.add.reduceat(self.unit_len, off[:-1])  # bounded above: no overflow
            _first_bad(where, "input_len", prompt_len != self.input_len,
                       "does not equal the prompt's length", self.input_len, other=prompt_len)
        # a segment id must mean the same tokens everywhere: same length in every row
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

    def _validate_ids(self, where: str) -> None:
        ids = self.ids
        if any(not isinstance(x, str) for x in ids):
            i = next(i for i, x in enumerate(ids) if not isinstance(x, str))
            raise UserError(f"{where}: row {i + 1}, field id: {ids[i]!r} is not a string")
        if len(set(ids)) != len(ids):
            first: dict = {}
            for i, x in enumerate(ids):
                if x in first:
                    raise UserError(f"{where}: row {i + 1}, field id: {x!r} repeats row {first[x] + 1} "
                                    "(request ids must be unique)")
                first[x] = i

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
    input_len = _length_column("input_len", input_len)
    output_len = _length_column("output_len", output_len)
    n = len(input_len)
    if prompts is None:
        prompts = [None] * n
    if not isinstance(prompts, (list, tuple)) or len(prompts) != n:
        raise UserError(f"prompts: expected a list of {n} prompts (one per request, None for a unique one), got "
                        f"{type(prompts).__name__}" + (f" of {len(prompts)}" if isinstance(prompts, (list, tuple))
                                                       else ""))
    try:
        return _from_prompts(input_len, output_len, prompts, ids, optional)
    except (TypeError, ValueError, OverflowError) as e:
        raise UserError(f"make_trace: {str(e).splitlines()[0][:160]}") from None


def _length_column(name: str, v) -> np.ndarray:
    """A column of whole token counts as int64, or one line naming the column and the first bad row (a float
    NaN, a fraction or a value beyond int64 would otherwise fail or wrap inside numpy)."""
    try:
        a = np.asarray(v)
    except (TypeError, ValueError) as e:
        raise UserError(f"{name}: not a column of numbers ({e})") from None
    if a.ndim != 1:
        raise UserError(f"{name}: expected one number per request (a list or 1-D array), got shape {a.shape}")
    if a.size == 0:
        return a.astype(np.int64)
    if a.dtype.kind not in "iuf":
        raise UserError(f"{name}: expected whole numbers of tokens, got values of type {a.dtype}")
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(a.astype(np.float64)) | (a != np.floor(a)) | (a < 1) | (a > MAX_TOKENS)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise UserError(f"{name}: row {i + 1}: {a[i].item()!r} is not a whole number of tokens in "
                        f"1..{MAX_TOKENS:,} (MAX_TOKENS)")
    return a.astype(np.int64)


def _from_prompts(input_len, output_len, prompts, ids, optional) -> Trace:
    n = len(input_len)
    counts = np.empty(n, dtype=np.int64)
    syms: list[int] = []
    lens: list[int] = []
    next_unique = _unique_segment_start(prompts)
    for i, pr in enumerate(prompts):
        if pr is None:
            if next_unique > MAX_SEGMENT_ID:  # user segment ids near the top leave no room for a prompt of its own
                raise UserError(f"prompts[{i}]: None needs a segment id of its own above the given ones, past "
                                f"{MAX_SEGMENT_ID:,}; give this prompt's segments, or use smaller segment ids")
            syms.append(SEGMENT_BASE + next_unique)
            lens.append(int(input_len[i]))
            next_unique += 1
            counts[i] = 1
            continue
        if isinstance(pr, (str, bytes)) or not isinstance(pr, (list, tuple, np.ndarray)):
            raise UserError(f"prompts[{i}]: expected a list of token ids or of (segment_id, length) pairs, or None, "
                            f"got {type(pr).__name__}")
        try:
            if len(pr) and isinstance(pr[0], (tuple, list)):
                for sid, ln in pr:
                    if not 0 <= _whole(sid) <= MAX_SEGMENT_ID:
                        raise UserError(f"prompts[{i}]: segment id {sid} is not in 0..{MAX_SEGMENT_ID:,}")
                    syms.append(SEGMENT_BASE + _whole(sid))
                    lens.append(_whole(ln))
            else:
                for t in pr:
                    if not 0 <= _whole(t) <= MAX_TOKEN_ID:  # above it a value would read back as a segment
                        raise UserError(f"prompts[{i}]: {t} is not a token id (0..{MAX_TOKEN_ID:,})")
                    syms.append(_whole(t))
                lens.extend([1] * len(pr))
        except (TypeError, ValueError):
            raise UserError(f"prompts[{i}]: expected a list of token ids or of (segment_id, length) pairs, or None; "
                            f"{str(pr)[:60]} holds something else") from None
        counts[i] = len(pr)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    ids = np.array([str(i) for i in range(n)], dtype=object) if ids is None else _opt_array("ids", ids)
    return Trace(ids=ids, input_len=input_len, output_len=output_len, unit_offsets=offsets,
                 unit_sym=np.array(syms, dtype=np.int64), unit_len=np.array(lens, dtype=np.int64),
                 **{k: _opt_array(k, v) for k, v in optional.items()})


def _whole(x) -> int:
    """An integer token id, segment id or length (a float or string is not one)."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(x)
    return int(x)


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
        if pr is not None and len(pr) and isinstance(pr[0], (tuple, list)):  # a numpy array of token ids has no truth
            top = max(top, max(int(s) for s, _ in pr))
    return top + 1 + (1 << 30)  # far from user segment ids


def _opt_array(name: str, v):
    if v is None:
        return None
    if name == "meta":  # how the trace was made, written into the Parquet file as JSON
        import json

        if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
            raise UserError(f"meta: expected a dict of name -> JSON value (how the trace was made), got "
                            f"{type(v).__name__}")
        try:
            json.dumps(v, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise UserError(f"meta: every value must be JSON (a string, number, list or dict): {e}") from None
        return dict(v)
    if isinstance(v, (str, bytes, dict)) or np.ndim(v) != 1:
        raise UserError(f"{name}: expected one value per request (a list or 1-D array), got {type(v).__name__}")
    if name in ("source", "ids"):
        for i, x in enumerate(v):  # None or NaN would become the text 'None' / 'nan': an id no one gave
            if x is None or (isinstance(x, float) and x != x):
                raise UserError(f"{name}[{i}]: {x!r} is no {'id' if name == 'ids' else 'label'}; give a string or a "
                                f"number (or leave {name} out)")
        return np.asarray([str(x) for x in v], dtype=object)
    if name == "output_len_hint":
        a = np.asarray(v)
        if a.dtype.kind not in "iu" and not (a.dtype.kind == "f" and np.isfinite(a).all() and (a == np.floor(a)).all()
                                           and np.abs(a).max(initial=0) <= MAX_TOKENS):
            raise UserError(f"{name}: expected whole numbers of tokens (-1: none), got {a.dtype} values")
        return a.astype(np.int64)
    a = np.asarray(v)
    if a.dtype.kind not in "iuf":
        raise UserError(f"{name}: expected numbers (seconds), got values of type {a.dtype}")
    return a.astype(np.float64)


# ---- Parquet I/O --------------------------------------------------------------------------
def write_trace(trace: Trace, path: str | Path) -> Path:
    """Write ``trace`` as Parquet (atomically: a temporary file renamed into place)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from blendsim.sim import columns as col
    from blendsim.sim.io import atomic_path, check_own_file

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
    check_own_file(path, is_trace_file, "blendsim trace")
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return path


def is_trace_file(path: str | Path) -> bool:
    """Whether ``path`` is a trace blendsim wrote (a Parquet file carrying its schema metadata): what a new
    trace may replace."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
    except Exception:  # noqa: BLE001 -- anything unreadable as Parquet is not ours
        return False
    return b"blendsim.schema_version" in meta


REQUIRED = ("input_len", "output_len")
# every column read_trace reads (write_trace's), and those a trace may leave out (a default stands in)
TRACE_COLUMNS = ("id", "input_len", "output_len", "prompt_tokens", "prompt_segments", "output_len_hint", "arrival_s",
                 "ttft_slo_s", "tbt_slo_s", "jct_slo_s", "source")
OPTIONAL_COLUMNS = ("output_len_hint", "arrival_s", "ttft_slo_s", "tbt_slo_s", "jct_slo_s", "source")
# columns only a run's requests.parquet has (blendsim.runner's per-request table): such a file is refused as a trace
RUN_TABLE_COLUMNS = frozenset({"admit_s", "first_token_s", "finish_s", "generated_tokens", "prefill_computed"})


def read_trace(path: str | Path, allow_empty: bool = False) -> Trace:
    """Read a trace written by :func:`write_trace` (or any Parquet file with its columns).

    Every column's type and every value is checked (one line naming the file, row and field); a trace
    without rows is refused unless ``allow_empty``.
    """
    path = Path(path)
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
    except (ValueError, RecursionError):
        meta = {}
    if not isinstance(meta, dict):
        meta = {}
    cols = set(table.column_names)
    if RUN_TABLE_COLUMNS <= cols and not cols & {"prompt_tokens", "prompt_segments"}:
        # simulate's requests.parquet: its lengths without the prompts' shared tokens
        raise UserError(f"{path}: this is a run's per-request table (written by blendsim simulate), not a trace: "
                        f"it has no prompt tokens, so sharing would read as none; give the trace the run was made "
                        f"from")
    if not cols & set(REQUIRED) and {"t_end_s", "dt_s", "num_tokens"} <= cols:  # simulate's steps.parquet
        raise UserError(f"{path}: this is a run's per-step table (written by blendsim simulate), not a trace; give "
                        f"the trace the run was made from")
    for c in REQUIRED:
        if c not in cols:
            raise UserError(f"{path}: missing column {c!r}")
    from blendsim.sim.checks import misspelt

    typo = misspelt(table.column_names, OPTIONAL_COLUMNS, TRACE_COLUMNS)
    if typo:  # ttft_slo would leave the trace without SLOs, unsaid (the JSONL reader refuses it too)
        raise UserError(f"{path}: column {typo[0]!r} is not one blendsim reads; did you mean {typo[1]!r}?")
    if table.num_rows == 0 and not allow_empty:
        raise UserError(f"{path}: the trace has no requests")
    trace = _TraceColumns(path, table).trace(meta)
    del table
    _release_arrow_memory()
    trace.validate(str(path))
    return trace


def compact_strings(a: np.ndarray) -> np.ndarray:
    """An object array of ``str`` as numpy's variable-width StringDType: a string of up to 15 bytes sits in the
    array's own 16 bytes, not in a ~55-byte Python object (10M request ids: 0.16 GB, not 0.6 GB). Items read back
    as ``str``. Converted a chunk at a time; anything but an object array of ``str`` is returned as it is."""
    if a.dtype != object or not all(type(x) is str for x in a):
        return a
    out = np.empty(len(a), dtype=np.dtypes.StringDType())
    step = 1 << 16
    for i in range(0, len(a), step):
        out[i:i + step] = a[i:i + step]
    return out


def _release_arrow_memory() -> None:
    """Hand the memory Arrow's allocator keeps after reading a table back to the system: numpy cannot reuse it,
    and on a 1M-request trace it is ~150 MB (10M: 1.5 GB) held for the rest of the run."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


class _TraceColumns:
    """Typed, checked numpy columns of a trace table (NOTE: sim.columns rather than to_numpy, which
    imports pandas)."""

    def __init__(self, path: Path, table):
        self.path, self.table = path, table
        self.cols = set(table.column_names)
        self.n = table.num_rows

    def column(self, name: str):
        """One Arrow array (combine_chunks: a table without rows may have no chunk at all)."""
        return self.table.column(name).combine_chunks()

    def fail(self, name: str, what: str, row: int | None = None):
        at = f"row {row + 1}, field {name}:" if row is not None else f"column {name!r}"
        raise UserError(f"{self.path}: {at} {what}")

    def ints(self, name: str, fill: int | None = None, low: int = 1, high: int = MAX_TOKENS) -> np.ndarray:
        """An integer column within [low, high]; nulls are ``fill`` (or refused when None)."""
        import pyarrow as pa


        c = self.column(name)
        if pa.types.is_null(c.type) and fill is not None:
            return np.full(self.n, fill, dtype=np.int64)
        if not pa.types.is_integer(c.type):
            self.fail(name, f"must hold integers, found {c.type}")
        return self._bounded(name, c, fill, low, high)

    def _bounded(self, name, c, fill, low, high, rows=None) -> np.ndarray:
        from blendsim.sim import columns as col

        valid = col.valid_mask(c)
        if fill is None and not valid.all():
            i = int(np.flatnonzero(~valid)[0])
            self.fail(name, "missing value", int(rows[i]) if rows is not None else i)
        raw = col.to_numpy(c)  # its own integer type: compare before any cast can wrap
        bad = np.flatnonzero(valid & ((raw < low) | (raw > high)))
        if len(bad):
            i = int(bad[0])
            what = TOO_LONG if high == MAX_TOKENS and raw[i] > high else f"must be in {low}..{high}"
            self.fail(name, f"{raw[i].item()!r} {what}", int(rows[i]) if rows is not None else i)
        return np.where(valid, raw.astype(np.int64), fill if fill is not None else 0)

    def floats(self, name: str, default: float) -> np.ndarray:
        import pyarrow as pa

        from blendsim.sim import columns as col

        if name not in self.cols:
            return np.full(self.n, default, dtype=np.float64)
        c = self.column(name)
        if not (pa.types.is_floating(c.type) or pa.types.is_integer(c.type) or pa.types.is_null(c.type)):
            self.fail(name, f"must hold numbers, found {c.type}")
        if pa.types.is_floating(c.type) and c.type.bit_width == 16:
            c = c.cast(pa.float32())
        if name == "arrival_s" and 0 < c.null_count < len(c):  # some requests timed, others not: when do they come?
            import pyarrow.compute as pc

            self.fail(name, "is missing (null) where other rows have an arrival time; give every row one (0 for "
                            "offline), or none", int(pc.index(pc.is_null(c), True).as_py()))
        return col.to_numpy(c, fill=default).astype(np.float64)

    def strings(self, name: str, default, ints_ok: bool, allow_null: bool) -> np.ndarray:
        import pyarrow as pa

        from blendsim.sim import columns as col

        if name not in self.cols:
            return default
        c = self.column(name)
        t = c.type.value_type if pa.types.is_dictionary(c.type) else c.type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(c.type)
                or (ints_ok and pa.types.is_integer(t))):
            self.fail(name, f"must hold {'strings or integers' if ints_ok else 'strings'}, found {c.type}")
        if not allow_null and c.null_count:
            self.fail(name, "missing value", 0 if pa.types.is_null(c.type) else int(np.flatnonzero(~col.valid_mask(c))[0]))
        if pa.types.is_null(c.type):
            return np.full(self.n, "", dtype=object)
        v = col.to_numpy(c, fill="")
        if pa.types.is_integer(t):
            return np.array([str(x) for x in v.tolist()], dtype=object)
        return v

    def lists(self, name: str):
        """(valid, lengths, flat values, owner row of each value) of a list column."""
        import pyarrow as pa

        from blendsim.sim import columns as col

        c = self.column(name)
        if pa.types.is_null(c.type):
            return np.zeros(self.n, dtype=bool), np.zeros(self.n, dtype=np.int64), None, np.zeros(0, dtype=np.int64)
        if not (pa.types.is_list(c.type) or pa.types.is_large_list(c.type)):
            self.fail(name, f"must hold lists, found {c.type}")
        valid, lens, flat = col.list_parts(c)
        return valid, lens, flat, np.repeat(np.arange(self.n), lens)

    def trace(self, meta: dict) -> Trace:
        import pyarrow as pa

        from blendsim.sim import columns as col

        n, cols = self.n, self.cols
        input_len, output_len = self.ints("input_len"), self.ints("output_len")
        hint = self.ints("output_len_hint", fill=-1) if "output_len_hint" in cols else np.full(n, -1, dtype=np.int64)
        ids = compact_strings(self.strings("id", np.arange(n).astype(str).astype(object), ints_ok=True,
                                          allow_null=False))
        source = self.strings("source", np.full(n, "", dtype=object), ints_ok=False, allow_null=True)

        counts = np.zeros(n, dtype=np.int64)
        has_prompt = np.zeros(n, dtype=bool)
        sym_chunks, len_chunks, owner_chunks = [], [], []
        if "prompt_tokens" in cols:
            valid, lens, flat, owner = self.lists("prompt_tokens")
            if (valid & (lens == 0)).any():  # an empty prompt, where null means "none given"
                self.fail("prompt_tokens", "is an empty list (a prompt has at least one token; leave the cell null for a "
                          "prompt of its own)", int(np.flatnonzero(valid & (lens == 0))[0]))
            if flat is not None and len(flat):
                if not pa.types.is_integer(flat.type):
                    self.fail("prompt_tokens", f"must hold lists of integer token ids, found lists of {flat.type}")
                vals = self._bounded("prompt_tokens", flat, None, 0, MAX_TOKEN_ID, rows=owner)
                sym_chunks.append(vals)
                len_chunks.append(np.ones(len(vals), dtype=np.int64))
                owner_chunks.append(owner)
                counts += lens
                has_prompt |= valid & (lens > 0)
        if "prompt_segments" in cols:
            valid, lens, flat, owner = self.lists("prompt_segments")
            if (valid & (lens == 0)).any():  # an empty prompt, where null means "none given"
                self.fail("prompt_segments", "is an empty list (a prompt has at least one token; leave the cell null for a "
                          "prompt of its own)", int(np.flatnonzero(valid & (lens == 0))[0]))
            if (valid & has_prompt).any():
                row = int(np.flatnonzero(valid & has_prompt)[0])
                raise UserError(f"{self.path}: row {row + 1}: both prompt_tokens and prompt_segments are set")
            if flat is not None and len(flat):
                names = [flat.type.field(i).name for i in range(flat.type.num_fields)] \
                    if pa.types.is_struct(flat.type) else []
                if "segment_id" not in names or "length" not in names:
                    self.fail("prompt_segments", f"must hold (segment_id, length) structs, found {flat.type}")
                for f in ("segment_id", "length"):
                    if not pa.types.is_integer(flat.field(f).type):
                        self.fail("prompt_segments", f"must hold integer {f}s, found {flat.field(f).type}")
                if flat.null_count:
                    self.fail("prompt_segments", "a segment is null", int(owner[np.flatnonzero(~col.valid_mask(flat))[0]]))
                sid = self._bounded("prompt_segments", flat.field("segment_id"), None, 0, MAX_SEGMENT_ID, rows=owner)
                sln = self._bounded("prompt_segments", flat.field("length"), None, 1, MAX_TOKENS, rows=owner)
                sym_chunks.append(SEGMENT_BASE + sid)
                len_chunks.append(sln)
                owner_chunks.append(owner)
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
        return Trace(
            ids=ids, input_len=input_len, output_len=output_len, unit_offsets=offsets,
            unit_sym=unit_sym, unit_len=unit_len, output_len_hint=hint,
            arrival_s=self.floats("arrival_s", 0.0), ttft_slo_s=self.floats("ttft_slo_s", np.nan),
            tbt_slo_s=self.floats("tbt_slo_s", np.nan), jct_slo_s=self.floats("jct_slo_s", np.nan),
            source=source, meta=meta,
        )


__all__ = [
    "MAX_TIME_S", "MAX_TOKENS", "SCHEMA_VERSION", "SEGMENT_BASE", "Trace", "concat", "from_columns", "from_segment_arrays",
    "is_trace_file", "read_trace", "unique_prompts", "write_trace",
]
