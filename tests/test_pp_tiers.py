"""Host/disk KV tiers under pipeline parallelism: each stage keeps and reloads its own layers' KV over its own
links (sim.kv_tiers), the virtual engines split the tiers' blocks, a load delays only the stage that waits for
it, capacities hold every step, and the compiled and pure-Python step paths agree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blendsim.runner import RunConfig, prepare_run, run_simulation
from blendsim.sim import _compiled, engine
from blendsim.sim.deployment import Deployment
from blendsim.sim.errors import UserError
from blendsim.sim.hardware import get_hardware
from blendsim.sim.kv_tiers import StageLinks, TieredKVCache, make_kv, tier_spec
from blendsim.sim.models import get_model
from blendsim.workloads.trace import from_columns
from tests.test_engine_invariants import check_invariants
from tests.test_kv_tiers import BB, KVB, LINK, B, _cfg, gb, reuse_scenarios

ROOT = Path(__file__).resolve().parents[1]
VE_BLOCKS = 13  # GPU blocks of each virtual engine in the runs below (208 tokens)


def _evict_and_rehit_twice(copies: int = 2):
    """``copies`` copies of test_kv_tiers' evict-and-rehit, one per virtual engine (the router takes them in
    turn): P_k (4 blocks), then X_k (200 tokens + 1: all 13 blocks, so P_k leaves the GPU), then C_k = P_k + 32
    tokens."""
    k = range(copies)
    prompts = ([[(10 * j + 1, 64)] for j in k] + [[(10 * j + 2, 200)] for j in k]
               + [[(10 * j + 1, 64), (10 * j + 3, 32)] for j in k])
    return from_columns(input_len=[64] * copies + [200] * copies + [96] * copies,
                        output_len=[1] * (2 * copies) + [2] * copies, prompts=prompts)


def _pp_cfg(pp, **kw):
    return _cfg(pp=pp, kv_capacity_override=pp * VE_BLOCKS * B * KVB, **kw)


def _capture_stage_loads(monkeypatch) -> list:
    """Record every PP step's stage loads, in seconds from when the step was scheduled (TieredKVCache.stage_loads)."""
    seen = []
    orig = TieredKVCache.stage_loads

    def stage_loads(self, now):
        out = orig(self, now)
        seen.append([t - now for t in out])
        return out

    monkeypatch.setattr(TieredKVCache, "stage_loads", stage_loads)
    return seen


def test_a_tier_under_pp_loads_the_evicted_prefix_instead_of_recomputing_it():
    trace = _evict_and_rehit_twice()
    gpu = run_simulation(trace, _pp_cfg(2))
    tier = run_simulation(trace, _pp_cfg(2, host_kv_gb=gb(16)))
    # GPU only: each X evicted its P, so each C recomputes its whole prompt
    assert list(gpu.requests["cached_tokens"][4:]) == [0, 0]
    assert list(gpu.requests["prefill_computed"][4:]) == [96, 96]
    # a host tier: both P's come back (4 blocks each), each C computes only its own 32 tokens
    assert list(tier.requests["cached_tokens"][4:]) == [64, 64]
    assert list(tier.requests["prefill_computed"][4:]) == [32, 32]
    s = tier.summary
    assert s["prefix_hit_tokens"] == {"gpu": 0, "host": 128, "disk": 0}
    assert s["kv_load_bytes"] == 8 * BB  # the whole replica's bytes: every stage loads its layers' share
    assert s["pp"] == 2
    assert sum(tier.requests["recomputed_tokens"]) <= sum(gpu.requests["recomputed_tokens"])
    assert s["makespan_s"] > 0


@pytest.mark.parametrize("pp", [2, 3])
def test_each_stage_loads_its_layers_share_over_its_own_link(monkeypatch, pp):
    """tiny has 4 layers: pp=2 splits them 2+2, pp=3 1+2+1 (vLLM's split, sim.deployment). A stage's load
    takes its share of a block's bytes over its own tp GPUs' host link; a stall adds exactly that to its step."""
    seen = _capture_stage_loads(monkeypatch)
    trace = _evict_and_rehit_twice(pp)
    r = run_simulation(trace, _pp_cfg(pp, host_kv_gb=gb(16), kv_load="stall"))
    assert r.summary["prefix_hit_tokens"]["host"] == 64 * pp
    layers = Deployment(get_model("tiny"), get_hardware("a100-80gb"), 1, pp=pp).stage_layers()
    assert layers == ([2, 2] if pp == 2 else [1, 2, 1])
    loads = [s for s in seen if any(s)]
    assert loads  # the C's loads reached the pipeline
    for s in loads:
        # every block a stage moves (the writes ahead of the load on its link, then the load) costs its share
        # of the block's bytes; so each stage's wait is the same number of blocks at its own bytes per block
        blocks = [t * LINK / (BB * n / 4) for t, n in zip(s, layers)]
        assert blocks == pytest.approx([round(blocks[0])] * pp, rel=1e-9)
        assert round(blocks[0]) >= 4  # at least the prefix's 4 blocks
    # stall: each stage waits for what is left of its own load when it takes the batch up (stage 0 at once, a later
    # stage after the earlier ones' compute); the summary gives the stage-seconds waited over the stages
    stall = r.summary["kv_load_stall_s"]
    assert sum(s[0] for s in loads) / pp <= stall <= sum(sum(s) for s in loads) / pp + 1e-12


