"""Property tests (issue 14): malformed traces and profiles never end in anything but one clear line.

Hypothesis builds JSONL, CSV (BurstGPT, Azure, Vidur) and Parquet traces and calibration profiles from
valid and invalid pieces (huge, negative, fractional, non-finite, mistyped, missing, duplicated values).
For each, the loader must either return something every later stage can use — a trace that passes
validation and survives a Parquet round trip; a profile whose fits give positive finite times and that
``calibrate show`` prints — or raise :class:`UserError` with one line that starts with the file's path and
names the field (or says what is wrong with the file as a whole). Any other exception fails the test.
Derandomised and bounded so CI is deterministic and fast; no subnormal floats (torch may have set the
processor to flush them to zero earlier in the same test session).
"""

from __future__ import annotations

import functools
import io
import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blendsim.sim.errors import UserError
from blendsim.workloads.loaders import load
from blendsim.workloads.trace import read_trace, write_trace

SETTINGS = settings(max_examples=80, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# what a message names when no single field is at fault
WHOLE_FILE = ("not valid JSON", "not usable JSON", "no requests", "expected a JSON object", "not a UTF-8",
              "is empty", "no data rows", "malformed CSV", "missing column", "not a text CSV", "not UTF-8 text", "no successful",
              "not a blendsim profile", "schema version", "corrupt profile", "missing field", "both prompt_tokens")


def check_error(e: UserError, path: Path) -> None:
    msg = str(e)
    assert "\n" not in msg and msg.startswith(str(path)), msg
    named = ("field", "column", ": ops.")  # ops.<operator> is a profile's field path
    assert any(w in msg for w in named) or any(w in msg for w in WHOLE_FILE), msg


def check_trace(t, tmp: Path) -> None:
    """A loaded trace is whole: it validates and a Parquet round trip keeps every value."""
    t.validate("loaded")
    back = read_trace(write_trace(t, tmp / "round.parquet"), allow_empty=True)
    assert back.ids.tolist() == t.ids.tolist()
    np.testing.assert_array_equal(back.input_len, t.input_len)
    np.testing.assert_array_equal(back.output_len, t.output_len)
    np.testing.assert_array_equal(back.output_len_hint, t.output_len_hint)
    np.testing.assert_array_equal(back.arrival_s, t.arrival_s)
    assert [back.prompt_repr(i) for i in range(back.n)] == [t.prompt_repr(i) for i in range(t.n)]


def attempt(path: Path, fn) -> None:
    try:
        result = fn()
    except UserError as e:
        check_error(e, path)
        return
    check_trace(result, path.parent)


# ---- values: a valid base, then a few corruptions ------------------------------------------------
INTS = st.one_of(st.integers(0, 60), st.sampled_from([1, 2**31, 2**63 - 1, 2**63, 2**64, -1, 10**7, 10**7 + 1]))
JSON_ANY = st.recursive(
    st.one_of(st.none(), st.booleans(), INTS, st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False),
              st.text(max_size=4)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=6,
)
NUMBER = st.one_of(INTS, st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False), st.sampled_from([0.5, 1e308, -1e308, 1e9]))
BAD = st.one_of(NUMBER, JSON_ANY)
N_BAD = st.sampled_from([0, 0, 1, 1, 2])  # corruptions per input: a third of inputs are clean


@st.composite
def jsonl_lines(draw):
    recs = []
    for _ in range(draw(st.integers(1, 5))):
        rec = {"prompt_token_ids": draw(st.lists(st.integers(0, 9), min_size=1, max_size=6)),
               "output_len": draw(st.integers(1, 50))}
        if draw(st.booleans()):
            rec["id"] = draw(st.one_of(st.integers(0, 3), st.sampled_from(["a", "b", "c"])))
        if draw(st.booleans()):
            rec["output_len_hint"] = draw(st.integers(1, 50))
        for k in ("arrival_s", "ttft_slo_s", "tbt_slo_s", "jct_slo_s"):
            if draw(st.integers(0, 3)) == 0:
                rec[k] = draw(st.floats(0.001, 1e4, allow_subnormal=False))
        if draw(st.integers(0, 3)) == 0:
            rec["source"] = draw(st.sampled_from(["chat", "code", ""]))
        recs.append(rec)
    keys = ("prompt_token_ids", "output_len", "id", "output_len_hint", "arrival_s", "ttft_slo_s", "source")
    for _ in range(draw(N_BAD)):
        rec = draw(st.sampled_from(recs))
        key = draw(st.sampled_from(keys))
        if draw(st.integers(0, 4)) == 0:
            rec.pop(key, None)
        elif key == "prompt_token_ids" and isinstance(rec.get(key), list) and draw(st.booleans()):
            rec[key] = rec[key] + [draw(BAD)]
        else:
            rec[key] = draw(BAD)
    lines = [json.dumps(r) for r in recs]
    if draw(st.integers(0, 5)) == 0:
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(["", "  ", "{", "[1]", "NaN", "1e999"])))
    return lines


