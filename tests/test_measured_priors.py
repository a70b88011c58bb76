"""Efficiency ranges measured on a lent GPU (sim.efficiency.MEASURED) or in published kernel benchmarks
(PUBLISHED): the fitter uses them for that architecture only, a fit cannot leave them, and the lent GPU's ranges
bracket what the GPU day's profiles measured."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import blendsim.fidelity.fit as F
from blendsim.fidelity.suite import load_suite
from blendsim.sim.efficiency import BOUNDS, MEASURED, MEASURED_SOURCE, measured
from tests.test_fidelity import _row, _write

DAY = Path(__file__).resolve().parents[1] / MEASURED_SOURCE
RUNS = ("run1-cudnn", "run2-no-cudnn")
PEAK, HBM = 989.4e12, 4.8e12  # the h200 preset's dense BF16 peak and bandwidth (sim.hardware)


def _gemm_points(folder: Path):
    """(op, tokens, seconds, flops, bytes) of llama-3-8b's layer GEMMs in the profile of a GPU day's run folder
    (raw medians)."""
    p = json.loads((folder / "profile.json").read_text())
    s = p["model_shape"]
    h, q, kv, i = s["hidden_size"], s["num_heads"] * s["head_dim"], s["num_kv_heads"] * s["head_dim"], \
        s["intermediate_size"]
    shapes = {"qkv_proj": (h, q + 2 * kv), "o_proj": (q, h), "gate_up_proj": (h, 2 * i), "down_proj": (i, h)}
    for op, (k, n) in shapes.items():
        o = p["ops"][op]
        for (t,), sec in zip(o["grid"], o["median_s"], strict=True):
            yield op, t, sec, 2 * t * k * n, 2 * k * n + 2 * t * (k + n)


@pytest.mark.parametrize("run", RUNS)
def test_hopper_ranges_bracket_the_h200_measurements(run):
    g_lo, g_hi, g_prior = measured("hopper", "gemm_eff")
    m_lo, m_hi, m_prior = measured("hopper", "mem_eff")
    big = [f / s / PEAK for op, t, s, f, _b in _gemm_points(DAY / run) if t >= 2048]
    assert big and g_lo <= min(big) and max(big) <= g_hi
    assert g_lo < g_prior < g_hi
    # weight streaming at decode sizes of the two largest layer GEMMs (qkv/o_proj are host-bound there)
    # (each operator's median over the grid: the cuDNN run's host-bound steps scatter single points)
    small = [float(np.median([b / s / HBM for o, t, s, _f, b in _gemm_points(DAY / run) if t <= 128 and o == op]))
             for op in ("gate_up_proj", "down_proj")]
    assert m_lo <= min(small) and max(small) <= m_hi
    copy = json.loads((DAY / run / "profile.json").read_text())["hardware"]["mem_bandwidth"] / HBM
    assert copy == pytest.approx(m_hi, abs=0.015)  # the ceiling is the day's copy bandwidth
    assert m_lo < m_prior < m_hi


def test_measured_ranges_are_within_the_generic_bounds():
    for arch, names in MEASURED.items():
        for name, (lo, hi, prior) in names.items():
            assert BOUNDS[name][0] <= lo < prior < hi <= BOUNDS[name][1], (arch, name)


ROWS = [
    _row(id="h-1", source="doc A", workload="const:512/256", requests=100, value=200),
    _row(id="h-2", source="doc A", workload="const:128/512", requests=100, value=150),
    _row(id="a-1", source="doc B", hardware="a100-80gb", workload="const:512/256", requests=100, value=100),
]


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    return load_suite(_write(tmp_path_factory.mktemp("cat"), ROWS), {})


def test_the_fitter_uses_measured_ranges_only_where_measured(suite):
    ps = {p.name: p for p in F.free_params(suite.ok)}
    hop, amp = ps["arch.hopper.gemm_eff"], ps["arch.ampere.gemm_eff"]
    assert (hop.lo, hop.hi, hop.prior) == MEASURED["hopper"]["gemm_eff"]
    assert (amp.lo, amp.hi) == BOUNDS["gemm_eff"] and amp.prior == pytest.approx(0.70)
    assert (ps["arch.hopper.mem_eff"].lo, ps["arch.hopper.mem_eff"].hi) == MEASURED["hopper"]["mem_eff"][:2]
    assert (ps["arch.hopper.attn_mem_eff"].lo, ps["arch.hopper.attn_mem_eff"].hi) == BOUNDS["attn_mem_eff"]


def test_a_fit_that_wants_slower_gemms_stops_at_the_measured_floor(suite):
    # measurements far below what any efficiency in range gives: plain least squares pushes every efficiency down,
    # and Hopper's GEMM efficiency stops at the measured floor while Ampere's may go to the generic one (the shipped
    # robust loss pulls less on rows this far off: test_fit_robust_loss.py)
    out = F.fit(suite.ok, loss="linear")
    lo = MEASURED["hopper"]["gemm_eff"][0]
    assert out["arch"]["hopper"]["gemm_eff"] >= lo - 1e-12
    assert out["bounds"]["arch.hopper.gemm_eff"] == list(MEASURED["hopper"]["gemm_eff"][:2])
    assert out["bounds"]["arch.ampere.gemm_eff"] == list(BOUNDS["gemm_eff"])
    assert out["arch"]["hopper"]["gemm_eff"] == pytest.approx(lo, abs=1e-3)


@pytest.mark.parametrize("kind", ["MEASURED", "PUBLISHED"])
def test_the_shipped_parameters_were_fitted_within_the_measured_ranges(kind):
    import blendsim.sim.efficiency as E
    from blendsim.sim.engines import PARAMS_FILE

    params = json.loads(PARAMS_FILE.read_text())
    from blendsim.sim.hardware import PRESETS

    for arch, names in getattr(E, kind).items():
        for name, (lo, hi, prior) in names.items():
            if name not in params["arch"].get(arch, {}):  # no shipped row runs it (MI300X's 16-bit GEMMs): the
                hw = [h for h in PRESETS.values() if h.arch == arch]  # preset carries the prior
                assert name == "gemm_eff" and hw and all(h.compute_efficiency == prior for h in hw), (arch, name)
                continue
            assert params["bounds"][f"arch.{arch}.{name}"] == [lo, hi]
            assert lo <= params["arch"][arch][name] <= hi


def test_params_marks_measured_bounds_only_where_the_file_has_them(tmp_path):
    from typer.testing import CliRunner

    from blendsim.cli import get_app

    lo, hi, _ = MEASURED["hopper"]["gemm_eff"]
    prm = {"arch": {"hopper": {"gemm_eff": lo, "mem_eff": 0.5}, "ampere": {"gemm_eff": 0.25}},
           "bounds": {"arch.hopper.gemm_eff": [lo, hi], "arch.hopper.mem_eff": list(BOUNDS["mem_eff"]),
                      "arch.ampere.gemm_eff": list(BOUNDS["gemm_eff"])}}
    f = tmp_path / "p.json"
    f.write_text(json.dumps(prm))
    res = CliRunner().invoke(get_app(), ["fidelity", "--params", "--params-file", str(f), "--json"])
    assert res.exit_code == 0, res.output
    out = {p["name"]: p for p in json.loads(res.stdout)["params"]}
    assert out["arch.hopper.gemm_eff"]["measured_bounds"] and out["arch.hopper.gemm_eff"]["at_bound"] == "lower"
    assert not out["arch.hopper.mem_eff"]["measured_bounds"]  # generic bounds in this file: not the measured ones
    assert not out["arch.ampere.gemm_eff"]["measured_bounds"] and out["arch.ampere.gemm_eff"]["at_bound"] == "lower"
    text = CliRunner().invoke(get_app(), ["fidelity", "--params", "--params-file", str(f)], env={"COLUMNS": "200"})
    lines = {ln.split()[0]: ln for ln in text.output.splitlines() if ln.startswith("  arch.")}
    assert lines["arch.hopper.gemm_eff"].endswith("AT LOWER BOUND (measured)")
    assert lines["arch.ampere.gemm_eff"].endswith("AT LOWER BOUND")
    assert "(measured): bounds measured on a lent GPU's kernels" in text.output


# ---- ranges from published kernel benchmarks (sim.efficiency.PUBLISHED): the same use as MEASURED -----------

def test_published_ranges_are_within_the_generic_bounds_and_not_measured_twice():
    from blendsim.sim.efficiency import PUBLISHED

    for arch, names in PUBLISHED.items():
        for name, (lo, hi, prior) in names.items():
            assert BOUNDS[name][0] <= lo < prior < hi <= BOUNDS[name][1], (arch, name)
            assert name not in MEASURED.get(arch, {})  # a lent GPU's measurement would take precedence
            assert measured(arch, name) == (lo, hi, prior)


FP8_ROWS = [
    _row(id="f-1", source="doc A", weights="fp8", kv_dtype="fp8", workload="const:2048/128", requests=200,
         value=2000),
    _row(id="f-2", source="doc A", weights="fp8", kv_dtype="fp8", hardware="a100-80gb", workload="const:2048/128",
         requests=200, value=800),
]


@pytest.fixture(scope="module")
def fp8_suite(tmp_path_factory):
    return load_suite(_write(tmp_path_factory.mktemp("fp8"), FP8_ROWS), {})


def test_hoppers_fp8_gemm_efficiency_is_fitted_within_the_published_range_only_on_hopper(fp8_suite):
    from blendsim.sim.efficiency import PUBLISHED

    ps = {p.name: p for p in F.free_params(fp8_suite.ok)}
    hop, amp = ps["arch.hopper.lowp_eff"], ps["arch.ampere.lowp_eff"]
    assert (hop.lo, hop.hi, hop.prior) == PUBLISHED["hopper"]["lowp_eff"]
    assert (amp.lo, amp.hi) == BOUNDS["lowp_eff"]
    # measurements far below what the range allows: Hopper's FP8 efficiency stops at the published floor,
    # Ampere's (no FP8 tensor cores: a weight-only kernel) may go to the generic one
    slow = [(dataclasses.replace(r, value=r.value / 20), p) for r, p in fp8_suite.ok]
    out = F.fit(slow, select=lambda p: p.path[-1] == "lowp_eff")
    assert out["arch"]["hopper"]["lowp_eff"] == pytest.approx(PUBLISHED["hopper"]["lowp_eff"][0], abs=1e-3)
    assert out["arch"]["ampere"]["lowp_eff"] < PUBLISHED["hopper"]["lowp_eff"][0]



H100_DAY = Path(__file__).resolve().parents[1] / "docs" / "gpu-days" / "2026-11-26-h100"


def test_hopper_ranges_also_bracket_the_h100_day():
    """The second lent GPU (an H100, same die as the H200 the ranges came from): its in-forward layer GEMMs at
    >= 2,048 tokens, its plain bf16 GEMMs timed alone, and its FP8 GEMMs against the published FP8 range."""
    g_lo, g_hi, _ = measured("hopper", "gemm_eff")
    big = [f / s / PEAK for _op, t, s, f, _b in _gemm_points(H100_DAY) if t >= 2048]
    assert len(big) >= 16 and g_lo <= min(big) and max(big) <= g_hi
    alone = json.loads((H100_DAY / "moe_gemm.json").read_text())["fp8"]
    b16 = [r["flops"] / r["bf16_s"] / PEAK for r in alone if r["M"] >= 2048]
    assert g_lo <= min(b16) and max(b16) <= g_hi
    f_lo, f_hi, _ = measured("hopper", "lowp_eff")
    f8 = [r["flops"] / r["fp8_s"] / 1979e12 for r in alone if r["M"] >= 2048 and r["K"] >= 1024]
    assert len(f8) >= 30 and f_lo <= min(f8) and max(f8) <= f_hi
