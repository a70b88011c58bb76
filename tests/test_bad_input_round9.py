"""Bad input, review of 1 Dec 2026: every case one line naming what is wrong (never a traceback, never a silently
wrong number), an output folder that cannot be moved aside (a mount point) written into, and Unix times loaded."""

from __future__ import annotations

import errno
import json
import pathlib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import blendsim
from blendsim.cli import get_app
from blendsim.sim.errors import UserError
from tests.helpers import one_line_error


def _cli(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


def _trace(**kw):
    cols = dict(ids=np.array(["a", "b"], dtype=object), input_len=np.array([5, 5]), output_len=np.array([4, 4]),
                unit_offsets=np.array([0, 5, 10]), unit_sym=np.arange(10), unit_len=np.ones(10, dtype=np.int64))
    cols.update(kw)
    return blendsim.Trace(**cols)


@pytest.mark.parametrize("kw, words", [
    ({"output_len": np.array([4, -3])}, "row 2, field output_len: -3 must be a positive integer"),
    ({"input_len": np.array([5, 500])}, "row 2, field input_len: 500 does not equal the prompt's length"),
    ({"arrival_s": np.array([0.0, np.nan])}, "row 2, field arrival_s: nan must be a finite time"),
    ({"ids": np.array(["a", "a"], dtype=object)}, "row 2, field id: 'a' repeats row 1"),
])
def test_a_trace_built_or_edited_in_python_is_checked_as_a_file_is(tmp_path, kw, words):
    """Was: simulated as it stood (a negative output length gave a negative throughput) and written to a file that
    load_trace then refused."""
    with pytest.raises(UserError, match=words):
        blendsim.simulate(_trace(**kw), policy="fcfs")
    with pytest.raises(UserError, match=words):
        blendsim.write_trace(_trace(**kw), tmp_path / "t.parquet")
    assert not (tmp_path / "t.parquet").exists()


def test_an_output_folder_that_cannot_be_moved_aside_is_written_into(tmp_path, monkeypatch):
    """An empty -o that is a mount point (docker -v, NFS) cannot be renamed: was a traceback after the whole run and
    a .NAME.old.* folder left behind; now the output goes into it. A non-empty one is one line."""
    final = tmp_path / "mnt"
    final.mkdir()
    real = pathlib.Path.rename

    def rename(self, target):
        if Path(self) == final:
            raise OSError(errno.EBUSY, "Device or resource busy")
        return real(self, target)

    monkeypatch.setattr(pathlib.Path, "rename", rename)
    t = blendsim.make_trace(input_len=[50] * 4, output_len=[5] * 4)
    with pytest.warns(UserWarning):
        blendsim.simulate(t, policy="fcfs").write(final)
    assert (final / "summary.json").is_file() and (final / "blendsim-files.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnt"]  # no staging or .old folder left
    # again, with --force: blendsim's own output in it is replaced in place (a mount point cannot move aside)
    with pytest.warns(UserWarning):
        blendsim.simulate(t, policy="dfs").write(final, force=True)
    assert json.loads((final / "summary.json").read_text())["policy"] == "dfs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnt"]
    (final / "mine.txt").write_text("the user's")  # a file blendsim did not write: refused, nothing removed
    with pytest.warns(UserWarning), pytest.raises(UserError, match="holds what blendsim did not write"):
        blendsim.simulate(t, policy="fcfs").write(final, force=True)
    assert (final / "mine.txt").read_text() == "the user's" and (final / "summary.json").is_file()


def test_calibrate_engine_with_a_missing_workload_file_is_one_line(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"elapsed_time": 10.0, "num_requests": 100, "total_num_tokens": 115200,
                                                 "requests_per_second": 10.0, "tokens_per_second": 11520.0}))
    r = _cli("calibrate", "engine", tmp_path / "a.json", "--engine", "vllm", "--hardware", "a100-80gb", "-m",
             "llama-3-8b", "--workload", f"file:{tmp_path / 'nosuch.csv'}", "-o", tmp_path / "p.json")
    one_line_error(r, "--workload", "does not exist")
    r = _cli("calibrate", "engine", tmp_path / "a.json", "--engine", "vllm", "--hardware", "a100-80gb", "-m",
             "llama-3-8b", "--workload", "bogus:blendserve", "-o", tmp_path / "p.json")
    one_line_error(r, "'bogus:blendserve' is not const:ISL/OSL, random:ISL/OSL")


def _price_file(tmp_path, text):
    (tmp_path / "p.csv").write_text(text)
    return tmp_path / "p.csv"


