"""Versioned engine profiles (issue 24): NAME@VERSION on simulate, sweep, cost and as catalogue rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.fidelity.suite import load_suite
from blendsim.sim.engines import PROFILES, VERSIONS, get_profile, resolve_version
from blendsim.sim.errors import UserError
from blendsim.workloads.trace import write_trace
from tests.helpers import random_trace
from tests.test_fidelity import _row, _write

ISSUE_KEYS = ("vllm@0.5.3", "vllm@0.6", "vllm@0.10", "sglang@0.3", "sglang@0.4", "trtllm@0.8", "trtllm@1.0",
              "deepspeed-fastgen", "nanoflow")


def invoke(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


def test_name_alone_is_the_newest_and_a_version_between_two_takes_the_older():
    # (with no fitted parameters the registered profile itself; with the shipped ones a copy carrying its fitted loop)
    assert get_profile("vllm").version == "0.8" and get_profile("vllm", {}) is PROFILES["vllm"]
    assert get_profile("sglang").version == "0.5.3" and get_profile("trtllm").version == "1.0"
    assert resolve_version("vllm", "0.5.3") is VERSIONS[("vllm", "0.5")]
    assert resolve_version("vllm", "0.7.3") is VERSIONS[("vllm", "0.6")]
    assert resolve_version("vllm", "0.11.0") is VERSIONS[("vllm", "0.8")]
    assert resolve_version("sglang", "0.5.5") is VERSIONS[("sglang", "0.5.3")]
    assert resolve_version("sglang", "0.5.2") is VERSIONS[("sglang", "0.5")]
    assert resolve_version("sglang", "0.4.9") is VERSIONS[("sglang", "0.4")]
    assert resolve_version("sglang", "0.2.7") is VERSIONS[("sglang", "0.2")]
    assert resolve_version("trtllm", "0.9") is VERSIONS[("trtllm", "0.8")]
    assert resolve_version("trtllm", "0.13.0") is VERSIONS[("trtllm", "0.13")]
    # mechanisms differ by version: V0 is prefill-first and synchronous, V1 chunks and hides more CPU work
    v05, v06, v1 = (get_profile(k) for k in ("vllm@0.5", "vllm@0.6", "vllm@0.8"))
    assert v05.scheduler["mix"] == "prefill-first" and v1.scheduler["mix"] == "decode-first"
    assert v05.overhead(256, 256) > v06.overhead(256, 256) and v05.overhead(256, 256) > v1.overhead(256, 256)
    assert get_profile("sglang@0.3").overhead(128, 128) > get_profile("sglang@0.4").overhead(128, 128)
    assert get_profile("deepspeed-fastgen").scheduler["token_budget"] == 768


def test_an_unknown_version_names_the_modelled_ones_in_one_line(tmp_path):
    with pytest.raises(UserError) as e:
        get_profile("vllm@0.2.1")
    msg = str(e.value)
    assert "\n" not in msg and "vllm@0.5" in msg and "vllm@0.6" in msg and "vllm@0.8" in msg
    t = write_trace(random_trace(np.random.default_rng(0), n=10), tmp_path / "t.parquet")
    r = invoke("simulate", t, "--model", "tiny", "--hardware", "cpu", "--engine", "sglang@0.1", "-o",
               tmp_path / "r")
    assert r.exit_code == 2 and "sglang@0.3" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("key", ISSUE_KEYS)
def test_every_issue_version_runs_simulate_and_cost(key, tmp_path):
    t = write_trace(random_trace(np.random.default_rng(1), n=24), tmp_path / "t.parquet")
    r = invoke("simulate", t, "--model", "tiny", "--hardware", "cpu", "--engine", key, "-o", tmp_path / "r", "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["makespan_s"] > 0
    c = invoke("cost", "--model", "llama-3-8b", "--hardware", "a100-80gb", "--engine", key, "--decode-seqs", "64",
               "--context", "512", "--json")
    assert c.exit_code == 0, c.output


def test_versions_run_in_a_sweep(tmp_path):
    for key in ("vllm@0.5.3", "sglang@0.3", "deepspeed-fastgen"):
        d = tmp_path / key.replace("@", "_")
        r = invoke("sweep", "--densities", "1.0", "--sharing", "0.25", "--policies", "fcfs", "--requests", "200",
                   "--engine", key, "--jobs", "1", "-o", d)
        assert r.exit_code == 0, r.output


def test_catalogue_engine_version_selects_the_profile(tmp_path):
    rows = [_row(id=f"v{v}", engine="vllm", engine_version=f"vLLM v{v}", workload="const:400/200", requests=300,
                 hardware="a100-80gb") for v in ("0.5.3", "0.6.0", "0.11.0", "0.2.1")]
    rows.append(_row(id="none", engine="vllm", workload="const:400/200", requests=300, hardware="a100-80gb"))
    suite = load_suite(_write(tmp_path, rows), {})
    got = {rid: (pr.profile.name, pr.profile.version) for rid, pr in suite.pricers.items()}
    assert got == {"v0.5.3": ("vllm", "0.5"), "v0.6.0": ("vllm", "0.6"), "v0.11.0": ("vllm", "0.8"),
                   "none": ("vllm", "0.8")}
    assert "older than every modelled version" in suite.reasons["v0.2.1"]
    # the JSON names the profile that priced each row (review of 1 Dec 2026, second: only --markdown said it)
    from blendsim.fidelity.suite import predictions, summarise

    js = {x["id"]: x for x in summarise(suite, predictions(suite, {}))["rows"]}
    assert js["v0.11.0"]["engine_profile"] == "vllm@0.8" and js["v0.5.3"]["engine_profile"] == "vllm@0.5"
    # the synchronous V0 loop is slower than V1 on the same rows
    ms = {rid: pr.makespan({}) for rid, pr in suite.pricers.items()}
    assert ms["v0.5.3"] > ms["v0.6.0"] and ms["v0.5.3"] > ms["v0.11.0"]


def test_sglang_02_batches_whole_prompts_and_captures_fewer_graphs():
    # sglang@v0.2.0: no chunked prefill (whole prompts up to max_prefill_tokens 16384), CUDA graphs to batch 128
    v02, v03 = get_profile("sglang@0.2"), get_profile("sglang@0.3")
    assert v02.scheduler["token_budget"] == 16384 and v03.scheduler["token_budget"] == 8192
    assert (v02.cuda_graph_max, v03.cuda_graph_max) == (128, 160)
    assert v02.graph_size(129) == 129 and v03.graph_size(129) == 136  # eager above 128 on 0.2


@pytest.mark.parametrize("typed,modelled", [("vllm@v0.6", "vllm@0.6"), ("vllm@0.5.5.post1", "vllm@0.5"),
                                            ("sglang@0.3rc0", "sglang@0.3"), ("sglang@0.5.5.post1", "sglang@0.5.3"), ("sglang@0.5.2", "sglang@0.5"),
                                            ("vllm@0.6.0", "vllm@0.6"), ("trtllm@V1.0", "trtllm@1.0")])
def test_tags_and_release_suffixes_select_their_release(typed, modelled):
    assert get_profile(typed).modelled == modelled


@pytest.mark.parametrize("typed", ["vllm@abc", "vllm@latest", "vllm@", "vllm@-1", "vllm@0.6@0.8", "sglang@0.x"])
def test_what_is_no_version_number_is_one_line_not_the_newest_profile(typed):
    with pytest.raises(UserError, match="not a version number") as e:
        get_profile(typed)
    assert "\n" not in str(e.value)


def test_an_unversioned_engine_with_a_version_says_it_has_none():
    for typed in ("nanoflow@2", "ideal@1.0"):
        with pytest.raises(UserError, match="has no modelled versions"):
            get_profile(typed)
    with pytest.raises(UserError, match="given twice"):
        get_profile("vllm:fixed_s=0.001,fixed_s=0.002")


def test_a_run_names_the_modelled_profile_that_priced_it(tmp_path):
    t = write_trace(random_trace(np.random.default_rng(2), n=16), tmp_path / "t.parquet")
    for typed, modelled in (("vllm@0.7.2", "vllm@0.6"), ("vllm", "vllm@0.8"), ("nanoflow", "nanoflow")):
        d = tmp_path / typed.replace("@", "_")
        r = invoke("simulate", t, "--model", "tiny", "--hardware", "cpu", "--engine", typed, "-o", d)
        assert r.exit_code == 0, r.output
        s = json.loads((d / "summary.json").read_text())
        assert (s["engine"], s["engine_profile"]) == (typed, modelled)
        assert typed == modelled or f"(modelled by {modelled})" in " ".join(r.output.split())
    # vllm@0.10 and vllm are one profile: a report takes both as priced on one engine
    r = invoke("simulate", t, "--model", "tiny", "--hardware", "cpu", "--engine", "vllm@0.10", "-o", tmp_path / "v10")
    assert r.exit_code == 0, r.output
    assert invoke("report", tmp_path / "vllm", tmp_path / "v10", "-o", tmp_path / "rep").exit_code == 0


def test_nanoflow_runs_in_its_own_overlap_mode_unless_told_otherwise(tmp_path):
    t = write_trace(random_trace(np.random.default_rng(3), n=16), tmp_path / "t.parquet")
    modes = {}
    for extra in ((), ("--mode", "sequential")):
        d = tmp_path / f"r{len(extra)}"
        r = invoke("simulate", t, "--model", "tiny", "--hardware", "cpu", "--engine", "nanoflow", *extra, "-o", d)
        assert r.exit_code == 0, r.output
        modes[extra] = json.loads((d / "summary.json").read_text())["mode"]
    assert modes == {(): "overlap", ("--mode", "sequential"): "sequential"}
    r = invoke("simulate", t, "--model", "tiny", "--hardware", "cpu", "--engine", "vllm", "-o", tmp_path / "v")
    assert json.loads((tmp_path / "v" / "summary.json").read_text())["mode"] == "sequential"


def test_a_profile_file_with_overrides_says_it_takes_none():
    with pytest.raises(UserError, match="takes no overrides"):
        get_profile("my.json:fixed_s=0.01")


def test_vllm_async_scheduling_leaves_only_its_residual_on_the_step():
    """vLLM >= 0.10's --async-scheduling (PR #19970) runs the scheduler a step ahead of the GPU: the loop's place on
    the step is taken by the residual SGLang's overlapped scheduler keeps, not fitted; older releases refuse it."""
    from blendsim.sim.engines import ASYNC_RESIDUAL, load_params

    params = load_params()
    for key in ("vllm@0.10:async_scheduling=1", "vllm@0.11:serve=1,async_scheduling=1", "vllm:async_scheduling=1"):
        p = get_profile(key, params)
        assert p.async_scheduling and (p.fixed_s, p.per_seq_s) == ASYNC_RESIDUAL and p.fitted == ()
        # the fidelity re-pricer keeps the residual; behind the server, V1's API-server stage stays (its own process)
        assert p.fitted_overhead(params) == ({"server_token_s": params["engine"]["vllm@0.8:server"]["token_s"],
                                              "server_request_s": params["engine"]["vllm@0.8:server"]["request_s"]}
                                             if p.serve else {})
        sync = get_profile(key.replace("async_scheduling=1", "async_scheduling=0"), params)
        assert not sync.async_scheduling and p.overhead(512, 512) < sync.overhead(512, 512)
    # the key's own loop still wins over the residual
    assert get_profile("vllm@0.10:async_scheduling=1,fixed_s=0.001", params).fixed_s == 0.001
    for key, said in (("vllm@0.9:async_scheduling=1", "arrived in 0.10"), ("vllm@0.6:async_scheduling=1", "no opt-in"),
                      ("sglang@0.4:async_scheduling=1", "always on"), ("vllm:async_scheduling=2", r"0 \(off\) or 1")):
        with pytest.raises(UserError, match=said):
            get_profile(key, params)


