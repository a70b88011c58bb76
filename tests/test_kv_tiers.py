"""Host-memory and disk KV tiers (issue 26): hand-computed loads and spills, 0 GB = no tier byte for byte,
tier capacities never exceeded (every step, every policy), bad sizes refused in one line."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.policies.registry import policy_names
from blendsim.runner import RunConfig, prepare_run, run_simulation, write_run
from blendsim.sim.batch import Batch
from blendsim.sim.engine import SimExecutor
from blendsim.sim.errors import UserError
from blendsim.sim.hardware import get_hardware
from blendsim.sim.kv_tiers import TieredKVCache
from blendsim.sim.models import get_model
from blendsim.workloads.trace import from_columns, write_trace
from tests.helpers import one_line_error
from tests.test_hypothesis_policies import run_checked

KVB = get_model("tiny").kv_bytes_per_token  # 4096 bytes per token
B = 16
BB = B * KVB  # bytes per block
LINK = get_hardware("a100-80gb").host_link_bandwidth  # 25 GB/s per GPU
HW = get_hardware("a100-80gb")


def gb(blocks: float) -> float:
    """A tier size in GB holding ``blocks`` whole blocks (half a block spare against rounding)."""
    return (blocks + 0.5) * BB / 1e9


def _evict_and_rehit():
    """A: the 64-token prefix P alone (4 blocks). X: a long unrelated prompt whose KV needs every block, so
    P leaves the GPU. C: P + 32 tokens, re-hits P's 4 blocks. One at a time (max_seqs 1), in this order."""
    prompts = [[(1, 64)], [(2, 420)], [(1, 64), (3, 32)]]
    return from_columns(input_len=[64, 420, 96], output_len=[1, 1, 2], prompts=prompts)


def _cfg(**kw):
    base = dict(policy="fcfs", model="tiny", hardware="a100-80gb", block_size=B, max_seqs=1, token_budget=4096,
                kv_capacity_override=(400 + 2 * B) * KVB, offline=True, engine="ideal")
    base.update(kw)
    return RunConfig(**base)


def _first_chunk_step(r, req):
    """The step (replica 0) that ran request ``req``'s first prefill chunk: its index and duration."""
    t = r.requests["admit_s"][req]
    ends = np.asarray(r.steps[0]["t_end_s"])
    i = int(np.searchsorted(ends, t, side="right"))
    return i, float(r.steps[0]["dt_s"][i])


def test_an_evicted_block_rehit_is_loaded_not_recomputed_and_the_step_pays_the_link():
    trace = _evict_and_rehit()
    gpu = run_simulation(trace, _cfg())
    tier = run_simulation(trace, _cfg(host_kv_gb=gb(16), kv_load="stall"))
    # GPU only: X evicted P, so C recomputes its whole prompt
    assert gpu.requests["cached_tokens"][2] == 0 and gpu.requests["prefill_computed"][2] == 96
    # with a host tier: P's 4 blocks come back over the link; C computes only its own 32 tokens
    s = tier.summary
    assert tier.requests["cached_tokens"][2] == 64 and tier.requests["prefill_computed"][2] == 32
    assert s["prefix_hit_tokens"] == {"gpu": 0, "host": 64, "disk": 0}
    assert s["kv_load_bytes"] == 4 * BB == 262144
    # Block by block: X's prompt needs all 27 blocks, so P's 4 go to host (4 writes); X's 26 full blocks stay
    # cached, 1 block is free. C's load needs 4 GPU blocks: 3 of X's are evicted first, and their writes
    # (GPU -> host) leave over the link's other direction while the load comes in (full duplex); the loaded
    # blocks fill the slots the writes empty, one block behind them: the first lands in the free block at t,
    # the k-th in the slot written out by t(k - 1), so the load ends after 4 blocks at 25 GB/s:
    # 4 x 65,536 B / 25e9 = 10.49 us (on one half-duplex FIFO it would be 3 + 4 blocks, 18.35 us).
    load_s = 4 * BB / LINK
    assert s["kv_load_stall_s"] == pytest.approx(load_s, rel=1e-12)
    # the step that runs C's chunk is priced as always, then waits for the load before its compute
    run = prepare_run(trace, _cfg(host_kv_gb=gb(16)))
    compute = SimExecutor(run.cost_model).run(Batch(0, [(2, 32, 64, 64)], 0, 0, 1))
    _, dt = _first_chunk_step(tier, 2)
    assert dt == pytest.approx(compute + load_s, rel=1e-12)
    # a slower link (an override) stretches the wait in proportion: 4 blocks at 5 GB/s
    slow = run_simulation(trace, _cfg(host_kv_gb=gb(16), kv_load="stall", host_link_gbps=5))
    assert slow.summary["kv_load_stall_s"] == pytest.approx(4 * BB / 5e9, rel=1e-12)
    # overlap: the step lasts the longer of the two (here the compute)
    ov = run_simulation(trace, _cfg(host_kv_gb=gb(16), kv_load="overlap"))
    _, dt = _first_chunk_step(ov, 2)
    assert dt == pytest.approx(max(compute, load_s), rel=1e-12)
    # writes: P's 4, X's 3 for the load, 2 for C's own 32 tokens, 1 for its decode token
    assert s["kv_offload_bytes"] == (4 + 3 + 2 + 1) * BB