def _pipe(stages: int, overlap: bool):
    ve = engine.Replica.__new__(engine.Replica)
    ve.load_stall_s, ve.overlap_loads = 0.0, overlap
    pr = engine.PipelinedReplica.__new__(engine.PipelinedReplica)
    pr.free, pr.server_free = [0.0] * stages, 0.0
    return pr, ve


def test_a_stage_waits_only_for_what_is_left_of_its_load_when_it_takes_the_batch_up():
    """A load is issued when the step is scheduled (t = 0) and runs on the stage's own link while the earlier
    stages compute: stage 1's load (1.25 s) has arrived when stage 0 hands it the batch at 1.5 s, so only stage 0
    waits. (Waiting its whole 1.25 s again there counted the link's time twice: the review of 1 Dec 2026 saw PP4
    with a host tier stall 1.7x its links' time and run slower than TP4 on the same GPUs.)"""
    pr, ve = _pipe(2, overlap=False)
    assert pr._through(0.0, [1.0, 2.0], [0.0], loads=[0.5, 1.25], ve=ve) == 3.5
    assert ve.load_stall_s == 0.5
    pr, ve = _pipe(2, overlap=False)  # a later stage still loading waits for the rest: 2.0 - 1.5
    assert pr._through(0.0, [1.0, 2.0], [0.0], loads=[0.5, 3.5], ve=ve) == 5.5
    assert ve.load_stall_s == 0.5 + 2.0
    pr, ve = _pipe(2, overlap=True)  # overlap: the stage lasts the longer of its compute and the rest of its load
    assert pr._through(0.0, [1.0, 2.0], [0.0], loads=[1.5, 4.0], ve=ve) == 4.0
    assert ve.load_stall_s == 0.5 + 0.5  # stage 1 starts at 1.5 with 2.5 s of load left against 2 s of compute
    pr, ve = _pipe(2, overlap=False)  # no loads: the stages as before
    assert pr._through(0.0, [1.0, 2.0], [0.25]) == 3.25 and ve.load_stall_s == 0.0


def test_overlap_hides_the_loads_behind_each_stage_s_compute():
    trace = _evict_and_rehit_twice()
    st_ = run_simulation(trace, _pp_cfg(2, host_kv_gb=gb(16), kv_load="stall"))
    ov = run_simulation(trace, _pp_cfg(2, host_kv_gb=gb(16), kv_load="overlap"))
    assert st_.summary["kv_load_stall_s"] > 0
    assert 0 <= ov.summary["kv_load_stall_s"] < st_.summary["kv_load_stall_s"]
    assert ov.summary["makespan_s"] <= st_.summary["makespan_s"]
    assert list(ov.requests["prefill_computed"]) == list(st_.requests["prefill_computed"])


