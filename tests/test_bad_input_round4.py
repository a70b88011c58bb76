"""Bad input, round 4: rows with more fields than their header are refused with the row named (pandas would take
the first column as an index and shift every column), and other inputs that were read wrongly or named unclearly."""

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


@pytest.mark.parametrize("prompts, says", [
    (["abc"], "prompts[0]: expected a list of token ids or of (segment_id, length) pairs, or None, got str"),
    ([[1, "x"]], "prompts[0]: expected a list of token ids or of (segment_id, length) pairs, or None; [1, 'x']"),
    ([[1.0, 2.0, 3.0]], "prompts[0]: expected a list of token ids"),
])
def test_make_trace_names_the_prompt_it_cannot_read(prompts, says):
    import blendsim

    with pytest.raises(UserError) as e:
        blendsim.make_trace(input_len=[3], output_len=[5], prompts=prompts)
    assert str(e.value).startswith(says)


def test_load_trace_on_a_folder_says_so(tmp_path):
    import blendsim

    with pytest.raises(UserError, match="is a folder; give a trace file"):
        blendsim.load_trace(tmp_path)


def test_an_engine_field_with_an_underscore_is_not_read_as_one_number():
    from blendsim.sim.engines import parse_key

    with pytest.raises(UserError, match="fixed_s must be a number of seconds, got '1_0'"):
        parse_key("vllm:fixed_s=1_0")


def test_an_unknown_dtype_lists_the_known_ones_as_text():
    from blendsim.sim.models import get_model

    with pytest.raises(UserError) as e:
        get_model("llama-3-8b", dtype="fp64")
    assert "[" not in str(e.value) and "bf16" in str(e.value)


def test_a_presets_fields_say_their_units():
    from blendsim.cli import _field_text

    assert _field_text("peak_flops", 9.894e14) == "989.4 TFLOP/s (9.894e+14)"
    assert _field_text("mem_bandwidth", 3.35e12) == "3,350.0 GB/s (3.35e+12)"
    assert _field_text("memory_bytes", 85_899_345_920) == "80.0 GiB (85,899,345,920)"
    assert _field_text("link_latency_s", 8e-6) == "8.0 us (8e-06)"
    assert _field_text("device_names", ("h100",)) == "h100" and _field_text("peak_flops_fp4", 0) == "0"


def test_attention_dp_asked_of_a_dense_model_is_said_to_change_nothing():
    import blendsim

    t = blendsim.synthesize("blendserve", requests=100, seed=0)
    with __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore")
        on = blendsim.simulate(t, policy="fcfs", engine="vllm:attn_dp=1")
        off = blendsim.simulate(t, policy="fcfs", engine="vllm")
    assert any("attn_dp=1 changes nothing for llama-3-8b at tp 1" in n for n in on.notes)
    assert not any("attn_dp" in n for n in off.notes)
    assert on.summary["makespan_s"] == off.summary["makespan_s"]
