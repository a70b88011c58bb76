"""Bad input, round 5: a JSON object naming one key twice (Python's json would keep the last one silently), a
parameters file with nothing fitted in it, and the kernel profiling's options given before a calibrate subcommand
(where they were ignored)."""

import json

import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.sim.errors import UserError
from blendsim.sim.io import DuplicateKey, loads_strict, read_json


def _run(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


def test_loads_strict_refuses_a_key_given_twice_at_any_depth():
    assert loads_strict('{"a": 1, "b": {"c": 2}}') == {"a": 1, "b": {"c": 2}}
    for text in ('{"a": 1, "a": 2}', '{"x": [{"k": 1, "k": 1}]}'):
        with pytest.raises(DuplicateKey, match="appears twice"):
            loads_strict(text)


def test_a_jsonl_trace_line_naming_a_field_twice_is_refused(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"prompt_token_ids": [1, 2, 3], "output_len": 5}\n'
                 '{"prompt_token_ids": [1, 2], "output_len": 5, "output_len": 7}\n')
    res = _run("workloads", "load", f, "-f", "jsonl", "-o", tmp_path / "t.parquet")
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "line 2" in res.output and "'output_len' appears twice" in res.output
    assert not (tmp_path / "t.parquet").exists()


def test_a_json_file_naming_a_key_twice_is_refused(tmp_path):
    f = tmp_path / "p.json"
    f.write_text('{"engine": {}, "engine": {"vllm@0.6": {"fixed_s": 0.001}}}')
    with pytest.raises(UserError, match="'engine' appears twice"):
        read_json(f, "parameters")
    res = _run("fidelity", "--params-file", f, "--no-cv")
    assert res.exit_code == 2 and "appears twice" in res.output


def test_a_benchmark_result_naming_a_key_twice_is_refused(tmp_path):
    f = tmp_path / "vllm.json"
    f.write_text('{"elapsed_time": 10.0, "num_requests": 100, "total_num_tokens": 50000, '
                 '"requests_per_second": 10.0, "tokens_per_second": 5000.0, "tokens_per_second": 6000.0}')
    res = _run("calibrate", "engine", f, "--engine", "vllm@0.6", "--hardware", "a100-80gb", "--model",
               "llama-3-8b", "--workload", "const:512/256", "-o", tmp_path / "o.json")
    assert res.exit_code == 2 and "'tokens_per_second' appears twice" in res.output, res.output
    assert not (tmp_path / "o.json").exists()


def test_a_parameters_file_with_nothing_fitted_is_refused(tmp_path):
    for body in ({}, {"bounds": {}, "fitted_on": {"rows": 3}}, {"engine": {}, "arch": {}}):
        f = tmp_path / "empty.json"
        f.write_text(json.dumps(body))
        res = _run("fidelity", "--params-file", f, "--no-cv")
        assert res.exit_code == 2 and "holds no fitted parameters" in res.output, (body, res.output)


@pytest.mark.parametrize("before", [["--tp", "2"], ["-o", "x.json"], ["--quick"], ["--device", "cpu", "--seed", "3"]])
def test_kernel_profiling_options_before_a_subcommand_are_refused(tmp_path, before):
    res = _run("calibrate", *before, "show", tmp_path / "p.json")
    assert res.exit_code == 2 and "before the subcommand" in res.output and "Traceback" not in res.output
    assert before[0] in res.output
