"""validation.csv's vLLM 0.5.4 rows (LambdaLabsML/vllm-benchmark, 320 ShareGPT prompts): out of the fit, priced as
vLLM 0.5's served engine with the scheduler their command line gives."""

import csv
import re

from blendsim.fidelity.catalogue import engine_settings, read_catalogue, row_engine_key
from blendsim.fidelity.suite import SHIPPED_CATALOGUES, SHIPPED_VALIDATION
from blendsim.sim.engines import get_profile
from blendsim.sim.hardware import get_hardware


def _rows():
    return [r for r in read_catalogue(SHIPPED_VALIDATION) if "-lambda-" in r.id]


def test_the_rows_are_cited_unfitted_and_distinct():
    rows = _rows()
    assert len(rows) == 20
    assert len({r.id for r in rows}) == 20
    fitted = {r["id"] for p in SHIPPED_CATALOGUES for r in csv.DictReader(open(p, newline=""))}
    assert not fitted & {r.id for r in rows}
    for r in rows:
        assert r.source.startswith("LambdaLabsML/vllm-benchmark results/prompt_320/"), r.id
        assert "v0.5.4" in r.engine_version and r.requests == 320 and r.metric == "output_tok_s", r.id
        assert "SHAREGPT SAMPLE NOT SHIPPED" in r.note, r.id
        assert r.gpus == r.tp and r.hardware in ("a100-80gb", "h100-80gb"), r.id
    # one row per model, GPU and TP degree; both GPUs, TP 1 to 8
    assert len({(r.model, r.hardware, r.tp) for r in rows}) == 20
    assert {r.tp for r in rows} == {1, 2, 4, 8}


def test_they_run_on_vllm_0_5_behind_its_server_with_the_budget_their_context_sets():
    for r in _rows():
        key = row_engine_key(r)
        assert key == "vllm@0.5:serve=1", (r.id, key)
        profile = get_profile(key)
        settings = engine_settings(r, profile, get_hardware(r.hardware))
        length = int(re.search(r"--max-model-len (\d+)", r.engine_version).group(1))
        assert f"-len{length}-" in r.id
        if length <= 32768:  # V0 without chunked prefill: a prefill step of up to max(context, 2048) tokens
            assert settings["token_budget"] == max(length, 2048), r.id
        else:  # over 32,768 V0 chunks its prefills and keeps its own budget
            assert settings["token_budget"] < length, r.id
        assert settings["max_seqs"] == 256, r.id
