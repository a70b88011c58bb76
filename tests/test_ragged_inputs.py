"""Rows with more fields than their header are refused with the row named, never read shifted by one column
(pandas would take the first column as an index), and a column named for a Parquet trace is checked."""

import numpy as np
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.sim.errors import UserError
from blendsim.workloads.hashed import output_lengths
from blendsim.workloads.trace import write_trace
from tests.helpers import random_trace


@pytest.mark.parametrize("rows, says", [
    ("0,100,50,7\n1,200,60,8\n", "data row 1 has 4 fields, the header 3"),
    ("0,100,50,\n1,200,60,\n", "data row 1 has 4 fields (a trailing comma?), the header 3"),
])
def test_a_trace_csv_with_extra_fields_is_refused(tmp_path, rows, says):
    f = tmp_path / "bg.csv"
    f.write_text("Timestamp,Request tokens,Response tokens\n" + rows)
    res = CliRunner().invoke(get_app(), ["workloads", "load", str(f), "-f", "burstgpt", "-o", str(tmp_path / "t.parquet")])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert says in res.output and not (tmp_path / "t.parquet").exists()


def test_an_output_length_csv_with_extra_fields_is_refused(tmp_path):
    f = tmp_path / "lengths.csv"
    f.write_text("output_len\n5,7\n9,11\n")
    with pytest.raises(UserError, match="data row 1 has 2 fields, the header 1"):
        output_lengths(str(f))


def test_a_parquet_traces_output_lengths_are_its_output_len_column(tmp_path):
    t = write_trace(random_trace(np.random.default_rng(0), n=20), tmp_path / "t.parquet")
    pool, src = output_lengths(f"{t}:output_len")
    assert src.endswith(":output_len") and len(pool)
    for col in ("input_len", "nocol"):
        with pytest.raises(UserError, match="gives its output_len column only"):
            output_lengths(f"{t}:{col}")


@pytest.mark.parametrize("value", ["-5", "2.5"])
def test_a_negative_or_fractional_max_context_is_not_read_as_a_model_name(value):
    from blendsim.workloads.hashed import parse_max_context

    with pytest.raises(UserError, match="--max-context must be a whole number of tokens"):
        parse_max_context(value)
    assert parse_max_context("4096") == (4096, "4096 tokens")
