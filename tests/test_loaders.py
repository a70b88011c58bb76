"""Loaders: real samples from ../shared/data, small files built here, and every bad-input case."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.sim.errors import UserError
from blendsim.sim.prefix_tree import PrefixTree
from blendsim.workloads.loaders import load
from blendsim.workloads.trace import read_trace, write_trace

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"real trace samples not found at {DATA}")

BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def _csv_columns(path: Path, *cols: str) -> list[np.ndarray]:
    """Columns of a CSV read with the standard library (an independent check of the loader)."""
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    return [np.array([r[c] for r in rows]) for c in cols]


# ---- real samples -------------------------------------------------------------------------
@needs_data
@pytest.mark.parametrize("name", ["azure_llm_inference_2023_conv.csv", "azure_llm_inference_2023_code.csv"])
def test_azure_sample_loads_every_row_with_its_lengths(name):
    path = DATA / name
    ctx, gen, ts = _csv_columns(path, "ContextTokens", "GeneratedTokens", "TIMESTAMP")
    t = load(path, "azure")
    t.validate()
    assert t.n == len(ctx)
    np.testing.assert_array_equal(t.input_len, ctx.astype(np.int64))
    np.testing.assert_array_equal(t.output_len, gen.astype(np.int64))
    assert t.arrival_s[0] == 0.0 and np.all(np.diff(t.arrival_s) >= 0)
    # the last arrival is the span of the timestamps (about an hour, SOURCES.md)
    span = (np.datetime64(ts[-1][:26]) - np.datetime64(ts[0][:26])) / np.timedelta64(1, "us") / 1e6
    assert t.arrival_s[-1] == pytest.approx(span, abs=1e-6)
    assert PrefixTree(t).optimal_sharing_ratio() == 0.0  # no content: no false sharing


@needs_data
def test_azure_limit_keeps_the_first_requests():
    full = load(DATA / "azure_llm_inference_2023_code.csv", "azure")
    head = load(DATA / "azure_llm_inference_2023_code.csv", "azure", limit=25)
    assert head.n == 25
    np.testing.assert_array_equal(head.input_len, full.input_len[:25])
    np.testing.assert_allclose(head.arrival_s, full.arrival_s[:25])


@needs_data
def test_vidur_file_from_the_azure_sample_matches_the_azure_loader(tmp_path):
    """Vidur's splitwise_*.csv are the Azure rows with arrived_at = seconds since the first TIMESTAMP."""
    azure = load(DATA / "azure_llm_inference_2023_conv.csv", "azure", limit=500)
    path = tmp_path / "splitwise_conv.csv"
    with path.open("w") as fh:
        fh.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
        for a, p, d in zip(azure.arrival_s, azure.input_len, azure.output_len, strict=True):
            fh.write(f"{float(a)!r},{p},{d}\n")
    vidur = load(path, "vidur")
    np.testing.assert_array_equal(vidur.input_len, azure.input_len)
    np.testing.assert_array_equal(vidur.output_len, azure.output_len)
    np.testing.assert_allclose(vidur.arrival_s, azure.arrival_s)


@needs_data
def test_vidur_length_only_sample_loads_offline():
    path = DATA / "vidur_arxiv_summarization_lengths_llama2tok.csv"
    pre, dec = _csv_columns(path, "num_prefill_tokens", "num_decode_tokens")
    t = load(path, "vidur")
    assert t.n == len(pre) and not t.has_arrivals
    assert t.input_len.sum() == pre.astype(np.int64).sum() and t.output_len.sum() == dec.astype(np.int64).sum()


# ---- BurstGPT and JSONL, built here (no BurstGPT sample ships) --------------------------------
def _burst(tmp_path, rows: list[str]) -> Path:
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text(BURST_HEADER + "".join(r + "\n" for r in rows))
    return path


