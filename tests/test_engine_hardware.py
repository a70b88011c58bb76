"""Engines on the GPUs they run on: TensorRT-LLM and NanoFlow are NVIDIA-only (sim.engines ENGINE_VENDORS), refused on
an MI300X in one line by simulate, cost and sweep, and left out of plan's space (review of 1 Dec 2026, second: plan
recommended TensorRT-LLM on an MI300X)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.plan.prices import read_prices
from blendsim.plan.search import run_search
from blendsim.plan.space import Space, shapes
from blendsim.sim.engines import get_profile, hardware_unsupported
from blendsim.sim.hardware import get_hardware
from blendsim.workloads.trace import write_trace
from tests.helpers import one_line_error, random_trace


def _cli(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


@pytest.mark.parametrize("engine", ["trtllm", "trtllm@0.8", "nanoflow"])
def test_nvidia_only_engines_are_refused_on_amd(engine, tmp_path):
    assert hardware_unsupported(get_profile(engine, {}), get_hardware("mi300x"))
    assert not hardware_unsupported(get_profile(engine, {}), get_hardware("h100-80gb"))
    t = write_trace(random_trace(np.random.default_rng(1), n=20), tmp_path / "t.parquet")
    one_line_error(_cli("simulate", t, "-m", "llama-3-8b", "--hardware", "mi300x", "--engine", engine, "-o",
                        tmp_path / "run"), "mi300x", "NVIDIA GPUs only")
    assert not (tmp_path / "run").exists()
    one_line_error(_cli("cost", "-m", "llama-3-8b", "--hardware", "mi300x", "--engine", engine, "--decode-seqs", 8,
                        "--context", 100), "NVIDIA GPUs only")
    one_line_error(_cli("sweep", "--densities", "1.0", "--sharing", "0.25", "--policies", "fcfs", "--requests", 50,
                        "--engine", engine, "--hardware", "mi300x", "-o", tmp_path / "sw"), "NVIDIA GPUs only")
    assert not (tmp_path / "sw").exists()


@pytest.mark.parametrize("engine", ["vllm", "sglang", "ideal"])
def test_engines_with_rocm_builds_run_on_amd(engine):
    assert not hardware_unsupported(get_profile(engine, {}), get_hardware("mi300x"))


def test_plan_leaves_the_pair_out_of_its_space():
    trace = random_trace(np.random.default_rng(2), n=60)
    space = Space("llama-3-8b", ("mi300x", "h100-80gb"), ("trtllm", "vllm"), ("fcfs",), (), (), max_gpus=1)
    feasible, pruned = shapes(space, trace)
    assert {(s.hardware, s.engine) for s, _ in feasible} == {("mi300x", "vllm"), ("h100-80gb", "trtllm"),
                                                          ("h100-80gb", "vllm")}
    assert pruned == {"on a GPU its engine does not run on": 1}
    out = run_search(trace, space, 1e9, read_prices())
    assert all(not (p.cand.shape.hardware == "mi300x" and p.cand.shape.engine == "trtllm")
               for p in out.points.values())


@pytest.mark.parametrize("typed, hint", [("A100-80GB", "did you mean a100-80gb?"),
                                         ("h100", "did you mean h100-80gb or h100-pcie?"),
                                         ("mi300", "did you mean mi300x?"), ("tpu", None)])
def test_an_unknown_gpu_name_suggests_the_preset_meant(typed, hint):
    """Review of 1 Dec 2026 (second): A100-80GB and h100 were refused with the preset list alone."""
    from blendsim.sim.errors import UserError

    with pytest.raises(UserError) as e:
        get_hardware(typed)
    assert str(e.value).startswith(f"unknown hardware {typed!r}")
    assert (hint in str(e.value)) if hint else "did you mean" not in str(e.value)
