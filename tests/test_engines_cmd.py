"""blendsim engines: every modelled profile listed, and one profile's mechanics as the cost model uses them."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.sim.engines import VERSIONS, get_profile, version_order


def _run(*args: str, width: int = 80):
    return CliRunner().invoke(get_app(), ["engines", *args], env={"COLUMNS": str(width)})


def test_the_list_names_every_registered_profile_and_fits_the_terminal():
    res = _run()
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    table = lines[:next(i for i, line in enumerate(lines) if line.startswith("until:"))]
    cells = [line.split() for line in table if line.split() and "@" in line.split()[0]]
    want = sorted((f"{n}@{v}" for n, v in VERSIONS if v), key=lambda k: (k.split("@")[0],
                                                                        version_order(k.split("@")[1])))
    assert [c[0] for c in cells] == want
    until = {c[0]: c[1] for c in cells}
    assert until["vllm@0.5"] == "0.6" and until["trtllm@0.8"] == "0.13"  # priced until the next modelled release
    assert {k for k, v in until.items() if v == "newest"} >= {"vllm@0.8", "trtllm@1.0", "sglang@0.5.3"}


def test_json_list_carries_the_priced_loop_of_each_profile():
    res = _run("--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert len(rows) == len(VERSIONS)
    for d in rows:
        prof = get_profile(d["engine"])
        assert d["fixed_s"] == prof.fixed_s and d["per_seq_s"] == prof.per_seq_s
        assert d["scheduler.token_budget" if "token_budget" in prof.scheduler else "engine"] is not None
    fitted = {d["engine"]: d["loop"] for d in rows}
    assert fitted["vllm@0.5"].startswith("fitted: fixed_s, per_seq_s")
    assert fitted["nanoflow"] == "cited (not fitted)"
    assert fitted["vllm@0.8"] == "cited prior (not fitted)"  # V1's offline loop keeps its prior (fit_offline)


@pytest.mark.parametrize("key, engine, releases", [("vllm@0.7", "vllm@0.6", "0.6 up to 0.8 (not included)"),
                                                    ("trtllm@0.10", "trtllm@0.8", "0.8 up to 0.13 (not included)"),
                                                    ("sglang", "sglang@0.5.3", "0.5.3 and later"),
                                                    ("nanoflow", "nanoflow", "every release (no versions modelled)")])
def test_one_profile_names_what_prices_the_release_asked_for(key, engine, releases):
    res = _run(key, "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert (d["engine"], d["releases"], d["asked_as"]) == (engine, releases, key)
    assert d["source"] and d["all_reduce"] and d["kv_load_source"].startswith(d["kv_load"])


def test_one_profile_shows_the_loop_behind_the_server_and_the_reload_its_release_has():
    served = json.loads(_run("vllm@0.10:serve=1", "--json").stdout)
    prof = get_profile("vllm@0.10:serve=1")
    assert served["serve"] is True and served["server_token_s"] == prof.server_token_s
    assert "key vllm@0.8:serve" in served["loop"] and "key vllm@0.8:server" in served["server"]
    old = json.loads(_run("vllm@0.5", "--json").stdout)
    assert old["kv_load"] == "stall" and "before vllm 0.11" in old["kv_load_source"]
    text = _run("vllm@0.5", width=120).output
    assert "vllm@0.5" in text and "us (" in text  # seconds shown in microseconds with the raw value


def test_an_unknown_engine_or_version_is_one_line():
    for key, says in (("tgi", "unknown engine 'tgi'"), ("vllm@0.4", "older than every modelled version")):
        res = _run(key)
        assert res.exit_code == 2 and says in res.output and "Traceback" not in res.output


def test_a_calibrated_profile_file_shows_its_own_fit(tmp_path):
    from blendsim.fidelity.catalogue import read_catalogue
    from blendsim.fidelity.engine_calibration import write_rows_csv
    from blendsim.fidelity.suite import SHIPPED_CATALOGUE

    rows = {r.id: r for r in read_catalogue(SHIPPED_CATALOGUE)}
    pre = "vllm-0.6.0-blog-llama-3-8b-a100-80gb-tp1-"
    write_rows_csv(tmp_path / "train.csv", [rows[pre + "decode"], rows[pre + "prefill"]])
    out = tmp_path / "mine.json"
    r = CliRunner().invoke(get_app(), ["calibrate", "engine", str(tmp_path / "train.csv"), "--engine", "vllm@0.6",
                                       "--hardware", "a100-80gb", "-o", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(_run(str(out), "--json").stdout)
    fitted = json.loads(out.read_text())["engine"]["vllm@0.6"]
    assert d["fixed_s"] == pytest.approx(fitted["fixed_s"]) and str(out.resolve()) in d["loop"]
    assert d["engine"].startswith("vllm@0.6 fitted in")


def test_one_profile_on_a_deployment_says_what_the_engine_sets_there():
    d = json.loads(_run("sglang@0.4", "--hardware", "h100-80gb", "--model", "llama-3.1-8b", "--json").stdout)
    assert d["deployment"] == "h100-80gb TP1, llama-3.1-8b"
    assert d["here.max_seqs"] == 2048  # a 128K-context model: SGLang's request pool floor
    assert d["here.gpu_memory_utilization"] == 0.88 and d["here.kv_tokens"] > 100_000
    assert d["here.cuda_graph_sizes"].endswith("152, 160 (23 sizes)")  # 1, 2, 4, then multiples of 8 to 160
    v1 = json.loads(_run("vllm", "--hardware", "h100-80gb", "--json").stdout)
    assert (v1["here.token_budget"], v1["here.max_seqs"]) == (16384, 1024)  # V1's limits on a GPU of >= 70 GiB
    for args, says in ((["--hardware", "h100-80gb"], "describe one engine"), (["vllm", "-m", "llama-3-8b"],
                                                                             "--model needs --hardware"),
                       (["vllm", "--hardware", "h100-80gb", "-m", "llama-3-70b"], "does not fit")):
        res = _run(*args)
        assert res.exit_code == 2 and says in res.output and "Traceback" not in res.output


def test_an_engine_shows_its_fitted_server_stage_and_milliseconds_as_such():
    """`engines trtllm@0.8` prices served runs by its fitted server stage: the view shows those values (not the
    cited prior) and a fitted 10.4 ms as milliseconds (was: "0.010 s", a 10 ms prior by its look)."""
    from blendsim.cli import get_app
    from blendsim.sim.engines import load_params

    fitted = load_params()["engine"]["trtllm@0.8:server"]
    d = json.loads(CliRunner().invoke(get_app(), ["engines", "trtllm@0.8", "--json"]).stdout)
    assert d["server_request_s"] == fitted["request_s"] and d["server_token_s"] == fitted["token_s"]
    assert d["server"].startswith("behind its API server (serve=1) only; fitted")
    text = CliRunner().invoke(get_app(), ["engines", "sglang@0.2"], env={"COLUMNS": "120"}).stdout
    assert " ms (0.00135" in text
