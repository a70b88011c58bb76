"""The expected-error table: built from a fidelity run's leave-one-source-out rows (blendsim.fidelity.expected),
shipped beside the parameters it was made with and read back (blendsim.sim.expected), quoted by simulate's summary,
plan's answer, report and Result.expected_error."""

from __future__ import annotations

import json

import pytest

import blendsim.fidelity.expected as B
import blendsim.sim.expected as X
from blendsim.fidelity.catalogue import read_catalogue
from tests.test_fidelity import _row, _write

# two sources, two deployments, two engine profiles; LOSO errors signed (+ = the simulator too fast)
ROWS = [
    *(_row(id=f"t{i}", source="doc A", engine="trtllm", engine_version="0.13", hardware="h100-80gb", tp=8, gpus=8,
           model="llama-3-70b") for i in range(4)),
    *(_row(id=f"v{i}", source="doc B", engine="vllm", engine_version="0.5.3", hardware="a100-80gb", tp=8, gpus=8,
           model="llama-3-70b") for i in range(3)),
    _row(id="e1", source="doc B", engine="vllm", engine_version="0.5.3", hardware="h200", tp=8, gpus=8, ep=8,
         model="mixtral-8x7b"),
]
LOSO = {"t0": 0.02, "t1": -0.04, "t2": 0.06, "t3": 0.10, "v0": 0.20, "v1": 0.30, "v2": 0.10, "e1": -0.5}
FIT = {"t0": 0.01, "t1": -0.02, "t2": 0.03, "t3": 0.05, "v0": 0.1, "v1": 0.1, "v2": 0.05, "e1": -0.2}


def _result() -> dict:
    return {"rows": [{"id": k, "status": "ok", "error": v} for k, v in FIT.items()],
            "cv": {X.CV: {"rows": dict(LOSO)}}}


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    rows = read_catalogue(_write(tmp_path_factory.mktemp("cat"), ROWS))
    return B.build(_result(), rows, "sha")


def test_groups_by_profile_deployment_and_both(table):
    assert set(table["deployment"]) == {"h100-80gb TP8", "a100-80gb TP8", "h200 TP8, EP8"}
    assert set(table["profile"]) == {"trtllm@0.13", "vllm@0.5"}
    a100 = table["deployment"]["a100-80gb TP8"]
    assert a100["n"] == 3 and a100["loso_median"] == pytest.approx(0.20)
    assert a100["loso_signed_median"] == pytest.approx(0.20) and a100["in_sample_median"] == pytest.approx(0.1)
    # the vLLM profile's rows on two deployments, a negative error counted by its size
    v = table["profile"]["vllm@0.5"]
    assert v["n"] == 4 and v["loso_median"] == pytest.approx(0.25) and v["loso_signed_median"] == pytest.approx(0.15)
    assert table["profile_deployment"]["vllm@0.5 on a100-80gb TP8"]["n"] == 3
    assert table["all"]["n"] == 8 and table["params_sha256"] == "sha"


def test_line_names_the_most_specific_groups_and_the_lean(table):
    line = X.expected_line("vllm@0.5", "a100-80gb TP8", table)
    assert line.startswith("expected error (median |error| of published runs, each predicted by a fit without")
    assert "20% over 3 runs of vllm@0.5 on a100-80gb TP8 (p90 28%, typically 20% too fast)" in line
    assert "25% over 4 runs of vllm@0.5 on any GPU" in line and line.endswith("over all 8")
    # every a100 TP8 run is vllm@0.5's: the deployment's group would say the same again, and is left out
    assert "with any engine" not in line
    # a deployment with too few runs says so, and what does speak for it follows
    line = X.expected_line("vllm@0.5", "h200 TP8, EP8", table)
    assert "only 1 run of vllm@0.5 on h200 TP8, EP8 (50%); only 1 run on h200 TP8, EP8 (50%)" in line
    assert "of vllm@0.5 on any GPU" in line
    # an engine and a deployment no published run measured
    line = X.expected_line("sglang@0.4", "b200 TP1", table)
    assert "no published run of sglang@0.4; no published run on b200 TP1; 10% over all 8" in line
    assert X.expected("vllm@0.5", "h200 TP8, EP8", table)["of"] == "of vllm@0.5 on any GPU"
    t = X.expected("trtllm@0.13", "h100-80gb TP8", table)
    assert t["scope"] == "profile_deployment" and t["loso_median"] == pytest.approx(0.05) and t["profile_runs"] == 4
    # without enough runs of the profile there, the worse of the deployment's and the profile's
    x = X.expected("trtllm@0.13", "a100-80gb TP8", table)
    assert x["of"] == "on a100-80gb TP8 with any engine" and x["scope"] == "deployment"
    x = X.expected("sglang@0.4", "b200 TP1", table)
    assert x["scope"] == "all" and x["profile_runs"] == 0