def test_a_catalogue_row_with_async_scheduling_runs_it(tmp_path):
    base = "vLLM v0.11.0 (V1 engine); server command: vllm serve m --max-model-len 32768"
    rows = [_row(id="sync", engine="vllm", engine_version=base, workload="const:400/200", requests=300),
            _row(id="async", engine="vllm", engine_version=base + " --async-scheduling", workload="const:400/200",
                 requests=300)]
    suite = load_suite(_write(tmp_path, rows), {})
    a, s = suite.pricers["async"].profile, suite.pricers["sync"].profile
    assert a.async_scheduling and a.serve and not s.async_scheduling and s.serve
    assert suite.pricers["async"].makespan({}) < suite.pricers["sync"].makespan({})
    r = invoke("simulate", write_trace(random_trace(np.random.default_rng(2), n=24), tmp_path / "t.parquet"),
               "--model", "tiny", "--hardware", "cpu", "--engine", "vllm@0.10:async_scheduling=1", "-o",
               tmp_path / "r", "--json")
    assert r.exit_code == 0, r.output


def test_engine_names_are_case_blind_trimmed_and_a_missing_name_is_one_line():
    assert get_profile("vLLM@0.6").modelled == "vllm@0.6" and get_profile(" vllm@0.6 ").label == "vllm@0.6"
    with pytest.raises(UserError, match="no engine name before '@'") as e:
        get_profile("@0.5")
    assert "vllm@0.5" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match="unknown engine 'tgi'") as e:
        get_profile("tgi")
    assert "sglang@0.3" in str(e.value) and "trtllm@0.8" in str(e.value)  # the modelled versions are named


