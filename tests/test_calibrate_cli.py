"""``blendsim calibrate`` end to end on the CPU: the quick tiny-model run, held-out accuracy, ``show``,
the profile in ``blendsim cost``, and every user error ending in one line and exit code 2."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from blendsim.calibrate.fit import refit
from blendsim.calibrate.run import CalibrationConfig, Calibrator, shard_deployment
from blendsim.calibrate.validate import holdout_errors, predict, summary, validate
from blendsim.cli import get_app
from blendsim.sim.models import get_model
from blendsim.sim.profile import ProfileTimer, load_profile
from tests.helpers import one_line_error

# an earlier profile of the user's (what -o may replace): a failed run must keep it as it was
PRECIOUS = '{"schema": "blendsim.profile", "precious": true}'


def run(*args: str):
    return CliRunner().invoke(get_app(), list(args))


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One quick CPU calibration of the tiny model, with 8 held-out points per operator."""
    out = tmp_path_factory.mktemp("cal") / "p.json"
    r = run("calibrate", "--device", "cpu", "--model", "tiny", "--quick", "--holdout", "8", "-o", str(out))
    assert r.exit_code == 0, r.output
    return out, r


def test_quick_cpu_calibration_writes_a_complete_profile(quick):
    """Its wall time (2 minutes on 2 cores) is a benchmark's figure: benchmarks/bench_calibrate.py."""
    out, r = quick
    p = load_profile(out)
    assert (p.model, p.dtype, p.tp) == ("tiny", "fp32", 1)
    expected = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head", "norm", "rope", "act", "kv_write",
                "embedding", "attn_prefill", "attn_decode"}
    assert set(p.ops) == expected
    for op, f in p.ops.items():
        assert len(f.grid) == len(f.median_s) == len(f.p10_s) == len(f.p90_s) == f.fit["n_points"] >= 16
        assert all(lo <= m <= hi for lo, m, hi in zip(f.p10_s, f.median_s, f.p90_s)), op
        assert 0 <= f.fit["median_rel_err"] <= f.fit["max_rel_err"]
        assert f.fit["heldout_median_rel_err"] is not None and len(f.fit["holdout"]["grid"]) >= 6
    assert p.device["kind"] == "cpu" and p.device["threads"] == 1
    assert p.software["attention_backend"] == "torch_sdpa" and p.software["torch"] == torch.__version__
    assert p.interference is None and p.overlap is None
    assert any(s["op"] == "overlap" and "no CUDA streams" in s["reason"] for s in p.skipped)
    assert p.hardware["mem_bandwidth"] > 1e8 and p.hardware["peak_flops"] > 1e8
    assert p.produced_by["quick"] is True and "--quick" in p.produced_by["command"]
    assert "qkv_proj" in r.stdout and "wrote" in r.stdout


def test_heldout_points_predicted_within_ten_percent(quick):
    """Off-grid points, timed in the calibration's own sweeps but kept out of its fit, against the cost
    model (ProfileTimer with engine-built features): median relative error under 10%."""
    out, _ = quick
    p = load_profile(out)
    res = holdout_errors(p, get_model("tiny"))
    s = summary(res)
    assert s["n_points"] >= 12 * 6
    assert s["all"] < 0.10, s
    for op, e in s["per_op"].items():  # no operator off by a factor (wrong units, shapes or variables)
        assert e < 0.5, (op, s["per_op"])
    # the points are really off the fitting grid and inside its domain
    for op, r in res.items():
        f = p.ops[op]
        grid = {tuple(g) for g in f.grid}
        for pt in r["points"]:
            assert tuple(pt) not in grid
            assert all(lo <= v <= hi for v, (lo, hi) in zip(pt, f.domain))


def test_fresh_measurements_agree_with_the_profile(quick):
    """Points timed now, after the run, follow the profile's shape. A shared host's speed drifts between
    runs by a common factor (other processes take the cores), so the check divides that factor out:
    the machine is the same within 2x, and relative to it each point is predicted within 15% (median)."""
    out, _ = quick
    p = load_profile(out)
    # a burst of other work on the shared host skews one measurement (a clean-clone CI run of 1 Dec 2026: 16.5%):
    # timed again once, as calibrate's own passes re-time a point, before the shape is held against the profile
    for _ in range(2):
        res = validate(p, get_model("tiny"), "cpu", n_points=5, seed=7, passes=2,
                       ops={"qkv_proj", "down_proj", "norm", "attn_decode", "attn_prefill"})
        assert summary(res)["n_points"] >= 20
        ratio = np.concatenate([np.asarray(r["measured_s"]) / np.asarray(r["predicted_s"]) for r in res.values()])
        common = float(np.median(ratio))
        spread = float(np.median(np.abs(ratio / common - 1)))
        if 0.5 < common < 2.0 and spread < 0.15:
            break
    assert 0.5 < common < 2.0, common
    assert spread < 0.15, (common, ratio)