def test_a_full_host_tier_spills_to_disk_and_a_disk_hit_streams_over_the_link():
    trace = _evict_and_rehit()
    # host holds 2 blocks: P's 4 evicted blocks come down, its last 2 go on to disk
    r = run_simulation(trace, _cfg(host_kv_gb=gb(2), disk_kv_gb=gb(100), kv_load="stall"))
    s = r.summary
    assert s["prefix_hit_tokens"] == {"gpu": 0, "host": 32, "disk": 32}
    assert r.requests["prefill_computed"][2] == 32
    assert s["kv_load_bytes"] == 4 * BB
    # C's load first evicts 3 of X's blocks to host (3 link writes), which needs a host slot emptied: 1 host
    # block goes to disk first (1 disk write, 17.2 us at 3.8 GB/s), and the last host write lands one block after
    # it (19.9 us); 4 blocks cross the link, the last one block behind those writes (22.5 us), while 2 are read
    # from disk (20.5 us at 6.4 GB/s, ahead of the drive's write-back): the latest of them ends the load
    t = BB / LINK
    host_writes = max(3 * t, BB / HW.disk_write_bandwidth + t)
    load_s = max(4 * t, host_writes + t, 2 * BB / HW.disk_read_bandwidth)
    assert load_s == pytest.approx(BB / 3.8e9 + 2 * t, rel=1e-12)
    assert s["kv_load_stall_s"] == pytest.approx(load_s, rel=1e-12)
    # no disk: the 2 blocks are gone, C loads 2 and recomputes 2 + its own
    r = run_simulation(trace, _cfg(host_kv_gb=gb(2)))
    assert r.summary["prefix_hit_tokens"] == {"gpu": 0, "host": 32, "disk": 0}
    assert r.requests["prefill_computed"][2] == 64


def _host_blocks_of_p(kv, n: int = 4):
    """Put P's ``n`` blocks (request 0's path) in ``kv``'s host tier; the path."""
    path = kv.path_of(0)
    kv.host[path[-1]] = n
    kv.host_used = n
    return path


def _cache_x(kv, blocks: int, now: float = 0.0):
    """Cache ``blocks`` of X's prompt (request 1) on the GPU, unreferenced: evictable."""
    x = kv.path_of(1)[-1]
    kv.lock(x, now)
    assert kv.reserve(blocks)
    assert kv.insert(x, 0, blocks) == blocks
    kv.unlock(x, now)


def test_the_host_link_is_full_duplex_a_load_does_not_queue_behind_unrelated_writes():
    """Loads (host -> GPU) and write-backs (GPU -> host) each have their own direction of the link."""
    run = prepare_run(_evict_and_rehit(), _cfg(host_kv_gb=gb(64)))
    t = BB / LINK
    kv = TieredKVCache(run.tree, 10, B, True, run.tiers)
    path = _host_blocks_of_p(kv)
    kv.links.host_w[0].transfer(0.0, 1.0)  # earlier write-backs busy until t = 1 s
    # the GPU has room for the 4 blocks: the load needs no write and ends after its own 4 blocks
    assert kv.load(path, 4, 0.25) == pytest.approx(0.25 + 4 * t, rel=1e-12)
    assert kv.links.host[0].busy_s == pytest.approx(4 * t, rel=1e-12)
    assert kv.links.host_w[0].busy_s == 1.0