def test_stage_links_scale_with_the_stage_share_and_its_gpus():
    dep = Deployment(get_model("tiny"), get_hardware("a100-80gb"), 2, pp=3)
    spec = tier_spec(dep, B, gb(60), gb(30))
    # per virtual engine: the replica's blocks (the whole model's KV per token) split 3 ways
    assert (spec.host_blocks, spec.disk_blocks) == (60 // 3, 30 // 3)
    assert spec.block_bytes == BB  # tiny has 2 KV heads: at tp=2 each GPU holds one, none is replicated
    assert dep.stage_layers() == [1, 2, 1]
    assert spec.stage_bytes == (spec.block_bytes // 4, spec.block_bytes // 2, spec.block_bytes // 4)
    assert spec.link_bw == 2 * LINK  # one stage: its 2 GPUs' host links
    assert spec.load_bytes_per_block == spec.block_bytes // 2  # the 2-layer stage is the slowest
    links = StageLinks(spec)
    assert links.t_link == [bb / (2 * LINK) for bb in spec.stage_bytes]
    hw = get_hardware("a100-80gb")
    assert links.t_dread == [bb / (2 * hw.disk_read_bandwidth) for bb in spec.stage_bytes]
    # one stage: unchanged (the whole block over the replica's links)
    one = tier_spec(Deployment(get_model("tiny"), get_hardware("a100-80gb"), 2), B, gb(60), 0)
    assert one.stage_bytes == () and one.host_blocks == 60 and one.load_bytes_per_block == one.block_bytes


def test_the_tier_total_in_tokens_is_the_replica_s_under_pp():
    for pp in (1, 2, 4):
        dep = Deployment(get_model("tiny"), get_hardware("a100-80gb"), 1, pp=pp)
        spec = tier_spec(dep, B, gb(400), gb(800))
        assert spec.host_blocks * pp == 400 and spec.disk_blocks * pp == 800


def test_a_replica_on_two_nodes_may_use_both_nodes_host_memory():
    hw = get_hardware("a100-80gb")
    m = get_model("llama-3-8b")
    over_one = 1.5 * hw.host_memory_bytes / 1e9  # GB: more than one node, less than two
    with pytest.raises(UserError, match="host memory per node"):
        tier_spec(Deployment(m, hw, 8), B, over_one, 0)
    # tp=8 x pp=2: two nodes, each holding one stage's 16 of 32 layers (half the KV)
    spec = tier_spec(Deployment(m, hw, 8, pp=2), B, over_one, 0)
    assert spec.host_blocks > 0
    with pytest.raises(UserError, match="busiest node holds"):
        tier_spec(Deployment(m, hw, 8, pp=2), B, 2.5 * hw.host_memory_bytes / 1e9, 0)


def test_the_virtual_engines_of_a_replica_share_its_stages_links():
    trace = _evict_and_rehit_twice()

    run = prepare_run(trace, _pp_cfg(2, host_kv_gb=gb(16)))
    links = StageLinks(run.tiers)
    a = make_kv(run.tree, VE_BLOCKS, B, True, True, run.tiers, links)
    b = make_kv(run.tree, VE_BLOCKS, B, True, True, run.tiers, links)
    assert a.links is b.links and a.link is b.link is links.host[0]
    a.link.transfer(0.0, 1.0)
    assert b.link.transfer(0.5, 0.5) == 1.5  # the other virtual engine's transfer queues behind it


def _check_pp_kv_every_step(monkeypatch) -> None:
    """test_engine_invariants.check_kv_every_step, for the virtual engines a PipelinedReplica steps."""
    from tests.test_engine_invariants import check_kv_every_step

    check_kv_every_step(monkeypatch, pipelined=True)


@pytest.mark.parametrize("policy", ["fcfs", "dfs", "blendserve", "e2", "vllm"])
@settings(max_examples=25, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=reuse_scenarios(), pp=st.sampled_from([2, 3]), host=st.sampled_from([1, 3, 12, 400]),
       disk=st.sampled_from([0, 1, 5, 400]), load=st.sampled_from(["stall", "overlap"]))
def test_pp_tier_capacities_are_never_exceeded(policy, case, pp, host, disk, load):
    """Random reuse traces under pp=2/3 with small tiers (blocks per virtual engine): every virtual engine's
    GPU cache and tiers are recounted and checked after every step, and the run keeps the engine's invariants."""
    trace, cfg, accelgen = case
    kvb = get_model(cfg["model"]).kv_bytes_per_token * cfg["block_size"]
    # each virtual engine holds what the replica held at pp=1, and the tiers `host`/`disk` blocks each
    cfg = {**cfg, "hardware": "a100-80gb", "pp": pp, "kv_capacity_override": cfg["kv_capacity_override"] * pp,
           "host_kv_gb": (host * pp + 0.5) * kvb / 1e9, "disk_kv_gb": (disk * pp + 0.5) * kvb / 1e9 if disk else 0,
           "kv_load": load}
    with pytest.MonkeyPatch.context() as mp:
        _check_pp_kv_every_step(mp)
        r = run_simulation(trace, RunConfig(policy=policy, **cfg))
    check_invariants(trace, r)
    s = r.summary
    assert s["pp"] == pp
    assert s["kv_load_bytes"] % kvb == 0 and s["kv_offload_bytes"] % kvb == 0 and s["kv_load_stall_s"] >= 0


_DIGEST = """
import json, sys
sys.path.insert(0, {tests!r})
import golden
from blendsim.sim import _compiled
from blendsim.runner import RunConfig, run_simulation
from test_pp_tiers import _evict_and_rehit_twice, _pp_cfg, gb
out = {{}}
for pp in (2, 3):
    for load in ("stall", "overlap"):
        for policy in ("fcfs", "e2"):
            cfg = _pp_cfg(pp, host_kv_gb=gb(3), disk_kv_gb=gb(16), kv_load=load, policy=policy)
            out[f"{{pp}}-{{load}}-{{policy}}"] = golden.digest(run_simulation(_evict_and_rehit_twice(pp), cfg))
print(json.dumps({{"status": _compiled.status(), "digests": out}}))
"""


def _digests(pure: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != _compiled.ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    if pure:
        env[_compiled.ENV] = "1"
    p = subprocess.run([sys.executable, "-c", _DIGEST.format(tests=str(ROOT / "tests"))], env=env, cwd=str(ROOT),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_pp_tier_runs_identical_compiled_and_pure():
    from tests.test_compiled import _compiled_built

    if not _compiled_built():
        pytest.skip("no compiled step path is built here (pip install without Cython or a C compiler)")
    compiled, pure = _digests(pure=False), _digests(pure=True)
    assert compiled["status"]["path"] in ("compiled", "mixed")
    assert pure["status"]["path"] == "pure Python"
    assert compiled["digests"] == pure["digests"]
    assert len(compiled["digests"]) == 8
