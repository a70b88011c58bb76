"""TensorRT-LLM's KV fraction is of the memory the weights and activations leave (free_gpu_memory_fraction);
vLLM's and SGLang's is of the whole device (gpu_memory_utilization, mem_fraction_static)."""

from __future__ import annotations

import pytest

from blendsim.sim.deployment import Deployment
from blendsim.sim.engines import VERSIONS, get_profile
from blendsim.sim.errors import UserError
from blendsim.sim.hardware import get_hardware
from blendsim.sim.models import get_model


def _dep(**kw) -> Deployment:
    return Deployment(get_model("llama-3-70b"), get_hardware("a100-80gb"), kw.pop("tp", 2),
                      gpu_memory_utilization=0.95, **kw)


def test_the_fraction_of_free_memory_leaves_more_kv_where_the_weights_fill_the_device():
    dev, free = _dep(), _dep(kv_of_free=True)
    mem, w, a = dev.hardware.memory_bytes, dev.weight_bytes_per_gpu, dev.activation_reserve_bytes
    assert dev.kv_capacity_bytes == pytest.approx((0.95 * mem - w - a) * 2)
    assert free.kv_capacity_bytes == pytest.approx(0.95 * (mem - w - a) * 2)
    # 70B in 16-bit on two A100s: the weights take ~80% of each GPU, so the two rules differ by a third
    assert free.kv_capacity_bytes > 1.3 * dev.kv_capacity_bytes
    # pipeline stages follow the same rule
    pp_dev, pp_free = _dep(tp=1, pp=2), _dep(tp=1, pp=2, kv_of_free=True)
    assert min(pp_free.stage_kv_tokens()) > 1.3 * min(pp_dev.stage_kv_tokens())


def test_only_tensorrt_llm_profiles_take_the_fraction_of_free_memory():
    free = {f"{n}@{v}" for (n, v), p in VERSIONS.items() if p.kv_of_free}
    assert free == {"trtllm@0.8", "trtllm@0.13", "trtllm@0.19", "trtllm@1.0"}
    assert get_profile("trtllm", {}).kv_of_free and not get_profile("vllm", {}).kv_of_free


def test_a_catalogue_row_and_a_run_use_the_engines_rule():
    import numpy as np

    from blendsim.fidelity.catalogue import Row
    from blendsim.fidelity.runner import deployment_for
    from blendsim.runner import RunConfig, run_simulation
    from tests.helpers import random_trace

    fields = dict(id="r", source="s", model="llama-3-70b", hardware="a100-80gb", gpus=2, tp=2, pp=1, ep=1,
                  weights="fp16", kv_dtype="fp16", engine="trtllm", engine_version="0.13", policy="",
                  workload="const:128/128", requests=10, metric="output_tok_s", scope="system", value=1.0, note="")
    from pathlib import Path

    row = Row(**{k: v for k, v in fields.items() if k in Row.__dataclass_fields__}, folder=Path("."), line=2)
    assert deployment_for(row, get_profile("trtllm@0.13", {})).kv_of_free
    assert not deployment_for(row, get_profile("vllm@0.6", {})).kv_of_free
    t = random_trace(np.random.default_rng(0), n=20)
    cap = {e: run_simulation(t, RunConfig(policy="fcfs", model="llama-3-70b", hardware="a100-80gb", tp=2,
                                          engine=e, offline=True)).summary["kv_capacity_blocks"]
           * get_profile(e, {}).scheduler["block_size"] for e in ("trtllm", "vllm")}  # KV tokens
    assert cap["trtllm"] > cap["vllm"]


def test_a_model_that_does_not_fit_still_says_so_in_one_line():
    with pytest.raises(UserError, match="does not fit on a100-80gb with tp=1"):
        _dep(tp=1, kv_of_free=True)