def test_a_load_that_evicts_for_room_ends_one_block_after_the_writes_that_empty_its_slots():
    run = prepare_run(_evict_and_rehit(), _cfg(host_kv_gb=gb(64)))
    t = BB / LINK
    kv = TieredKVCache(run.tree, 10, B, True, run.tiers)
    _cache_x(kv, 8)  # 8 of 10 blocks cached, 2 free: a 4-block load evicts 2 of them
    path = _host_blocks_of_p(kv)
    kv.links.host_w[0].transfer(0.0, 1.0)  # a write backlog until t = 1 s, ahead of the eviction's writes
    kv.now = 0.25
    end = kv.load(path, 4, 0.25)
    # the 2 evicted blocks leave after the backlog (1 s + 2t); the last loaded block lands in the last slot they
    # empty, one block's load later
    assert kv.offload_host_blocks == 2
    assert kv.links.host_w[0].free_at == pytest.approx(1.0 + 2 * t, rel=1e-12)
    assert end == pytest.approx(1.0 + 3 * t, rel=1e-12)
    # with no backlog the load's own 4 blocks are the longer: the 2 writes (2t) then one block (3t) fit in 4t
    kv = TieredKVCache(run.tree, 10, B, True, run.tiers)
    _cache_x(kv, 8)
    path = _host_blocks_of_p(kv)
    kv.now = 0.25
    assert kv.load(path, 4, 0.25) == pytest.approx(0.25 + 4 * t, rel=1e-12)


def test_a_slow_drive_backs_up_host_writes_and_the_loads_that_evict():
    """Host memory full: each GPU -> host write needs a host slot emptied to disk first, so the drive's write rate
    reaches the loads that evict (--disk-write-gbps is not inert)."""
    trace = _evict_and_rehit()
    stall = {w: run_simulation(trace, _cfg(host_kv_gb=gb(2), disk_kv_gb=gb(100), kv_load="stall",
                                          disk_write_gbps=w)).summary["kv_load_stall_s"] for w in (0.01, 100.0)}
    assert stall[0.01] > 100 * stall[100.0] > 0
    # P's own spill (2 blocks to disk) and then the load's (1 block) queue on the drive ahead of the load's host writes
    assert stall[0.01] > 2 * BB / 0.01e9


def test_disk_reads_go_before_the_write_back_backlog_and_push_it_back():
    run = prepare_run(_evict_and_rehit(), _cfg(host_kv_gb=gb(2), disk_kv_gb=gb(100)))
    kv = TieredKVCache(run.tree, 10, B, True, run.tiers)
    path = kv.path_of(0)
    kv.disk[path[-1]] = 4
    kv.disk_used = 4
    L = kv.links
    L.disk_w[0].transfer(0.0, 2.0)  # 2 s of write-backs queued on the drive
    # a write-back issued while a read is queued starts after it
    L.disk[0].transfer(0.0, 0.1)
    L.disk_w[0].write_after(L.disk[0], 0.05, 0.3)
    assert L.disk_w[0].free_at == pytest.approx(2.3)  # behind the backlog here
    L.disk[0].free_at = L.disk[0].busy_s = 0.0
    L.disk_w[0].free_at = 2.0
    r = 4 * BB / HW.disk_read_bandwidth
    end = kv.load(path, 4, 0.5)
    assert end == pytest.approx(0.5 + r, rel=1e-12)  # not 2 s + r: the read does not wait for the writes
    assert L.disk[0].busy_s == pytest.approx(r, rel=1e-12)
    assert L.disk_w[0].free_at == pytest.approx(2.0 + r, rel=1e-12)  # the drive's time is shared: writes wait it out
    # a backlog that has drained by the time of the read is not pushed back
    L.disk_w[0].free_at = 0.1
    kv.disk[path[-1]] = 4
    kv.disk_used += 4
    kv.cached[path[-1]] = 0
    kv.cache_blocks -= 4
    kv.load(path, 4, 0.5)
    assert L.disk_w[0].free_at == 0.1


def _write(r, d: Path) -> dict:
    write_run(r, d)
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


@pytest.mark.parametrize("policy", ["fcfs", "dfs", "blendserve", "e2"])
def test_a_zero_gb_tier_is_byte_identical_to_no_tier(tmp_path, policy):
    rng = np.random.default_rng(3)
    from tests.helpers import random_trace

    trace = random_trace(rng, n=30, arrivals=policy == "e2")
    cfg = dict(policy=policy, model="tiny", hardware="a100-80gb", kv_capacity_override=600 * KVB, replicas=2)
    a = run_simulation(trace, RunConfig(**cfg))
    b = run_simulation(trace, RunConfig(**cfg, host_kv_gb=0.0, disk_kv_gb=0.0, kv_load="overlap"))
    assert _write(a, tmp_path / "a") == _write(b, tmp_path / "b")
    assert a.summary["prefix_hit_tokens"]["host"] == 0 and a.summary["kv_load_bytes"] == 0


