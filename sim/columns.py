"""numpy <-> Arrow conversion that never imports pandas.

pyarrow imports pandas (a quarter of a second) the first time it converts a Python or numpy object
(``pa.array``, ``to_numpy``, compute functions with Python scalars), only to check whether the object is
a pandas one. Commands that read a trace, simulate and write results would pay that on every run, so
the project's Parquet I/O goes through these buffer-level helpers instead.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_NUMERIC = {
    np.dtype(np.int8): pa.int8(), np.dtype(np.int16): pa.int16(), np.dtype(np.int32): pa.int32(),
    np.dtype(np.int64): pa.int64(), np.dtype(np.uint8): pa.uint8(), np.dtype(np.uint32): pa.uint32(),
    np.dtype(np.uint64): pa.uint64(), np.dtype(np.float32): pa.float32(), np.dtype(np.float64): pa.float64(),
}
_BACK = {str(v): k for k, v in _NUMERIC.items()}


def _bitmap(valid: np.ndarray) -> pa.Buffer:
    return pa.py_buffer(np.packbits(valid.astype(bool), bitorder="little"))


def _unbits(buf: pa.Buffer, offset: int, n: int) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(buf, dtype=np.uint8), bitorder="little")
    return bits[offset:offset + n].astype(bool)


def to_arrow(a, mask: np.ndarray | None = None) -> pa.Array:
    """A numpy array (numbers, bools or strings) as an Arrow array; ``mask`` marks nulls."""
    a = np.asarray(a)
    n = len(a)
    validity = None if mask is None or not np.any(mask) else _bitmap(~np.asarray(mask))
    if a.dtype == bool:
        return pa.Array.from_buffers(pa.bool_(), n, [validity, _bitmap(a)])
    if a.dtype.kind in "OUST":  # T: numpy's variable-width StringDType (a trace's request ids)
        return strings(a, mask)
    a = np.ascontiguousarray(a)
    typ = _NUMERIC.get(a.dtype)
    if typ is None:
        a = a.astype(np.float64 if a.dtype.kind == "f" else np.int64)
        typ = _NUMERIC[a.dtype]
    return pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(a)])


_STR_CHUNK = 1 << 16  # values encoded at once by strings(): a 10M-row column never exists as 10M Python bytes


def strings(values, mask: np.ndarray | None = None) -> pa.Array:
    """A string array of ``values`` (a list or a numpy array; ``str`` of each, None as ""), encoded a chunk at a
    time."""
    n = len(values)
    lens = np.empty(n, dtype=np.int64)
    parts = []
    for a in range(0, n, _STR_CHUNK):
        chunk = values[a:a + _STR_CHUNK]
        enc = [("" if v is None else str(v)).encode("utf-8") for v in (chunk.tolist() if isinstance(chunk, np.ndarray)
                                                                          else chunk)]
        lens[a:a + len(enc)] = np.fromiter(map(len, enc), dtype=np.int64, count=len(enc))
        parts.append(b"".join(enc))
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    validity = None if mask is None or not np.any(mask) else _bitmap(~np.asarray(mask))
    typ, off = (pa.string(), offsets.astype(np.int32)) if offsets[-1] < 2**31 else (pa.large_string(), offsets)
    return pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(off), pa.py_buffer(b"".join(parts))])


def list_array(offsets: np.ndarray, values: pa.Array, valid: np.ndarray | None = None) -> pa.Array:
    """A list array from CSR offsets; rows where ``valid`` is False are null (and must be empty)."""
    off = np.asarray(offsets)
    typ, off = (pa.list_(values.type), off.astype(np.int32)) if off[-1] < 2**31 else \
        (pa.large_list(values.type), off.astype(np.int64))
    validity = None if valid is None or np.all(valid) else _bitmap(valid)
    return pa.ListArray.from_buffers(typ, len(off) - 1, [validity, pa.py_buffer(off)], children=[values]) \
        if typ == pa.list_(values.type) else \
        pa.LargeListArray.from_buffers(typ, len(off) - 1, [validity, pa.py_buffer(off)], children=[values])


def table(columns: dict) -> pa.Table:
    """A table from numpy arrays (or ready Arrow arrays)."""
    return pa.Table.from_arrays([c if isinstance(c, pa.Array) else to_arrow(c) for c in columns.values()],
                                names=list(columns))


def combine(col) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.chunk(0) if col.num_chunks == 1 else pa.concat_arrays(col.chunks)
    return col


def valid_mask(arr) -> np.ndarray:
    arr = combine(arr)
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return _unbits(arr.buffers()[0], arr.offset, len(arr))


def to_numpy(arr, fill=None) -> np.ndarray:
    """An Arrow numeric/bool/string/dictionary array as numpy; nulls become ``fill``."""
    arr = combine(arr)
    t = arr.type
    n = len(arr)
    if pa.types.is_dictionary(t):
        idx = to_numpy(arr.indices, fill=0).astype(np.int64)
        words = np.array(to_numpy(arr.dictionary, fill=fill).tolist() + [fill], dtype=object)
        valid = valid_mask(arr)
        return words[np.where(valid, idx, len(words) - 1)]
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        vals = arr.to_pylist()
        return np.array([fill if v is None else v for v in vals] if arr.null_count else vals, dtype=object)
    if pa.types.is_boolean(t):
        out = _unbits(arr.buffers()[1], arr.offset, n)
    elif pa.types.is_null(t):
        return np.full(n, fill)
    else:
        dt = _BACK.get(str(t))
        if dt is None:
            raise TypeError(f"unsupported Arrow type {t}")
        out = np.frombuffer(arr.buffers()[1], dtype=dt, count=n, offset=arr.offset * dt.itemsize).copy()
    if arr.null_count:
        valid = valid_mask(arr)
        if fill is not None:
            out = out.astype(np.result_type(out.dtype, np.asarray(fill).dtype))
        out[~valid] = fill if fill is not None else 0
    return out


def list_parts(arr) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """(valid, lengths, flattened values) of a list array; null rows have length 0."""
    arr = combine(arr)
    valid = valid_mask(arr)
    off = to_numpy(arr.offsets).astype(np.int64)
    lens = np.where(valid, np.diff(off), 0)
    return valid, lens, arr.flatten()


__all__ = ["combine", "list_array", "list_parts", "strings", "table", "to_arrow", "to_numpy", "valid_mask"]