def test_a_profile_file_with_a_bad_header_names_the_file_and_field(tmp_path):
    f = tmp_path / "mine.JSON"  # the suffix in any case
    for head, field in (({"engine": "vllmx"}, "profile.engine"), ({"engine": "vllm", "version": "0.4"},
                                                                   "profile.version")):
        f.write_text(json.dumps({"profile": {"kind": "blendsim-engine-profile", **head}}))
        with pytest.raises(UserError) as e:
            get_profile(str(f))
        assert str(e.value).startswith(f"{f}: field {field}: "), str(e.value)


@pytest.mark.parametrize("text,key", [("CUDA 12.4, vLLM 0.5.3", "vllm@0.5"), ("vLLM for Llama-3.1 models, 0.5.3", "vllm@0.5"),
                                      ("vLLM v0.6.0, --num-scheduler-steps 10", "vllm@0.6"),
                                      ("Triton r24.07 (TensorRT-LLM v0.11.0)", "trtllm@0.11"), ("", "vllm")])
def test_a_rows_version_is_the_one_written_after_the_engines_name(text, key):
    from types import SimpleNamespace

    from blendsim.fidelity.catalogue import engine_version_key

    row = SimpleNamespace(engine="trtllm" if "TensorRT" in text else "vllm", engine_version=text)
    assert engine_version_key(row) == key