@st.composite
def reuse_scenarios(draw):
    """Traces that evict and re-hit: many requests over a few (nested) prefixes, a KV cache that holds
    little more than the largest request, arrivals spread out or all at once."""
    n = draw(st.integers(6, 24))
    roots = draw(st.lists(st.integers(4, 160), min_size=2, max_size=6))
    subs = draw(st.lists(st.integers(1, 80), min_size=0, max_size=3))
    prompts = []
    for i in range(n):
        k = draw(st.integers(0, len(roots) - 1))
        path = [(1 + k, roots[k])]
        if subs and draw(st.booleans()):
            j = draw(st.integers(0, len(subs) - 1))
            path.append((100 + 10 * k + j, subs[j]))
        path.append((1000 + i, draw(st.integers(1, 60))))
        prompts.append(path)
    p = [sum(ln for _, ln in pr) for pr in prompts]
    d = [draw(st.integers(1, 30)) for _ in range(n)]
    cols = {}
    if draw(st.booleans()):
        cols["arrival_s"] = np.sort(np.asarray(draw(st.lists(st.floats(0, 2, allow_subnormal=False),
                                                             min_size=n, max_size=n))))
    trace = from_columns(input_len=p, output_len=d, prompts=prompts, **cols)
    bs = draw(st.sampled_from([1, 4, 16]))
    kv_tokens = max(a + b for a, b in zip(p, d, strict=True)) + draw(st.sampled_from([0, 8, 30, 150])) + 2 * bs
    cfg = dict(model="tiny", block_size=bs, kv_capacity_override=kv_tokens * KVB,
               token_budget=draw(st.sampled_from([16, 64, 2048])), max_seqs=draw(st.sampled_from([0, 1, 3])),
               replicas=draw(st.integers(1, 2)))
    accelgen = {"long_prompt": str(draw(st.sampled_from([64, 4096]))),
                "budget_model": draw(st.sampled_from(["eq4", "cost"]))}
    return trace, cfg, accelgen


@pytest.mark.parametrize("policy", policy_names())
@settings(max_examples=25, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=reuse_scenarios(), host=st.sampled_from([0, 1, 3, 12, 400]),
       disk=st.sampled_from([0, 1, 5, 400]), load=st.sampled_from(["stall", "overlap", "async"]))
def test_tier_capacities_are_never_exceeded(policy, case, host, disk, load):
    """Every policy on random traces with small tiers (blocks: host 0-400, disk 0-400): the GPU cache and
    both tiers are recounted and checked against their capacities after every step (TieredKVCache.check),
    and every run finishes with the engine's invariants."""
    trace, cfg, accelgen = case
    kvb = get_model(cfg["model"]).kv_bytes_per_token * cfg["block_size"]
    host, disk = host + 0.5 * (host > 0), disk + 0.5 * (disk > 0)  # whole blocks despite float rounding
    cfg = {**cfg, "hardware": "a100-80gb", "host_kv_gb": host * kvb / 1e9, "disk_kv_gb": disk * kvb / 1e9,
           "kv_load": load}
    r, cap = run_checked(trace, cfg, policy, accelgen)
    s = r.summary
    assert sum(s["prefix_hit_tokens"].values()) >= 0 and s["kv_load_stall_s"] >= 0
    assert s["kv_load_bytes"] % kvb == 0 and s["kv_offload_bytes"] % kvb == 0


def test_every_preset_with_a_host_link_cites_it():
    from blendsim.sim.hardware import PRESETS

    for h in PRESETS.values():
        if h.host_link_bandwidth:
            assert h.host_source, h.name
    assert PRESETS["gb200"].host_link_bandwidth > 3 * PRESETS["h100-80gb"].host_link_bandwidth  # C2C vs PCIe


def test_every_engine_profile_cites_its_kv_load():
    from blendsim.sim.engines import KV_LOAD_SOURCES, PROFILES

    for name, p in PROFILES.items():
        assert p.kv_load in ("stall", "overlap", "async")
        assert KV_LOAD_SOURCES[name].startswith(p.kv_load + ":"), name


