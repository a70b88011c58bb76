"""Issue 14, input side: every reproducer ends in one line naming file/row/field (exit 2) or a correct result.

Items covered here: 1 (``workloads stats --json`` stays valid JSON), 3 (huge lengths and times), 4 (input
tracebacks: jsonl, Azure time zones, ``-o`` at a folder, mistyped Parquet columns, mistyped profiles),
5 (silent corruption: token ids, request ids, profile polynomials), 6 (empty Parquet, JSONL with a BOM)
and 7 (atomic writes honour the umask).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.sim.errors import UserError
from blendsim.sim.io import atomic_path, write_json
from blendsim.sim.profile import load_profile
from blendsim.workloads.loaders import load
from blendsim.workloads.trace import MAX_TOKENS, from_columns, read_trace, write_trace
from tests.helpers import one_line_error

BURST = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens\n"
HUGE = (str(2**63), "1e30", str(MAX_TOKENS + 1))


def invoke(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


def _strict_json(text: str):
    def refuse(name):
        raise AssertionError(f"not valid JSON: {name}")

    return json.loads(text, parse_constant=refuse)


# ---- item 1: stats --json --------------------------------------------------------------------
@pytest.mark.parametrize("rows", [[(3, 1)], [(3, 1), (5, 1)], []], ids=["one 1-token", "all 1-token", "empty"])
def test_stats_json_is_valid_when_density_is_unbounded(tmp_path, rows):
    t = from_columns(input_len=[p for p, _ in rows], output_len=[d for _, d in rows])
    path = write_trace(t, tmp_path / "t.parquet")
    r = invoke("workloads", "stats", path, "--json")
    assert r.exit_code == 0, r.output
    out = _strict_json(r.stdout)
    assert out["compute_density"] is None and "unbounded" in out["compute_density_note"]
    assert out["requests"] == len(rows)
    r = invoke("workloads", "stats", path)  # the table says so too
    assert r.exit_code == 0 and "unbounded" in r.stdout


def test_stats_json_keeps_a_finite_density(tmp_path):
    path = write_trace(from_columns(input_len=[30, 40], output_len=[20, 2]), tmp_path / "t.parquet")
    out = _strict_json(invoke("workloads", "stats", path, "--json").stdout)
    assert out["compute_density"] > 0 and "compute_density_note" not in out


# ---- item 3: huge lengths and times in CSVs, never replacing an existing output -------------------
CSV_HUGE = [("burstgpt", BURST + "5,ChatGPT,{},18,490,x\n", "Request tokens"),
            ("burstgpt", BURST + "5,ChatGPT,12,{},490,x\n", "Response tokens"),
            ("azure", AZURE + "2023-11-16 18:15:46,{},4\n", "ContextTokens"),
            ("azure", AZURE + "2023-11-16 18:15:46,3,{}\n", "GeneratedTokens"),
            ("vidur", VIDUR + "0,{},3\n", "num_prefill_tokens"),
            ("vidur", VIDUR + "0,5,{}\n", "num_decode_tokens")]


@pytest.mark.parametrize("value", HUGE)
@pytest.mark.parametrize(("fmt", "body", "field"), CSV_HUGE, ids=[f"{f}-{c}" for f, _, c in CSV_HUGE])
def test_csv_lengths_beyond_any_context_are_refused_and_keep_the_output(tmp_path, fmt, body, field, value):
    src = tmp_path / "in.csv"
    src.write_text(body.format(value))
    out = tmp_path / "o.parquet"
    out.write_bytes(b"precious")
    one_line_error(invoke("workloads", "load", src, "-f", fmt, "-o", out), str(src), "data row 1",
                   f"field {field}", "MAX_TOKENS")
    assert out.read_bytes() == b"precious"


@pytest.mark.parametrize(("fmt", "body", "field", "why"), [
    ("burstgpt", BURST + "1e308,ChatGPT,10,18,490,x\n", "Timestamp", "more seconds than any clock reads"),
    ("burstgpt", BURST + "5,ChatGPT,10,18,490,x\n-1e308,ChatGPT,10,18,490,x\n", "Timestamp", ">= 0"),
    ("burstgpt", BURST + "inf,ChatGPT,10,18,490,x\n", "Timestamp", "not finite"),
    ("vidur", VIDUR + "1e300,5,3\n", "arrived_at", "more seconds than any clock reads"),
    ("azure", AZURE + "2023-11-16 18:15:46,3,4\n9999-11-16 18:15:46,3,4\n", "TIMESTAMP", "MAX_TIME_S"),
], ids=["burst 1e308", "burst -1e308", "burst inf", "vidur 1e300", "azure year 9999"])
def test_csv_times_must_be_finite_and_bounded(tmp_path, fmt, body, field, why):
    src = tmp_path / "in.csv"
    src.write_text(body)
    with pytest.raises(UserError) as e:
        load(src, fmt)
    assert str(src) in str(e.value) and f"field {field}" in str(e.value) and why in str(e.value), str(e.value)


def test_burstgpt_large_but_valid_values_still_load(tmp_path):
    src = tmp_path / "in.csv"
    src.write_text(BURST + f"0,ChatGPT,{MAX_TOKENS},1,{MAX_TOKENS + 1},x\n1e8,ChatGPT,1,{MAX_TOKENS},{MAX_TOKENS + 1},x\n")
    t = load(src, "burstgpt")
    assert t.input_len.tolist() == [MAX_TOKENS, 1] and t.output_len.tolist() == [1, MAX_TOKENS]
    assert t.arrival_s.tolist() == [0.0, 1e8]


def _parquet(path, **cols):
    pq.write_table(pa.table({k: v if isinstance(v, pa.Array) else pa.array(v) for k, v in cols.items()}), path)
    return path


@pytest.mark.parametrize("value", [2**63 - 2, MAX_TOKENS + 1])
def test_parquet_output_len_near_int64_max_is_refused_by_simulate_and_stats(tmp_path, value):
    path = _parquet(tmp_path / "t.parquet", input_len=[3, 4], output_len=[value, 2])
    for cmd in (["simulate", path, "-o", tmp_path / "run"], ["workloads", "stats", path, "--json"]):
        one_line_error(invoke(*cmd), str(path), "row 1", "field output_len", "MAX_TOKENS")
    assert not (tmp_path / "run").exists()
    # an unsigned column beyond int64 cannot wrap to a negative length either
    path = _parquet(tmp_path / "u.parquet", input_len=pa.array([3], pa.uint64()),
                    output_len=pa.array([2**64 - 1], pa.uint64()))
    one_line_error(invoke("workloads", "stats", path), "row 1", "field output_len", str(2**64 - 1))


# ---- item 4: tracebacks -----------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["output_len", "output_len_hint"])
@pytest.mark.parametrize("value", [2**63, 2**64 + 5, 10**400])
def test_jsonl_lengths_beyond_int64_are_one_line(tmp_path, field, value):
    rec = {"prompt_token_ids": [1, 2], "output_len": 3, field: value}
    src = tmp_path / "r.jsonl"
    src.write_text(json.dumps(rec) + "\n")
    one_line_error(invoke("workloads", "load", src, "-f", "jsonl", "-o", tmp_path / "o.parquet"),
                   f"{src}: line 1, field {field}", "MAX_TOKENS")


def test_jsonl_integer_beyond_pythons_digit_limit_is_one_line(tmp_path):
    src = tmp_path / "r.jsonl"
    src.write_text('{"prompt_token_ids": [1], "output_len": ' + "9" * 5000 + "}\n")
    one_line_error(invoke("workloads", "load", src, "-f", "jsonl", "-o", tmp_path / "o.parquet"), f"{src}: line 1")


def test_azure_time_zones_mixed_with_naive_times_are_one_line(tmp_path):
    src = tmp_path / "a.csv"
    src.write_text(AZURE + "2023-11-16 18:15:46+00:00,3,4\n2023-11-16 18:15:47,3,4\n")
    one_line_error(invoke("workloads", "load", src, "-f", "azure", "-o", tmp_path / "o.parquet"),
                   str(src), "data row 2", "field TIMESTAMP", "time zone")
    src.write_text(AZURE + "2023-11-16 18:15:46,3,4\n2023-11-16 18:15:47Z,3,4\n")
    one_line_error(invoke("workloads", "load", src, "-f", "azure", "-o", tmp_path / "o.parquet"),
                   "data row 2", "field TIMESTAMP")


def test_azure_differing_offsets_are_compared_in_utc(tmp_path):
    src = tmp_path / "a.csv"
    src.write_text(AZURE + "2023-11-16 18:15:46+00:00,3,4\n2023-11-16 20:15:50+02:00,3,4\n"
                   "2023-11-16T18:16:46Z,3,4\n")
    assert load(src, "azure").arrival_s.tolist() == [0.0, 4.0, 60.0]


def test_load_and_synth_refuse_a_folder_as_output(tmp_path):
    src = tmp_path / "r.jsonl"
    src.write_text('{"prompt_token_ids": [1], "output_len": 2}\n')
    folder = tmp_path / "out"
    folder.mkdir()
    one_line_error(invoke("workloads", "load", src, "-f", "jsonl", "-o", folder), str(folder), "is a folder")
    one_line_error(invoke("workloads", "synth", "batchllm", "--prefix-len", "4", "--distinct-len", "2",
                          "--share-degree", "2", "--requests", "4", "--output-len", "3", "-o", folder),
                   str(folder), "is a folder")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    one_line_error(invoke("workloads", "load", src, "-f", "jsonl", "-o", blocker / "o.parquet"), "not a folder")
    assert folder.is_dir() and not any(folder.iterdir())


MISTYPED = {
    "hint of text": dict(output_len_hint=["x", "y"]),
    "prompt_tokens of strings": dict(prompt_tokens=[["a", "b"], ["c", "d"]]),
    "id of lists": dict(id=[[1], [2]]),
    "prompt_tokens not lists": dict(prompt_tokens=[1, 2]),
    "segments of strings": dict(prompt_segments=[[{"segment_id": "a", "length": 2}], None]),
    "input_len of floats": dict(input_len=[2.0, 2.0]),
    "arrival of text": dict(arrival_s=["soon", "late"]),
    "source of numbers": dict(source=[1.5, 2.5]),
}


@pytest.mark.parametrize("cols", MISTYPED.values(), ids=list(MISTYPED))
def test_mistyped_parquet_columns_are_one_line_in_simulate_and_stats(tmp_path, cols):
    base = {"input_len": [2, 2], "output_len": [3, 3]}
    path = _parquet(tmp_path / "t.parquet", **{**base, **cols})
    field = next(iter(cols))
    for cmd in (["simulate", path, "-o", tmp_path / "run"], ["workloads", "stats", path, "--json"]):
        one_line_error(invoke(*cmd), str(path), field)


# ---- item 5: silent corruption of traces --------------------------------------------------------------
@pytest.mark.parametrize(("tokens", "needle"), [
    (pa.array([[1.5, 2.0], [1.0, 3.0]]), "integer token ids, found lists of double"),
    (pa.array([[1.0, 2.0], [1.0, 3.0]]), "integer token ids, found lists of double"),  # whole floats too: the column's type is wrong
    (pa.array([[None, 2], [0, 2]], pa.list_(pa.int64())), "row 1, field prompt_tokens: missing value"),
    (pa.array([[1, 2], [0, 2**40]], pa.list_(pa.int64())), "row 2, field prompt_tokens"),
    (pa.array([[1, 2], [0, 2**64 - 1]], pa.list_(pa.uint64())), "row 2, field prompt_tokens"),
])
def test_token_ids_are_never_truncated_or_invented(tmp_path, tokens, needle):
    path = _parquet(tmp_path / "t.parquet", prompt_tokens=tokens, input_len=[2, 2], output_len=[3, 3])
    with pytest.raises(UserError) as e:
        read_trace(path)
    assert str(e.value).startswith(str(path)) and needle in str(e.value), str(e.value)


def test_duplicate_request_ids_are_refused(tmp_path):
    path = _parquet(tmp_path / "t.parquet", id=["a", "b", "a"], input_len=[2, 2, 2], output_len=[3, 3, 3])
    one_line_error(invoke("simulate", path, "-o", tmp_path / "run"), str(path), "row 3, field id", "repeats row 1")
    path = _parquet(tmp_path / "n.parquet", id=pa.array(["a", None]), input_len=[2, 2], output_len=[3, 3])
    one_line_error(invoke("workloads", "stats", path), "row 2, field id: missing value")
    src = tmp_path / "r.jsonl"
    src.write_text('{"id": "x", "prompt_token_ids": [1], "output_len": 2}\n'
                   '{"id": 7, "prompt_token_ids": [1], "output_len": 2}\n\n'
                   '{"id": "x", "prompt_token_ids": [2], "output_len": 2}\n')
    one_line_error(invoke("workloads", "load", src, "-f", "jsonl", "-o", tmp_path / "o.parquet"),
                   f"{src}: line 4, field id", "repeats line 1")
    src.write_text('{"id": [1], "prompt_token_ids": [1], "output_len": 2}\n')
    one_line_error(invoke("workloads", "load", src, "-f", "jsonl", "-o", tmp_path / "o.parquet"),
                   "line 1, field id", "string or an integer")


def test_integer_ids_in_parquet_become_strings(tmp_path):
    path = _parquet(tmp_path / "t.parquet", id=[10, 11], input_len=[2, 2], output_len=[3, 3])
    assert read_trace(path).ids.tolist() == ["10", "11"]


# ---- item 6: empty Parquet, JSONL with a BOM ------------------------------------------------------
def test_empty_parquet_trace_names_its_file(tmp_path):
    path = _parquet(tmp_path / "e.parquet", input_len=pa.array([], pa.int64()), output_len=pa.array([], pa.int64()))
    one_line_error(invoke("simulate", path, "-o", tmp_path / "run"), str(path), "no requests")
    assert read_trace(path, allow_empty=True).n == 0


def test_jsonl_with_a_utf8_bom_loads_like_without(tmp_path):
    body = '{"id": "a", "prompt_token_ids": [1, 2, 3], "output_len": 4}\n{"prompt_token_ids": [1, 2], "output_len": 1}\n'
    plain, bom = tmp_path / "plain.jsonl", tmp_path / "bom.jsonl"
    plain.write_text(body, encoding="utf-8")
    bom.write_bytes(b"\xef\xbb\xbf" + body.encode())
    a, b = load(plain, "jsonl"), load(bom, "jsonl")
    assert a.ids.tolist() == b.ids.tolist() == ["a", "1"]
    assert a.prompt_repr(0) == b.prompt_repr(0) and a.output_len.tolist() == b.output_len.tolist()


# ---- item 7: atomic writes honour the umask ---------------------------------------------------------
@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_atomic_writes_honour_the_umask(tmp_path, mask):
    old = os.umask(mask)
    try:
        trace = write_trace(from_columns(input_len=[2], output_len=[3]), tmp_path / "t.parquet")
        js = write_json(tmp_path / "s.json", {"a": 1})
        with atomic_path(tmp_path / "x.bin") as tmp:
            tmp.write_bytes(b"x")
        src = tmp_path / "r.jsonl"
        src.write_text('{"prompt_token_ids": [1], "output_len": 2}\n')
        r = invoke("workloads", "load", src, "-f", "jsonl", "-o", tmp_path / "cli.parquet")
        assert r.exit_code == 0, r.output
    finally:
        os.umask(old)
    for p in (trace, js, tmp_path / "x.bin", tmp_path / "cli.parquet"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~mask, p
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


# ---- items 4 and 5: profiles ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def profile_dict():
    """A small real-shaped profile: fits from calibrate.fit on smooth synthetic times (with grids)."""
    from blendsim.calibrate.fit import fit_op
    from blendsim.sim.models import get_model
    from blendsim.sim.profile import Profile, model_shape

    tokens = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048]
    ops = {op: fit_op(op, [[x] for x in tokens], [2e-5 + k * 1e-8 * x for x in tokens])
           for k, op in enumerate(("qkv_proj", "o_proj", "gate_up_proj", "down_proj"), start=1)}
    grid = [[b, c] for b in (1, 4, 16, 64) for c in (16, 256, 1024, 4096)]
    ops["attn_decode"] = fit_op("attn_decode", grid, [1e-5 + 1e-9 * b * c for b, c in grid])
    m = get_model("tiny")
    return Profile(model="tiny", model_shape=model_shape(m), dtype=m.dtype, tp=1, ops=ops,
                   device={"kind": "cpu", "name": "test"}, hardware={"peak_flops": 1e11, "mem_bandwidth": 1e10},
                   skipped=[{"op": "overlap", "reason": "cpu"}]).to_dict()


def _set(path: str, value):
    def edit(d):
        *keys, last = path.split(".")
        for k in keys:
            d = d[int(k)] if isinstance(d, list) else d[k]
        d[int(last) if isinstance(d, list) else last] = value(d[int(last) if isinstance(d, list) else last]) \
            if callable(value) else value
    return edit


PROFILE_CASES = {
    "tp abc": (_set("tp", "abc"), "field 'tp'"),
    "device gpu": (_set("device", "gpu"), "field 'device'"),
    "skipped x": (_set("skipped", ["x"]), "field 'skipped[0]'"),
    "string in hardware": (_set("hardware.peak_flops", "fast"), "field 'hardware.peak_flops'"),
    "hardware a string": (_set("hardware", "fast"), "field 'hardware'"),
    "string in fit": (_set("ops.qkv_proj.fit.max_rel_err", "small"), "ops.qkv_proj: field 'fit.max_rel_err'"),
    "fit a string": (_set("ops.qkv_proj.fit", "good"), "ops.qkv_proj: field 'fit'"),
    "string in model_shape": (_set("model_shape.hidden_size", "512"), "field 'model_shape.hidden_size'"),
    "scale of zeros": (_set("ops.attn_decode.scale", [0, 0]), "ops.attn_decode: malformed fit: scale"),
    "domain of zeros": (_set("ops.qkv_proj.domain", [[0, 0]]), "ops.qkv_proj: malformed fit: domain"),
    "inverted domain": (_set("ops.qkv_proj.domain", [[2048, 1]]), "domain of tokens [2048, 1]"),
    "domain for one of two variables": (_set("ops.attn_decode.domain", [[1, 64]]), "ops.attn_decode: malformed fit: domain"),
    "negative coefficients": (_set("ops.qkv_proj.coef", lambda c: [-x for x in c]), "not a positive time"),
    "negative, no measurements kept": (lambda d: [_set(f"ops.qkv_proj.{k}", [])(d) for k in ("grid", "median_s")]
                                       and _set("ops.qkv_proj.coef", lambda c: [-x for x in c])(d),
                                       "not a positive time"),
    "one coefficient edited": (_set("ops.attn_decode.coef.0", lambda c: 3 * c), "edited or corrupt"),
    "coefficient 1e300": (_set("ops.qkv_proj.coef.0", 1e300), "1e+300 s"),
    "bool tp": (_set("tp", True), "field 'tp'"),
    "dtype unknown": (_set("dtype", "int3"), "field 'dtype'"),
    "interference text": (_set("interference", "0.2"), "'interference'"),
    "median_s of text": (_set("ops.qkv_proj.median_s.0", "x"), "ops.qkv_proj: malformed fit: median_s"),
    "terms fractional": (_set("ops.qkv_proj.terms.0", [0.5]), "ops.qkv_proj: malformed fit: terms"),
    "op not an object": (_set("ops.o_proj", [1, 2]), "ops.o_proj: must be an object"),
}


def test_the_profile_fixture_is_valid_and_runs(profile_dict, tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(profile_dict))
    assert invoke("calibrate", "show", path).exit_code == 0
    trace = write_trace(from_columns(input_len=[20, 30], output_len=[5, 9]), tmp_path / "t.parquet")
    r = invoke("simulate", trace, "--model", "tiny", "--hardware", "cpu", "--profile", path, "-o", tmp_path / "r")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(("edit", "needle"), PROFILE_CASES.values(), ids=list(PROFILE_CASES))
def test_bad_profiles_are_one_line_in_show_and_simulate(profile_dict, tmp_path, edit, needle):
    d = json.loads(json.dumps(profile_dict))
    edit(d)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(UserError) as e:
        load_profile(path)
    assert str(e.value).startswith(str(path)) and needle in str(e.value), str(e.value)
    one_line_error(invoke("calibrate", "show", path), str(path), needle)
    trace = write_trace(from_columns(input_len=[20, 30], output_len=[5, 9]), tmp_path / "t.parquet")
    one_line_error(invoke("simulate", trace, "--model", "tiny", "--hardware", "cpu", "--profile", path,
                          "-o", tmp_path / "r"), str(path), needle)
    assert not (tmp_path / "r").exists()


def test_profile_json_with_huge_integers_is_one_line(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"schema": "blendsim.profile", "tp": ' + "1" * 5000 + "}")
    one_line_error(invoke("calibrate", "show", path), str(path), "corrupt profile")


def test_every_shape_of_the_vidur_profile_still_loads(tmp_path):
    """The shipped Vidur profile, imported, passes every check (a real fit with the x^-1 forms)."""
    data = Path(__file__).resolve().parents[2] / "shared" / "data"
    src = data / "vidur_profile_a100_Llama-2-7b-hf_mlp.csv"
    if not src.exists():
        pytest.skip(f"{src} not found")
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "mlp.csv").write_bytes(src.read_bytes())
    r = invoke("calibrate", "import-vidur", tmp_path / "v", "--model", "llama-2-7b", "-o", tmp_path / "p.json")
    assert r.exit_code == 0, r.output
    p = load_profile(tmp_path / "p.json")
    assert p.ops and all(np.all(np.isfinite(f.coef)) for f in p.ops.values())