def test_what_no_fit_priced_gets_no_error():
    """ideal, a calibrated profile file and an overridden key are not the fitted profiles the runs measured."""
    assert X.of_engine("vllm", "h100-80gb", 1)["profile"] == "vllm@0.8"
    assert X.of_engine("vllm@0.5.3", "a100-80gb", 8)["deployment"] == "a100-80gb TP8"
    for engine in ("ideal", "mine.json", "vllm:fixed_s=0.01", None):
        assert X.of_engine(engine, "h100-80gb", 1) is None
    x = X.of_engine("nanoflow", "a100-80gb", 8)
    assert x["profile_runs"] == 0 and "no published run of nanoflow" in x["line"]


def test_a_small_lean_is_not_called_one(table):
    line = X.expected_line("trtllm@0.13", "h100-80gb TP8", table)
    assert "5.0% over 4 runs of trtllm@0.13 on h100-80gb TP8 (p90 8.8%)" in line and "too fast" not in line


def test_build_needs_the_cross_validation(tmp_path):
    rows = read_catalogue(_write(tmp_path, ROWS))
    with pytest.raises(ValueError, match="no cv.leave_one_source_out rows"):
        B.build({"rows": []}, rows, "sha")
    with pytest.raises(ValueError, match="1 row.s. of the result are in none of the catalogues given"):
        B.build({"cv": {X.CV: {"rows": {**LOSO, "zz": 0.1}}}}, rows, "sha")


def test_the_shipped_table_is_for_the_shipped_parameters():
    """Refitting sim/engine_params.json without remaking the table fails here (the module docstring says how)."""
    raw = json.loads(X.TABLE_FILE.read_text())
    assert raw["params_sha256"] == X.params_sha256(), "remake sim/expected_error.json"
    t = X.load()
    assert t is not None and t["all"]["n"] >= 600
    # every group adds up to the same runs
    for kind in ("profile", "deployment", "profile_deployment"):
        assert sum(g["n"] for g in t[kind].values()) == t["all"]["n"]


def test_a_table_for_other_parameters_is_not_quoted(tmp_path):
    raw = json.loads(X.TABLE_FILE.read_text())
    p = tmp_path / "t.json"
    p.write_text(json.dumps({**raw, "params_sha256": "0" * 64}))
    assert X.load(p) is None
    p.write_text("not json")
    assert X.load(p) is None


