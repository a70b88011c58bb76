"""An API server's own work beside the engine (``EngineProfile.server_s``: Triton in front of TensorRT-LLM 0.8-era):
it paces a served run's steps, prices the same in the simulator, the cost command and the fidelity pricer, and is
fitted from served rows only."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.fidelity.catalogue import build_workload, read_catalogue, row_engine_key
from blendsim.fidelity.fit import _reads, fit, free_params, predict
from blendsim.fidelity.runner import simulate_row
from blendsim.fidelity.suite import load_suite, prepare_row
from blendsim.sim.batch import FEATURE_FIELDS, BatchFeatures
from blendsim.sim.build_cost import build_cost_model
from blendsim.sim.deployment import make_deployment
from blendsim.sim.engines import get_profile, overhead_keys
from blendsim.sim.errors import UserError
from blendsim.sim.paramfile import check_params
from tests.test_fidelity import _row, _write

TRITON = "TensorRT-LLM v0.10 (Triton Inference Server r24.06 with the TensorRT-LLM backend)"
SLOW_SERVER = {"engine": {"trtllm@0.8:server": {"token_s": 400e-6, "request_s": 20e-3}}}


def test_the_server_stage_is_triton_s_and_only_behind_the_server():
    served = get_profile("trtllm@0.8:serve=1", SLOW_SERVER)
    assert served.server_apart and served.server_key == "trtllm@0.8:server"
    assert (served.server_token_s, served.server_request_s) == (400e-6, 20e-3)  # read under their short names
    # 100 sampled tokens, 98 of them decodes: two requests' prompts finished (each request once, however chunked)
    assert served.server_s(100, 98) == pytest.approx(100 * 400e-6 + 2 * 20e-3)
    offline = get_profile("trtllm@0.8", SLOW_SERVER)
    assert not offline.server_apart and offline.server_s(100, 98) == 0.0
    # later releases' servers are not measured by any row: no stage beside the engine from the params file (the
    # key's own server_token_s gives one, below)
    assert not get_profile("trtllm@1.0:serve=1", SLOW_SERVER).server_apart
    # the shared C++ loop stays shared: the served profile's loop is the offline one's
    loop = {"engine": {"trtllm": {"fixed_s": 1e-3, "per_seq_s": 3e-6}, **SLOW_SERVER["engine"]}}
    a, b = get_profile("trtllm@0.8:serve=1", loop), get_profile("trtllm@0.8", loop)
    assert (a.fixed_s, a.per_seq_s) == (b.fixed_s, b.per_seq_s) == (1e-3, 3e-6)
    # the user's own figures
    own = get_profile("trtllm@0.8:serve=1,server_token_s=0.001,server_request_s=0", {})
    assert own.server_s(10, 10) == pytest.approx(0.01)
    assert get_profile("vllm:serve=1,server_token_s=0.001", {}).server_s(10, 10) == pytest.approx(0.01)


def test_a_step_lasts_at_least_the_server_s_share_in_every_pricing_path():
    dep = make_deployment("llama-3-8b", "h100-80gb", 1)
    served = build_cost_model(dep, None, get_profile("trtllm@0.8:serve=1", SLOW_SERVER))
    plain = build_cost_model(dep, None, get_profile("trtllm@0.8", SLOW_SERVER))
    ctx = np.array([256 * 500.0, 256 * 900.0])
    t_plain, *_ = plain.decode_many(256, ctx)
    t_served, *_ = served.decode_many(256, ctx)
    np.testing.assert_allclose(t_served, np.maximum(t_plain, 256 * 400e-6))
    assert (t_served > t_plain).all()  # 102 ms of streaming against an engine step of ~17 ms
    # step (the engine's fast path), cost (exact) and cost_many (vectorised) agree, a prefill included
    f = BatchFeatures.from_parts([(0, 300, 0, 0), (1, 200, 0, 0)], 64, 64 * 700, 66)
    t, _c, _m = served.step(564, 500, 2, 300 * 301 // 2 + 200 * 201 // 2, 0, 64, 64 * 700, 66)
    sc = served.cost(f)
    # a chunk that does not finish its prompt samples no token and starts no response: only finished prompts count
    assert sc.time_s == pytest.approx(t, rel=1e-9) and sc.server_s == pytest.approx(66 * 400e-6 + 2 * 20e-3)
    part = BatchFeatures.from_parts([(0, 300, 0, 0), (1, 200, 0, 0)], 64, 64 * 700, 65)  # one prompt goes on
    assert served.cost(part).server_s == pytest.approx(65 * 400e-6 + 1 * 20e-3)
    assert sc.time_s == pytest.approx(max(plain.cost(f).time_s, sc.server_s))
    many = served.cost_many(BatchFeatures(**{k: np.array([getattr(f, k)] * 2) for k in FEATURE_FIELDS}))
    np.testing.assert_allclose(many["time_s"], sc.time_s, rtol=1e-9)


def test_the_cost_command_says_when_the_server_sets_the_step():
    args = ["cost", "-m", "llama-3-8b", "--hardware", "h100-80gb", "--decode-seqs", "256", "--context", "500"]
    served = CliRunner().invoke(get_app(), [*args, "--engine", "trtllm@0.8:serve=1,server_token_s=4e-4"])
    assert served.exit_code == 0, served.output
    assert "step 102.400 ms: the API server's own work" in " ".join(served.stdout.split())
    # set off the server, the field changes nothing, and says so
    offline = CliRunner().invoke(get_app(), [*args, "--engine", "trtllm@0.8:server_token_s=4e-4"])
    assert offline.exit_code == 0 and "API server" not in offline.stdout
    assert "server_token_s is the API server's work and this run is offline (serve=0): it changes nothing" in \
        " ".join(offline.stderr.split())
    # pipelined: the server paces the pipe beside the stages, not in series with them
    pp = CliRunner().invoke(get_app(), ["cost", "-m", "llama-3-70b", "--hardware", "h100-80gb", "--tp", "4", "--pp",
                                        "2", "--decode-seqs", "256", "--context", "500", "--json", "--engine",
                                        "trtllm@0.8:serve=1,server_token_s=4e-4,server_request_s=0"])
    out = json.loads(pp.stdout)
    stages = [st["step_time_s"] for st in out["stages"]]
    assert out["server_s"] == pytest.approx(0.1024) and out["server_s"] > max(stages)
    assert out["pipe_full_step_s"] == pytest.approx(0.1024)
    assert out["one_batch_in_flight_s"] == pytest.approx(max(sum(stages) + sum(out["handoff_s"]), 0.1024))


def test_a_served_row_is_priced_as_it_is_simulated(tmp_path):
    # the fidelity pricer's max(engine step, server share) is the simulator's, at any parameters
    cat = _write(tmp_path, [_row(workload="const:300/200", requests=300, engine_version=TRITON)])
    row = read_catalogue(cat)[0]
    assert row_engine_key(row) == "trtllm@0.10:serve=1"  # TRITON says "Server": behind it (0.10: trtllm@0.8's)
    a = simulate_row(row, build_workload(row), {})
    b = simulate_row(row, build_workload(row), SLOW_SERVER)
    assert b.makespan_s > 2 * a.makespan_s  # 200 tokens x 400 us + 20 ms a request: the server sets the pace
    pr = prepare_row(row, {})
    assert pr.makespan({}) == pytest.approx(a.makespan_s, rel=1e-9)
    assert pr.makespan(SLOW_SERVER) == pytest.approx(b.makespan_s, rel=1e-9)
    # the fit frees the server stage for this row only: an offline row of the same engine does not read it
    offline = prepare_row(read_catalogue(_write(tmp_path, [_row()], "off.csv"))[0], {})
    names = {p.name: p for p in free_params([(row, pr.compressed()), (None, offline.compressed())])}
    p = names["engine.trtllm@0.8:server.token_s"]
    assert "engine.trtllm@0.8:server.request_s" in names and (p.lo, p.prior) == (0.0, 100e-6)
    assert _reads(pr, p) and not _reads(offline, p)


def test_fit_recovers_the_server_stage_from_served_rows(tmp_path):
    truth = {"engine": {"trtllm@0.8:server": {"token_s": 250e-6, "request_s": 15e-3}}}
    rows = [_row(id=f"{i}x{o}", workload=f"const:{i}/{o}", requests=n, engine_version=TRITON)
            for i, o, n in ((128, 128, 400), (512, 512, 200), (128, 1024, 150), (2048, 64, 300), (128, 16, 600))]
    suite = load_suite(_write(tmp_path, rows), {})
    measured = {r.id: predict(r, pr, truth) for r, pr in suite.ok}
    relabelled = [(dataclasses.replace(r, value=measured[r.id]), pr) for r, pr in suite.ok]
    fitted = fit(relabelled, base={}, select=lambda p: p.path[1] == "trtllm@0.8:server")
    got = fitted["engine"]["trtllm@0.8:server"]
    assert got["token_s"] == pytest.approx(250e-6, rel=0.05)
    assert got["request_s"] == pytest.approx(15e-3, rel=0.1)


@pytest.mark.parametrize("engine,field,message", [
    ("trtllm", "token_s", "parameters are fixed_s, per_seq_s, per_token_s"),
    ("trtllm@0.8:server", "fixed_s", "parameters are token_s, request_s"),
])
def test_a_params_file_keeps_loop_and_server_fields_apart(engine, field, message):
    assert "trtllm@0.8:server" in overhead_keys()
    with pytest.raises(UserError, match=f"f.json: field engine.{engine}.{field}: unknown parameter; {message}"):
        check_params({"engine": {engine: {field: 1e-4}}}, "f.json", overhead_keys())


def test_every_command_taking_an_engine_names_every_field_a_key_may_set():
    from blendsim.cli.run import ENGINE_FIELDS_HELP
    from blendsim.sim.engines import OVERRIDABLE

    assert all(k in ENGINE_FIELDS_HELP for k in OVERRIDABLE)
    for cmd in ("simulate", "cost", "sweep"):
        text = " ".join(CliRunner().invoke(get_app(), [cmd, "--help"], env={"COLUMNS": "200"}).stdout.split())
        assert "server_token_s and server_request_s" in text and "async_scheduling" in text, cmd


def test_vllm_v1s_api_server_is_a_stage_of_its_own_behind_the_server():
    # V1's API server is a process apart from EngineCore: its per-token and per-request work paces a served run
    # (fitted under vllm@0.8:server; the prior without a params file), never an offline one; V0's server shared the
    # engine's process and is priced in its loop (api_share) instead
    fitted = {"engine": {"vllm@0.8:server": {"token_s": 150e-6, "request_s": 7e-3}}}
    served = get_profile("vllm@0.10:serve=1", fitted)
    assert served.server_apart and served.server_key == "vllm@0.8:server"
    assert served.server_s(100, 98) == pytest.approx(100 * 150e-6 + 2 * 7e-3)
    prior = get_profile("vllm:serve=1", {})
    assert (prior.server_token_s, prior.server_request_s) == (100e-6, 5e-3)
    assert not get_profile("vllm@0.10", fitted).server_apart  # offline
    assert not get_profile("vllm@0.5:serve=1", fitted).server_apart and get_profile("vllm@0.5:serve=1").api_share > 0