@pytest.mark.parametrize("kw, needle", [
    ({"host_kv_gb": -1}, "--host-kv-gb must be a finite number >= 0"),
    ({"host_kv_gb": math.nan}, "--host-kv-gb must be a finite number >= 0"),
    ({"disk_kv_gb": math.inf}, "--disk-kv-gb must be a finite number >= 0"),
    ({"host_kv_gb": 5000}, "more than a100-80gb's host memory per node"),
    ({"disk_kv_gb": 9000}, "more than a100-80gb's local NVMe per node"),
    ({"host_kv_gb": 1, "kv_load": "sometimes"}, "--kv-load must be one of stall, overlap"),
    ({"host_kv_gb": 1, "host_link_gbps": 0}, "--host-link-gbps must be a finite number > 0"),
    ({"disk_kv_gb": 1, "disk_read_gbps": math.nan}, "--disk-read-gbps must be a finite number > 0"),
])
def test_bad_tier_values_are_refused(kw, needle):
    trace = _evict_and_rehit()
    with pytest.raises(UserError, match=needle.replace("(", r"\(")):
        run_simulation(trace, _cfg(**kw))


def test_a_host_tier_on_a_device_without_a_host_link_is_refused():
    with pytest.raises(UserError, match="no host link bandwidth"):
        run_simulation(_evict_and_rehit(), _cfg(hardware="cpu", host_kv_gb=1))


def test_the_cli_refuses_a_bad_tier_in_one_line(tmp_path):
    f = tmp_path / "t.parquet"
    write_trace(_evict_and_rehit(), f)
    r = CliRunner().invoke(get_app(), ["simulate", str(f), "--model", "tiny", "--host-kv-gb", "-2", "-o",
                                 str(tmp_path / "run")])
    one_line_error(r, "--host-kv-gb")
    r = CliRunner().invoke(get_app(), ["simulate", str(f), "--model", "tiny", "--host-kv-gb", "nan", "-o",
                                 str(tmp_path / "run")])
    one_line_error(r, "--host-kv-gb")


# ---- tier-aware policy variants (ours, default off) ---------------------------------------------
def _e2_router(tiers: str):
    from types import SimpleNamespace

    from blendsim.policies.e2.router import E2Router

    trace = _evict_and_rehit()
    run = prepare_run(trace, RunConfig(policy="e2", model="tiny", hardware="a100-80gb", host_kv_gb=gb(64),
                                       kv_capacity_override=(420 + 32) * KVB, options={"tiers": tiers}))
    kv = TieredKVCache(run.tree, run.num_blocks, run.engine.block_size, True, run.tiers)
    rep = SimpleNamespace(scheduler=SimpleNamespace(kv=kv))
    return E2Router(run.policy.ctx, [rep]), kv, run


@pytest.mark.parametrize("tiers", ["gpu", "load"])
def test_e2_prices_a_host_resident_prefix_as_a_load_only_when_asked(tiers):
    router, kv, run = _e2_router(tiers)
    path = kv.path_of(2)  # C: P (64 tokens) then its own 32
    x = path[0]
    kv.host[x] = kv.nblocks[x]  # P sits in host memory, nothing on the GPU (block size 1: 64 blocks)
    kv.host_used = kv.nblocks[x]
    _, P = router.cost(0, path, 96)
    tm = router.tm
    if tiers == "gpu":
        assert P == tm.prefill(96, 0)  # the paper: a miss, all 96 tokens recomputed
    else:
        per_token = run.tiers.block_bytes / run.engine.block_size / run.tiers.link_bw
        assert per_token == KVB / LINK
        assert P == pytest.approx(tm.prefill(32, 64) + 64 * KVB / LINK, rel=1e-12)
        assert P < tm.prefill(96, 0)


def test_e2_tier_option_is_checked():
    with pytest.raises(UserError, match="option tiers"):
        run_simulation(_evict_and_rehit(), _cfg(policy="e2", options={"tiers": "maybe"}))
    with pytest.raises(UserError, match="option tiers"):
        run_simulation(_evict_and_rehit(), _cfg(policy="blendserve", options={"tiers": "maybe"}))