@pytest.mark.parametrize("text, words", [
    ("hardware,usd_per_gpu_hour,usd_per_gpu_hour\na100-80gb,2.7,27\n", "usd_per_gpu_hour appear twice in the header"),
    ("hardware,usd_per_gpu_hour\na100-80gb,2,3\n", "row 2: 3 cells for the header's 2 columns"),
    ("hardware,usd_per_gpu_hour\na100-80gb,1e308\n", "more than 1,000 (cents given as dollars?)"),
])
def test_a_price_file_that_would_be_read_wrong_is_refused(tmp_path, text, words):
    from blendsim.plan.prices import read_prices

    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        read_prices(_price_file(tmp_path, text))


def test_plan_prices_of_a_wrong_type_is_one_line():
    t = blendsim.make_trace(input_len=[50] * 4, output_len=[5] * 4)
    with pytest.raises(UserError, match="--prices must be a file path"):
        blendsim.plan(t, prices=5)


@pytest.mark.parametrize("options, words", [
    ({"block_size": "512"}, "--block-size must be a whole number"),
    ({"block_size": 512.0}, "--block-size must be a whole number"),
    ({"time_unit": ["s"]}, "--time-unit must be"),
    ({"output_len": 5.5}, "--output-len must be a whole number"),
    ({"seed": None}, "--seed must be a whole number"),
    ({"output_from": 5}, "--output-from must be a file path"),
])
def test_load_trace_options_of_a_wrong_type_are_one_line(tmp_path, options, words):
    p = tmp_path / "m.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 1024, "output_length": 10, "hash_ids": [1, 2]}\n')
    with pytest.raises(UserError, match=words):
        blendsim.load_trace(p, format="mooncake", **options)


def test_a_workload_option_given_twice_is_refused(tmp_path):
    from tests.test_fidelity import _row, _write

    cat = _write(tmp_path, [_row(id="r", workload="random:128/64?range_ratio=0.1&range_ratio=0.5")])
    r = _cli("fidelity", cat, "--no-cv", "-q")
    one_line_error(r, "option range_ratio is given twice (range_ratio=0.1 and range_ratio=0.5)")


def test_a_misspelt_optional_column_is_refused(tmp_path):
    from tests.test_fidelity import _row, _write

    cat = _write(tmp_path, [_row(id="r")])
    text = cat.read_text().splitlines()
    cat.write_text("\n".join([text[0] + ",host_kv_GB", *(line + ",20" for line in text[1:])]) + "\n")
    one_line_error(_cli("fidelity", cat, "--no-cv", "-q"), "column 'host_kv_GB' is not one blendsim reads; did you "
                                                           "mean 'host_kv_gb'?")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"input_len": [5], "output_len": [3], "ttft_slo": [1.0]}), tmp_path / "t.parquet")
    with pytest.raises(UserError, match="column 'ttft_slo' is not one blendsim reads; did you mean 'ttft_slo_s'"):
        blendsim.load_trace(tmp_path / "t.parquet")


def test_validate_with_an_empty_policy_is_refused(tmp_path):
    t = blendsim.make_trace(input_len=[50] * 4, output_len=[5] * 4)
    blendsim.write_trace(t, tmp_path / "t.parquet")
    for flag in ("--policies", "-p"):
        r = _cli("validate", tmp_path / "t.parquet", flag, "", "-o", tmp_path / "v")
        assert r.exit_code == 2 and "polic" in r.output, r.output
        assert not (tmp_path / "v").exists()


def test_unix_times_load_and_a_header_with_spaces_after_its_commas_reads(tmp_path):
    (tmp_path / "e.csv").write_text("Timestamp, Request tokens, Response tokens\n1700000000,10,5\n1700000002,11,6\n")
    t = blendsim.load_trace(tmp_path / "e.csv", format="burstgpt")
    assert t.arrival_s.tolist() == [0.0, 2.0]
    (tmp_path / "f.csv").write_text("Timestamp,Request tokens,Response tokens\n0,10,5\n2000000000,11,6\n")
    with pytest.raises(UserError, match="data row 2, field Timestamp: 2000000000 is 2000000000 s after the first"):
        blendsim.load_trace(tmp_path / "f.csv", format="burstgpt")


def test_a_price_row_with_an_empty_trailing_cell_still_reads(tmp_path):
    from blendsim.plan.prices import read_prices

    assert read_prices(_price_file(tmp_path, "hardware,usd_per_gpu_hour\na100-80gb,2.7,\n")).prices[
        "a100-80gb"].usd_per_gpu_hour == 2.7
