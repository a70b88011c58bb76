"""Each engine version's CPU loop is its own fitted parameter (``EngineProfile.overhead_key``)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from blendsim.fidelity.catalogue import read_catalogue
from blendsim.fidelity.fit import fit, free_params, predict
from blendsim.fidelity.suite import SHIPPED_CATALOGUE, prepare_row
from blendsim.sim.engines import VERSIONS, get_profile, load_params, overhead_keys
from blendsim.sim.errors import UserError


def test_each_version_has_its_own_key_and_trtllm_shares_one():
    assert get_profile("vllm@0.6", {}).overhead_key == "vllm@0.6"
    assert get_profile("vllm@0.10", {}).overhead_key == "vllm@0.8"  # priced by the 0.8 profile
    assert get_profile("vllm", {}).overhead_key == "vllm@0.8"  # the newest
    assert get_profile("vllm-v0@0.6", {}).overhead_key == "vllm@0.6"  # the same loop as vllm@0.6
    assert {get_profile(k, {}).overhead_key for k in ("trtllm@0.8", "trtllm@0.13", "trtllm@1.0")} == {"trtllm"}
    assert get_profile("nanoflow", {}).overhead_key == "nanoflow"


def test_a_versions_fitted_overhead_prices_that_version_only():
    params = {"engine": {"vllm@0.6": {"fixed_s": 4e-3, "per_seq_s": 50e-6}}}
    assert get_profile("vllm@0.6", params).fixed_s == 4e-3
    assert get_profile("vllm@0.8", params).fixed_s == VERSIONS[("vllm", "0.8")].fixed_s
    # a file keyed by the name alone (older files, a calibration of the name) prices every version of it
    named = {"engine": {"vllm": {"fixed_s": 3e-3}}}
    assert get_profile("vllm@0.6", named).fixed_s == get_profile("vllm@0.8", named).fixed_s == 3e-3
    # the version's own key wins over the name's
    both = {"engine": {"vllm": {"fixed_s": 3e-3}, "vllm@0.6": {"fixed_s": 1e-3}}}
    assert get_profile("vllm@0.6", both).fixed_s == 1e-3 and get_profile("vllm@0.8", both).fixed_s == 3e-3


def test_behind_its_api_server_an_engine_runs_its_served_loop_and_offline_its_own():
    params = {"engine": {"vllm@0.8": {"fixed_s": 1e-4, "per_seq_s": 1e-6},
                         "vllm@0.8:serve": {"fixed_s": 2e-4, "per_seq_s": 9e-6}}}
    off, on = get_profile("vllm@0.8", params), get_profile("vllm@0.8:serve=1", params)
    assert (off.overhead_key, off.fixed_s, off.per_seq_s) == ("vllm@0.8", 1e-4, 1e-6)
    assert (on.overhead_key, on.fixed_s, on.per_seq_s) == ("vllm@0.8:serve", 2e-4, 9e-6)
    # no served fit: the offline loop prices the served run too; vLLM 0.5 (server in the engine's process) has one loop
    assert get_profile("vllm@0.8:serve=1", {"engine": {"vllm@0.8": {"fixed_s": 1e-4}}}).fixed_s == 1e-4
    assert get_profile("vllm@0.5:serve=1", {}).overhead_key == "vllm@0.5"
    assert "vllm@0.8:serve" in overhead_keys() and "vllm@0.5:serve" not in overhead_keys()


def test_a_params_file_names_a_version_it_does_not_model_in_one_line(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"engine": {"sglang@0.3": {"fixed_s": 1e-3}}}))
    assert load_params(good)["engine"]["sglang@0.3"]["fixed_s"] == 1e-3
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"engine": {"vllm@9.9": {"fixed_s": 1e-3}}}))
    with pytest.raises(UserError, match=r"field engine\.vllm@9\.9: unknown engine profile.*vllm@0\.6"):
        load_params(bad)


def _freed(pr):
    """The pricer (and its compressed copy, which the fit reads) with the overhead free, as calibrate engine does."""
    prof = dataclasses.replace(pr.profile, fitted=("fixed_s", "per_seq_s"), served_loop=False)
    pr.profile = pr.compressed().profile = prof
    return pr


@pytest.fixture(scope="module")
def two_versions():
    rows = {r.id: r for r in read_catalogue(SHIPPED_CATALOGUE)}
    ids = ["vllm-0.6.0-blog-llama-3-8b-a100-80gb-tp1-decode", "sglang-0.3.0-blog-llama-3-8b-a100-80gb-tp1-decode"]
    return [(rows[i], prepare_row(rows[i], {})) for i in ids]


def test_the_fit_frees_each_versions_loop_and_a_row_reads_only_its_own(two_versions):
    # the shipped profiles fit the loops of TensorRT-LLM, vLLM 0.5, 0.6 and V1 and SGLang 0.3, each under its version;
    # calibrate engine frees any engine's the same way
    loops = {f"engine.{v}.{n}" for v in ("vllm@0.6", "sglang@0.3") for n in ("fixed_s", "per_seq_s")}
    assert {p.name for p in free_params(two_versions) if p.path[0] == "engine"} == loops
    names = {p.name for p in free_params([(r, _freed(p)) for r, p in two_versions])}
    assert {"engine.vllm@0.6.fixed_s", "engine.vllm@0.6.per_seq_s",
            "engine.sglang@0.3.fixed_s", "engine.sglang@0.3.per_seq_s"} <= names
    (vr, vp), (sr, sp) = two_versions
    base = {"engine": {"vllm@0.6": {"fixed_s": 1e-3}, "sglang@0.3": {"fixed_s": 1e-3}}}
    slower = {"engine": {"vllm@0.6": {"fixed_s": 4e-3}, "sglang@0.3": {"fixed_s": 1e-3}}}
    assert predict(vr, vp, slower) < predict(vr, vp, base)  # vLLM 0.6's row reads its own loop
    assert predict(sr, sp, slower) == predict(sr, sp, base)  # SGLang 0.3's does not read vLLM's


def test_fitting_one_versions_rows_moves_only_that_versions_loop(two_versions):
    (vr, vp), _ = two_versions
    out = fit([(vr, _freed(vp))], base={}, select=lambda p: p.path[0] == "engine")
    assert set(out["engine"]) == {"vllm@0.6"}
    # the bound is five times the prior where that is above the generic 20 us: vllm@0.6's 3.6 us gives 18 us, so 20 us;
    # vllm@0.5's 36 us gives 180 us
    assert out["bounds"]["engine.vllm@0.6.per_seq_s"] == [0.0, pytest.approx(20e-6)]
    slow = _freed(prepare_row(dataclasses.replace(vr, id="v05", engine_version="0.5.3"), {}))
    assert slow.profile.overhead_key == "vllm@0.5"
    (p05,) = [p for p in free_params([(vr, slow)]) if p.name == "engine.vllm@0.5.per_seq_s"]
    assert (p05.prior, p05.hi) == (36e-6, pytest.approx(180e-6))


def test_v1s_offline_loop_keeps_its_prior_in_the_catalogue_fit_and_its_served_loop_is_fitted(tmp_path):
    """vLLM V1's only offline rows are ROCm's MI300X runs, which cannot tell the loop from the paged-attention rate:
    the catalogue fit frees V1's loop behind the API server only (EngineProfile.fit_offline); `calibrate engine`
    frees it on a user's own offline runs."""
    from blendsim.fidelity.suite import load_suite
    from tests.test_fidelity import _row, _write

    rows = [_row(id="off", engine="vllm", engine_version="vLLM v0.10.0", workload="const:512/64", requests=64),
            _row(id="srv", engine="vllm", engine_version="vLLM v0.10.0; vllm serve X", workload="const:512/64",
                 requests=64)]
    s = load_suite(_write(tmp_path, rows), {})
    (off, poff), (srv, psrv) = s.ok
    assert (poff.profile.overhead_key, psrv.profile.overhead_key) == ("vllm@0.8", "vllm@0.8:serve")
    assert not [p for p in free_params([(off, poff)]) if p.path[0] == "engine"]
    assert {p.name for p in free_params([(srv, psrv)]) if p.path[0] == "engine"} == {
        "engine.vllm@0.8:serve.fixed_s", "engine.vllm@0.8:serve.per_seq_s",  # its served loop, and beside it
        "engine.vllm@0.8:server.token_s", "engine.vllm@0.8:server.request_s"}  # its API server's own stage
    freed = dataclasses.replace(poff.profile, fitted=("fixed_s", "per_seq_s"), served_loop=False, fit_offline=True)
    poff.profile = poff.compressed().profile = freed  # as calibrate engine frees it
    assert {p.name for p in free_params([(off, poff)]) if p.path[0] == "engine"} == {
        "engine.vllm@0.8.fixed_s", "engine.vllm@0.8.per_seq_s"}
    # and an offline V1 prediction is priced by the cited prior, whatever the shipped file
    shipped = get_profile("vllm@0.8", load_params())
    assert (shipped.fixed_s, shipped.per_seq_s) == (0.2e-3, 1.2e-6)
