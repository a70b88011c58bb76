"""MI300X from published measurements (issue 24): its efficiency ranges and preset from an Azure ND MI300X v5 VM's
microbenchmarks and stas00's MAMF table (sim.efficiency PUBLISHED["cdna3"]), its RCCL all-reduce curve, and the 18
catalogue rows of vLLM 0.6.4 on that VM (`vllm-0.6-azure-*`)."""

from __future__ import annotations

import dataclasses

import pytest

import blendsim.fidelity.fit as F
from blendsim.fidelity.catalogue import engine_settings, engine_version_key, read_catalogue, row_engine_key
from blendsim.fidelity.suite import SHIPPED_CATALOGUE, load_suite
from blendsim.sim.efficiency import BOUNDS, PUBLISHED
from blendsim.sim.engines import get_profile
from blendsim.sim.hardware import PRESETS
from blendsim.sim.timers import nccl_allreduce_s
from tests.test_fidelity import _row, _write

MI = PRESETS["mi300x"]


def test_the_preset_takes_the_published_priors_and_they_sit_inside_the_generic_bounds():
    pub = PUBLISHED["cdna3"]
    assert MI.arch == "cdna3"
    assert MI.compute_efficiency == pub["gemm_eff"][2] == 0.60  # 781.9 of 1,300 TFLOP/s (MAMF, ROCm 6.2)
    assert MI.memory_efficiency == pub["mem_eff"][2] == 0.755  # STREAM Dot, 4.0 of 5.3 TB/s
    for name, (lo, hi, prior) in pub.items():
        assert BOUNDS[name][0] <= lo < prior < hi <= BOUNDS[name][1], name
    # the FP8 range brackets the page's hipBLASLt GEMMs from the 2,048 cube (726.9 TFLOP/s) up
    lo, hi, _ = pub["lowp_eff"]
    fp8_peak = MI.peak_flops_fp8
    for tflops in (726.9, 1085.4, 1222.9, 1081.4, 1148.7):
        assert lo <= tflops * 1e12 / fp8_peak <= hi


def test_the_rccl_curve_returns_the_published_bus_bandwidth():
    curves = MI.nccl_allreduce
    assert [g for g, _ in curves] == [8]

    def busbw(b):
        return b * 2 * 7 / 8 / float(nccl_allreduce_s(curves, 8, b))

    assert busbw(2**20) == pytest.approx(22.41e9)  # the "1M" row
    assert busbw(2**23) == pytest.approx(131.57e9)  # "8M"
    assert busbw(2**33) == pytest.approx(316.82e9)  # "8G"
    assert nccl_allreduce_s(curves, 8, 2**20) == pytest.approx(81.9e-6, rel=1e-3)
    times = [float(nccl_allreduce_s(curves, 8, 2**k)) for k in range(15, 34)]
    assert all(b > a for a, b in zip(times, times[1:]))
    # four MI300X scale from the eight as a ring: (t - 1)/7 of the time of a message 8/t as large
    assert nccl_allreduce_s(curves, 4, 2**24) == pytest.approx(3 / 7 * nccl_allreduce_s(curves, 8, 2**25))


def test_the_azure_rows_run_vllm_0_6_with_the_commands_settings():
    rows = [r for r in read_catalogue(SHIPPED_CATALOGUE) if r.id.startswith("vllm-0.6-azure-")]
    assert len(rows) == 18
    assert {r.model for r in rows} == {"llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b"}
    assert len({r.source.split(",")[0] for r in rows}) == 1  # one source for leave-one-source-out
    for r in rows:
        assert engine_version_key(r) == row_engine_key(r) == "vllm@0.6"  # offline, multi-step V0
        assert (r.hardware, r.weights, r.kv_dtype, r.metric, r.requests) == ("mi300x", "fp8", "fp8", "output_tok_s",
                                                                             1000)
        assert r.tp == r.gpus == (1 if r.model == "llama-3.1-8b" else 8)
        s = engine_settings(r, get_profile("vllm@0.6"), MI)
        assert (s["token_budget"], s["max_seqs"], s["gpu_memory_utilization"]) == (131072, 3000, 0.90)
        assert s["mix"] == "prefill-first"  # --enable-chunked-prefill false
    values = {r.id: r.value for r in rows}
    assert values["vllm-0.6-azure-llama-3.1-8b-mi300x-tp1-fp8-128x128"] == 18149
    assert values["vllm-0.6-azure-llama-3.1-405b-mi300x-tp8-fp8-2048x2048"] == 1840


@pytest.fixture(scope="module")
def mi_suite(tmp_path_factory):
    rows = [_row(id="m-1", source="doc M", model="llama-3.1-8b", hardware="mi300x", weights="fp8", kv_dtype="fp8",
                 workload="const:1024/64", requests=128, value=9000, engine="vllm", engine_version="0.6.4")]
    # vLLM: TensorRT-LLM, the rows' default engine, runs on NVIDIA GPUs only (sim.engines.ENGINE_VENDORS)
    return load_suite(_write(tmp_path_factory.mktemp("mi"), rows), {})


def test_the_fitter_keeps_mi300x_inside_its_published_ranges(mi_suite):
    ps = {p.name: p for p in F.free_params(mi_suite.ok)}
    for name in ("lowp_eff", "mem_eff"):
        p = ps[f"arch.cdna3.{name}"]
        assert (p.lo, p.hi, p.prior) == PUBLISHED["cdna3"][name]
    # a run measured 20x faster than any MI300X could go: the FP8 GEMM rate stops at the published ceiling
    fast = [(dataclasses.replace(r, value=r.value * 20), p) for r, p in mi_suite.ok]
    out = F.fit(fast, select=lambda p: p.path[-1] == "lowp_eff")
    assert out["arch"]["cdna3"]["lowp_eff"] == pytest.approx(PUBLISHED["cdna3"]["lowp_eff"][1], abs=1e-3)
