"""Issue 22: fidelity catalogues and parameter files, block-hash loader options, sizes and bounds.

Every malformed file ends in one line naming the file, row and field (exit 2) or loads and runs; the
hypothesis tests build catalogue CSVs and parameter files from valid and corrupted pieces.
"""

from __future__ import annotations

import csv
import io
import json
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.fidelity.catalogue import COLUMNS, MAX_GPUS, MAX_REQUESTS, build_workload, read_catalogue
from blendsim.fidelity.suite import load_suite
from blendsim.sim.engines import load_params
from blendsim.sim.errors import UserError
from tests.helpers import one_line_error

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def invoke(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


def row(**kw) -> dict:
    base = {"id": "r", "source": "test", "model": "tiny", "hardware": "cpu", "gpus": 1, "tp": 1, "pp": 1, "ep": 1,
            "weights": "", "kv_dtype": "", "engine": "vllm", "engine_version": "", "policy": "",
            "workload": "const:32/8", "requests": 8, "metric": "output_tok_s", "scope": "system", "value": 100,
            "note": ""}
    base.update(kw)
    return base


def write_cat(path: Path, rows, header=COLUMNS, bom: bool = False) -> Path:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    for r in rows:
        w.writerow([r.get(c, "") for c in header])
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + buf.getvalue().encode())
    return path


# ---- parameter files ---------------------------------------------------------------------------------
BAD_PARAMS = {
    "fixed_s -1": ({"engine": {"trtllm": {"fixed_s": -1}}}, "engine.trtllm.fixed_s"),
    "fixed_s NaN": ('{"engine": {"trtllm": {"fixed_s": NaN}}}', "engine.trtllm.fixed_s"),
    "attn_eff NaN": ('{"global": {"attn_eff": NaN}}', "global.attn_eff"),
    "gemm_eff 0": ({"hardware": {"cpu": {"gemm_eff": 0}}}, "hardware.cpu.gemm_eff"),
    "gemm_eff -0.5": ({"hardware": {"cpu": {"gemm_eff": -0.5}}}, "hardware.cpu.gemm_eff"),
    "gemm_eff text": ({"hardware": {"cpu": {"gemm_eff": "fast"}}}, "hardware.cpu.gemm_eff"),
    "a list": ([1, 2], "expected a JSON object"),
    "null": (None, "expected a JSON object"),
    "engine 5": ({"engine": 5}, "field engine"),
    "engine text": ({"engine": {"trtllm": "x"}}, "engine.trtllm"),
    "unknown engine": ({"engine": {"warp": {"fixed_s": 0.001}}}, "engine.warp"),
    "hardware list": ({"hardware": [1]}, "field hardware"),
    "bounds": ({"bounds": {"x": [2, 1]}}, "bounds.x"),
    "bounds text": ({"bounds": "wide"}, "field bounds"),
    "fitted_on": ({"fitted_on": {"rows": -3}}, "fitted_on.rows"),
    "fitted_on list": ({"fitted_on": [1]}, "field fitted_on"),
    "unknown section": ({"engines": {}}, "field engines"),
    "regime": ({"regime": {"nanoflow": {"*": {"kappa": 2}}}}, "regime.nanoflow.*.kappa"),
    "binary": (b"\x00\xff\xfe\x81binary", "cannot read"),
}


@pytest.mark.parametrize(("content", "needle"), BAD_PARAMS.values(), ids=list(BAD_PARAMS))
def test_bad_parameter_files_are_one_line_naming_the_field(tmp_path, content, needle):
    p = tmp_path / "p.json"
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content if isinstance(content, str) else json.dumps(content))
    cat = write_cat(tmp_path / "cat.csv", [row()])
    one_line_error(invoke("fidelity", cat, "--params-file", p, "--no-cv", "--json"), str(p), needle)
    one_line_error(invoke("fidelity", "--params", "--params-file", p), str(p), needle)


def test_the_shipped_parameters_pass_the_check():
    assert load_params()["fitted_on"]["rows"] > 0


# ---- catalogues ------------------------------------------------------------------------------------------
def test_a_header_naming_a_column_twice_is_refused(tmp_path):
    cat = write_cat(tmp_path / "c.csv", [row()], header=[*COLUMNS, "value"])
    with pytest.raises(UserError, match="column 'value' appears more than once"):
        read_catalogue(cat)


def test_a_catalogue_saved_with_a_byte_order_mark_reads(tmp_path):
    cat = write_cat(tmp_path / "c.csv", [row(id="bom")], bom=True)
    assert [r.id for r in read_catalogue(cat)] == ["bom"]


