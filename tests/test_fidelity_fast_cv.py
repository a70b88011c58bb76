"""fidelity's fast cross-validation: stacked pricing equals row-by-row pricing, folds never read held-out rows,
results do not depend on --jobs, the per-group table and --cv-by."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
from typer.testing import CliRunner

import blendsim.fidelity.fit as F
from blendsim.cli import get_app
from blendsim.cli.fidelity import flatten
from blendsim.fidelity.suite import CV_KEYS, load_suite
from tests.test_fidelity import _row, _write

# three sources: one deployment with several rows (stacked), a second engine and GPU, pipelined rows (stacked)
ROWS = [
    *(_row(id=f"a-{i}x{o}", source="doc A, table 1", workload=f"const:{i}/{o}", requests=80, value=v)
      for i, o, v in ((128, 128, 9000), (512, 64, 5000), (256, 256, 7000))),
    *(_row(id=f"b-{i}x{o}", source="doc B", engine="vllm", engine_version="0.6.0", hardware=hw,
           workload=f"const:{i}/{o}", requests=80, value=v)
      for i, o, hw, v in ((128, 128, "h100-80gb", 6000), (512, 128, "h100-80gb", 4000),
                          (256, 128, "a100-80gb", 2500))),
    *(_row(id=f"c-pp{p}-{i}", source="doc C", model="llama-3-70b", weights="fp8", kv_dtype="fp8", pp=p, gpus=p,
           workload=f"const:{i}/64", requests=60, value=v)
      for p, i, v in ((2, 256, 1500), (2, 1024, 1100), (2, 512, 1300))),
]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return load_suite(_write(tmp_path_factory.mktemp("cat"), ROWS), {})


def _other(params: dict) -> dict:
    """Parameters away from the presets the rows were simulated with."""
    return {"hardware": {"h100-80gb": {"gemm_eff": 0.45, "mem_eff": 0.6, "attn_mem_eff": 0.5},
                         "a100-80gb": {"gemm_eff": 0.5, "mem_eff": 0.65, "attn_mem_eff": 0.55}},
            "global": {"attn_eff": 0.4, "link_eff": 0.6},
            "engine": {"trtllm": {"fixed_s": 2e-3, "per_seq_s": 5e-6}, "vllm": {"fixed_s": 3e-3, "per_seq_s": 8e-6}},
            **params}


def test_stacked_units_price_every_row_as_one_by_one(suite):
    rows = [(r, p.compressed()) for r, p in suite.ok]
    units = F._units(rows, {})
    kinds = {type(u).__name__ for u in units if len(u.index) > 1}
    assert kinds == {"_Stack", "_PipeStack"}  # both kinds stacked here, so the check below covers both
    assert sorted(int(i) for u in units for i in u.index) == list(range(len(rows)))
    prm = _other({})
    for u in units:
        one = [F.predict(*rows[i], prm) for i in u.index]
        np.testing.assert_allclose(u.predictions(prm), one, rtol=1e-9)


def test_a_compressed_pipelined_row_prices_as_the_full_one(suite):
    prm = _other({})
    for r, p in suite.ok:
        if r.pp > 1:
            c = p.compressed()
            assert sum(len(x["weight"]) for x in c.sched.replicas) < sum(len(x["weight"]) for x in p.sched.replicas)
            assert c.makespan({}) == pytest.approx(p.sched.makespan_s, rel=1e-9)
            assert c.makespan(prm) == pytest.approx(p.makespan(prm), rel=5e-3)


def test_a_row_does_not_move_with_a_parameter_it_is_said_not_to_read(suite):
    ps = F.free_params(suite.ok)
    prm = _other({})
    for r, pr in suite.ok:
        base = F.predict(r, pr, prm)
        for p in ps:
            if F._reads(pr, p):
                continue
            for v in (p.lo, p.hi):
                q = copy.deepcopy(prm)
                F.set_value(q, p.path, v)
                assert F.predict(r, pr, q) == base, (r.id, p.name)


def test_stacking_does_not_change_the_fit(suite, monkeypatch):
    stacked = F.fit(suite.ok, {})
    monkeypatch.setattr(F, "_units", lambda rows, params: [F._Single(i, *rp) for i, rp in enumerate(rows)])
    single = F.fit(suite.ok, {})
    a, b = dict(flatten(stacked)), dict(flatten(single))
    assert set(a) == set(b) and len(a) >= 8
    for k, v in a.items():
        assert v == pytest.approx(b[k], rel=1e-6, abs=1e-12), k


def test_a_fold_never_reads_its_held_out_rows(suite):
    key = CV_KEYS["source"]
    pred = F.cross_validate(suite.ok, key, base={})
    assert set(pred) == {r.id for r, _ in suite.ok}
    # the held-out source's measurements cut to 60%: its own predictions must not move (its fold never read
    # them), other sources' do (their folds fitted on them) -- so the check can fail
    moved = [(dataclasses.replace(r, value=0.6 * r.value) if key(r) == "doc A" else r, p) for r, p in suite.ok]
    again = F.cross_validate(moved, key, base={})
    shift = {r.id: again[r.id] / pred[r.id] - 1 for r, _ in suite.ok}
    assert all(shift[r.id] == 0.0 for r, _ in suite.ok if key(r) == "doc A"), shift
    assert max(abs(shift[r.id]) for r, _ in suite.ok if key(r) != "doc A") > 0.01, shift


def test_cross_validation_does_not_depend_on_jobs(suite):
    key = CV_KEYS["engine_version"]
    one = F.cross_validate(suite.ok, key, base={})
    two = F.cross_validate(suite.ok, key, base={}, jobs=2)
    assert json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True)


def test_cv_by_selects_cross_validations_and_the_table_leads_with_loso(tmp_path):
    cat = _write(tmp_path, ROWS[:6])
    res = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--json", "--cv-by", "source", "-q"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out["cv"]) == {"leave_one_source_out"}
    assert set(out["by"]["engine_version"]) == {"trtllm", "vllm@0.6"}
    assert set(out["cv"]["leave_one_source_out"]["by"]["engine"]) == {"trtllm", "vllm"}
    assert set(out["cv"]["leave_one_source_out"]["by"]["deployment"]) == set(out["by"]["deployment"])
    text = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--cv-by", "source", "--cv-by", "engine_version",
                                          "-q"])
    assert text.exit_code == 0, text.output
    head = next(line for line in text.output.splitlines() if line.lstrip().startswith("engine ") and "LOSO" in line)
    assert head.split() == ["engine", "n", "LOSO", "LOSO", "p90", "shipped", "shipped", "p90", "LOEVO"]
    assert "|error| by engine version" in text.output and "LOMO" not in text.output


def test_errors_by_deployment_name_the_gpu_and_its_split(tmp_path):
    """The per-deployment table: one group per GPU and TP x PP (x EP) split, with its rows' own errors."""
    rows = [*ROWS, _row(id="d-ep", source="doc D", model="mixtral-8x7b", tp=2, ep=2, gpus=2, value=3000)]
    cat = _write(tmp_path, rows)
    res = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--json", "--no-cv", "-q"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    dep = out["by"]["deployment"]
    assert set(dep) == {"h100-80gb TP1", "a100-80gb TP1", "h100-80gb TP1 x PP2", "h100-80gb TP2, EP2"}
    assert dep["h100-80gb TP1"]["n"] == 5 and dep["h100-80gb TP1 x PP2"]["n"] == 3
    errs = sorted(abs(x["error"]) for x in out["rows"] if x["id"].startswith("c-"))
    assert dep["h100-80gb TP1 x PP2"]["median_abs_error"] == pytest.approx(errs[1])
    text = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--no-cv", "-q"])
    assert "|error| by deployment" in text.output and "h100-80gb TP2, EP2" in text.output