@SETTINGS
@given(lines=jsonl_lines(), bom=st.booleans(), limit=st.sampled_from([None, None, 1, 2]))
def test_jsonl_loader(lines, bom, limit):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.jsonl"
        path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + "\n".join(lines).encode())
        attempt(path, lambda: load(path, "jsonl", limit))


# ---- CSVs -------------------------------------------------------------------------------------------
BAD_CELL = st.sampled_from(
    ["", "0", "-1", "1.5", "1e30", "9223372036854775808", "18446744073709551616", "inf", "-inf", "nan", "1e308",
     "-1e308", "abc", " 12 ", "10000001", "10000000", "1e9", "1e10", "\"3\"", "2023-11-16 18:15:47+02:00",
     "2023-11-16T18:15:47Z", "9999-12-31 00:00:00", "0001-01-01 00:00:00", "yesterday", "2023-13-45 99:99:99"])
TOKENS_CELL = st.integers(1, 5000).map(str)
FORMATS = {
    "burstgpt": (("Timestamp", st.integers(0, 10**6).map(str)), ("Model", st.sampled_from(["ChatGPT", "GPT-4"])),
                 ("Request tokens", TOKENS_CELL), ("Response tokens", st.integers(0, 900).map(str))),
    "azure": (("TIMESTAMP", st.integers(0, 59).map(lambda s: f"2023-11-16 18:15:{s:02d}.6805900")),
              ("ContextTokens", TOKENS_CELL), ("GeneratedTokens", TOKENS_CELL)),
    "vidur": (("arrived_at", st.floats(0, 1e5, allow_subnormal=False).map(repr)), ("num_prefill_tokens", TOKENS_CELL),
              ("num_decode_tokens", TOKENS_CELL)),
}


@st.composite
def csv_files(draw):
    fmt = draw(st.sampled_from(sorted(FORMATS)))
    cols = list(FORMATS[fmt])
    rows = [list(r) for r in draw(st.lists(st.tuples(*[s for _, s in cols]), min_size=1, max_size=5))]
    truncate = False
    for _ in range(draw(N_BAD)):
        kind = draw(st.sampled_from(["cell"] * 6 + ["column", "truncate"]))
        if kind == "column" and len(cols) > 1:
            c = draw(st.integers(0, len(cols) - 1))
            cols.pop(c)
            for r in rows:
                r.pop(c)
        elif kind == "truncate":
            truncate = True
        else:
            draw(st.sampled_from(rows))[draw(st.integers(0, len(cols) - 1))] = draw(BAD_CELL)
    quote = lambda v: f'"{v}"' if "," in v else v  # noqa: E731
    body = ",".join(c for c, _ in cols) + "\n" + "".join(",".join(map(quote, r)) + "\n" for r in rows)
    if truncate:
        body = body[: draw(st.integers(0, len(body)))]
    return fmt, body, draw(st.sampled_from([None, None, 1, 3]))


@SETTINGS
@given(case=csv_files(), bom=st.booleans())
def test_csv_loaders(case, bom):
    fmt, body, limit = case
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.csv"
        path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + body.encode())
        attempt(path, lambda: load(path, fmt, limit))


# ---- Parquet ----------------------------------------------------------------------------------------
def _bad_column(draw, n: int):
    """An Arrow column of ``n`` rows of some type, often the wrong one, and often with bad values."""
    anyval = st.one_of(st.none(), st.integers(-3, 9), st.sampled_from([0, 10**7 + 1, 2**62, 2**31]))
    return draw(st.sampled_from([
        lambda: pa.array(draw(st.lists(st.text(max_size=3), min_size=n, max_size=n))),
        lambda: pa.array(draw(st.lists(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False), min_size=n, max_size=n))),
        lambda: pa.array(draw(st.lists(anyval, min_size=n, max_size=n)), pa.int64()),
        lambda: pa.array(draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n)), pa.uint64()),
        lambda: pa.array(draw(st.lists(st.lists(anyval, max_size=3), min_size=n, max_size=n)), pa.list_(pa.int64())),
        lambda: pa.array(draw(st.lists(st.lists(st.floats(0, 9, allow_subnormal=False), max_size=3), min_size=n, max_size=n))),
        lambda: pa.array(draw(st.lists(st.lists(st.fixed_dictionaries(
            {"segment_id": st.integers(-1, 3), "length": st.integers(-1, 6)}), max_size=3), min_size=n, max_size=n))),
        lambda: pa.array([None] * n),
    ]))()