def test_a_jsonl_workload_with_fewer_rows_than_requests_is_refused(tmp_path):
    (tmp_path / "x.jsonl").write_text("".join(json.dumps({"prompt_token_ids": [1, 2, 3], "output_len": 4}) + "\n"
                                              for _ in range(5)))
    cat = write_cat(tmp_path / "c.csv", [row(workload="file:x.jsonl", requests=200)])
    with pytest.raises(UserError, match="5 usable requests, fewer than requests=200"):
        build_workload(read_catalogue(cat)[0])


@pytest.mark.parametrize(("change", "needle"), [
    ({"requests": 10**12}, f"must be <= {MAX_REQUESTS:,}"),
    ({"requests": 10**7, "workload": "const:16/4"}, f"must be <= {MAX_REQUESTS:,}"),
    ({"gpus": 10**30}, f"must be <= {MAX_GPUS:,}"),
    ({"workload": "const:100000000000/4"}, "MAX_TOKENS"),
], ids=["requests 1e12", "requests 1e7", "gpus 1e30", "const huge"])
def test_sizes_beyond_the_limits_are_one_line_stating_the_limit(tmp_path, change, needle):
    cat = write_cat(tmp_path / "c.csv", [row(**change)])
    with pytest.raises(UserError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        build_workload(read_catalogue(cat)[0])


def test_file_workload_lengths_beyond_int64_are_refused(tmp_path):
    (tmp_path / "l.csv").write_text("prompt_tokens,output_tokens\n10,4\n1e30,4\n")
    cat = write_cat(tmp_path / "c.csv", [row(workload="file:l.csv", requests=2)])
    with pytest.raises(UserError, match="data row 2, column prompt_tokens.*MAX_TOKENS"):
        build_workload(read_catalogue(cat)[0])


def test_ep_on_a_dense_model_is_refused_by_fidelity_as_by_simulate(tmp_path):
    cat = write_cat(tmp_path / "c.csv", [row(ep=4, gpus=4, tp=4, model="llama-3-8b", hardware="h100-80gb")])
    with pytest.raises(UserError, match="field 'ep': ep 4 on llama-3-8b, a dense model"):
        load_suite(cat, {})


# ---- workloads load: options -----------------------------------------------------------------------------
HASHED = '{"timestamp": 1, "input_length": 10, "hash_ids": [1]}\n'


@pytest.mark.parametrize(("args", "needle"), [
    (["--output-len", "3", "--max-context", "²"], "unknown model"),
    (["--output-from", "LENS", "--seed", "-1"], "--seed must be >= 0"),
    (["--output-from", "LENS"], "MAX_TOKENS"),
    (["--output-len", "3", "--block-size", str(10**19)], "--block-size must be"),
], ids=["max-context superscript", "negative seed", "output-from 1e30", "huge block size"])
def test_workloads_load_options_are_one_line(tmp_path, args, needle):
    src = tmp_path / "h.jsonl"
    src.write_text(HASHED)
    (tmp_path / "lens.csv").write_text("output_len\n1e30\n")
    args = [str(tmp_path / "lens.csv") if a == "LENS" else a for a in args]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning before the line
        r = invoke("workloads", "load", src, "-f", "mooncake", "-o", tmp_path / "o.parquet", *args)
    err = one_line_error(r, needle)
    assert "1e+30" in err or "1e30" not in " ".join(args)


@pytest.mark.parametrize("ts", ["1e308", "-1e308"])
def test_mooncake_timestamps_far_apart_blame_the_timestamp_without_warnings(tmp_path, ts):
    src = tmp_path / "m.jsonl"
    src.write_text('{"timestamp": 5, "input_length": 10, "output_length": 3, "hash_ids": [1]}\n'
                   f'{{"timestamp": {ts}, "input_length": 10, "output_length": 3, "hash_ids": [1]}}\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = invoke("workloads", "load", src, "-f", "mooncake", "-o", tmp_path / "o.parquet")
    one_line_error(r, str(src), "field timestamp", "MAX_TIME_S")


# ---- property tests ----------------------------------------------------------------------------------------
FIELD_VALUES = {
    "gpus": ["1", "2", "0", "-1", "x", "1e3", str(10**30), ""], "tp": ["1", "2", "0", "", "3"],
    "pp": ["1", "2", ""], "ep": ["1", "2", "4", ""], "requests": ["4", "8", "0", str(10**12), "x", ""],
    "value": ["100", "0", "-1", "nan", "inf", "x", ""], "metric": ["output_tok_s", "req_s", "x", ""],
    "scope": ["system", "per_gpu", "x"], "engine": ["vllm", "sglang", "trtllm", "x", ""],
    "model": ["tiny", "x", "", "llama-3-8b"], "hardware": ["cpu", "x", ""],
    "workload": ["const:32/8", "const:0/1", "const:x", "const:1/100000000000", "file:nope.csv", "file:l.csv",
                 "file:l.csv?min_len=x", "synth:x", "x", "", "file:x.jsonl"],
    "weights": ["", "bf16", "fp8", "x"], "kv_dtype": ["", "fp8", "x"], "policy": ["", "fcfs", "x", "nope.py:X"],
    "id": ["r", "", "s"],
}


@st.composite
def catalogues(draw):
    rows = []
    for i in range(draw(st.integers(1, 2))):
        r = row(id=f"r{i}")
        for k in draw(st.lists(st.sampled_from(sorted(FIELD_VALUES)), max_size=3, unique=True)):
            r[k] = draw(st.sampled_from(FIELD_VALUES[k]))
        rows.append(r)
    header = list(COLUMNS)
    shape = draw(st.sampled_from(["ok", "ok", "ok", "drop", "dup", "bom", "empty", "binary"]))
    if shape == "drop":
        header.remove(draw(st.sampled_from(COLUMNS)))
    elif shape == "dup":
        header.append(draw(st.sampled_from(COLUMNS)))
    return rows, header, shape


@SETTINGS
@given(cat=catalogues())
def test_any_catalogue_runs_or_is_one_line_naming_file_row_and_field(cat):
    rows, header, shape = cat
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "cat.csv"
        (Path(d) / "l.csv").write_text("prompt_tokens,output_tokens\n" + "20,4\n" * 10 + "1e30,2\n")
        (Path(d) / "x.jsonl").write_text(json.dumps({"prompt_token_ids": [1, 2], "output_len": 3}) + "\n")
        if shape == "binary":
            path.write_bytes(b"\x00\xff\x81\xfe" * 5)
        elif shape == "empty":
            path.write_text("")
        else:
            write_cat(path, rows, header, bom=shape == "bom")
        r = invoke("fidelity", path, "--json", "--no-cv")
        if shape == "dup":  # a column given twice is refused, never one of the two silently kept
            one_line_error(r, str(path), "appears more than once")
            return
        if shape == "bom":  # a spreadsheet's byte-order mark is not part of the first column's name
            assert "missing column" not in r.output, r.output
        if r.exit_code == 0:
            out = json.loads(r.stdout)
            for x in out["rows"]:  # a skipped row says why in one line
                assert x["status"] == "ok" or ("\n" not in x["reason"] and x["reason"]), x
            return
        err = one_line_error(r)
        assert str(path) in err, err
        if "row " in err:
            assert "field" in err or "column" in err, err


PARAM_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.floats(allow_subnormal=False),
                         st.text(max_size=3), st.lists(st.integers(), max_size=2))


@st.composite
def param_files(draw):
    obj = json.loads(json.dumps(load_params()))
    for _ in range(draw(st.integers(0, 3))):
        where = draw(st.sampled_from(["engine.trtllm.fixed_s", "engine.trtllm.per_seq_s", "global.attn_eff",
                                      "hardware.cpu.gemm_eff", "hardware.cpu.mem_eff", "regime.nanoflow.*.kappa",
                                      "bounds.x", "fitted_on.rows", "engine.trtllm", "hardware", "engine",
                                      "global.moe_eff", "hardware.cpu.attn_mem_eff", "hardware.cpu.bogus"]))
        d = obj
        parts = where.split(".")
        for k in parts[:-1]:
            d = d.setdefault(k, {}) if isinstance(d, dict) else {}
        if isinstance(d, dict):
            d[parts[-1]] = draw(PARAM_VALUES)
    if draw(st.integers(0, 6)) == 0:
        obj = draw(PARAM_VALUES)
    return obj


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(obj=param_files())
def test_any_parameter_file_predicts_finite_positive_or_is_one_line(obj):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "p.json"
        p.write_text(json.dumps(obj))  # NaN and Infinity as Python's json writes them
        cat = write_cat(Path(d) / "cat.csv", [row(), row(id="s", engine="trtllm")])
        r = invoke("fidelity", cat, "--params-file", p, "--json", "--no-cv")
        if r.exit_code != 0:
            err = one_line_error(r, str(p))
            assert "field" in err or "JSON" in err, err
            return
        out = json.loads(r.stdout)
        assert out["n_ok"] == 2, out
        assert all(x["predicted"] > 0 and x["predicted"] < float("inf") for x in out["rows"])
