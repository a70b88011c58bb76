"""Catalogue rows of a serving benchmark's random dataset (``random:ISL/OSL?range_ratio=R``) and of a client's cap on
requests in flight (``--max-concurrency N``), and validation.csv's vLLM FP8 KV-cache blog rows that use both."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from blendsim.fidelity.catalogue import (
    build_workload,
    client_concurrency,
    engine_settings,
    read_catalogue,
    row_engine_key,
)
from blendsim.fidelity.suite import SHIPPED_CATALOGUES, SHIPPED_VALIDATION, load_suite, predictions
from blendsim.sim.engines import get_profile, load_params
from blendsim.sim.errors import UserError
from blendsim.sim.hardware import get_hardware
from tests.helpers import write_catalogue


def _row(**kw) -> dict:
    base = {"id": "r", "source": "test", "model": "llama-3.1-8b", "hardware": "h100-80gb", "gpus": 1, "tp": 1, "pp": 1,
            "ep": 1, "weights": "bf16", "kv_dtype": "bf16", "engine": "vllm", "engine_version": "vLLM v0.10.1",
            "policy": "", "workload": "random:2000/200?range_ratio=0.15", "requests": 400, "metric": "output_tok_s",
            "scope": "system", "value": 1000, "note": ""}
    base.update(kw)
    return base


_write = write_catalogue


def test_random_lengths_span_the_ratio_as_vllm_draws_them_and_repeat(tmp_path):
    row = read_catalogue(_write(tmp_path, [_row()]))[0]
    t = build_workload(row)
    assert t.n == 400
    # vLLM's RandomDataset: [int(X (1 - r)), int(X (1 + r))], ends included
    assert t.input_len.min() >= 1700 and t.input_len.max() <= 2300
    assert t.output_len.min() >= 170 and t.output_len.max() <= 230
    assert abs(t.input_len.mean() - 2000) < 30 and abs(t.output_len.mean() - 200) < 3
    assert t.input_len.std() > 100  # spread, not constant
    again = build_workload(row)
    assert np.array_equal(t.input_len, again.input_len) and np.array_equal(t.output_len, again.output_len)
    # no ratio: every request at the stated lengths, as const:ISL/OSL
    flat = build_workload(read_catalogue(_write(tmp_path, [_row(workload="random:300/30")]))[0])
    assert set(flat.input_len) == {300} and set(flat.output_len) == {30}


@pytest.mark.parametrize("workload, says", [
    ("random:2000", "is not random:ISL/OSL"),
    ("random:2000/x", "is not random:ISL/OSL"),
    ("random:2000/200?range_ratio=1", "must be a number in [0, 1)"),
    ("random:2000/200?range_ratio=-0.1", "must be a number in [0, 1)"),
    ("random:2000/200?range_ratio=nan", "must be a number in [0, 1)"),
    ("random:2000/200?range_ratio=abc", "must be a number in [0, 1)"),
    ("random:2000/200?ratio=0.1", "unknown random option(s) ratio"),
    ("random:1/200?range_ratio=0.5", "every length must be in 1.."),
    ("random:2000/0", "every length must be in 1.."),
    ("rand:2000/200", "is not const:ISL/OSL, random:ISL/OSL?range_ratio=R"),
])
def test_a_malformed_random_workload_stops_the_read_in_one_line(tmp_path, workload, says):
    with pytest.raises(UserError) as e:
        read_catalogue(_write(tmp_path, [_row(workload=workload)]))
    msg = str(e.value)
    assert says in msg and "field 'workload'" in msg and "\n" not in msg


def test_a_clients_concurrency_caps_the_engines_sequences(tmp_path):
    rows = read_catalogue(_write(tmp_path, [
        _row(id="a", engine_version="vLLM v0.10.1; vllm serve m; client: vllm bench serve --max-concurrency 8"),
        _row(id="b", engine_version="vLLM v0.10.1; vllm serve m --max-num-seqs 4; vllm bench serve --max-concurrency 8"),
        _row(id="c", engine_version="vLLM v0.10.1; vllm serve m"),
        _row(id="d", engine="trtllm", engine_version="TensorRT-LLM v0.19; trtllm-bench throughput --concurrency 16"),
    ]))
    hw = get_hardware("h100-80gb")
    settings = {r.id: engine_settings(r, get_profile(row_engine_key(r)), hw) for r in rows}
    assert settings["a"]["max_seqs"] == 8
    assert settings["b"]["max_seqs"] == 4  # the engine's own cap is lower
    assert settings["c"]["max_seqs"] > 8  # no client cap: the engine's default
    assert [client_concurrency(r) for r in rows] == [8, 8, None, 16]


def test_a_cap_of_eight_in_flight_slows_a_run_as_a_smaller_batch_does(tmp_path):
    """The same workload with and without the client's cap: fewer sequences a step, so fewer tokens a second."""
    base = "vLLM v0.10.1; vllm serve m; client: vllm bench serve"
    p = _write(tmp_path, [_row(id="open", engine_version=base, requests=64, workload="random:512/128?range_ratio=0.1"),
                          _row(id="capped", engine_version=base + " --max-concurrency 8", requests=64,
                               workload="random:512/128?range_ratio=0.1")])
    params = load_params()
    suite = load_suite(p, params)
    pred = predictions(suite, params)
    assert pred["capped"] < 0.5 * pred["open"]


def _blog_rows():
    return [r for r in read_catalogue(SHIPPED_VALIDATION) if "-fp8kvblog-" in r.id]


def test_the_fp8_kv_blog_rows_are_cited_unfitted_and_capped_at_eight():
    rows = _blog_rows()
    assert len(rows) == 4 and len({r.id for r in rows}) == 4
    fitted = {r["id"] for p in SHIPPED_CATALOGUES for r in csv.DictReader(open(p, newline=""))}
    assert not fitted & {r.id for r in rows}
    assert {(r.model, r.kv_dtype) for r in rows} == {("llama-3.1-8b", "bf16"), ("llama-3.1-8b", "fp8"),
                                                     ("gpt-oss-20b", "bf16"), ("gpt-oss-20b", "fp8")}
    for r in rows:
        assert r.source.startswith("vLLM blog 'The State of FP8 KV-Cache") and "Output tok/s" in r.source, r.id
        assert r.workload == "random:20000/2000?range_ratio=0.15" and r.requests == 150, r.id
        assert r.hardware == "h100-80gb" and r.tp == 1 and r.metric == "output_tok_s", r.id
        assert client_concurrency(r) == 8 and row_engine_key(r).startswith("vllm@0.19"), r.id
        settings = engine_settings(r, get_profile(row_engine_key(r)), get_hardware(r.hardware))
        assert settings["max_seqs"] == 8, r.id