def test_burstgpt_skips_failed_rows_and_counts_them(tmp_path):
    path = _burst(tmp_path, ["5,ChatGPT,472,18,490,Conversation log", "45,ChatGPT,1087,230,1317,Conversation log",
                             "50,GPT-4,0,0,0,Conversation log", "118,GPT-4,417,276,693,Conversation log",
                             "120,ChatGPT,300,0,300,API log", "185,ChatGPT,1360,647,2007,API log"])
    t = load(path, "burstgpt")
    assert t.n == 4 and t.meta["skipped_failed"] == 2
    assert t.input_len.tolist() == [472, 1087, 417, 1360] and t.output_len.tolist() == [18, 230, 276, 647]
    assert t.arrival_s.tolist() == [0.0, 40.0, 113.0, 180.0]
    assert t.ids.tolist() == ["1", "2", "4", "6"]  # data rows of the file
    assert t.source.tolist() == ["burstgpt/ChatGPT", "burstgpt/ChatGPT", "burstgpt/GPT-4", "burstgpt/ChatGPT"]
    head = load(path, "burstgpt", limit=3)
    assert head.n == 3 and head.meta["skipped_failed"] == 1 and head.ids.tolist() == ["1", "2", "4"]


def test_burstgpt_counts_the_failed_rows_after_the_last_kept_one(tmp_path):
    path = _burst(tmp_path, ["0,ChatGPT,100,20,120,Conversation log", "1,ChatGPT,100,0,100,Conversation log",
                             "1.5,ChatGPT,200,7,207,Conversation log", "2,ChatGPT,100,0,100,Conversation log",
                             "3,ChatGPT,100,0,100,Conversation log"])
    assert load(path, "burstgpt").meta["skipped_failed"] == 3  # every failure of the file (was 1)
    assert load(path, "burstgpt", limit=2).meta["skipped_failed"] == 1  # the limit stops at the second success
    assert load(path, "burstgpt", limit=5).meta["skipped_failed"] == 3  # fewer successes than the limit: all read


def test_burstgpt_limit_reads_past_many_failures(tmp_path):
    rows = [f"{i},ChatGPT,10,0,10,API log" for i in range(3000)] + ["4000,ChatGPT,11,12,23,API log"]
    t = load(_burst(tmp_path, rows), "burstgpt", limit=1)
    assert t.n == 1 and t.input_len.tolist() == [11] and t.meta["skipped_failed"] == 3000


@pytest.mark.parametrize("limit", [None, 5])  # pyarrow's reader, and the text reader a limit takes
def test_burstgpt_nan_timestamp_is_not_a_number_and_an_empty_one_is_missing(tmp_path, limit):
    path = _burst(tmp_path, ["0,ChatGPT,100,20,120,API log", "nan,ChatGPT,100,20,120,API log"])
    with pytest.raises(UserError) as err:
        load(path, "burstgpt", limit)
    assert "data row 2, field Timestamp" in str(err.value) and "is not a number" in str(err.value), str(err.value)
    assert "missing" not in str(err.value)
    path = _burst(tmp_path, ["0,ChatGPT,100,20,120,API log", ",ChatGPT,100,20,120,API log"])
    with pytest.raises(UserError, match="data row 2, field Timestamp: is missing"):
        load(path, "burstgpt", limit)


def test_a_compressed_trace_is_named_by_its_stem_without_the_compression(tmp_path):
    import gzip

    rows = BURST_HEADER + "0,ChatGPT,100,20,120,API log\n"
    (tmp_path / "bg.csv").write_text(rows)
    (tmp_path / "bg.csv.gz").write_bytes(gzip.compress(rows.encode()))
    assert load(tmp_path / "bg.csv", "burstgpt").meta["name"] == "bg"
    assert load(tmp_path / "bg.csv.gz", "burstgpt").meta["name"] == "bg"  # was "bg.csv"
    line = json.dumps({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}) + "\n"
    (tmp_path / "mc.jsonl.gz").write_bytes(gzip.compress(line.encode()))
    assert load(tmp_path / "mc.jsonl.gz", "mooncake").meta["name"] == "mc"