def test_plan_engine_lists_keep_each_engines_overrides_together():
    from blendsim.options import parse_names

    assert parse_names("vllm:fixed_s=0.001,per_seq_s=1e-6, sglang@0.4", "--engines", engines=True) == (
        "vllm:fixed_s=0.001,per_seq_s=1e-6", "sglang@0.4")
    assert parse_names("fixed_s=0.001,per_seq_s=1e-6", "--engines", engines=True) == ("fixed_s=0.001,per_seq_s=1e-6",)
    assert parse_names("a,b=1", "--policies") == ("a", "b=1")  # other lists split on every comma


def test_a_row_runs_on_the_profile_of_the_full_release_it_states():
    from blendsim.fidelity.catalogue import engine_release_key, engine_version_key, read_catalogue
    from blendsim.fidelity.suite import SHIPPED_CATALOGUE

    rows = [r for r in read_catalogue(SHIPPED_CATALOGUE) if r.engine == "sglang" and "0.5." in r.engine_version]
    assert rows and {engine_version_key(r) for r in rows} == {"sglang@0.5"}  # tables group by MAJOR.MINOR
    assert {get_profile(engine_release_key(r)).version for r in rows} == {"0.5.3"}  # 0.5.3 and 0.5.5 run on 0.5.3
    vllm = [r for r in read_catalogue(SHIPPED_CATALOGUE) if r.engine == "vllm" and "0.7.3" in r.engine_version]
    assert vllm and {engine_release_key(r) for r in vllm} == {"vllm@0.7"}  # 0.7.3 is priced as 0.7 is: unchanged


def test_sglang_053_reserves_what_its_own_settings_need():
    from blendsim.sim.engines import sglang_053_reserve_gib
    from blendsim.sim.hardware import get_hardware

    # one H100 (80 GiB): 512 MiB + 8,192 x 1.5 MiB + 256 x 2 MiB + 1/8 GiB = 13.1 GiB
    assert sglang_053_reserve_gib(80, 1, 1, 0, 8192, 256) == pytest.approx(13440 / 1024)
    assert sglang_053_reserve_gib(40, 1, 1, 0, 4096, 32) == pytest.approx((512 + 6144 + 64 + 128) / 1024)  # no floor
    assert sglang_053_reserve_gib(80, 8, 1, 8, 8192, 512) > 30  # attention DP over 8 ranks reserves ~18 GiB more
    p = get_profile("sglang@0.5.3")
    assert p.scheduler_for(get_hardware("h100-80gb"), tp=1)["gpu_memory_utilization"] == pytest.approx(0.836, abs=1e-3)
    assert get_profile("sglang@0.5").scheduler_for(get_hardware("h100-80gb"), tp=1)["gpu_memory_utilization"] == \
        pytest.approx(0.875, abs=1e-3)  # 0.5.0-0.5.2's rule


@pytest.mark.parametrize("key, profile", [("trtllm@1", "trtllm@1.0"), ("trtllm@v1", "trtllm@1.0"),
                                          ("trtllm@1.0.0", "trtllm@1.0"), ("trtllm@0.20", "trtllm@0.19"),
                                          ("vllm@0.6.0", "vllm@0.6"), ("sglang@0.5.2", "sglang@0.5")])
def test_a_version_with_fewer_places_is_that_release_with_zeros(key, profile):
    """Review of 1 Dec 2026 (second): ``trtllm@1`` was priced by trtllm@0.19, since the tuple (1,) sorts before 1.0's
    (1, 0)."""
    p = get_profile(key, {})
    assert f"{p.name}@{p.version}" == profile
    from blendsim.sim.engines import next_release

    assert next_release("trtllm", "1") == ""
