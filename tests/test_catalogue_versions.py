"""A catalogue row's engine version is the one written right after the engine's name, or none (the newest modelled):
a version read from elsewhere in the text (CUDA's, a model's) or a text that states none would price another release
in silence."""

import json

import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.fidelity.catalogue import engine_version_key, read_catalogue, row_engine_key
from tests.helpers import catalogue_row, write_catalogue


def _row(**kw) -> dict:
    return catalogue_row(**{"engine": "vllm", "requests": 100, **kw})


@pytest.mark.parametrize("text, key", [
    ("vLLM 0.5.3", "vllm@0.5"), ("CUDA 12.4, vLLM 0.5.3", "vllm@0.5"), ("CUDA 12.4, vLLM ~0.5.3", "vllm@0.5"),
    ("CUDA 12.1, vLLM version 0.5.3", "vllm@0.5"), ("vLLM v0.6.0, --num-scheduler-steps 10", "vllm@0.6"),
    ("vLLM ~v0.2.1.post1 (latest release)", "vllm@0.2"), ("Llama 3.1 8B on vLLM 0.8.4", "vllm@0.8"),
    ("vLLM: 0.10.2", "vllm@0.10"), ("", "vllm"), ("0.6.0", "vllm@0.6"), ("v1.0 (V1 engine)", "vllm@1.0"),
    ("vLLM for Llama-3.1 models, 0.5.3", "vllm@0.5"), ("CUDA 12.4; 0.5.3", "vllm@0.5"),
    ("image vllm/vllm-openai:v0.6.3", "vllm@0.6"),
])
def test_the_version_is_read_right_after_the_engine_name(tmp_path, text, key):
    row = read_catalogue(write_catalogue(tmp_path, [_row(engine_version=text)]))[0]
    assert engine_version_key(row) == key


@pytest.mark.parametrize("engine, text", [
    ("vllm", "banana"), ("vllm", "latest"), ("vllm", "CUDA 12.4"), ("vllm", "Llama 3.1 8B on vLLM (nightly)"),
    ("vllm", "vLLM 0.x"), ("trtllm", "CUDA 12.8, TensorRT-LLM (main)"), ("sglang", "v"), ("vllm", "Llama-3.1"),
])
def test_a_text_that_states_no_version_after_the_name_is_refused_in_one_line(tmp_path, engine, text):
    cat = write_catalogue(tmp_path, [_row(engine=engine, engine_version=text)])
    res = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--no-cv"])
    assert res.exit_code == 2
    line = res.output.strip()
    assert "\n" not in line and "row 2" in line and "'engine_version'" in line and "states no" in line
    assert "Traceback" not in res.output


def test_an_unversioned_engine_takes_any_text(tmp_path):
    row = read_catalogue(write_catalogue(tmp_path, [_row(engine="nanoflow", engine_version="C++ backend, 2024")]))[0]
    assert row_engine_key(row) == "nanoflow"


def test_a_release_past_every_modelled_one_is_priced_by_the_newest_with_a_note(tmp_path):
    cat = write_catalogue(tmp_path, [_row(id="new", engine_version="vLLM 9.9"), _row(id="known", engine_version="vLLM 0.8.4")])
    res = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--no-cv", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["id"]: r for r in json.loads(res.stdout)["rows"]}
    assert rows["new"]["predicted"] == rows["known"]["predicted"]
    assert "beyond every modelled one" in rows["new"]["note"] and "note" not in rows["known"]
    text = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--no-cv"]).output
    assert "note: engine vllm@9.9 is a major release beyond every modelled one" in " ".join(text.split())


def test_a_junk_version_no_longer_passes_a_release_check(tmp_path):
    # pipeline stages on vLLM V1 from 0.8.4: a row stating 0.8.2 is skipped; one stating junk used to be priced
    rows = [_row(id="old", engine_version="vLLM 0.8.2", gpus=2, pp=2)]
    res = CliRunner().invoke(get_app(), ["fidelity", str(write_catalogue(tmp_path, rows)), "--no-cv", "--json"])
    assert json.loads(res.stdout)["rows"][0]["status"] == "skipped"
    bad = write_catalogue(tmp_path, [_row(id="junk", engine_version="banana", gpus=2, pp=2)])
    assert CliRunner().invoke(get_app(), ["fidelity", str(bad), "--no-cv"]).exit_code == 2