def _jsonl(tmp_path, lines: list, name="reqs.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_jsonl_keeps_tokens_fields_and_real_sharing(tmp_path):
    path = _jsonl(tmp_path, [
        {"id": "a", "prompt_token_ids": [1, 2, 3, 4], "output_len": 5, "arrival_s": 0.5, "ttft_slo_s": 1.0,
         "source": "chat"},
        "",
        {"id": "b", "prompt_token_ids": [1, 2, 3, 9, 9], "output_len": 7, "output_len_hint": 6, "tbt_slo_s": 0.2,
         "arrival_s": 1.0},
        {"prompt_token_ids": [7], "output_len": 1, "jct_slo_s": 30, "arrival_s": 2.0},
    ])
    t = load(path, "jsonl")
    assert t.ids.tolist() == ["a", "b", "2"] and t.input_len.tolist() == [4, 5, 1]
    assert t.prompt_repr(1) == [1, 2, 3, 9, 9]
    assert t.output_len_hint.tolist() == [-1, 6, -1] and t.source.tolist() == ["chat", "", ""]
    assert t.arrival_s.tolist() == [0.5, 1.0, 2.0] and t.ttft_slo_s[0] == 1.0 and t.jct_slo_s[2] == 30  # as given
    assert PrefixTree(t).optimal_sharing_ratio() == pytest.approx(1 - 7 / 10)  # "1 2 3" computed once
    back = read_trace(write_trace(t, tmp_path / "t.parquet"))
    assert back.prompt_repr(0) == [1, 2, 3, 4] and back.tbt_slo_s[1] == 0.2
    assert load(path, "jsonl", limit=2).n == 2


# ---- bad input: one line naming file, row/line and field; exit code 2 in the CLI ---------------
GOOD = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
CSV_CASES = {
    "empty": ("azure", "", ["is empty"]),
    "header only": ("azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n", ["no data rows"]),
    "missing column": ("azure", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n", ["missing column 'GeneratedTokens'"]),
    "not a number": ("azure", GOOD + "2023-11-16 18:15:47,12x,4\n", ["data row 2", "field ContextTokens", "'12x'"]),
    "negative": ("azure", GOOD + "2023-11-16 18:15:47,5,-4\n", ["data row 2", "field GeneratedTokens", ">= 1"]),
    "zero": ("vidur", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,3\n1.5,0,3\n",
             ["data row 2", "field num_prefill_tokens", "-> 0" if False else "0 must be >= 1"]),
    "fraction": ("vidur", "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,3.5\n",
                 ["data row 1", "field num_decode_tokens", "whole number"]),
    "truncated": ("azure", GOOD + "2023-11-16 18:15:47,12", ["data row 2", "field GeneratedTokens", "missing"]),
    "extra field": ("azure", GOOD + "2023-11-16 18:15:47,12,4,9\n", ["malformed CSV", "line 3"]),
    "bad time": ("azure", GOOD + "yesterday,12,4\n", ["data row 2", "field TIMESTAMP", "'yesterday'"]),
    "negative arrival": ("vidur", "arrived_at,num_prefill_tokens,num_decode_tokens\n-1,5,3\n",
                         ["data row 1", "field arrived_at"]),
    "burst negative": ("burstgpt", BURST_HEADER + "5,ChatGPT,472,-1,490,API log\n",
                       ["data row 1", "field Response tokens", ">= 0"]),
    "burst zero prompt": ("burstgpt", BURST_HEADER + "5,ChatGPT,0,3,3,API log\n",
                          ["data row 1", "field Request tokens", ">= 1"]),
    "burst all failed": ("burstgpt", BURST_HEADER + "5,ChatGPT,4,0,4,API log\n", ["no successful requests"]),
    "burst bad time": ("burstgpt", BURST_HEADER + "5,ChatGPT,4,3,7,API log\nsoon,ChatGPT,4,3,7,API log\n",
                       ["data row 2", "field Timestamp", "'soon'"]),
    "burst total": ("burstgpt", BURST_HEADER + "1.0,ChatGPT,800,50,999,API log\n",
                    ["data row 1", "field Total tokens", "999 is not Request tokens + Response tokens (800 + 50 = 850)"]),
    "burst backwards": ("burstgpt", BURST_HEADER + "0.5,ChatGPT,4,3,7,API log\n0.2,ChatGPT,4,0,4,API log\n"
                        "0.1,ChatGPT,4,3,7,API log\n", ["data row 3", "field Timestamp", "0.1 is before data row 1's 0.5",
                                                      "time order"]),
}
JSONL_CASES = {
    "bad json": ('{"prompt_token_ids": [1], "output_len": 2}\n{"prompt_token_ids": [1, "output_len": 2}\n',
                 ["line 2", "not valid JSON"]),
    "missing output_len": ('{"prompt_token_ids": [1, 2]}\n', ["line 1", "field output_len", "missing"]),
    "tokens not a list": ('{"prompt_token_ids": "1 2", "output_len": 2}\n', ["line 1", "field prompt_token_ids"]),
    "empty prompt": ('{"prompt_token_ids": [], "output_len": 2}\n', ["line 1", "field prompt_token_ids"]),
    "negative token": ('{"prompt_token_ids": [3, -1], "output_len": 2}\n', ["line 1", "field prompt_token_ids", "-1"]),
    "zero output": ('\n{"prompt_token_ids": [3], "output_len": 0}\n', ["line 2", "field output_len"]),
    "string output": ('{"prompt_token_ids": [3], "output_len": "4"}\n', ["line 1", "field output_len"]),
    "negative arrival": ('{"prompt_token_ids": [3], "output_len": 4, "arrival_s": -2}\n', ["line 1", "field arrival_s"]),
    "zero slo": ('{"prompt_token_ids": [3], "output_len": 4, "tbt_slo_s": 0}\n', ["line 1", "field tbt_slo_s"]),
    "misspelt field": ('{"prompt_token_ids": [3], "output_len": 4}\n{"prompt_token_ids": [3], "output_len": 4, '
                       '"ttft_slo": 0.5}\n', ["line 2", "field 'ttft_slo'", "the fields are id, prompt_token_ids, "
                                                "output_len, output_len_hint, arrival_s, ttft_slo_s, tbt_slo_s, "
                                                "jct_slo_s, source"]),
    "misspelt required field": ('{"prompt_token_ids": [3], "outputlen": 4}\n', ["line 1", "field 'outputlen'"]),
    "not an object": ("[1, 2]\n", ["line 1", "expected a JSON object"]),
    "empty": ("\n\n", ["no requests"]),
}


def _bad_file(tmp_path, fmt: str, content: str) -> Path:
    path = tmp_path / ("bad.jsonl" if fmt == "jsonl" else "bad.csv")
    path.write_text(content)
    return path


CASES = [(fmt, body, want) for fmt, body, want in CSV_CASES.values()] + \
        [("jsonl", body, want) for body, want in JSONL_CASES.values()]
IDS = list(CSV_CASES) + [f"jsonl {k}" for k in JSONL_CASES]


@pytest.mark.parametrize(("fmt", "content", "want"), CASES, ids=IDS)
def test_bad_input_raises_one_line_naming_file_row_and_field(tmp_path, fmt, content, want):
    path = _bad_file(tmp_path, fmt, content)
    with pytest.raises(UserError) as err:
        load(path, fmt)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(str(path))
    for w in want:
        assert w in msg, msg


@pytest.mark.parametrize(("fmt", "content", "want"), CASES, ids=IDS)
def test_bad_input_cli_exits_2_with_one_stderr_line(tmp_path, fmt, content, want):
    path = _bad_file(tmp_path, fmt, content)
    r = CliRunner().invoke(get_app(), ["workloads", "load", str(path), "--format", fmt, "-o", str(tmp_path / "o.parquet")])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("blendsim: error: ") and str(path) in lines[0]
    assert all(w in lines[0] for w in want) and "Traceback" not in r.output
    assert not (tmp_path / "o.parquet").exists()


@pytest.mark.parametrize("fmt", ["azure", "jsonl"])
def test_unreadable_and_missing_and_binary_files(tmp_path, fmt):
    with pytest.raises(UserError, match="no such file"):
        load(tmp_path / "nope.csv", fmt)
    with pytest.raises(UserError, match="cannot read"):
        load(tmp_path, fmt)  # a directory
    junk = tmp_path / "junk.bin"
    junk.write_bytes(bytes(range(128, 256)) * 40)
    with pytest.raises(UserError) as err:
        load(junk, fmt)
    assert str(junk) in str(err.value) and "\n" not in str(err.value)


def test_unknown_format_and_bad_limit(tmp_path):
    path = _bad_file(tmp_path, "azure", GOOD)
    with pytest.raises(UserError, match="unknown format 'parquet'"):
        load(path, "parquet")
    with pytest.raises(UserError, match="--limit must be at least 1"):
        load(path, "azure", limit=0)


@pytest.mark.parametrize("fmt,text,message", [
    ("azure", b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:50.99,39\xe9,109\n",
     "data row 2: not UTF-8 text (byte 0xe9 at column 26)"),
    ("vidur", b"arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,100,10\n1.0,1\xe900,10\n", "data row 2: not UTF-8"),
    ("burstgpt", b"Timestamp,Model,Request tokens,Response tokens\n1,Chat\xe9GPT,10,10\n", "data row 1: not UTF-8"),
    ("azure", b"TIMESTAMP,ContextTokens,GeneratedTokens,TIMESTAMP\n2023-11-16 18:15:46.68,374,44,x\n",
     "column 'TIMESTAMP' appears twice"),
    ("burstgpt", b"Timestamp,Model,Request tokens,Response tokens,Model\n1,a,10,10,b\n", "column 'Model' appears twice"),
])
def test_bytes_that_are_not_text_and_columns_named_twice_are_one_line(tmp_path, fmt, text, message):
    f = tmp_path / "t.csv"
    f.write_bytes(text)
    for limit in (None, 5):  # the fast reader and the row-by-row one
        with pytest.raises(UserError) as e:
            load(f, fmt, limit=limit)
        assert str(e.value) == f"{f}: {message}" or str(e.value).startswith(f"{f}: {message}"), str(e.value)


def test_a_parquet_trace_with_some_arrival_times_missing_is_one_line(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from blendsim.workloads.trace import from_columns

    p = write_trace(from_columns(input_len=[10, 20, 30], output_len=[5, 5, 5], arrival_s=[0.0, 1.0, 2.0]),
                    tmp_path / "t.parquet")
    tab = pq.read_table(p)
    i = tab.column_names.index("arrival_s")
    for name, values in (("some.parquet", [0.0, None, 2.0]), ("none.parquet", [None, None, None])):
        pq.write_table(tab.set_column(i, "arrival_s", pa.array(values, type=pa.float64())), tmp_path / name)
    with pytest.raises(UserError) as e:
        read_trace(tmp_path / "some.parquet")
    assert str(e.value).startswith(f"{tmp_path / 'some.parquet'}: row 2, field arrival_s: is missing (null)")
    assert list(read_trace(tmp_path / "none.parquet").arrival_s) == [0.0] * 3  # no times at all: offline


def test_vidur_arrivals_start_at_the_earliest_as_every_loaders_do(tmp_path):
    """arrived_at 5, 1: arrivals 4, 0 (as azure's and mooncake's rebase), the file's row order kept."""
    from blendsim.workloads.loaders import load

    f = tmp_path / "v.csv"
    f.write_text("num_prefill_tokens,num_decode_tokens,arrived_at\n10,5,5\n20,6,1\n")
    t = load(f, "vidur")
    np.testing.assert_array_equal(t.arrival_s, [4.0, 0.0])
    np.testing.assert_array_equal(t.input_len, [10, 20])
