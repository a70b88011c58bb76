"""blendsim fidelity: catalogue parsing, the schedule-once pricing, the fit, the CLI's JSON."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.fidelity.catalogue import build_workload, read_catalogue
from blendsim.fidelity.fit import fit, predict
from blendsim.fidelity.price import RowPricer
from blendsim.fidelity.runner import simulate_row
from blendsim.fidelity.suite import load_suite, predictions, prepare_row
from blendsim.sim.engines import load_params
from blendsim.sim.errors import UserError
from tests.helpers import catalogue_row, write_catalogue

_row = catalogue_row


_write = write_catalogue


def test_fidelity_json_on_a_small_catalogue(tmp_path):
    (tmp_path / "lens.csv").write_text("prompt_tokens,output_tokens\n" + "".join(
        f"{100 + 7 * i},{20 + (i % 13)}\n" for i in range(300)))
    cat = _write(tmp_path, [
        _row(id="const", value=4000),
        _row(id="file", engine="vllm", workload="file:lens.csv?min_len=4", requests=150, metric="total_tok_s",
             scope="per_gpu", gpus=2, value=9000),
        _row(id="pp", pp=2, gpus=2),
    ])
    res = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--json", "--no-cv"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert {"rows", "median_abs_error", "p90_abs_error", "n_ok", "n_skipped"} <= set(out)
    assert (out["n_ok"], out["n_skipped"]) == (3, 0)  # a pipeline-parallel row runs (issue 25)
    byid = {r["id"]: r for r in out["rows"]}
    assert byid["pp"]["status"] == "ok" and byid["pp"]["predicted"] > 0
    errs = []
    for rid in ("const", "file", "pp"):
        r = byid[rid]
        assert r["status"] == "ok" and r["predicted"] > 0
        assert r["error"] == pytest.approx(r["predicted"] / r["measured"] - 1, rel=1e-12)
        errs.append(abs(r["error"]))
    assert out["median_abs_error"] == pytest.approx(np.median(errs))
    # the per-GPU, total-token row: (prompt + output tokens) / makespan / 2 GPUs, 2 replicas of tp=1
    p = 100 + 7 * np.arange(150)
    d = 20 + np.arange(150) % 13
    shipped = load_params()
    suite = load_suite(cat, shipped)
    pr = suite.pricers["file"]
    assert pr.sched.input_tokens == p.sum() and pr.sched.output_tokens == d.sum()
    assert len(pr.sched.replicas) == 2
    assert byid["file"]["predicted"] == pytest.approx((p.sum() + d.sum()) / pr.makespan(shipped) / 2, rel=1e-9)


def test_schedule_is_independent_of_step_times_and_pricing_is_exact(tmp_path):
    # an offline FCFS row: the same Batches whatever the parameters, and the pricer's makespan equals
    # the simulation's under each parameter set
    cat = _write(tmp_path, [_row(workload="const:700/90", requests=400)])
    row = read_catalogue(cat)[0]
    slow = {"hardware": {"h100-80gb": {"gemm_eff": 0.3, "mem_eff": 0.5, "attn_mem_eff": 0.3}},
            "engine": {"trtllm": {"fixed_s": 4e-3, "per_seq_s": 1e-5}}}
    a = simulate_row(row, build_workload(row), {})
    b = simulate_row(row, build_workload(row), slow)
    assert b.makespan_s > 1.5 * a.makespan_s
    for ra, rb in zip(a.replicas, b.replicas):
        for k in ra:
            np.testing.assert_array_equal(ra[k], rb[k])
    pr = prepare_row(row, {})
    assert pr.makespan({}) == pytest.approx(a.makespan_s, rel=1e-9)
    assert pr.makespan(slow) == pytest.approx(b.makespan_s, rel=1e-9)
    # the compressed pricer used for fitting stays within 0.5%
    c = RowPricer(pr.sched, pr.dep, pr.profile, compress=True)
    assert c.makespan(slow) == pytest.approx(b.makespan_s, rel=5e-3)


def test_the_fidelity_pricer_hands_nccl_the_same_all_reduces_as_the_simulator(tmp_path):
    # 70B on 8 A100s under TensorRT-LLM, 600 short requests at once: decode batches above its 8 MB workspace go to
    # NCCL in the simulator's cost model (build_cost_model); the fidelity pricer must price them the same way, or
    # the fit would see the link price
    cat = _write(tmp_path, [_row(model="llama-3-70b", hardware="a100-80gb", gpus=8, tp=8, workload="const:128/256",
                                 requests=600)])
    row = read_catalogue(cat)[0]
    pr = prepare_row(row, {})
    assert pr.makespan({}) == pytest.approx(simulate_row(row, build_workload(row), {}).makespan_s, rel=1e-9)
    w, f, counts, _tok0, _logits0 = pr.parts[0]
    per = counts["allreduce"][1] / np.maximum(counts["allreduce"][2], 1)
    assert (per > 8e6).any()  # some steps' messages are NCCL's
    base = pr.components({})[0]["comm"]
    pr.profile = replace(pr.profile, custom_allreduce=None)  # the same row with every message at the link
    assert (pr.components({})[0]["comm"] < base).any()


@pytest.mark.parametrize("pp", [2, 4])
def test_a_pipelined_row_is_priced_close_to_its_resimulation(tmp_path, pp):
    # the pipelined pricer is exact at the parameters the row was simulated with, and its formula (each batch
    # the slower of its slowest stage and its share of a virtual engine's cycle) follows a re-simulation under
    # other parameters within 1% (0.05% measured)
    cat = _write(tmp_path, [_row(workload="const:700/90", requests=400, tp=1, pp=pp, gpus=pp, model="llama-3-70b",
                                 weights="fp8", kv_dtype="fp8")])
    row = read_catalogue(cat)[0]
    slow = {"hardware": {"h100-80gb": {"gemm_eff": 0.3, "mem_eff": 0.5, "attn_mem_eff": 0.3}},
            "engine": {"trtllm": {"fixed_s": 4e-3, "per_seq_s": 1e-5}}}
    pr = prepare_row(row, {})
    assert pr.makespan({}) == pytest.approx(pr.sched.makespan_s, rel=1e-12)
    assert pr.scale == pytest.approx(1.0, abs=0.01)  # the formula alone is within 1% of the engine here
    b = simulate_row(row, build_workload(row), slow)
    assert b.makespan_s > 1.3 * pr.sched.makespan_s
    assert pr.makespan(slow) == pytest.approx(b.makespan_s, rel=0.01)


def test_fit_recovers_parameters_that_generated_the_measurements(tmp_path):
    # Hopper's gemm_eff and mem_eff within the ranges an H200 measured (sim.efficiency.MEASURED bounds the fit)
    truth = {"hardware": {"h100-80gb": {"gemm_eff": 0.65, "mem_eff": 0.7, "attn_mem_eff": 0.6}},
             "engine": {"trtllm": {"fixed_s": 1e-3, "per_seq_s": 4e-6}}}
    rows = [_row(id=f"{i}x{o}", workload=f"const:{i}/{o}", requests=n)
            for i, o, n in ((128, 128, 600), (2048, 128, 200), (128, 1024, 300), (1000, 1000, 150),
                            (4000, 300, 100), (64, 2048, 400))]
    suite = load_suite(_write(tmp_path, rows), {})
    ok = suite.ok
    rows_true = [(r, pr) for r, pr in ok]
    measured = {r.id: predict(r, pr, truth) for r, pr in rows_true}
    import dataclasses

    relabelled = [(dataclasses.replace(r, value=measured[r.id]), pr) for r, pr in ok]
    fitted = fit(relabelled, base={})
    errs = [abs(predict(r, pr, fitted) / r.value - 1) for r, pr in relabelled]
    assert max(errs) < 0.02
    assert "bounds" in fitted and all(lo < hi for lo, hi in fitted["bounds"].values())


def test_workload_grammar(tmp_path):
    (tmp_path / "azure.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:00:0{i % 10},{50 * (i + 1)},{i + 1}\n" for i in range(20)))
    cat = _write(tmp_path, [
        _row(id="c", workload="const:10/3", requests=4),
        _row(id="f", workload="file:azure.csv?min_len=4&max_total=700", requests=5),
        _row(id="s", workload="synth:batchllm?prefix_len=64&distinct_len=16&share_degree=2&seed=3", requests=8),
    ])
    c, f, s = (build_workload(r) for r in read_catalogue(cat))
    assert c.n == 4 and set(c.input_len) == {10} and set(c.output_len) == {3}
    # rows with output >= 4 and prompt + output <= 700: i = 3..12
    assert f.input_len.tolist() == [50 * (i + 1) for i in range(3, 8)]
    assert f.output_len.tolist() == [i + 1 for i in range(3, 8)]
    assert s.n == 8 and (s.arrival_s == 0).all()
    s2 = build_workload(read_catalogue(cat)[2])
    assert s2.input_len.tolist() == s.input_len.tolist()  # seeded


@pytest.mark.parametrize("change, message", [
    ({"metric": "tokens"}, "field 'metric'"),
    ({"value": "fast"}, "field 'value': expected a number"),
    ({"gpus": 3, "tp": 2}, "not a multiple of tp x pp"),
    ({"workload": "poisson:3"}, "field 'workload'"),
])
def test_bad_catalogue_rows_stop_with_one_line(tmp_path, change, message):
    cat = _write(tmp_path, [_row(**change)])
    with pytest.raises(UserError) as e:
        read_catalogue(cat)
    assert message in str(e.value) and "row 2" in str(e.value)
    res = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--no-cv"])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output


def test_unrunnable_rows_are_skipped_with_their_reason(tmp_path):
    cat = _write(tmp_path, [_row(id="eng", engine="tgi"), _row(id="file", workload="file:missing.csv"),
                            _row(id="ok", requests=20)])
    suite = load_suite(cat, {})
    assert set(suite.pricers) == {"ok"}
    assert "unknown engine 'tgi'" in suite.reasons["eng"]
    assert "does not exist" in suite.reasons["file"]
    assert set(predictions(suite, {})) == {"ok"}


@pytest.mark.parametrize("field,bad,says", [
    ("model", "no-such-model", "field 'model': unknown model 'no-such-model': not a preset"),
    ("hardware", "a100-80", "field 'hardware': unknown hardware"),
    ("policy", "blendserv", "field 'policy': unknown policy 'blendserv'"),
    ("workload", "const:abc/12", "field 'workload': 'const:abc/12' is not const:ISL/OSL"),
    ("workload", "file:lengths.csv?mean_promt=200", "unknown file option(s) mean_promt"),
    ("workload", "synth:blendserve?densty=1.2", "recipe blendserve has no option 'densty'"),
    ("weights", "int3", "field 'weights': 'int3' is not one of"),
    ("ep", "2", "field 'ep': ep 2 on llama-3-8b, a dense model"),
    # review of 1 Dec 2026 (second): --engine's spelling in the engine column was skipped as an unknown engine
    ("engine", "vllm@0.6", "field 'engine': 'vllm@0.6': write the engine's name alone ('vllm') and its version in "
                           "engine_version ('0.6')"),
])
def test_a_malformed_row_stops_the_run_with_one_line(tmp_path, field, bad, says):
    """A row naming what blendsim does not have (a model, a GPU, a policy, a precision, a workload option) is a
    mistake in the file, refused before any row runs, not a row skipped among the predicted ones."""
    cat = _write(tmp_path, [_row(id="ok", requests=20), _row(id="bad", **{field: bad})])
    res = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--json", "--no-cv"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and str(cat) in lines[0] and "row 3 (id bad)" in lines[0] and says in lines[0], lines


def test_params_flag_prints_every_fitted_constant_with_bounds():
    res = CliRunner().invoke(get_app(), ["fidelity", "--params", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["params"], "the shipped parameters file is empty"
    for p in out["params"]:
        assert p["bounds"] is None or p["bounds"][0] <= p["value"] <= p["bounds"][1]


def test_params_says_what_an_engine_loop_at_its_bound_means(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"engine": {"vllm@0.8": {"fixed_s": 2e-4, "per_seq_s": 2e-5}},
                             "bounds": {"engine.vllm@0.8.fixed_s": [0, 5e-3], "engine.vllm@0.8.per_seq_s": [0, 2e-5]}}))
    res = CliRunner().invoke(get_app(), ["fidelity", "--params", "--params-file", str(f)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "engine.vllm@0.8.per_seq_s" in res.stdout and "AT UPPER BOUND" in res.stdout
    assert "(engine loops): an engine loop's upper bound is the most blendsim lets that loop cost" in res.stdout
    f.write_text(json.dumps({"engine": {"vllm@0.8": {"fixed_s": 2e-4, "per_seq_s": 1e-5}},
                             "bounds": {"engine.vllm@0.8.per_seq_s": [0, 2e-5]}}))
    res = CliRunner().invoke(get_app(), ["fidelity", "--params", "--params-file", str(f)], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "(engine loops)" not in res.stdout


def test_only_selects_rows_by_id_pattern(tmp_path):
    cat = _write(tmp_path, [_row(id="keep-a", value=4000), _row(id="drop-b", value=4000)])
    res = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--json", "--no-cv", "--only", "keep-*"])
    assert res.exit_code == 0, res.output
    assert [r["id"] for r in json.loads(res.stdout)["rows"]] == ["keep-a"]
    res = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--only", "none-*"])
    assert res.exit_code == 2 and "no catalogue row id matches" in res.output


def test_a_catalogue_that_predicts_nothing_exits_2(tmp_path):
    cat = _write(tmp_path, [_row(id="typo", engine="vlm")])
    res = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--no-cv"])
    assert res.exit_code == 2 and "nothing could be predicted (1 skipped; the first, typo: unknown engine" in res.output, res.output
    assert "Traceback" not in res.output


def test_save_and_markdown_replace_only_their_own_kind_of_file(tmp_path):
    """--save and --markdown write over a parameter file or a table they wrote, never a user's other file."""
    mine = tmp_path / "mine.py"
    mine.write_text("print(1)\n")
    for args in (["--refit", "--save", str(mine)], ["--markdown", str(mine)]):
        res = CliRunner().invoke(get_app(), ["fidelity", "--only", "vllm-0.6.0-blog-*", "--no-cv", *args])
        assert res.exit_code == 2 and "nothing was replaced" in res.output, res.output
        assert mine.read_text() == "print(1)\n"
    table = tmp_path / "t.md"
    table.write_text("| engine | version (profile) | rows | shipped median (p90) |\n")
    res = CliRunner().invoke(get_app(), ["fidelity", "--only", "trtllm-0.13-*a100*", "--no-cv", "--markdown",
                                         str(table)])
    assert res.exit_code == 0, res.output
    assert "**trtllm**" in table.read_text()