@pytest.mark.parametrize("args, message", [(["--cv-by", "gpu"], "--cv-by gpu: use one of source"),
                                           (["--jobs", "0"], "--jobs 0: must be at least 1")])
def test_bad_cv_options_stop_with_one_line(tmp_path, args, message):
    cat = _write(tmp_path, ROWS[:2])
    res = CliRunner().invoke(get_app(), ["fidelity", str(cat), *args])
    assert res.exit_code != 0 and message in res.output and "Traceback" not in res.output


def test_markdown_table_per_engine_and_version(tmp_path):
    cat = _write(tmp_path, ROWS[:6])
    md = tmp_path / "table.md"
    res = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--json", "-q", "--cv-by", "source",
                                         "--cv-by", "engine_version", "--markdown", str(md)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    lines = md.read_text().splitlines()
    assert lines[0] == ("| engine | version (profile) | rows | LOSO median (p90) | shipped median (p90) | "
                        "LOEVO median (p90) |")
    vllm = next(line for line in lines if "(`vllm@0.6`)" in line).split(" | ")
    errs = np.abs(list(out["cv"]["leave_one_source_out"]["rows"].values())[3:6])
    assert vllm[3] == f"{100 * np.median(errs):.1f}% ({100 * np.percentile(errs, 90):.1f}%)"
    assert vllm[4] == (f"{100 * out['by']['engine_version']['vllm@0.6']['median_abs_error']:.1f}% "
                       f"({100 * out['by']['engine_version']['vllm@0.6']['p90_abs_error']:.1f}%)")
    blank = lines.index("")
    assert lines[blank - 2].startswith("| **all rows** | | 6 |")
    assert lines[blank - 1].startswith("| **other than TensorRT-LLM** | | 3 |")
    # then per deployment, the same columns: the H100 rows of doc A and doc B, the A100 row of doc B
    assert lines[blank + 1] == "| deployment | rows | LOSO median (p90) | shipped median (p90) | LOEVO median (p90) |"
    deps = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in lines[blank + 3:]}
    assert set(deps) == {"a100-80gb TP1", "h100-80gb TP1"} and deps["h100-80gb TP1"][1] == "5"
    a100 = out["by"]["deployment"]["a100-80gb TP1"]
    assert deps["a100-80gb TP1"][3] == f"{100 * a100['median_abs_error']:.1f}% ({100 * a100['p90_abs_error']:.1f}%)"


