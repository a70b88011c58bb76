"""The tier-aware policy options (tiers=load, ours) price a prefix load as sim.kv_tiers charges it: a block in host
memory crosses the host link, a block on disk is also read from the drive and the later of the two ends the load,
each pipeline stage moves its own layers' share, and under attention DP one rank's link carries a sequence's load.
(They once priced a disk hit at the host link's rate, 4x too cheap on an A100's NVMe.)"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from blendsim.policies._tiercost import load_s, split_load_s_per_block
from blendsim.runner import RunConfig, prepare_run, run_simulation
from blendsim.sim.deployment import Deployment
from blendsim.sim.hardware import get_hardware
from blendsim.sim.kv_tiers import StageLinks, TieredKVCache, tier_spec
from blendsim.sim.models import get_model
from tests.test_kv_tiers import _evict_and_rehit

HW = get_hardware("a100-80gb")  # host link 25 GB/s, NVMe read 6.4 GB/s per GPU


def _spec(kind: str, block_size: int, disk_read_gbps=None):
    """A replica's tiers: plain (tiny on one A100), pp3 (tiny's 4 layers over 3 stages: 1+2+1) or attn_dp
    (qwen3-30b-a3b on 4 H100s, a rank per GPU)."""
    if kind == "attn_dp":
        dep = Deployment(get_model("qwen3-30b-a3b"), get_hardware("h100-80gb"), 4, attn_dp=True)
    else:
        dep = Deployment(get_model("tiny"), HW, 1, pp=3 if kind == "pp3" else 1)
    return tier_spec(dep, block_size, 1.0, 10.0, disk_read_gbps=disk_read_gbps)


def _prefix_kv(run, spec, host: int, disk: int, gpu: int = 0):
    """A tiered cache on ``run``'s tree whose request 2 (C: P's 64 tokens, then 32 of its own) finds P with ``gpu``
    blocks on the GPU, the next ``host`` in host memory and the last ``disk`` on disk."""
    kv = TieredKVCache(run.tree, 1000, run.engine.block_size, True, spec)
    path = kv.path_of(2)
    x = path[0]
    assert gpu + host + disk == kv.nblocks[x]
    if gpu:
        kv.insert(x, 0, gpu)
    kv.host[x], kv.disk[x] = host, disk
    kv.host_used, kv.disk_used = host, disk
    return kv, path


KINDS = ["plain", "pp3", "attn_dp"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("host,disk", [(4, 0), (0, 4), (1, 3), (3, 1)])
def test_load_s_is_what_the_tiered_cache_charges(kind, host, disk):
    run = prepare_run(_evict_and_rehit(), RunConfig(policy="fcfs", model="tiny", hardware="a100-80gb", block_size=16))
    spec = _spec(kind, 16)
    assert (spec.ranks > 1) == (kind == "attn_dp") and (len(spec.stage_bytes) == 3) == (kind == "pp3")
    kv, path = _prefix_kv(run, spec, host, disk)
    est = load_s(kv.links, spec.ranks, host + disk, disk)
    assert kv.load(path, 4, 0.0) == pytest.approx(est, rel=1e-12)
    # the drive (6.4 GB/s per GPU) sets the time when reading the disk's blocks takes longer than moving all four
    # over the link (A100: 25 GB/s per GPU, H100: 55.6)
    assert (est > load_s(kv.links, spec.ranks, host + disk)) == (disk / spec.disk_read_bw > 4 / spec.link_bw)


RUNS = {"plain": dict(model="tiny", hardware="a100-80gb"), "pp3": dict(model="tiny", hardware="a100-80gb", pp=3),
        "attn_dp": dict(model="qwen3-30b-a3b", hardware="h100-80gb", tp=4, engine="sglang:attn_dp=1")}


def _e2(runs_kv: list, tiers: str = "load", disk_read_gbps=None, kind: str = "plain", kv_load=None):
    """E2's router over replicas whose tiered caches ``runs_kv`` make from the run (tiny's run: 4 KB of KV a token,
    P's prefix a 64-block node at E2's block size 1)."""
    from blendsim.policies.e2.router import E2Router

    run = prepare_run(_evict_and_rehit(), RunConfig(
        policy="e2", host_kv_gb=1.0, disk_kv_gb=10.0, disk_read_gbps=disk_read_gbps, options={"tiers": tiers},
        kv_load=kv_load,
        **RUNS[kind]))
    kvs = [f(run) for f in runs_kv]
    router = E2Router(run.policy.ctx, [SimpleNamespace(scheduler=SimpleNamespace(kv=kv)) for kv in kvs])
    return router, kvs, run


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("gpu,host,disk", [(0, 0, 64), (0, 40, 24), (16, 16, 32), (24, 40, 0)])
def test_e2_prices_a_lower_tier_prefix_as_the_cache_then_charges_it(kind, gpu, host, disk):
    """E2's P of C (its 96 tokens: P's 64 partly on the GPU, in host memory and on disk, then 32 of its own) is the
    prefill of what it computes plus the load the replica's cache charges when C is admitted."""
    paths = []

    def make(run):
        kv, path = _prefix_kv(run, run.tiers, host, disk, gpu)
        paths.append(path)
        return kv

    router, (kv,), run = _e2([make], kind=kind, kv_load="stall")  # the load before the compute: P adds them
    assert (run.tiers.ranks > 1) == (kind == "attn_dp") and (len(run.tiers.stage_bytes) == 3) == (kind == "pp3")
    assert kv.block_size == 1
    path = paths[0]
    _, P = router.cost(0, path, 96)
    est = P - router.tm.prefill(32, 64)
    charged = kv.load(path, kv.match_tiers(path, 96), 0.0)
    assert est == pytest.approx(charged, rel=1e-9)
    assert est == pytest.approx(load_s(kv.links, kv.spec.ranks, host + disk, disk), rel=1e-9)