def test_cv_by_with_no_cv_is_refused_and_an_underdetermined_refit_says_so():
    res = CliRunner().invoke(get_app(), ["fidelity", "--only", "vllm-0.6.0-blog-*", "--no-cv", "--cv-by", "source"])
    assert res.exit_code == 2 and "--no-cv runs none" in res.output
    res = CliRunner().invoke(get_app(), ["fidelity", "--only", "trtllm-0.13-llama-3-8b-a100-80gb-tp1-fp16-128x*",
                                         "--no-cv", "--refit"])
    assert res.exit_code == 0, res.output
    assert "its in-sample error says nothing" in res.output


def test_a_params_file_without_a_rows_engine_loop_says_so(tmp_path):
    """A file refitted on other engines' rows: the rows of an engine it lacks run on the profile's constants."""
    from blendsim.sim.engines import PARAMS_FILE, load_params

    params = load_params()
    params["engine"] = {k: v for k, v in params["engine"].items() if not k.startswith("trtllm")}
    f = tmp_path / "partial.json"
    f.write_text(json.dumps(params))
    res = CliRunner().invoke(get_app(), ["fidelity", "--only", "trtllm-0.13-llama-3-8b-a100-80gb-tp1-fp16-128x*",
                                         "--no-cv", "--params-file", str(f)])
    assert res.exit_code == 0, res.output
    assert "has no fitted loop of trtllm" in " ".join(res.output.split())  # the line wraps where tmp_path is long
    res = CliRunner().invoke(get_app(), ["fidelity", "--only", "trtllm-0.13-llama-3-8b-a100-80gb-tp1-fp16-128x*",
                                         "--no-cv", "--params-file", str(PARAMS_FILE)])
    assert "has no fitted loop" not in res.output


@pytest.mark.parametrize("workload,says", [
    ("const:0/64", "ISL and OSL must be in 1..10,000,000 (MAX_TOKENS), got const:0/64"),
    ("synth:batchllm?prefix_len=10", "recipe batchllm needs option(s) distinct_len, share_degree"),
    ("synth:blendserve?density=-1&sharing=0.3", "recipe option density must be a positive number, got -1.0"),
])
def test_a_workload_that_cannot_be_built_stops_the_run_naming_row_and_field(tmp_path, workload, says):
    """Out-of-range lengths, a recipe's missing or bad option: refused when the catalogue is read (were: the row
    skipped, exit 0, the recipe's message in its command-line flags)."""
    cat = _write(tmp_path, [_row(id="ok", requests=20), _row(id="bad", workload=workload)])
    res = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--json", "--no-cv"])
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert line.startswith(f"blendsim: error: {cat}: row 3 (id bad), field 'workload': ") and says in line, line
