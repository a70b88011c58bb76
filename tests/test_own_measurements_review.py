"""A user's own measurements (review of 30 Nov 2026): `calibrate engine` checks what its result files say against
what it is told (lengths, engine, version, precision, TP) instead of fitting silently wrong runs; a hand-edited
profile names a misspelt architecture, hardware or regime and an efficiency outside its bounds; a user's catalogue
refuses cells past its header, ``1_000`` and an engine name written in capitals."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.fidelity.engine_calibration import Setup, read_results
from blendsim.sim.engines import PARAMS_FILE
from tests.helpers import one_line_error

SGL = {"backend": "engine", "successful_requests": 50, "total_latency": 5.0, "total_input_tokens": 50 * 300,
       "total_output_tokens": 50 * 90}


def _trt(**over):
    rep = {"request_info": {"num_requests": 30, "avg_input_length": 128.0, "avg_output_length": 2048.0},
           "performance": {"system_output_throughput_tok_s": 5000.0}, "world_info": {"tp_size": 1, "pp_size": 1},
           "engine": {"version": "0.13.0", "quantization": "None", "kv_cache_dtype": "None"}}
    for k, v in over.items():
        rep[k] = v if not isinstance(v, dict) or not isinstance(rep.get(k), dict) else {**rep[k], **v}
    return rep


def _cal(tmp_path, *files, engine="trtllm@0.13", hardware="h100-80gb", extra=()):
    return CliRunner().invoke(get_app(), ["calibrate", "engine", *map(str, files), "--engine", engine, "--hardware",
                                          hardware, "-m", "llama-3-8b", "-o", str(tmp_path / "p.json"), *extra])


def test_a_workload_that_disagrees_with_the_lengths_a_file_records_is_refused(tmp_path):
    f = tmp_path / "s.jsonl"
    f.write_text(json.dumps(SGL) + "\n")
    r = _cal(tmp_path, f, engine="sglang@0.3", hardware="a100-80gb", extra=["--workload", "const:462/16"])
    one_line_error(r, "s.jsonl: line 1", "mean lengths 462/16", "records 300/90")
    assert not (tmp_path / "p.json").exists()
    s = Setup("sglang", "0.3", "a100-80gb", "llama-3-8b", None, "bf16", "", "const:300/90")
    assert read_results([f], s)[0].workload == "const:300/90"  # one that agrees is taken
    v = tmp_path / "v.json"  # vLLM: any workload form is checked against total_num_tokens
    v.write_text(json.dumps({"elapsed_time": 10.0, "num_requests": 200, "total_num_tokens": 200 * 478}))
    one_line_error(_cal(tmp_path, v, engine="vllm@0.6", hardware="a100-80gb",
                        extra=["--workload", "random:2048/256?range_ratio=0.1"]), "total_num_tokens is 95,600")


def test_a_result_of_another_engine_or_release_is_refused(tmp_path):
    s = tmp_path / "s.jsonl"
    s.write_text(json.dumps(SGL) + "\n")
    one_line_error(_cal(tmp_path, s, engine="vllm@0.6"), "an SGLang bench_offline_throughput result",
                   "calibrate sglang with it")
    t = tmp_path / "t.json"
    t.write_text(json.dumps(_trt()))
    one_line_error(_cal(tmp_path, t, engine="vllm@0.6"), "a trtllm-bench report")
    one_line_error(_cal(tmp_path, t, engine="trtllm@1.0"), "field engine.version", "TensorRT-LLM 0.13.0")


def test_a_trtllm_report_s_precision_and_degrees_are_taken_and_checked(tmp_path):
    t = tmp_path / "t.json"
    t.write_text(json.dumps(_trt(engine={"quantization": "FP8", "kv_cache_dtype": "FP8"},
                                 world_info={"tp_size": 2, "pp_size": 2})))
    s = Setup("trtllm", "0.13", "h100-80gb", "llama-3-8b", None, "", "", None)  # --weights not given
    row = read_results([t], s)[0]
    assert (row.weights, row.kv_dtype, row.tp, row.pp, row.gpus) == ("fp8", "fp8", 2, 2, 4)
    one_line_error(_cal(tmp_path, t, extra=["--weights", "bf16"]), "engine.quantization", "says FP8", "--weights bf16")
    one_line_error(_cal(tmp_path, t, extra=["--kv-dtype", "bf16"]), "engine.kv_cache_dtype")
    one_line_error(_cal(tmp_path, t, extra=["--tp", "4"]), "world_info.tp_size", "ran TP 2, but --tp 4")
    t.write_text(json.dumps(_trt(world_info={"tp_size": "2"})))
    one_line_error(_cal(tmp_path, t), "world_info.tp_size", "whole number >= 1")
    t.write_text(json.dumps(_trt(performance=[{"system_output_throughput_tok_s": 1.0}])))
    one_line_error(_cal(tmp_path, t), "field performance: expected an object")


def test_identical_runs_are_noted_and_a_byte_order_mark_is_read(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps(SGL) + "\n")
    b.write_text(json.dumps(SGL) + "\n")
    notes: list = []
    read_results([a, b], Setup("sglang", "0.3", "a100-80gb", "llama-3-8b", None, "bf16", "", None), notes)
    assert any("identical in every figure" in n for n in notes), notes
    v = tmp_path / "v.json"
    v.write_bytes(b"\xef\xbb\xbf" + json.dumps({"elapsed_time": 1.0, "num_requests": 10,
                                                 "total_num_tokens": 10 * 600}).encode())
    rows = read_results([v], Setup("vllm", "0.6", "a100-80gb", "llama-3-8b", None, "bf16", "", "const:500/100"))
    assert rows[0].value == pytest.approx(6000.0)


def _profile(tmp_path, edit) -> str:
    p = json.loads(PARAMS_FILE.read_text())
    p["profile"] = {"kind": "blendsim-engine-profile", "engine": "trtllm", "version": "0.13", "hardware": "a100-80gb"}
    edit(p)
    f = tmp_path / "prof.json"
    f.write_text(json.dumps(p))
    return str(f)


@pytest.mark.parametrize("edit, needles", [
    (lambda p: p["arch"].__setitem__("Ampere", p["arch"].pop("ampere")), ["field arch.Ampere", "unknown GPU architecture"]),
    (lambda p: p.__setitem__("hardware", {"a100-80": {"gemm_eff": 0.7}}), ["field hardware.a100-80", "unknown hardware"]),
    (lambda p: p["regime"].__setitem__("cuda_graph", p["regime"].pop("cuda-graph")), ["field regime.cuda_graph"]),
    (lambda p: p["arch"]["ampere"].__setitem__("gemm_eff", 1e-9), ["field arch.ampere.gemm_eff", "from 0.25 to 0.95"]),
    (lambda p: p["profile"].__setitem__("hardware", "a100"), ["field profile.hardware", "'a100' is not a hardware preset"]),
    (lambda p: (p["profile"].update(engine="sglang", version="0.3"),
                p["engine"].__setitem__("sglang@0.4", p["engine"].pop("sglang@0.3"))),
     ["field engine", "under sglang@0.4 but none under sglang@0.3"]),
])
def test_a_hand_edited_profile_names_what_is_wrong(tmp_path, edit, needles):
    f = _profile(tmp_path, edit)
    r = CliRunner().invoke(get_app(), ["cost", "--engine", f, "--decode-seqs", "8", "--context", "256"])
    one_line_error(r, *needles)


def test_an_untouched_profile_still_prices(tmp_path):
    f = _profile(tmp_path, lambda p: None)
    r = CliRunner().invoke(get_app(), ["cost", "--engine", f, "--decode-seqs", "8", "--context", "256"])
    assert r.exit_code == 0, r.output


def _catalogue(tmp_path, edit=None, tail="") -> str:
    from blendsim.fidelity.catalogue import COLUMNS

    row = {c: "" for c in COLUMNS}
    row.update(id="r1", source="s", model="llama-3-8b", hardware="a100-80gb", gpus="1", tp="1", engine="vllm",
               engine_version="0.6.0", workload="const:128/128", requests="50", metric="output_tok_s", scope="system",
               value="1000")
    if edit:
        row.update(edit)
    f = tmp_path / "c.csv"
    f.write_text(",".join(COLUMNS) + "\n" + ",".join(row[c] for c in COLUMNS) + tail + "\n")
    return str(f)


@pytest.mark.parametrize("edit, tail, needles", [
    (None, ",x,y", ["row 2 (id r1)", "cells for the header's", "quote the cell"]),
    ({"value": "1_000"}, "", ["field 'value'", "'1_000'"]),
    ({"engine": "SGLang"}, "", ["field 'engine'", "write 'sglang'"]),
])
def test_a_user_catalogue_refuses_what_it_cannot_read_as_written(tmp_path, edit, tail, needles):
    r = CliRunner().invoke(get_app(), ["fidelity", _catalogue(tmp_path, edit, tail), "--no-cv"])
    one_line_error(r, *needles)


def test_a_trtllm_report_s_limits_are_run_and_latency_or_capped_runs_refused(tmp_path):
    """A trtllm-bench report's max_batch_size / max_num_tokens set the run's limits as a catalogue row's flags do (was:
    the tool's sizes from the dataset, whatever the run had); a latency report (max_batch_size 1) and a run whose
    client capped the requests in flight (--concurrency) are refused in one line instead of fitted as offline runs."""
    from blendsim.fidelity.catalogue import engine_flags

    s = Setup("trtllm", "0.13", "h100-80gb", "llama-3-8b", None, "", "", None)
    t = tmp_path / "t.json"
    t.write_text(json.dumps(_trt(world_info={"max_batch_size": 256, "max_num_tokens": 4096})))
    row = read_results([t], s)[0]
    assert engine_flags(row) == {"max_seqs": 256, "token_budget": 4096}
    t.write_text(json.dumps(_trt(world_info={"max_batch_size": 256}, engine={"version": ""})))  # no version, no tokens
    assert read_results([t], dataclasses.replace(s, version=""))[0].engine_version == "--max_batch_size 256"
    lat = tmp_path / "lat.json"
    lat.write_text(json.dumps(_trt(world_info={"max_batch_size": 1, "max_num_tokens": 8192})))
    one_line_error(_cal(tmp_path, lat), "world_info.max_batch_size is 1", "trtllm-bench latency report")
    # --concurrency 8 of 30 requests: about 8 in flight, issued as others finished (issue rate near the completion rate)
    capped = _trt(world_info={"max_batch_size": 2048, "issue_rate": 3.1},
                  request_info={"avg_num_concurrent_requests": 7.8},
                  performance={"request_throughput_req_s": 2.4})
    t.write_text(json.dumps(capped))
    one_line_error(_cal(tmp_path, t), "avg_num_concurrent_requests is 7.8 for 30 requests and max_batch_size 2,048",
                   "--concurrency N", "catalogue CSV row")
    # as few in flight on average, but every request issued at the start (outputs of very uneven lengths): taken
    t.write_text(json.dumps({**capped, "world_info": {**capped["world_info"], "issue_rate": 1.2e5}}))
    assert read_results([t], s)[0].requests == 30
    # one that queued them all (about half in flight on average or more) is taken without an issue rate
    t.write_text(json.dumps(_trt(request_info={"avg_num_concurrent_requests": 19.5})))
    assert read_results([t], s)[0].requests == 30


@pytest.mark.parametrize("algo, weights", [("FP8_BLOCK_SCALES", "fp8"), ("FP8_PER_CHANNEL_PER_TOKEN", "fp8"),
                                           ("W4A8_NVFP4_FP8", "fp4"), ("W4A8_MXFP4_MXFP8", "fp4"),
                                           ("W4A16_AWQ", "int4"), ("NVFP4", "fp4"), ("NO_QUANT", "bf16")])
def test_tensorrt_llms_own_precision_names_are_read(tmp_path, algo, weights):
    """TensorRT-LLM's QuantAlgo names as blendsim's precisions (was: FP8_BLOCK_SCALES, the default of DeepSeek-V3 and
    Qwen3 FP8 checkpoints, refused as a precision blendsim does not model)."""
    t = tmp_path / "t.json"
    t.write_text(json.dumps(_trt(engine={"quantization": algo, "kv_cache_dtype": "FP8"})))
    s = Setup("trtllm", "0.13", "h100-80gb", "llama-3-8b", None, "", "", None)
    assert (read_results([t], s)[0].weights, read_results([t], s)[0].kv_dtype) == (weights, "fp8")


def test_an_unmodelled_trtllm_precision_is_named_with_tensorrt_llms_names(tmp_path):
    t = tmp_path / "t.json"
    t.write_text(json.dumps(_trt(engine={"quantization": "W8A8_SQ_PER_CHANNEL"})))
    line = one_line_error(_cal(tmp_path, t), "field engine.quantization", "'W8A8_SQ_PER_CHANNEL' is a precision",
                          "FP8_BLOCK_SCALES", "W4A8_NVFP4_FP8")
    assert "BFLOAT16" not in line and "FLOAT16" not in line  # names TensorRT-LLM never writes there
    # an NVFP4 or INT8 KV cache stops with the field and file (was: every run skipped, naming a --kv-dtype never given)
    for kv in ("NVFP4", "INT8"):
        t.write_text(json.dumps(_trt(engine={"kv_cache_dtype": kv})))
        line = one_line_error(_cal(tmp_path, t), f"t.json: field engine.kv_cache_dtype: '{kv}' is a KV-cache precision "
                                                 f"blendsim does not model (it models FP8 or none)")
        assert "--kv-dtype" not in line