@pytest.mark.parametrize("dread", [None, 0.05])
def test_e2_prices_an_overlapped_load_as_the_longer_of_it_and_the_prefill(dread):
    """Under ``--kv-load overlap`` the step runs the load beside its compute and lasts the longer of the two, so E2's
    P is the longer of the prefill and the load, not their sum (a 0.05 GB/s drive makes the load the longer)."""
    paths = []

    def make(run):
        kv, path = _prefix_kv(run, run.tiers, 40, 24)
        paths.append(path)
        return kv

    router, (kv,), run = _e2([make], disk_read_gbps=dread, kv_load="overlap")
    assert run.tiers.load_mode == "overlap"
    _, P = router.cost(0, paths[0], 96)
    pre = router.tm.prefill(32, 64)
    load = load_s(kv.links, kv.spec.ranks, 64, 24)
    assert P == pytest.approx(max(pre, load), rel=1e-12)
    assert (load > pre) == (dread is not None)


def test_e2_sends_c_away_from_a_slow_disk_but_not_from_host_memory():
    """Two replicas: P on replica 0's disk (or host memory), nothing on replica 1. Reusing P's 64 tokens beats
    recomputing them (126 us of the tiny model's prefill) from host memory (10 us over 25 GB/s) and from an A100's
    NVMe (41 us at 6.4 GB/s), not from a 1 GB/s drive (262 us): E2 routes C to replica 1 then. Priced at the host
    link's rate, as it once was, the disk looked like host memory and C went to replica 0 every time."""
    def where(tier: str):
        def make(run):
            return _prefix_kv(run, run.tiers, 64 if tier == "host" else 0, 64 if tier == "disk" else 0)[0]
        return make

    def empty(run):
        return TieredKVCache(run.tree, 1000, run.engine.block_size, True, run.tiers)

    for tier, dread, to in (("host", None, 0), ("host", 1.0, 0), ("disk", None, 0), ("disk", 1.0, 1)):
        router, kvs, _ = _e2([where(tier), empty], disk_read_gbps=dread)
        assert router.decide(2, 0.0) == to, (tier, dread)
        recompute = router.tm.prefill(96, 0) - router.tm.prefill(32, 64)
        load = load_s(kvs[0].links, 1, 64, 64 if tier == "disk" else 0)
        assert (load > recompute) == (to == 1)
    # tiers=gpu (the paper): a prefix in a lower tier is a miss either way; the two replicas tie, the first wins
    router, _, _ = _e2([where("disk"), empty], tiers="gpu", disk_read_gbps=1.0)
    assert router.decide(2, 0.0) == 0


def test_blendserve_prices_a_split_prefix_by_where_its_tiers_would_hold_it():
    """BlendServe's plan cannot know where a split unit's prefix sits when it comes back: it takes host memory with
    the host tier's share of the two tiers' blocks, disk otherwise; a disk block costs its drive read (here the
    later of the two). Host only: the host link, as before."""
    m = get_model("llama-3-8b")
    prefill = 2.0 * m.gemm_params_active / (HW.peak_flops * HW.compute_efficiency)
    link = m.kv_bytes_per_token / HW.host_link_bandwidth
    dread = m.kv_bytes_per_token / HW.disk_read_bandwidth
    from tests.helpers import random_trace

    trace = random_trace(np.random.default_rng(5), n=40)
    cfg = dict(policy="blendserve", model="llama-3-8b", hardware="a100-80gb", kv_capacity_override=400 * m.kv_bytes_per_token)
    summ = {}
    for name, tiers in {"host": dict(host_kv_gb=1.0), "disk": dict(disk_kv_gb=1.0),
                        "both": dict(host_kv_gb=1.0, disk_kv_gb=3.0),
                        "slow": dict(disk_kv_gb=1.0, disk_read_gbps=0.5), "gpu": {}}.items():
        opts = {"tiers": "load"} if name != "gpu" else {}
        summ[name] = run_simulation(trace, RunConfig(**cfg, **tiers, options=opts)).summary["blendserve"]
        if name in ("host", "disk", "both"):
            spec = prepare_run(trace, RunConfig(**cfg, **tiers, options=opts)).tiers
            per_tok = split_load_s_per_block(spec, StageLinks(spec)) / 1  # blendserve's block size is 1
            assert summ[name]["split_tier_scale"] == pytest.approx(per_tok / prefill, rel=1e-12)
    assert summ["host"]["split_tier_scale"] == pytest.approx(link / prefill, rel=1e-12)
    assert summ["disk"]["split_tier_scale"] == pytest.approx(dread / prefill, rel=1e-12)  # 4x the host's
    w = 3.0 / 4.0  # the disk's share of the blocks (1 GB host, 3 GB disk)
    assert summ["both"]["split_tier_scale"] == pytest.approx((link + w * (dread - link)) / prefill, rel=1e-4)
    assert summ["host"]["split_budget_tokens"] > summ["disk"]["split_budget_tokens"] > summ["gpu"]["split_budget_tokens"]
    # a drive slower than recomputing: a split's prefix is worth no more than its recomputation, as without tiers
    assert 0.5e9 < m.kv_bytes_per_token / prefill
    assert "split_tier_scale" not in summ["slow"]
    for k in ("splits", "split_budget_tokens", "split_recompute_tokens", "split_moved_requests"):
        assert summ["slow"][k] == summ["gpu"][k], k
