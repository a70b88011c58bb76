"""Trace input (review round 8): ids that would read back as segments, an invented prompt for an empty one, a cut
trace's metadata, the first line of undecodable bytes."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import blendsim
from blendsim.workloads.trace import MAX_SEGMENT_ID, MAX_TOKEN_ID


def test_a_token_id_past_the_token_range_is_refused_not_read_as_a_segment():
    with pytest.raises(blendsim.BlendsimError, match="not a token id"):
        blendsim.make_trace(input_len=[4, 4], output_len=[5, 5],
                            prompts=[[2**40 + 7, 2**40 + 8, 2**40 + 9, 2**40 + 10], [(7, 1), (8, 1), (9, 1), (10, 1)]])
    with pytest.raises(blendsim.BlendsimError, match="not a token id"):
        blendsim.make_trace(input_len=[1], output_len=[1], prompts=[[MAX_TOKEN_ID + 1]])
    blendsim.make_trace(input_len=[1], output_len=[1], prompts=[[MAX_TOKEN_ID]])


def test_a_prompt_of_its_own_needs_room_above_the_given_segment_ids():
    with pytest.raises(blendsim.BlendsimError, match="segment id of its own"):
        blendsim.make_trace(input_len=[4, 3], output_len=[1, 1], prompts=[[(MAX_SEGMENT_ID, 4)], None])


@pytest.mark.parametrize("col", ["prompt_tokens", "prompt_segments"])
def test_an_empty_prompt_list_in_parquet_is_refused(tmp_path, col):
    t = blendsim.make_trace(input_len=[3, 3], output_len=[2, 2], prompts=[[1, 2, 3], [4, 5, 6]])
    p = tmp_path / "t.parquet"
    blendsim.write_trace(t, p)
    tab = pq.read_table(p)
    if col == "prompt_tokens":
        new = pa.array([[1, 2, 3], []], type=tab.schema.field(col).type)
    else:
        seg = pa.struct([("segment_id", pa.int64()), ("length", pa.int64())])
        tab = tab.drop_columns(["prompt_tokens"])
        new = pa.array([[{"segment_id": 1, "length": 3}], []], type=pa.list_(seg))
    tab = tab.set_column(tab.schema.get_field_index(col), col, new) if col in tab.column_names \
        else tab.append_column(col, new)
    pq.write_table(tab, p)
    with pytest.raises(blendsim.BlendsimError, match=f"row 2, field {col}: is an empty list"):
        blendsim.load_trace(p)


def test_a_cut_trace_drops_the_whole_traces_measured_figures(tmp_path):
    t = blendsim.synthesize("blendserve", requests=400, seed=0)
    p = tmp_path / "t.parquet"
    blendsim.write_trace(t, p)
    assert "measured" in blendsim.load_trace(p).meta
    assert "measured" not in blendsim.load_trace(p, limit=50).meta
    assert "measured" in blendsim.load_trace(p, limit=400).meta  # the whole trace: its own figures


def test_undecodable_jsonl_says_after_which_line(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_bytes(b'{"prompt_token_ids": [1, 2], "output_len": 3}\n' + b'\xff\xfe bad\n')
    with pytest.raises(blendsim.BlendsimError, match="not a UTF-8 text file .undecodable bytes on line 2."):
        blendsim.load_trace(p)


@pytest.mark.parametrize("limit", [[], ["--limit", "2"]])
def test_a_hexadecimal_count_is_refused_with_or_without_a_limit(tmp_path, limit):
    from typer.testing import CliRunner

    from blendsim.cli import get_app

    f = tmp_path / "a.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,0x10,20\n"
                 "2023-11-16 18:15:47.68,31,21\n")
    r = CliRunner().invoke(get_app(), ["workloads", "load", str(f), "-f", "azure", *limit, "-o",
                                       str(tmp_path / "t.parquet")])
    assert r.exit_code == 2 and "data row 1, field ContextTokens" in r.output, r.output


def test_an_azure_timestamp_without_a_time_of_day_is_refused(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,20\n2023-11-17,31,21\n")
    with pytest.raises(blendsim.BlendsimError, match="data row 2, field TIMESTAMP: '2023-11-17' is a date without"):
        blendsim.load_trace(f, format="azure")