def test_refit_from_the_file_reproduces_every_fit(quick):
    p = load_profile(quick[0])
    again = refit(p)
    for op, f in p.ops.items():
        g = again.ops[op]
        assert g.terms == f.terms and g.fit["form"] == f.fit["form"], op
        np.testing.assert_allclose(g.coef, f.coef, rtol=1e-8, atol=0, err_msg=op)


def test_show_prints_device_fit_errors_and_coverage(quick):
    r = run("calibrate", "show", str(quick[0]))
    assert r.exit_code == 0, r.output
    out = r.stdout
    for s in ("tiny fp32 tp=1", "device: cpu", "torch_sdpa", "Fit quality", "Coverage", "k-fold", "holdout",
              "tokens 1..1024", "batch 1..48", "context 0..1536", "attn_decode", "lm_head", "allreduce",
              "overlap interference: not measured", "measured peaks", "HardwareSpec fields they imply",
              "mem_bandwidth=", "peak_flops_fp32="):
        assert s in out, s


def test_measured_peaks_fill_a_hardware_spec(quick):
    from blendsim.calibrate.report import hardware_fields
    from blendsim.sim.hardware import HardwareSpec

    p = load_profile(quick[0])
    fields = hardware_fields(p)
    assert fields["mem_bandwidth"] == p.hardware["mem_bandwidth"] and fields["peak_flops_fp32"] == p.hardware["peak_flops"]
    hw = HardwareSpec("measured", peak_flops=16 * fields["peak_flops_fp32"], **fields)
    assert hw.flops_for("fp32") == p.hardware["peak_flops"] and hw.memory_bytes == p.device["memory_bytes"] > 0


def test_a_profile_timed_on_the_cpu_is_refused_on_a_gpu(quick):
    """A CPU's own name (an EPYC) maps to no GPU preset: the profile is the cpu preset's, refused elsewhere (was:
    CPU kernel times priced an A100's step, 32x too slow)."""
    r = run("cost", "--model", "tiny", "--hardware", "a100-80gb", "--profile", str(quick[0]), "--decode-seqs", "4")
    assert r.exit_code == 2 and "(the cpu preset), but the run is on a100-80gb" in r.output, r.output


def test_cost_command_uses_the_profile(quick):
    out = quick[0]
    r = run("cost", "--model", "tiny", "--hardware", "cpu", "--profile", str(out), "--prefill-tokens", "64", "--json")
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["cost_model"] == "profile" and res["step_time_s"] > 0
    p = load_profile(out)
    timer = ProfileTimer(p, shard_deployment(get_model("tiny"), 1))
    ops = {row["op"]: row["time_s"] for row in res["per_layer"] + res["whole_model"]}
    assert ops["qkv_proj"] == pytest.approx(predict(timer, "qkv_proj", (64,)), rel=1e-12)
    assert ops["attn_prefill"] == pytest.approx(predict(timer, "attn_prefill", (64, 0)), rel=1e-12)


def test_profile_for_another_dtype_or_model_is_refused(quick):
    out = str(quick[0])
    one_line_error(run("cost", "--model", "tiny", "--hardware", "cpu", "--dtype", "bf16", "--profile", out,
                       "--prefill-tokens", "64", "--json"), "dtype fp32", "bf16")
    one_line_error(run("cost", "--model", "llama-3-8b", "--hardware", "a100-80gb", "--profile", out,
                       "--prefill-tokens", "64"), "fitted for model 'tiny'", "hidden_size 512 vs 4096")


# ---- bad input ----------------------------------------------------------------------------
@pytest.mark.parametrize("content, needle", [
    ("{\"schema\": \"blendsim.profile\", \"schema_version\": 1, \"model\": ", "corrupt profile"),
    ("\x00\x01 not json", "corrupt profile"),
    ("{\"hello\": 1}", "not a blendsim profile"),
    # an engine profile of `calibrate engine -o` where a kernel profile is asked for: where it goes instead
    ("{\"profile\": {\"kind\": \"blendsim-engine-profile\", \"engine\": \"vllm@0.10\"}}",
     "an engine profile (blendsim calibrate engine), not a kernel profile: pass it as --engine"),
    ("{\"schema\": \"blendsim.profile\", \"schema_version\": 9, \"model\": \"m\", \"dtype\": \"fp32\", \"tp\": 1, "
     "\"ops\": {}}", "schema version 9"),
])
def test_corrupt_or_foreign_profiles_are_refused(tmp_path, content, needle):
    path = tmp_path / "bad.json"
    path.write_text(content)
    one_line_error(run("calibrate", "show", str(path)), str(path), needle)
    one_line_error(run("cost", "--model", "tiny", "--hardware", "cpu", "--profile", str(path),
                       "--decode-seqs", "4", "--context", "100"), needle)