def test_a_pricer_stacking_cannot_reproduce_is_priced_on_its_own(suite, monkeypatch):
    rows = [(r, p.compressed()) for r, p in suite.ok]
    monkeypatch.setattr(F._Stack, "predictions", lambda self, params: np.zeros(len(self.index)))
    units = F._units(rows, {})
    assert {type(u).__name__ for u in units if len(u.index) > 1} == {"_PipeStack"}
    assert sum(len(u.index) for u in units) == len(rows)


def test_a_held_out_sources_loop_is_its_prior_not_the_shipped_fit(suite, tmp_path):
    # doc B holds the only vLLM rows, so its fold fits no vLLM loop: those rows must be priced with the profile's cited
    # prior, however the parameters the suite was loaded with set that loop (a shipped file fitted with doc B's rows)
    shipped = {"engine": {"vllm@0.6": {"fixed_s": 4e-3, "per_seq_s": 1e-4}}}
    other = load_suite(_write(tmp_path, ROWS), shipped)
    key = CV_KEYS["source"]
    a, b = F.cross_validate(suite.ok, key, base={}), F.cross_validate(other.ok, key, base={})
    held = [r.id for r, _ in suite.ok if key(r) == "doc B"]
    assert held and all(b[i] == pytest.approx(a[i], rel=1e-9) for i in held)
    # in-sample, the loaded parameters do price those rows (so the check above can fail)
    r, p = next((r, p) for r, p in other.ok if r.id == held[0])
    assert F.predict(r, p, shipped) < 0.8 * F.predict(r, p, {})


def test_a_cross_validation_over_one_group_says_why_it_predicts_nothing(tmp_path):
    """--cv-by source over one source's rows: every fold would fit on nothing; the line says so."""
    from blendsim.fidelity.suite import cv_summary

    cat = _write(tmp_path, ROWS[:3])  # doc A's rows alone
    one = load_suite(cat, {})
    c = cv_summary(one, "source")
    assert c["n"] == 0 and c["note"] == ("needs rows of at least two sources to leave one out; the 3 row(s) it "
                                         "could price are all of one source")
    res = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--cv-by", "source"],
                             env={"COLUMNS": "300"})
    assert res.exit_code == 0 and "(0 rows): needs rows of at least two sources" in res.stdout, res.output