def test_blendserve_tier_variant_scales_the_split_budget_by_load_over_prefill():
    rng = np.random.default_rng(5)
    from tests.helpers import random_trace

    trace = random_trace(rng, n=40)
    m, hw = get_model("llama-3-8b"), get_hardware("a100-80gb")
    cfg = dict(policy="blendserve", model="llama-3-8b", hardware="a100-80gb",
               kv_capacity_override=400 * m.kv_bytes_per_token, host_kv_gb=1.0)
    base = run_simulation(trace, RunConfig(**cfg)).summary["blendserve"]
    tier = run_simulation(trace, RunConfig(**cfg, options={"tiers": "load"})).summary["blendserve"]
    assert "split_tier_scale" not in base
    # 8B: 131,072 KV bytes per token over 25 GB/s = 5.2 us; prefill 2 x 6.98e9 FLOP at 0.7 x 312 TFLOP/s = 64 us
    prefill = 2.0 * m.gemm_params_active / (hw.peak_flops * hw.compute_efficiency)
    scale = (m.kv_bytes_per_token / hw.host_link_bandwidth) / prefill
    assert 0.05 < scale < 0.1
    assert tier["split_tier_scale"] == pytest.approx(scale, rel=1e-12)
    keep = 0.99  # the default: a budget of 1% of the shared tokens becomes 1% / scale of them
    assert tier["split_budget_tokens"] == pytest.approx(base["split_budget_tokens"] / (1 - keep) * (
        1 - max(0.0, 1 - (1 - keep) / scale)), rel=1e-9)


MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "data" / "mooncake_conversation_trace.jsonl"
if not MOONCAKE.is_file():
    MOONCAKE = Path("/work/shared/data/mooncake_conversation_trace.jsonl")


@pytest.mark.skipif(not MOONCAKE.is_file(), reason="Mooncake trace not found")
def test_mooncake_online_fcfs_keeps_more_sharing_with_a_host_tier():
    """Issue 26: online fcfs on Mooncake's conversation trace (llama-3-8b, a100-80gb, its own timestamps) with
    512 GB of host KV keeps at least 5 points more prefix sharing than the GPU alone, and says where from."""
    from blendsim.workloads.loaders import load

    trace = load(MOONCAKE, "mooncake")
    gpu = run_simulation(trace, RunConfig(policy="fcfs")).summary
    host = run_simulation(trace, RunConfig(policy="fcfs", host_kv_gb=512)).summary
    assert host["prefix_sharing_ratio"] >= gpu["prefix_sharing_ratio"] + 0.05
    assert gpu["prefix_hit_tokens"]["host"] == 0 and gpu["kv_load_bytes"] == 0
    assert host["prefix_hit_tokens"]["host"] > 0 and host["kv_load_bytes"] > 0
    assert host["kv_load_bytes"] == host["prefix_hit_tokens"]["host"] * get_model("llama-3-8b").kv_bytes_per_token


def test_a_recorded_schedule_with_tiers_is_refused():
    with pytest.raises(UserError, match="record-schedule"):
        run_simulation(_evict_and_rehit(), _cfg(host_kv_gb=1, record_schedule=True))


def test_a_vllm_release_before_its_offloading_connector_stalls_on_a_reload():
    """vLLM's own offloading connector (asynchronous reloads) arrived in 0.11: an older requested release stalls,
    also one priced by a newer profile (vllm@0.10 by the 0.8 profile); unversioned means the newest."""
    from blendsim.sim.kv_tiers import kv_load_mode

    assert [kv_load_mode(None, e) for e in ("vllm@0.5.3", "vllm@0.6", "vllm@0.10")] == ["stall"] * 3
    assert [kv_load_mode(None, e) for e in ("vllm", "vllm@0.11", "vllm@0.12")] == ["async"] * 3
    assert kv_load_mode("overlap", "vllm@0.6") == "overlap"  # --kv-load still decides
    # SGLang's HiCache (PR #2693, January 2025) came after every 0.3 release
    assert [kv_load_mode(None, e) for e in ("sglang@0.3", "sglang@0.4", "sglang")] == ["stall", "overlap", "overlap"]


def test_tier_settings_without_a_tier_and_skew_on_a_dense_model_are_said_to_change_nothing():
    trace = _evict_and_rehit()
    plain = run_simulation(trace, _cfg())
    inert = run_simulation(trace, _cfg(kv_load="overlap", host_link_gbps=5.0, expert_skew=1.2))
    assert plain.summary["makespan_s"] == inert.summary["makespan_s"]
    assert "--expert-skew 1.2: tiny has no routed experts; it changes nothing" in inert.notes
    assert ("--kv-load, --host-link-gbps: no KV tier (--host-kv-gb / --disk-kv-gb 0); they change nothing"
            in inert.notes)
    # a host tier without a disk one: the disk's speeds are the inert ones
    host = run_simulation(trace, _cfg(host_kv_gb=gb(16), disk_read_gbps=1.0))
    assert "--disk-read-gbps: no disk tier (--disk-kv-gb 0); it changes nothing" in host.notes
    assert not [n for n in plain.notes + host.notes if "changes nothing" in n and "--disk" not in n]