def test_missing_profile_file(tmp_path):
    one_line_error(run("calibrate", "show", str(tmp_path / "nope.json")), "no such profile")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_gpu_is_one_line_and_keeps_the_old_output(tmp_path):
    out = tmp_path / "p.json"
    out.write_text(PRECIOUS)
    one_line_error(run("calibrate", "--device", "cuda", "--model", "tiny", "-o", str(out)), "--device cuda",
                   "no GPU")
    assert out.read_text() == PRECIOUS


@pytest.mark.parametrize("args, needle", [
    # only what is missing is named (was: "give --model and -o/--out" to a user who gave --model)
    (["--model", "tiny"], "calibrate: give -o/--out (the profile JSON to write) (or a subcommand"),
    (["--device", "cpu"], "calibrate: give --model (a preset or a config.json) (or a subcommand"),
    (["--device", "tpu", "--model", "tiny"], "--device 'tpu'"),
    (["--device", "cpu", "--model", "tiny", "--dtype", "fp8"], "--dtype fp8"),
    (["--device", "cpu", "--model", "no-such-model"], "unknown model"),
    (["--device", "cpu", "--model", "tiny", "--tp", "3"], "--tp 3"),
    (["--device", "cpu", "--model", "tiny", "--holdout", "-1"], "--holdout"),
])
def test_bad_calibrate_options(tmp_path, args, needle):
    out = tmp_path / "p.json"
    out.write_text(PRECIOUS)
    cmd = ["calibrate", *args] + (["-o", str(out)] if "give -o" not in needle else [])
    one_line_error(run(*cmd), needle)
    assert out.read_text() == PRECIOUS


def test_output_that_is_a_folder_is_refused_before_any_work(tmp_path):
    one_line_error(run("calibrate", "--device", "cpu", "--model", "tiny", "-o", str(tmp_path)), "is a folder")


def test_oom_point_during_a_run_is_skipped_and_recorded(monkeypatch, tmp_path):
    """A grid point that runs out of memory is listed in ``skipped``; the run and the fit go on."""
    from blendsim.calibrate import forward

    cal = Calibrator(CalibrationConfig(model="tiny", device="cpu", quick=True))
    cal.plan = {"o_proj": [(t,) for t in (1, 4, 16, 64, 256, 1024)], "attn_decode": [(1, 16), (4, 64), (12, 256)]}
    cal.holdout = {op: [] for op in cal.plan}
    real = forward.ForwardProbe.tokens

    def tokens(self, t, logits=1, keep=forward.TOKEN_OPS):
        if t == 1024:
            raise RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 1099511627776 bytes")
        return real(self, t, logits, keep)

    monkeypatch.setattr(forward.ForwardProbe, "tokens", tokens)
    steps = []
    p = cal.run(advance=steps.append)
    assert len(steps) == cal.total_steps()  # the progress bar reaches its end
    assert set(p.ops) == {"o_proj", "attn_decode"}
    assert p.ops["o_proj"].domain == [[1.0, 256.0]] and len(p.ops["o_proj"].grid) == 5
    oom = [s for s in p.skipped if s["op"] == "o_proj"]
    assert oom and oom[0]["point"] == [1024] and "out of memory" in oom[0]["reason"]
    p.save(tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json").skipped == p.skipped


@pytest.mark.parametrize("mode", ["sequential", "overlap"])
def test_runs_priced_by_a_calibration_profile_stay_above_their_t_o(quick, mode):
    """Issue 28: T_o is a bound for fitted profiles too (their attention fits count 0 in it; docs/DESIGN.md)."""
    import numpy as np

    from blendsim.runner import RunConfig, run_simulation
    from tests.helpers import random_trace

    out, _ = quick
    for seed in range(3):
        trace = random_trace(np.random.default_rng(seed), n=30)
        for policy in ("fcfs", "dfs"):
            s = run_simulation(trace, RunConfig(policy=policy, model="tiny", hardware="cpu", profile=str(out),
                                                mode=mode)).summary
            assert s["t_opt_exact"] and 0 < s["frac_of_opt"] <= 1 + 1e-9, (seed, policy, s["frac_of_opt"])
