"""A new user's review of the CLI, round 6: what plan, engines, cost and calibrate say where they said too little
or the wrong thing."""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.fidelity.suite import SHIPPED_CATALOGUE
from blendsim.sim.engines import get_profile
from blendsim.sim.errors import UserError


def _run(*args: str, width: int = 100):
    return CliRunner().invoke(get_app(), list(args), env={"COLUMNS": str(width)})


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan6")
    res = _run("workloads", "synth", "blendserve", "--density", "1.4", "--sharing", "0.35", "--requests", "800",
               "-o", str(d / "t.parquet"))
    assert res.exit_code == 0, res.output
    return d / "t.parquet"


def test_plan_says_why_nothing_ran_when_the_model_fits_nowhere(trace):
    res = _run("plan", str(trace), "-m", "llama-3.1-405b", "--max-gpus", "1", "--deadline", "1h", "--no-fidelity")
    assert res.exit_code == 1
    assert "see failures" not in res.output
    assert "every one of the" in res.output and "pruned (" in res.output and "does not fit" in res.output
    assert "raise --max-gpus" in res.output


def test_plan_names_what_its_front_is_taken_over(trace):
    base = ["plan", str(trace), "--hardware", "a100-80gb", "--engines", "vllm", "--policies", "dfs", "--max-gpus",
            "2", "--no-fidelity"]
    met = _json(_run(*base, "--deadline", "24h", "--json").stdout)
    missed = _json(_run(*base, "--deadline", "1s", "--json").stdout)
    assert met["pareto_of"] == "meeting" and missed["pareto_of"] == "all"
    text = _run(*base, "--deadline", "1s").output
    assert "Pareto front (makespan vs cost) of every simulated deployment (none meets the job)" in text


def _json(out: str) -> dict:
    return json.loads(out[out.index("{"):])


def test_plan_and_engines_note_a_release_beyond_every_modelled_one(trace):
    res = _run("engines", "sglang@9")
    assert res.exit_code == 0 and "note: engine sglang@9 is a major release beyond every modelled one" in res.output
    d = json.loads(_run("engines", "sglang@9", "--json").stdout)
    assert d["note"].startswith("engine sglang@9 is a major release beyond")
    assert "note" not in json.loads(_run("engines", "sglang@0.5.3", "--json").stdout)
    res = _run("plan", str(trace), "--hardware", "a100-80gb", "--engines", "vllm@0.6,sglang@9", "--policies", "dfs",
               "--max-gpus", "1", "--deadline", "24h", "--no-fidelity")
    assert "note: engine sglang@9 is a major release beyond" in res.output
    assert "vllm@0.6 is a major release" not in res.output


def test_engines_tp_and_pp_need_a_gpu():
    for flag in ("--tp", "--pp"):
        res = _run("engines", "vllm", flag, "2")
        assert res.exit_code == 2 and "give --hardware too" in res.output, res.output


def test_the_v1_profile_says_which_of_its_loops_is_fitted():
    src = get_profile("vllm@0.8").source
    assert "offline loop kept at that prior" in src and "vllm@0.8:serve" in src


@pytest.mark.parametrize("key", ["vllm@0.5:attn_dp=1", "vllm@0.6:attn_dp=1", "vllm@0.7.3:attn_dp=1",
                                 "vllm-v0:attn_dp=1"])
def test_vllm_v0_has_no_attention_data_parallelism(key):
    with pytest.raises(UserError, match="attention data parallelism is modelled from 0.8"):
        get_profile(key)


def test_attention_dp_on_a_dense_model_is_said_to_change_nothing():
    assert get_profile("vllm@0.10:attn_dp=1").attn_dp
    dense = _run("cost", "--decode-seqs", "8", "--tp", "2", "-m", "llama-3-8b", "--engine", "vllm:attn_dp=1")
    assert dense.exit_code == 0 and "attn_dp) changes nothing here: the model is dense" in dense.output
    moe = _run("cost", "--decode-seqs", "8", "--tp", "2", "-m", "mixtral-8x7b", "--engine", "vllm:attn_dp=1")
    assert moe.exit_code == 0 and "changes nothing" not in moe.output


def test_calibrate_engine_says_which_catalogue_rows_it_left_out(tmp_path):
    rows = [r for r in csv.DictReader(open(SHIPPED_CATALOGUE, newline=""))
            if r["id"].startswith("vllm-0.6.0-blog-llama-3-8b") and r["workload"].startswith("const:")]
    assert {r["hardware"] for r in rows} == {"a100-80gb", "h100-80gb"}
    cat = tmp_path / "cat.csv"
    with cat.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    out = tmp_path / "prof.json"
    res = _run("calibrate", "engine", str(cat), "--engine", "vllm@0.6", "--hardware", "a100-80gb", "-o", str(out))
    assert res.exit_code == 0, res.output
    assert "2 row(s) of vllm@0.6 on a100-80gb taken; left out: 2 of vllm@0.6 on other GPUs" in res.output
    # another version's rows, on any GPU, are counted as such, not as "on other GPUs"
    v5 = [r for r in csv.DictReader(open(SHIPPED_CATALOGUE, newline="")) if r["id"].startswith("vllm-0.5.3-blog")]
    with cat.open("a", newline="") as fh:
        csv.DictWriter(fh, fieldnames=list(rows[0])).writerows(v5)
    again = _run("calibrate", "engine", str(cat), "--engine", "vllm@0.6", "--hardware", "a100-80gb", "-o",
                 str(tmp_path / "again.json"))
    assert (f"left out: 2 of vllm@0.6 on other GPUs (a calibration fits one GPU: run it again with their "
            f"--hardware); {len(v5)} of other vllm versions") in " ".join(again.output.split()), again.output
    shown = _run("fidelity", "--params", "--params-file", str(out))
    said = " ".join(shown.output.split())
    prof = json.loads(out.read_text())["profile"]
    if prof["kept_shipped"]:
        assert f"engine profile {out} (vllm@0.6 on a100-80gb, 2 runs): its fit was no better" in said, said
        assert "CALIBRATED" not in said
    else:  # review of 1 Dec 2026 (second): which of the 55 constants the calibration moved
        assert f"engine profile {out} (vllm@0.6 on a100-80gb, 2 runs): the {len(prof['fitted'])} parameter(s)" in said
        assert sum(line.rstrip().endswith(" CALIBRATED") for line in shown.output.splitlines()) == len(prof["fitted"])
    js = json.loads(_run("fidelity", "--params", "--json", "--params-file", str(out)).output)
    assert {p["name"] for p in js["params"] if p["calibrated"]} == (set() if prof["kept_shipped"] else
                                                                    set(prof["fitted"]))


def test_stats_cost_and_simulate_say_the_same_of_a_model_that_does_not_fit(tmp_path, trace):
    import re

    said = []
    for args in (("workloads", "stats", str(trace)), ("cost", "--decode-seqs", "1"),
                 ("simulate", str(trace), "-o", str(tmp_path / "run"))):
        res = _run(*args, "-m", "llama-3.1-405b", "--hardware", "a100-80gb")
        assert res.exit_code == 2, res.output
        said.append(re.search(r"need ([\d.]+) GiB per GPU", res.output).group(1))
    assert len(set(said)) == 1, said


def test_cost_says_its_split_is_by_operator_class():
    res = _run("cost", "--decode-seqs", "4")
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert "operator classes, not what bounds them" in text and "weight-streaming GEMMs count as compute" in text