@st.composite
def parquet_tables(draw):
    n = draw(st.integers(1, 4))
    prompts = draw(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=4), min_size=n, max_size=n))
    cols = {"input_len": pa.array([len(p) for p in prompts], pa.int64()),
            "output_len": pa.array(draw(st.lists(st.integers(1, 40), min_size=n, max_size=n)), pa.int64())}
    if draw(st.booleans()):
        cols["prompt_tokens"] = pa.array(prompts, pa.list_(pa.int32()))
    elif draw(st.booleans()):
        cols["prompt_segments"] = pa.array([[{"segment_id": 7, "length": len(p)}] for p in prompts])
    if draw(st.booleans()):
        cols["id"] = pa.array(draw(st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=n, max_size=n,
                                            unique=draw(st.integers(0, 3)) > 0)))
    if draw(st.booleans()):
        cols["output_len_hint"] = pa.array(draw(st.lists(st.one_of(st.none(), st.integers(1, 40)), min_size=n,
                                                         max_size=n)), pa.int64())
    for k in ("arrival_s", "ttft_slo_s"):
        if draw(st.booleans()):
            cols[k] = pa.array(draw(st.lists(st.one_of(st.none(), st.floats(0.01, 1e3, allow_subnormal=False)), min_size=n, max_size=n)),
                               pa.float64())
    if draw(st.booleans()):
        cols["source"] = pa.array(draw(st.lists(st.sampled_from(["x", "y"]), min_size=n, max_size=n))).dictionary_encode()
    names = ("input_len", "output_len", "prompt_tokens", "prompt_segments", "id", "output_len_hint", "arrival_s",
             "ttft_slo_s", "source")
    for _ in range(draw(N_BAD)):
        name = draw(st.sampled_from(names))
        if draw(st.integers(0, 5)) == 0:
            cols.pop(name, None)
        else:
            cols[name] = _bad_column(draw, n)
    return pa.table(cols) if cols else pa.table({"x": pa.array([1] * n)})


@SETTINGS
@given(table=parquet_tables())
def test_parquet_reader(table):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.parquet"
        pq.write_table(table, path)
        attempt(path, lambda: read_trace(path))


# ---- profiles ----------------------------------------------------------------------------------------
@functools.cache
def _valid_profile() -> str:
    from blendsim.calibrate.fit import fit_op
    from blendsim.sim.models import get_model
    from blendsim.sim.profile import Profile, model_shape

    tokens = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    ops = {"qkv_proj": fit_op("qkv_proj", [[x] for x in tokens], [2e-5 + 1e-8 * x for x in tokens])}
    grid = [[b, c] for b in (1, 4, 16, 64) for c in (16, 256, 1024, 4096)]
    ops["attn_decode"] = fit_op("attn_decode", grid, [1e-5 + 1e-9 * b * c for b, c in grid])
    m = get_model("tiny")
    return json.dumps(Profile(model="tiny", model_shape=model_shape(m), dtype=m.dtype, tp=1, ops=ops,
                              device={"kind": "cpu", "name": "t", "memory_bytes": 10**9}, interference=0.2,
                              overlap={"fit": {"median_rel_err": 0.1, "n_points": 4}},
                              hardware={"peak_flops": 1e11, "mem_bandwidth": 1e10, "peak_flops_dtype": "float32"},
                              skipped=[{"op": "overlap", "point": [1, 2], "reason": "cpu"}]).to_dict())


@st.composite
def mutated_profiles(draw):
    d = json.loads(_valid_profile())
    for _ in range(draw(st.integers(1, 3))):
        node, key = None, None
        inside = isinstance(d.get("ops"), dict) and d["ops"] and draw(st.booleans())
        cur = d["ops"] if inside else d  # half the edits inside the fits
        while isinstance(cur, (dict, list)) and len(cur) and (node is None or draw(st.integers(0, 3))):
            keys = sorted(cur) if isinstance(cur, dict) else list(range(len(cur)))
            node, key = cur, draw(st.sampled_from(keys))
            cur = cur[key]
        if node is None:
            continue
        if draw(st.integers(0, 5)) == 0 and isinstance(node, dict):
            del node[key]
        elif isinstance(cur, (int, float)) and not isinstance(cur, bool) and draw(st.booleans()):
            node[key] = cur * draw(st.sampled_from([-1, 0, 3, 1e300, float("nan"), float("inf")]))
        else:
            node[key] = draw(JSON_ANY)
    return d


@SETTINGS
@given(d=mutated_profiles())
def test_profile_loader(d):
    from rich.console import Console

    from blendsim.calibrate.report import print_profile
    from blendsim.sim.profile import load_profile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.json"
        path.write_text(json.dumps(d))
        try:
            p = load_profile(path)
        except UserError as e:
            check_error(e, path)
            return
    for f in p.ops.values():
        for scale in (0.5, 1.0, 3.0):
            pt = [hi * scale for _, hi in f.domain]
            t = float(f.predict(*pt))
            assert np.isfinite(t) and t > 0, (f.op, pt, t)
            assert abs(f.predict_scalar(*pt) / t - 1) < 1e-9
    print_profile(p, Console(file=io.StringIO(), width=120))  # `calibrate show` prints any loaded profile