def test_main_writes_and_refuses_to_replace_a_foreign_file(tmp_path, capsys, monkeypatch):
    cat = _write(tmp_path, ROWS)
    res = tmp_path / "fid.json"
    res.write_text(json.dumps(_result()))
    out = tmp_path / "expected.json"
    assert B.main([str(res), str(cat), "-o", str(out)]) == 0
    assert json.loads(out.read_text())["all"]["n"] == 8
    assert B.main([str(res), str(cat), "-o", str(out)]) == 0  # its own kind is replaced
    mine = tmp_path / "mine.json"
    mine.write_text('{"a": 1}')
    assert B.main([str(res), str(cat), "-o", str(mine)]) == 2
    assert mine.read_text() == '{"a": 1}'
    assert "is not an expected-error table; not replaced" in capsys.readouterr().err
    res.write_text("{")
    assert B.main([str(res), str(cat), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blendsim: error:") and err.count("\n") == 1


def test_simulate_summary_quotes_it_for_a_fitted_engine_only():
    from blendsim.reports.terminal import expected_error_line

    s = {"cost_model": "roofline+fitted", "engine": "vllm@0.5.3", "engine_profile": "vllm@0.5", "hardware": "a100-80gb",
         "tp": 8, "pp": 1, "ep": 1, "replicas": 1}
    t = X.load()
    want = X.expected_line("vllm@0.5", "a100-80gb TP8", t)
    assert want and expected_error_line(s) == want
    assert expected_error_line({**s, "cost_model": "roofline"}) is None
    assert expected_error_line({**s, "engine": "mine.json"}) is None


def test_plan_warns_when_the_deadline_is_within_the_error():
    from blendsim.plan.report import margin_note

    x = {"of": "on h100-80gb TP8 with any engine", "n": 12, "loso_median": 0.10, "loso_p90": 0.3,
         "loso_signed_median": 0.08}
    rec = {"meets_deadline": True, "makespan_s": 3300.0, "expected_error": x}
    note = margin_note({"recommended": rec, "deadline_s": 3600.0})
    assert note.startswith("warning: the recommended meets the 1 h deadline by less than the error to expect: "
                           "10% median |error| over 12 published runs on h100-80gb TP8 with any engine (p90 30%); "
                           "10% slower it takes 1.01 h; such runs typically came out 8.0% slower than predicted.")
    ok = margin_note({"recommended": {**rec, "makespan_s": 3000.0}, "deadline_s": 3600.0})
    assert ok.startswith("expected error of the recommended: 10% median |error| over 12 published runs on h100-80gb")
    assert "10% slower it still meets the deadline (55 min)" in ok
    faster = {**rec, "makespan_s": 2000.0}  # a faster deployment on the front
    early = margin_note({"recommended": {**rec, "expected_error": {**x, "loso_signed_median": -0.2}},
                         "deadline_s": 3600.0, "pareto": [faster, rec]})
    assert early.endswith("such runs typically came out 20% faster than predicted, so the run is more likely early. "
                          "Allow a margin (--margin expected) or take a faster deployment from the front")
    # the recommended is the front's fastest: no faster one to take (review of 1 Dec 2026)
    alone = margin_note({"recommended": rec, "deadline_s": 3600.0, "pareto": [rec]})
    assert alone.endswith("Allow a margin (--margin expected); no faster deployment was found (a larger --max-gpus, "
                          "other --hardware or --engines may give one)")
    assert margin_note({"recommended": {**rec, "meets_deadline": False}, "deadline_s": 3600.0}) is None
    assert margin_note({"recommended": {**rec, "expected_error": None}, "deadline_s": 3600.0}) is None


def test_the_python_result_carries_it():
    import blendsim

    t = blendsim.make_trace(input_len=[512] * 40, output_len=[64] * 40)
    r = blendsim.simulate(t, model="llama-3-8b", hardware="h100-80gb", engine="vllm")
    x = r.expected_error
    assert x is not None and x["line"] == X.expected_line(r.summary["engine_profile"], "h100-80gb TP1")
    assert x["n"] >= X.MIN_RUNS and 0 < x["loso_median"] < 1
    assert blendsim.simulate(t, model="llama-3-8b", hardware="h100-80gb", engine="ideal").expected_error is None
    assert X.of_summary({**r.summary, "offline": False}) is None


@pytest.mark.parametrize("engine, quoted", [("vllm", True), ("ideal", False)])
def test_the_comparison_report_quotes_it_once(tmp_path, engine, quoted):
    import blendsim
    from blendsim.reports.render import write_report

    t = blendsim.make_trace(input_len=[512] * 40, output_len=[64] * 40)
    dirs = [blendsim.simulate(t, policy=p, hardware="h100-80gb", engine=engine).write(tmp_path / p)
            for p in ("dfs", "fcfs")]
    write_report(dirs, tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert md.count("Expected error of absolute throughput (median |error| of published runs") == int(quoted)
    if quoted:
        assert "a speedup between policies on one engine and deployment is a ratio of two predictions" in md


def test_the_report_names_each_engine_and_deployment_under_one_head(tmp_path):
    import blendsim
    from blendsim.reports.render import write_report

    t = blendsim.make_trace(input_len=[512] * 40, output_len=[64] * 40)
    dirs = [blendsim.simulate(t, policy="dfs", hardware=hw, engine="vllm").write(tmp_path / hw)
            for hw in ("h100-80gb", "a100-80gb")]
    write_report(dirs, tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert md.count("median |error| of published runs") == 1
    a, h = (X.of_engine("vllm", hw, 1)["line"][len(X.HEAD):] for hw in ("a100-80gb", "h100-80gb"))
    assert f"vllm@0.8 on a100-80gb TP1: {a} | vllm@0.8 on h100-80gb TP1: {h}." in md


def test_plan_quotes_only_fitted_engines_and_keeps_its_margin_in_the_answer(tmp_path):
    import blendsim
    from blendsim.plan.report import expected_errors

    of = expected_errors()
    e = {"engine": "vllm", "hardware": "h100-80gb", "tp": 2, "pp": 1, "ep": 1}
    assert of(e) == {k: v for k, v in X.of_engine("vllm", "h100-80gb", 2).items() if k != "line"}
    assert of({**e, "engine": "ideal"}) is None
    t = blendsim.make_trace(input_len=[512] * 200, output_len=[64] * 200)
    a = blendsim.plan(t, model="llama-3-8b", deadline="1h", hardware="h100-80gb", engines="vllm,ideal",
                      policies="dfs", max_gpus=1, jobs=1, fidelity=True)
    rec = a["recommended"]
    assert rec["engine"] == "ideal" and rec["expected_error"] is None and a["expected_error_note"] is None
    assert [p["expected_error"] is None for p in a["pareto"]] == [p["engine"] == "ideal" for p in a["pareto"]]


def test_saving_over_the_shipped_parameters_says_the_table_is_stale(tmp_path, monkeypatch):
    """A refit saved as the shipped parameters (here a stand-in file) says the quoted table no longer applies."""
    import shutil

    from typer.testing import CliRunner

    import blendsim.sim.engines as E
    from blendsim.cli import get_app

    shipped = tmp_path / "engine_params.json"
    shutil.copy(E.PARAMS_FILE, shipped)
    monkeypatch.setattr(E, "PARAMS_FILE", shipped)
    assert X.load() is not None
    res = CliRunner().invoke(get_app(), ["fidelity", "--only", "trtllm-0.13-*a100*", "--no-cv", "--refit", "--save",
                                         str(shipped)])
    assert res.exit_code == 0, res.output
    assert "expected_error.json, the error simulate and plan quote, no longer applies; remake it" in res.output
    assert X.load() is None


def test_simulate_json_keeps_summary_json_and_says_the_error_on_stderr(tmp_path):
    """summary.json is the run's record; the error to expect is the fit's and changes with it, so --json prints
    the record unchanged and the error as a note on stderr."""
    from typer.testing import CliRunner

    import blendsim
    from blendsim.cli import get_app

    t = blendsim.make_trace(input_len=[512] * 40, output_len=[64] * 40)
    path = blendsim.write_trace(t, tmp_path / "t.parquet")
    r = CliRunner().invoke(get_app(), ["simulate", str(path), "--hardware", "h100-80gb", "--engine", "vllm", "--json",
                                       "-o", str(tmp_path / "run")])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert "expected_error" not in s and s == json.loads((tmp_path / "run" / "summary.json").read_text())
    assert f"note: {X.of_engine('vllm', 'h100-80gb', 1)['line']}" in r.stderr
