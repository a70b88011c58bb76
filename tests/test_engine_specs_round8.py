"""Engine specs and calibrated profile files (review round 8): every bad value is one line, never a silent other
engine, and a huge CUDA-graph size is refused before it builds a list of every padded size."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.fidelity.catalogue import read_catalogue
from blendsim.fidelity.engine_calibration import write_rows_csv
from blendsim.fidelity.suite import SHIPPED_CATALOGUE
from blendsim.sim.engines import get_profile
from blendsim.sim.errors import UserError


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    d = tmp_path_factory.mktemp("prof")
    rows = {r.id: r for r in read_catalogue(SHIPPED_CATALOGUE)}
    write_rows_csv(d / "train.csv", [rows["vllm-0.6.0-blog-llama-3-8b-a100-80gb-tp1-decode"],
                                     rows["vllm-0.6.0-blog-llama-3-8b-a100-80gb-tp1-prefill"]])
    out = d / "mine.json"
    r = CliRunner().invoke(get_app(), ["calibrate", "engine", str(d / "train.csv"), "--engine", "vllm@0.6",
                                       "--hardware", "a100-80gb", "-o", str(out)])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())


def _file(tmp_path, data, **head) -> str:
    d = json.loads(json.dumps(data))
    d["profile"].update(head)
    p = tmp_path / "p.json"
    p.write_text(json.dumps(d))
    return str(p)


@pytest.mark.parametrize("head, field, says", [
    ({"engine": ""}, "profile.engine", "not a modelled engine name"),
    ({"engine": "fixed_s=1"}, "profile.engine", "not a modelled engine name"),
    ({"engine": "other.json"}, "profile.engine", "not a modelled engine name"),
    ({"engine": "ideal"}, "profile.engine", "not a modelled engine name"),
    ({"version": 0.10}, "profile.version", "must be a string"),
    ({"version": "0.8"}, "profile.version", "but the file fitted vllm@0.6"),
])
def test_a_profile_header_names_one_engine_and_the_release_it_was_fitted_for(tmp_path, profile, head, field, says):
    with pytest.raises(UserError) as e:
        get_profile(_file(tmp_path, profile, **head))
    assert f"field {field}" in str(e.value) and says in str(e.value) and "\n" not in str(e.value)


def test_a_profile_file_of_a_release_past_every_modelled_one_is_noted(tmp_path, profile):
    from blendsim.runner import newer_than_modelled

    d = json.loads(json.dumps(profile))
    d["engine"]["vllm@0.8"] = dict(d["engine"]["vllm@0.6"])
    d["profile"]["fitted"] = ["engine.vllm@0.8.fixed_s", "engine.vllm@0.8.per_seq_s"]
    prof = get_profile(_file(tmp_path, d, version="9.9"))
    assert prof.modelled.startswith("vllm@0.8") and "vllm@9.9" in newer_than_modelled(prof)[0]
    assert newer_than_modelled(get_profile(_file(tmp_path, profile))) == []


@pytest.mark.parametrize("spec, says", [
    ("vllm@0.6:cuda_graph_max=100000000", "is over 65,536"),
    (":", "no engine name before ':'"),
    (":fixed_s=1e-3", "no engine name before ':'"),
    ("c:d/my.json:serve=1", "takes no overrides"),
])
def test_bad_engine_specs_are_one_line(spec, says):
    r = CliRunner().invoke(get_app(), ["cost", "-m", "llama-3-8b", "--hardware", "h100-80gb", "--engine", spec,
                                       "--decode-seqs", "8"])
    assert r.exit_code == 2 and says in r.output and r.output.strip().count("\n") == 0, r.output


def test_the_largest_graph_size_still_runs():
    assert get_profile("vllm@0.6:cuda_graph_max=65536").cuda_graph_max == 65536


def test_a_user_policys_shared_prefix_hook_is_guarded(tmp_path):
    import numpy as np

    import blendsim

    class Loud(blendsim.Policy):
        def reads_shared_prefix_once(self):
            raise RuntimeError("boom")

    class Vague(blendsim.Policy):
        def reads_shared_prefix_once(self):
            return "yes"

    t = blendsim.make_trace(input_len=np.full(8, 32), output_len=np.full(8, 4))
    with pytest.raises(blendsim.BlendsimError, match="reads_shared_prefix_once.*boom"):
        blendsim.simulate(t, policy=Loud, model="tiny", hardware="cpu")
    with pytest.raises(blendsim.BlendsimError, match="must return True or False"):
        blendsim.simulate(t, policy=Vague, model="tiny", hardware="cpu")


@pytest.mark.parametrize("args, says", [
    (["engines", "sglang", "--hardware", "h100-80gb", "--tp", "-4"], "--tp must be >= 1"),
    (["engines", "sglang", "--hardware", "h100-80gb", "--pp", "0"], "--pp must be >= 1"),
    (["engines", "sglang", "--hardware", "h100-80gb", "--pp", "2", "-m", "llama-3-8b"], "with --pp 2"),
    (["engines", "vllm@0.6", "--hardware", "h100-80gb", "--pp", "2"], "with --pp 2"),
])
def test_engines_on_a_deployment_checks_it_as_simulate_does(args, says):
    r = CliRunner().invoke(get_app(), args)
    assert r.exit_code == 2 and says in r.output and r.output.strip().count("\n") == 0, r.output


def test_cost_says_when_a_step_is_larger_than_the_engine_runs():
    r = CliRunner().invoke(get_app(), ["cost", "-m", "llama-3-8b", "--hardware", "h100-80gb", "--engine", "vllm",
                                       "--decode-seqs", "512", "--max-seqs", "1", "--json"])
    assert r.exit_code == 0, r.output
    assert "512 sequences, over its cap of 1 (--max-seqs): priced all the same, but the engine runs no step that " \
           "large" in r.stderr and "budget" not in r.stderr  # only the limit the step exceeds
    assert json.loads(r.stdout)["step_time_s"] > 0 and json.loads(r.stdout)["max_seqs"] == 1
    r = CliRunner().invoke(get_app(), ["cost", "-m", "llama-3-8b", "--hardware", "h100-80gb", "--decode-seqs", "64",
                                       "--json"])
    assert "that large" not in r.stderr
    # the ideal engine has no sequence cap (simulate runs any number of sequences the KV holds): no note of one
    r = CliRunner().invoke(get_app(), ["cost", "-m", "llama-3-8b", "--decode-seqs", "2000", "--context", "100",
                                       "--json"])
    assert r.exit_code == 0 and "that large" not in r.stderr and json.loads(r.stdout)["max_seqs"] == 0
    r = CliRunner().invoke(get_app(), ["cost", "-m", "llama-3-8b", "--prefill-tokens", "4096", "--json"])
    assert "the step runs 4,096 tokens, over its 2,048-token budget (--token-budget)" in r.stderr
    assert "sequences" not in r.stderr


def test_policies_shows_a_policy_file_as_simulate_takes_it(tmp_path):
    f = tmp_path / "mypol.py"
    f.write_text("import blendsim\n\nclass Mine(blendsim.Policy):\n    description = 'my order'\n")
    for spec in (str(f), f"{f}:Mine"):
        r = CliRunner().invoke(get_app(), ["policies", spec])
        # the terminal wraps at 80 columns, and a long temporary path pushes the description onto two lines
        assert r.exit_code == 0 and "my order" in " ".join(r.output.split()), r.output


def test_engines_sizes_a_model_at_the_precision_simulate_runs_it(tmp_path):
    import numpy as np

    import blendsim

    r = CliRunner().invoke(get_app(), ["engines", "vllm", "--hardware", "h100-80gb", "-m", "llama-3-8b",
                                       "--kv-dtype", "fp8", "--json"])
    assert r.exit_code == 0, r.output
    kv = json.loads(r.stdout)["here.kv_tokens"]
    t = blendsim.make_trace(input_len=np.full(16, 64), output_len=np.full(16, 4))
    s = blendsim.simulate(t, policy="fcfs", model="llama-3-8b", hardware="h100-80gb", engine="vllm",
                          kv_dtype="fp8").summary
    assert abs(s["kv_capacity_blocks"] * 16 - kv) < 16  # whole blocks of 16 tokens


def test_attention_dp_on_a_dense_model_says_what_still_changes_on_sglang():
    # SGLang sets memory aside for --enable-dp-attention whatever the model: the KV pool moves, so the note says so
    def pool(engine):
        r = CliRunner().invoke(get_app(), ["engines", engine, "--hardware", "h100-80gb", "-m", "llama-3-8b", "--json"])
        return json.loads(r.stdout)["here.kv_tokens"]

    assert pool("sglang:attn_dp=1") < pool("sglang")
    r = CliRunner().invoke(get_app(), ["cost", "-m", "llama-3-8b", "--hardware", "h100-80gb", "--engine",
                                       "sglang:attn_dp=1", "--decode-seqs", "8"])
    text = " ".join(r.output.split())
    assert "splits nothing here: the model is dense" in text and "only the memory the engine sets aside" in text


def test_cost_json_reconciles_in_overlap_mode_and_per_pipeline_stage():
    r = CliRunner().invoke(get_app(), ["cost", "-m", "llama-3-70b", "--hardware", "h100-80gb", "--tp", "4",
                                       "--mode", "overlap", "--decode-seqs", "256", "--context", "2000", "--json"])
    d = json.loads(r.stdout)
    c, m, comm = d["compute_s"], d["memory_s"], d["comm_s"]
    kernels = max(max(c, m) + d["kappa"] * min(c, m) + d["comm_share"] * comm, comm)
    assert kernels + d["other_s"] + d["overhead_s"] == pytest.approx(d["step_time_s"], rel=1e-9)
    r = CliRunner().invoke(get_app(), ["cost", "-m", "llama-3-70b", "--hardware", "h100-80gb", "--tp", "4", "--pp",
                                       "2", "--engine", "trtllm", "--decode-seqs", "64", "--json"])
    for st in json.loads(r.stdout)["stages"]:
        parts = st["compute_s"] + st["memory_s"] + st["other_s"] + st["comm_s"] + st["overhead_s"]
        assert parts == pytest.approx(st["step_time_s"], rel=1e-9)


def test_engines_says_whether_attention_data_parallelism_is_on_and_how_to_ask_for_it():
    said = {e: json.loads(CliRunner().invoke(get_app(), ["engines", e, "--json"]).stdout).get("attention_dp")
            for e in ("sglang@0.4", "trtllm")}
    assert said["sglang@0.4"] == "off unless asked (sglang:attn_dp=1); modelled from 0.4.4"  # was "on: False"
    assert said["trtllm"].startswith("on")
