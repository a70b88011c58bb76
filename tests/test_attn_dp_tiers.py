"""Host/disk KV tiers under attention data parallelism: a sequence's KV is whole on one rank, so its prefix reloads
over that rank's link alone (one GPU's rate), loads of sequences on other ranks run beside it, and offload writes
spread over every rank's link (sim.kv_tiers.RankChannels)."""

from __future__ import annotations

import pytest

from blendsim.runner import RunConfig, run_simulation
from blendsim.sim.deployment import Deployment
from blendsim.sim.hardware import get_hardware
from blendsim.sim.kv_tiers import Channel, RankChannels, StageLinks, tier_spec
from blendsim.sim.models import get_model
from blendsim.workloads.trace import from_columns


def _spec(attn_dp: bool, tp: int = 4):
    dep = Deployment(get_model("qwen3-30b-a3b"), get_hardware("h100-80gb"), tp, attn_dp=attn_dp)
    return dep, tier_spec(dep, 16, 100, 100)


def test_the_tiers_have_a_link_per_attention_dp_rank():
    dep, spec = _spec(True)
    assert dep.dp == 4 and spec.ranks == 4
    links = StageLinks(spec)
    assert isinstance(links.host[0], RankChannels) and len(links.host[0].lanes) == 4
    assert isinstance(links.disk[0], RankChannels)
    _, split = _spec(False)
    assert split.ranks == 1 and isinstance(StageLinks(split).host[0], Channel)
    assert split.link_bw == spec.link_bw == 4 * get_hardware("h100-80gb").host_link_bandwidth


def test_one_sequence_loads_at_one_gpu_s_rate_and_others_run_beside_it():
    _, spec = _spec(True)
    link = StageLinks(spec).host[0]
    t = 1.0  # seconds of the load at the stage's four links together
    lane = link.pick()
    assert link.load(lane, 0.0, t) == pytest.approx(4.0)  # one rank's link: a quarter of the rate
    # the next three sequences go to the other ranks, whose links are free: they end with the first
    ends = []
    for _ in range(3):
        ends.append(link.load(link.pick(), 0.0, t))
    assert ends == pytest.approx([4.0, 4.0, 4.0])
    assert link.load(link.pick(), 0.0, t) == pytest.approx(8.0)  # a fifth waits for a rank
    # without attention DP the same five loads share the summed rate: 1 s each, one after another
    one = Channel("host link")
    assert [one.load(one.pick(), 0.0, t) for _ in range(5)] == pytest.approx([1, 2, 3, 4, 5])


def test_offload_writes_spread_over_every_rank_s_link():
    _, spec = _spec(True)
    links = StageLinks(spec)
    out, into = links.host_w[0], links.host[0]
    assert out.transfer(0.0, 2.0) == pytest.approx(2.0)  # 2 s at the summed rate: each rank a quarter at a quarter
    assert all(ch.busy_s == pytest.approx(2.0) for ch in out.lanes) and out.busy_s == pytest.approx(2.0)
    # the other direction of each rank's link is free: a load runs beside the writes, at one rank's rate
    lane = into.pick()
    assert into.load(lane, 0.0, 0.5) == pytest.approx(2.0) and out.free(lane) == pytest.approx(2.0)
    # writes on one direction queue behind each other, rank by rank
    assert out.load(lane, 0.0, 0.5) == pytest.approx(4.0)


def test_a_run_with_attention_dp_prices_a_lone_reload_at_one_gpu_s_link():
    # a shared prefix, evicted to host by a distinct prompt, then reloaded by one request alone
    prefix = 6000
    prompts = [[(1, prefix)], [(2, 7000)], [(1, prefix), (3, 16)]]
    trace = from_columns(input_len=[prefix, 7000, prefix + 16], output_len=[1, 1, 1], prompts=prompts)
    stall, hits, loaded = {}, {}, {}
    for dp in (False, True):
        dep, _ = _spec(dp)
        cfg = RunConfig(policy="fcfs", model="qwen3-30b-a3b", hardware="h100-80gb", tp=4, engine=f"sglang:attn_dp={int(dp)}",
                        block_size=16, max_seqs=1, token_budget=16384, offline=True, host_kv_gb=100, kv_load="stall",
                        kv_capacity_override=8000 * int(dep.kv_bytes_per_token))
        s = run_simulation(trace, cfg).summary
        hits[dp] = s["prefix_hit_tokens"]["host"]
        loaded[dp] = s["kv_load_bytes"]
        stall[dp] = s["kv_load_stall_s"]
    assert hits[True] == hits[False] > prefix // 2, hits
    # both wait for the same writes (evicting room for the load: spread over every link either way); the reload
    # itself crosses one GPU's link with attention DP, all four without: three times its split time more
    assert loaded[True] == loaded[False] > 0
    load_split = loaded[False] / (4 * get_hardware("h100-80gb").host_link_bandwidth)
    assert stall[True] - stall[False] == pytest.approx(3 * load_split, rel=0.01)
