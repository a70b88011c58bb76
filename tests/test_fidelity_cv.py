"""fidelity: leave-one-source-out / leave-one-engine-version-out, parameters at bounds, the shipped rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.fidelity.catalogue import build_workload, read_catalogue
from blendsim.fidelity.fit import at_bound
from blendsim.fidelity.suite import SHIPPED_CATALOGUES, engine_version_key, load_suite
from blendsim.sim.errors import UserError
from tests.test_fidelity import _row, _write


def test_engine_version_key_reads_the_first_version_number(tmp_path):
    rows = read_catalogue(_write(tmp_path, [_row(**r) for r in [
        {"id": "a", "engine": "vllm", "engine_version": "vLLM v0.6.0, --num-scheduler-steps 10"},
        {"id": "b", "engine": "trtllm", "engine_version": "TensorRT-LLM ~v1.0, PyTorch backend"},
        {"id": "c", "engine": "nanoflow", "engine_version": "version/commit not stated"},
        {"id": "d", "engine": "sglang", "engine_version": "SGLang 0.5.5.post1"},
    ]]))
    assert [engine_version_key(r) for r in rows] == ["vllm@0.6", "trtllm@1.0", "nanoflow", "sglang@0.5"]




def test_cv_json_has_leave_one_source_and_engine_version_out(tmp_path):
    rows = [_row(id=f"s{k}-{i}x{o}", source=f"doc {k}, table 1", engine_version=f"v1.{k}",
                 workload=f"const:{i}/{o}", requests=60, value=v)
            for k, (i, o, v) in enumerate([(128, 128, 9000), (512, 64, 5000), (256, 256, 7000)])]
    cat = _write(tmp_path, rows)
    res = CliRunner().invoke(get_app(), ["fidelity", str(cat), "--json"])
    assert res.exit_code == 0, res.output
    cv = json.loads(res.stdout)["cv"]
    assert set(cv) == {"leave_one_source_out", "leave_one_engine_version_out", "leave_one_model_out",
                       "leave_one_hardware_out"}
    shape = set(cv["leave_one_model_out"])
    for k in ("leave_one_source_out", "leave_one_engine_version_out"):
        assert set(cv[k]) == shape
        assert cv[k]["n"] == 3 and set(cv[k]["rows"]) == {r["id"] for r in rows}
        errs = np.abs(list(cv[k]["rows"].values()))
        assert cv[k]["median_abs_error"] == pytest.approx(np.median(errs))
    # each source predicted by a fit on the other two: not the in-sample errors
    insample = {x["id"]: x["error"] for x in json.loads(res.stdout)["rows"]}
    assert cv["leave_one_source_out"]["rows"] != insample
    text = CliRunner().invoke(get_app(), ["fidelity", str(cat)])
    assert text.exit_code == 0 and "leave-one-source-out: median" in text.output
    assert "leave-one-engine-version-out: median" in text.output and "LOSO" in text.output


def test_at_bound_flags_either_end():
    assert at_bound(0.4, [0.4, 0.95]) == "lower"
    assert at_bound(0.95, [0.4, 0.95]) == "upper"
    assert at_bound(0.6, [0.4, 0.95]) is None
    assert at_bound(0.6, None) is None


def test_params_marks_parameters_at_a_bound(tmp_path):
    prm = {"global": {"attn_eff": 0.9, "link_eff": 0.5}, "bounds": {"global.attn_eff": [0.15, 0.9],
                                                                    "global.link_eff": [0.2, 1.0]}}
    f = tmp_path / "p.json"
    f.write_text(json.dumps(prm))
    res = CliRunner().invoke(get_app(), ["fidelity", "--params", "--params-file", str(f), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["at_bound"] == ["global.attn_eff"]
    assert {p["name"]: p["at_bound"] for p in out["params"]} == {"global.attn_eff": "upper", "global.link_eff": None}
    res = CliRunner().invoke(get_app(), ["fidelity", "--params", "--params-file", str(f)])
    assert "AT UPPER BOUND" in res.output and "1 of 2 parameters at a bound: global.attn_eff" in res.output


def test_file_lengths_scaled_to_published_means_and_found_in_blendsim_data(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    (data / "lens.csv").write_text("prompt_tokens,output_tokens\n" + "".join(
        f"{10 + i},{5 + 2 * i}\n" for i in range(100)))
    cat = _write(tmp_path, [_row(id="f", workload="file:lens.csv?mean_prompt=200&mean_output=50", requests=40)])
    (f,) = read_catalogue(cat)
    monkeypatch.delenv("BLENDSIM_DATA", raising=False)
    suite = load_suite(cat, {})
    assert "does not exist" in suite.reasons["f"] and "BLENDSIM_DATA" in suite.reasons["f"]
    monkeypatch.setenv("BLENDSIM_DATA", str(data))
    t = build_workload(f)
    p = 10 + np.arange(40)
    assert t.input_len.tolist() == np.maximum(np.rint(p * 200 / p.mean()), 1).astype(int).tolist()
    assert abs(t.input_len.mean() - 200) < 1 and abs(t.output_len.mean() - 50) < 1
    # a malformed option is refused when the catalogue is read, the file present or not
    bad = _write(tmp_path, [_row(id="g", workload="file:lens.csv?mean_prompt=0", requests=40)], name="bad.csv")
    with pytest.raises(UserError, match=r"bad.csv: row 2 \(id g\), field 'workload': option mean_prompt='0' must be >= 1"):
        read_catalogue(bad)


def test_file_prompts_cut_at_a_uniform_length_with_uniform_outputs(tmp_path, monkeypatch):
    # sglang bench_serving's random dataset of July 2024 (v0.2.0): a ShareGPT prompt cut at a length drawn from [LO, HI]
    # and kept whole when shorter; outputs drawn from [LO, HI]
    (tmp_path / "lens.csv").write_text("prompt_tokens,output_tokens\n" + "".join(
        f"{40 * (i % 50) + 1},{7}\n" for i in range(500)))
    spec = "file:lens.csv?prompt_scale=2&cap_prompt=512-1024&output=256-512"
    bad = {"b1": "file:lens.csv?cap_prompt=1024-512", "b2": "file:lens.csv?output=x", "b3": "file:lens.csv?prompt_scale=0",
           "b4": "file:lens.csv?prompt_scale=2&mean_prompt=100", "b5": "file:lens.csv?cap_prompt=0-10"}
    cat = _write(tmp_path, [_row(id="ok", workload=spec, requests=400)])
    rows = {r.id: r for r in read_catalogue(cat)}
    t = build_workload(rows["ok"])
    p = 2 * (40 * (np.arange(400) % 50) + 1)
    assert (t.input_len <= p).all() and (t.input_len[p < 512] == p[p < 512]).all()  # short prompts stay whole
    cut = p > 1024
    assert (t.input_len[cut] >= 512).all() and (t.input_len[cut] <= 1024).all() and t.input_len[cut].std() > 50
    assert t.output_len.min() >= 256 and t.output_len.max() <= 512 and abs(t.output_len.mean() - 384) < 15
    again = build_workload(rows["ok"])  # seeded: the same row gives the same lengths
    assert (again.input_len == t.input_len).all() and (again.output_len == t.output_len).all()
    for k, msg in {"b1": "1 <= LO <= HI", "b2": "is not LO-HI", "b3": "prompt_scale='0' must be a number",
                   "b4": "one of prompt_scale and mean_prompt", "b5": "1 <= LO <= HI"}.items():
        one = _write(tmp_path, [_row(id=k, workload=bad[k], requests=400)], name=f"{k}.csv")
        with pytest.raises(UserError, match=msg):  # refused as the catalogue is read
            read_catalogue(one)


def test_file_prompts_cut_to_a_stated_mean(tmp_path):
    # a source that states the mean of the prompts it sent after the cut (the SGLang v0.2 blog's final text): with
    # cap_prompt, mean_prompt is that mean, and the scale of the stand-in lengths is found to give it
    (tmp_path / "lens.csv").write_text("prompt_tokens,output_tokens\n" + "".join(
        f"{40 * (i % 50) + 1},{7}\n" for i in range(500)))
    cat = _write(tmp_path, [_row(id="short", workload="file:lens.csv?mean_prompt=243&cap_prompt=512-1024&output=256-512",
                                 requests=400),
                            _row(id="long", workload="file:lens.csv?mean_prompt=295&cap_prompt=2048-4096&output=256-512",
                                 requests=400),
                            _row(id="over", workload="file:lens.csv?mean_prompt=1500&cap_prompt=512-1024", requests=400)])
    rows = {r.id: r for r in read_catalogue(cat)}
    short, long = build_workload(rows["short"]), build_workload(rows["long"])
    assert abs(short.input_len.mean() - 243) < 1 and abs(long.input_len.mean() - 295) < 1
    assert short.input_len.max() <= 1024 and long.input_len.max() <= 4096
    raw = 40 * (np.arange(400) % 50) + 1  # one scale per row: the order of the lengths is the file's
    assert (np.diff(long.input_len[np.argsort(raw, kind="stable")]) >= 0).all()
    again = build_workload(rows["short"])
    assert (again.input_len == short.input_len).all()
    with pytest.raises(Exception, match="more than prompts cut at cap_prompt can average"):
        build_workload(rows["over"])


def test_shipped_catalogues_cover_other_engines_with_citations():
    rows = [r for p in SHIPPED_CATALOGUES for r in read_catalogue(p)]
    assert len({r.id for r in rows}) == len(rows)
    other = [r for r in rows if r.engine != "trtllm"]
    assert len(other) >= 60
    assert {"vllm", "sglang", "deepspeed-fastgen", "nanoflow"} <= {r.engine for r in other}
    assert {"a100-80gb", "h100-80gb"} <= {r.hardware for r in other}
    assert all(r.source and r.note for r in rows)
    for r in rows:  # a ShareGPT row says why its sample is not shipped
        if "sharegpt" in r.workload:
            assert "SHAREGPT SAMPLE NOT SHIPPED" in r.note, r.id
            # the stand-in file is Llama-2-tokenized and output-heavier than any bench's sample: every row scales it
            # to the means its bench drew (printed by its source, or the vLLM blog's for the same filter/tokenizer);
            # a random-dataset row that cuts ShareGPT prompts scales them alike and draws its own outputs
            if "cap_prompt=" in r.workload:
                assert ("prompt_scale=" in r.workload or "mean_prompt=" in r.workload) and "output=" in r.workload, r.id
            else:
                assert "mean_prompt=" in r.workload and "mean_output=" in r.workload, r.id
