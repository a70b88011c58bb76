"""Azure's TensorRT-LLM 0.15 runs on 8 x H100 and 8 x H200 (`trtllm-0.15-azure-*` in validation.csv, out of the fit):
one trtllm-bench engine per model, built from the 2,048/2,048 dataset and benchmarked on every dataset, so its batch
and token limits are that dataset's (``catalogue.build_dataset``)."""

from __future__ import annotations

import csv
import dataclasses

import pytest

from blendsim.fidelity.catalogue import build_dataset, engine_version_key, read_catalogue
from blendsim.fidelity.fit import predict
from blendsim.fidelity.suite import SHIPPED_CATALOGUES, SHIPPED_VALIDATION, prepare_row
from blendsim.sim.engines import get_profile


def _rows():
    return [r for r in read_catalogue(SHIPPED_VALIDATION) if r.id.startswith("trtllm-0.15-azure-")]


def test_the_rows_are_cited_unfitted_and_read_their_build_dataset():
    rows = _rows()
    assert len(rows) == len({r.id for r in rows}) == 36
    fitted = {r["id"] for p in SHIPPED_CATALOGUES for r in csv.DictReader(open(p, newline=""))}
    assert not fitted & {r.id for r in rows}
    assert {r.hardware for r in rows} == {"h100-80gb", "h200"}
    for r in rows:
        assert engine_version_key(r) == "trtllm@0.15" and get_profile("trtllm@0.15").version == "0.13"
        assert build_dataset(r) == (2048.0, 2048.0)
        assert (r.weights, r.kv_dtype, r.requests, r.metric) == ("fp8", "fp8", 1000, "output_tok_s")
    assert build_dataset(dataclasses.replace(rows[0], engine_version="TensorRT-LLM 0.15.0")) is None


def test_an_engine_built_for_long_requests_keeps_its_smaller_batch_on_short_ones():
    (row,) = [r for r in _rows() if r.id == "trtllm-0.15-azure-llama-3.1-8b-h100-80gb-tp1-fp8-128x128"]
    own = dataclasses.replace(row, engine_version="TensorRT-LLM 0.15.0, trtllm-bench throughput")
    built, tuned = prepare_row(row, {}), prepare_row(own, {})
    # the 2,048/2,048 engine holds fewer sequences than one tuned on 128/128 requests, so it finishes later
    assert predict(row, built, {}) < 0.9 * predict(own, tuned, {})
    assert predict(row, built, {}) == pytest.approx(predict(row, prepare_row(row, {}), {}))