def test_replicas_on_one_node_share_its_host_memory_and_nvme():
    """8 TP1 replicas on an 8-GPU H100 node: each may have an eighth of the node's DRAM (was: each the whole 2.2 TB,
    16 TB modelled on one DGX); one replica keeps the whole; a replica of a node or more is not divided."""
    from blendsim.sim.deployment import make_deployment
    from blendsim.sim.errors import UserError
    from blendsim.sim.kv_tiers import tier_sizes

    dep = make_deployment("llama-3-8b", "h100-80gb", 1)
    node = dep.hardware.host_memory_bytes / 1e9
    assert tier_sizes(dep, 2000, 0, replicas=1) == (2000.0, 0.0)
    assert tier_sizes(dep, node / 8, 0, replicas=8)[0] == pytest.approx(node / 8)
    with pytest.raises(UserError, match="host memory per node shared by 8 replicas"):
        tier_sizes(dep, 2000, 0, replicas=8)
    with pytest.raises(UserError, match="local NVMe per node shared by 4 replicas"):
        tier_sizes(make_deployment("llama-3-8b", "h100-80gb", 2), 0, 20000, replicas=4)
    big = make_deployment("llama-3-70b", "h100-80gb", 8)
    assert tier_sizes(big, 2000, 0, replicas=4) == (2000.0, 0.0)


def test_a_sweep_bounds_a_pipelines_tiers_as_its_runs_do(tmp_path):
    """TP8 x PP2 spans two nodes: 3,000 GB of host tier fits their memory (simulate accepts it); the sweep's
    check before any cell now agrees (was: refused against one node's 2,199 GB)."""
    from blendsim.sim.deployment import make_deployment
    from blendsim.sim.kv_tiers import tier_sizes

    assert tier_sizes(make_deployment("llama-3-70b", "h100-80gb", 8, pp=2), 3000, 0)[0] == 3000.0
    r = CliRunner().invoke(get_app(), ["sweep", "-o", str(tmp_path / "s"), "--policies", "fcfs", "--models",
                                       "llama-3-70b", "--hardware", "h100-80gb", "--tp", "8", "--pp", "2",
                                       "--host-kv-gb", "3000", "--requests", "200", "--densities", "1.2",
                                       "--sharing", "0.3", "--jobs", "1"])
    assert r.exit_code == 0, r.output


def _interleaved_prefixes(groups: int = 8, per: int = 12, prefix: int = 256, tail: int = 32):
    """``groups`` long prefixes, their requests interleaved (round robin), so a small GPU cache evicts a prefix
    before its next request comes: arrival-order policies reload it from a lower tier."""
    prompts = [[(1 + g, prefix), (1000 + i * groups + g, tail)] for i in range(per) for g in range(groups)]
    n = len(prompts)
    return from_columns(input_len=[prefix + tail] * n, output_len=[8] * n, prompts=prompts)


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_s_steps_wait_for_the_loads_they_admit(policy):
    """A step whose admissions load KV from a lower tier waits for it under ``stall`` (accelgen formed its own
    steps and never passed their loads on: its loads were free, 18.5 against 17.2 k tok/s on Mooncake with disk)."""
    trace = _interleaved_prefixes()
    cfg = dict(policy=policy, model="tiny", hardware="a100-80gb", block_size=B, kv_capacity_override=1200 * KVB,
               offline=True, engine="ideal", host_kv_gb=1.0, kv_load="stall", host_link_gbps=0.05)
    s = run_simulation(trace, RunConfig(**cfg)).summary
    if s["kv_load_bytes"] == 0:
        assert policy == "sarathi", (policy, "loads nothing")  # no prefix cache
        return
    # each load's bytes cross a 0.05 GB/s link: the stall is at least the busiest step's share, and never zero
    assert s["kv_load_stall_s"] > 0, policy
    assert s["kv_load_stall_s"] <= s["makespan_s"]


_OWN_BATCH = '''
from blendsim import Policy
from blendsim.sim.batch import Batch
from blendsim.sim.scheduler import Scheduler


class OwnBatchScheduler(Scheduler):
    def schedule(self, now):
        b = super().schedule(now)
        if b is None:
            return None
        return Batch(b.step, b.prefill, b.num_decode, b.decode_ctx_sum, b.num_logits, b.decode)  # no load_s


class OwnBatch(Policy):
    name = "ownbatch"
    scheduler_cls = OwnBatchScheduler
'''


@pytest.mark.parametrize("pp", [1, 2])
def test_a_user_scheduler_that_drops_its_steps_load_wait_stops_in_one_line(tmp_path, pp):
    """A scheduler forming its own Batch without _load_wait got its host/disk loads for free, silently (as accelgen's
    once did): the run stops and says what to call."""
    f = tmp_path / "ownbatch.py"
    f.write_text(_OWN_BATCH)
    cfg = dict(model="tiny", hardware="a100-80gb", block_size=B, kv_capacity_override=1200 * KVB, offline=True,
               engine="ideal", host_kv_gb=1.0, kv_load="stall", host_link_gbps=0.05, pp=pp)
    with pytest.raises(UserError) as e:
        run_simulation(_interleaved_prefixes(), RunConfig(policy=f"{f}:OwnBatch", **cfg))
    msg = str(e.value)
    assert "\n" not in msg and "self._load_wait(now)" in msg and "OwnBatchScheduler" in msg
    # without tiers it runs (nothing to wait for)
    no_tier = {**cfg, "host_kv_gb": 0.0, "host_link_gbps": None, "kv_load": None}
    assert run_simulation(_interleaved_prefixes(), RunConfig(policy=f"{f}:OwnBatch", **no_tier)).summary["n_requests"]


def test_the_drive_s_busy_time_is_reported_and_a_drive_that_sets_the_pace_says_so():
    """summary.json's disk_busy_s is the drive's reads plus write-backs (they take turns on it); where it is busy most
    of the run and steps wait for loads, the run's notes say the drive set the pace (review of 1 Dec 2026: a disk tier
    1.75x slower than none, with no reported figure explaining the stall)."""
    trace = _evict_and_rehit()
    slow = run_simulation(trace, _cfg(host_kv_gb=gb(2), disk_kv_gb=gb(100), disk_write_gbps=0.01))
    s = slow.summary
    writes = s["kv_offload_bytes"] - s["kv_load_bytes"]  # below: every block written to host went on to disk but P's
    assert s["disk_busy_s"] >= 2 * BB / 0.01e9  # P's two blocks spilled to disk, at least (write-backs still
    assert writes > 0  # queued when the last request finishes count too: the drive works on after the run)
    assert any(n.startswith("KV tiers: the busiest drive was busy") and "--disk-read-gbps" in n and "even where "
               "recomputing it would be faster" in n for n in slow.notes)
    fast = run_simulation(trace, _cfg(host_kv_gb=gb(2), disk_kv_gb=gb(100), disk_write_gbps=100.0))
    assert 0 < fast.summary["disk_busy_s"] < s["disk_busy_s"]
    assert not any("drive" in n for n in fast.notes)
    host = run_simulation(trace, _cfg(host_kv_gb=gb(16)))
    assert host.summary["disk_busy_s"] == 0.0
    from blendsim.reports.terminal import run_summary_lines

    said = " ".join(run_summary_lines(dict(s)))
    assert f"busiest drive {s['disk_busy_s']:,.2f} s" in said and "busiest host link" in said
    assert "busiest drive" not in " ".join(run_summary_lines(dict(host.summary)))


def test_link_busy_is_the_busiest_link_not_a_sum_over_replicas():
    """Two replicas each doing the same tier work report one replica's link time (at most the makespan), not twice it."""
    one = _evict_and_rehit()
    prompts = [[(1, 64)], [(11, 64)], [(2, 420)], [(12, 420)], [(1, 64), (3, 32)], [(11, 64), (13, 32)]]
    two = from_columns(input_len=[64, 64, 420, 420, 96, 96], output_len=[1, 1, 1, 1, 2, 2],
                       prompts=prompts)  # round robin: each replica one copy of the three requests
    a = run_simulation(one, _cfg(host_kv_gb=gb(16))).summary
    b = run_simulation(two, _cfg(host_kv_gb=gb(16), replicas=2)).summary
    assert b["kv_load_bytes"] == 2 * a["kv_load_bytes"] > 0
    assert b["host_link_busy_s"] == pytest.approx(a["host_link_busy_s"], rel=1e-12)
    assert b["host_link_busy_s"] <= b["makespan_s"]
