"""BatchLLM: Alg. 1 on the paper's Fig. 4 tree, groups, R_group order, KV-threshold admission, Eq. 2,
and end to end (every group's prefix computed once)."""

from __future__ import annotations

import numpy as np
import pytest

from blendsim.policies.base import PolicyContext
from blendsim.policies.batchllm.grouping import enlarge_first_level, first_level_saving, multi_level_saving
from blendsim.policies.registry import get_policy
from blendsim.runner import RunConfig, run_simulation
from blendsim.sim.errors import UserError
from blendsim.sim.prefix_tree import PrefixTree
from blendsim.sim.seq import EngineConfig
from blendsim.workloads.trace import from_columns

# Fig. 4 as sec. 4.2 describes it (the text gives the shape, not every node's size; the sizes are ours
# and fit it): root -> 'a' (prompt 1) and 'b' (1 token, prompts 2-6); b -> c (1 token; prompts 2-5)
# and prompt 6's tail; c -> prompt 2's and 3's tails and f (6 tokens; prompts 4, 5). The naive first
# level shares b: 4 tokens saved. Sharing b+c+f (8 tokens) between prompts 4 and 5 saves 8.
FIG4 = [[(1, 4)],
        [(2, 1), (3, 1), (12, 3)],
        [(2, 1), (3, 1), (13, 2)],
        [(2, 1), (3, 1), (4, 6), (14, 2)],
        [(2, 1), (3, 1), (4, 6), (15, 3)],
        [(2, 1), (16, 5)]]


def _trace(prompts, out=None, **kw):
    p = [sum(ln for _, ln in pr) for pr in prompts]
    return from_columns(input_len=p, output_len=out or [4] * len(p), prompts=prompts, **kw)


def _policy(trace, block_size=16, **options):
    tree = PrefixTree(trace)
    ctx = PolicyContext(trace=trace, tree=tree, deployment=None, cost_model=None,
                        engine=EngineConfig(block_size=block_size), options=options, num_blocks=1000)
    pol = get_policy("batchllm")(ctx)
    pol.prepare()
    return pol


def _groups(fl, n):
    """Groups as sets of request indices, with their prefix length."""
    return sorted((int(fl.prefix_len[g]), tuple(np.flatnonzero(fl.group_of == g).tolist()))
                  for g in range(len(fl.anchor)))


# ---- Alg. 1 ----------------------------------------------------------------------------------
def test_fig4_enlargement_by_hand():
    tree = PrefixTree(_trace(FIG4))
    fl = enlarge_first_level(tree)
    # c forks with f under b (gain (2-1)*6 > 1); then b forks with c+f under the root ((2-1)*7 > 1);
    # c, left with prompts 2 and 3, stays under b: its gain (2-1)*1 is not above len(b) = 1
    assert _groups(fl, 6) == [(1, (1, 2, 5)), (4, (0,)), (8, (3, 4))]
    naive = enlarge_first_level(tree, enlarge=False)
    assert _groups(naive, 6) == [(1, (1, 2, 3, 4, 5)), (4, (0,))]
    # Eq. 2: 40 logical tokens; multi-level processes every node once (27), the naive first level
    # saves 4 (b shared by 5), the enlarged one 2 (b by 3) + 8 (b+c+f by 2)
    assert multi_level_saving(tree) == pytest.approx(13 / 40)
    assert first_level_saving(tree, naive) == pytest.approx(4 / 40)
    assert first_level_saving(tree, fl) == pytest.approx(10 / 40)
    # in blocks of 4: b's group (1 token) shares nothing, b+c+f shares 8 tokens = 2 blocks
    assert first_level_saving(tree, fl, 4, min_size=2) == pytest.approx(8 / 40)


def test_fork_needs_gain_strictly_above_cost():
    # root -> b (3) -> {c (2) -> {g (2) -> requests 0, 1; request 2}; request 3}
    # at b: g's gain (2-1)*2 = 2 equals c's cost 2 -> no fork; at the root: c's gain (3-1)*2 = 4 > 3
    # -> b+c (5 tokens) is a group of 0-2, and b, left with one child, merges into request 3's tail
    prompts = [[(1, 3), (2, 2), (3, 2), (10, 1)], [(1, 3), (2, 2), (3, 2), (11, 1)],
               [(1, 3), (2, 2), (12, 4)], [(1, 3), (13, 4)]]
    fl = enlarge_first_level(PrefixTree(_trace(prompts)))
    assert _groups(fl, 4) == [(5, (0, 1, 2)), (7, (3,))]
    # g grows to 3 tokens: at b, gain 3 > 2 -> c+g (5) moves under b and c merges into request 2's
    # tail; at the root, c+g's gain (2-1)*5 > 3 -> b+c+g (8) for 0, 1; c+tail's gain 0 -> b stays
    prompts[0][2] = prompts[1][2] = (3, 3)
    fl = enlarge_first_level(PrefixTree(_trace(prompts)))
    assert _groups(fl, 4) == [(3, (2, 3)), (8, (0, 1))]


def test_first_level_prefix_is_a_root_path():
    rng = np.random.default_rng(5)
    from tests.helpers import random_trace

    for _ in range(20):
        trace = random_trace(rng)
        tree = PrefixTree(trace)
        fl = enlarge_first_level(tree)
        # every member's prompt starts with its group's prefix: the anchor is on its root path
        for r in range(trace.n):
            a = int(fl.anchor[fl.group_of[r]])
            assert a in tree.path(int(tree.req_node[r]))
        naive = enlarge_first_level(tree, False)
        assert first_level_saving(tree, fl) >= first_level_saving(tree, naive) - 1e-12
        assert first_level_saving(tree, fl) <= multi_level_saving(tree) + 1e-12


# ---- groups and order -------------------------------------------------------------------------
def test_singletons_and_sub_block_prefixes_become_plain_requests():
    prompts = [[(1, 40), (10, 5)], [(1, 40), (11, 5)],  # 40-token prefix: 2 blocks of 16, 32 tokens
               [(2, 10), (12, 5)], [(2, 10), (13, 5)],  # 10-token prefix: under a block -> plain
               [(3, 50)]]  # alone -> plain
    pol = _policy(_trace(prompts), block_size=16)
    plan = pol.plan
    assert plan.group_of == [0, 0, -1, -1, -1]
    assert plan.prefix_tokens == [32]
    assert plan.hit_cap == [2, 2, 0, 0, 0]
    assert pol.summary_extra()["batchllm_groups"] == 1
    assert pol.summary_extra()["batchllm_plain_requests"] == 3
    assert _policy(_trace(prompts), block_size=16, share="cache").plan.hit_cap == [-1] * 5


def test_r_group_order_by_hand():
    # group A: prefix 32 + 2 x 16 = 64 prefill tokens; group B: 16 + 4 x 32 = 144; plain C: 40
    prompts = [[(2, 16), (20, 32)], [(1, 32), (10, 16)], [(3, 40)], [(2, 16), (21, 32)],
               [(1, 32), (11, 16)], [(2, 16), (22, 32)], [(2, 16), (23, 32)]]
    trace = _trace(prompts)
    rank = _policy(trace, block_size=16).rank()
    order = np.argsort(rank).tolist()
    # Eq. 4: R = 1/40 (C) > 1/64 (A) > 1/144 (B); members in tree order, the leader first
    assert order == [2, 1, 4, 0, 3, 5, 6]
    # the fork's tree order: B (first seen) then A then C
    tree_order = np.argsort(_policy(trace, block_size=16, order="tree").rank()).tolist()
    assert tree_order == [0, 3, 5, 6, 1, 4, 2]
    # Eq. 3 with hints: B's 4 x 100 / 144 beats A's 2 x 10 / 64 and C's 10 / 40
    hinted = _trace(prompts, output_len_hint=[100, 10, 10, 100, 10, 100, 100])
    hinted_order = np.argsort(_policy(hinted, block_size=16, order="r_group_hint").rank()).tolist()
    assert hinted_order[:4] == [0, 3, 5, 6]


def test_bad_options_are_user_errors():
    for opt in ({"order": "fcfs"}, {"batching": "none"}, {"share": "all"}, {"kv_threshold": "1.5"}):
        with pytest.raises(UserError):
            _policy(_trace(FIG4), **opt)


# ---- scheduling ---------------------------------------------------------------------------------
def _run(trace, B=16, capacity_tokens=100_000, **kw):
    options = kw.pop("options", {})
    cfg = RunConfig(policy="batchllm", model="tiny", hardware="cpu", block_size=B,
                    kv_capacity_override=capacity_tokens * 4096, options=options, **kw)
    return run_simulation(trace, cfg)


def test_kv_threshold_limits_admission_not_a_request_count():
    # 12 unique 64-token prompts = 4 blocks each; 100 blocks of KV; threshold 0.2 -> 20 blocks
    trace = from_columns(input_len=[64] * 12, output_len=[30] * 12)
    r = _run(trace, capacity_tokens=1600, token_budget=4096, record_schedule=True,
             options={"kv_threshold": "0.2"})
    assert r.summary["kv_capacity_blocks"] == 100
    sch = r.schedule
    first = [q for s, k, q in zip(sch["step"], sch["kind"], sch["request"]) if s == 0 and k == "chunk"]
    # Alg. 2: admit while the committed KV (4 blocks per prompt) is under 20 blocks: 5 prompts
    assert len(first) == 5
    # without a threshold (the fork's count rule, 356 requests) all 12 go at once
    r = _run(trace, capacity_tokens=1600, token_budget=4096, record_schedule=True,
             options={"batching": "count"})
    sch = r.schedule
    assert sum(1 for s, k in zip(sch["step"], sch["kind"]) if s == 0 and k == "chunk") == 12


def _grouped_trace(groups=6, degree=5, prefix=64, distinct=20, shuffle=None):
    prompts = [[(g, prefix), (1000 + g * degree + i, distinct)] for g in range(groups) for i in range(degree)]
    if shuffle is not None:
        prompts = [prompts[i] for i in np.random.default_rng(shuffle).permutation(len(prompts))]
    return _trace(prompts, out=[8] * len(prompts))


@pytest.mark.parametrize("shuffle", [None, 3])
def test_every_group_prefix_is_computed_once(shuffle):
    trace = _grouped_trace(shuffle=shuffle)
    r = _run(trace, token_budget=48)  # small budget: a prefix takes two chunks, members must wait
    rq, s = r.requests, r.summary
    groups = trace.unit_sym[trace.unit_offsets[:-1]]  # first segment = the group
    for g in np.unique(groups):
        cached = np.sort(rq["cached_tokens"][groups == g])
        assert cached.tolist() == [0, 64, 64, 64, 64]  # the leader computes it, the others hit it
    assert int(rq["prefill_computed"].sum()) == int(trace.input_len.sum()) - 6 * 4 * 64
    assert s["prefix_sharing_ratio"] == pytest.approx(s["batchllm_saving_first_level_blocks"])
    assert s["batchllm_saving_first_level"] == pytest.approx(s["batchllm_saving_multi_level"])


def test_members_wait_for_the_leaders_prefix_then_jump_the_queue():
    trace = _grouped_trace(groups=2, degree=3, prefix=64, distinct=16)
    # budget 48: the leader (request 0) computes 48 tokens, then 32 (the prefix's last 16 and its own
    # 16); the rest of that step goes to the next entry of the common queue (request 3, the next
    # group's leader), not to the members, whose prefix is only complete once that step has run
    r = _run(trace, token_budget=48, record_schedule=True)
    sch = r.schedule
    rows = zip(sch["step"], sch["kind"], sch["request"], sch["a"], sch["b"])
    chunks = [(s, q, a, b) for s, k, q, a, b in rows if k == "chunk"]
    assert chunks[:3] == [(0, 0, 48, 0), (1, 0, 32, 48), (1, 3, 16, 0)]
    first = {q: min(s for s, x, _, _ in chunks if x == q) for q in range(6)}
    assert min(first[1], first[2]) > 1
    # once ready, members go before anything new from the common queue; group 0's before group 1's
    assert max(first[1], first[2]) <= min(first[4], first[5])


def test_share_group_does_not_reuse_deeper_levels():
    # a 32-token group prefix; two members also share 16 more tokens (gain 16 = cost 32? no fork)
    prompts = [[(1, 32), (2, 16), (10, 16)], [(1, 32), (2, 16), (11, 16)], [(1, 32), (12, 32)]]
    trace = _trace(prompts, out=[4, 4, 4])
    grp = _run(trace, token_budget=4096).requests["cached_tokens"]
    cache = _run(trace, token_budget=4096, options={"share": "cache"}).requests["cached_tokens"]
    assert sorted(grp.tolist()) == [0, 32, 32]
    assert sorted(cache.tolist()) == [0, 32, 48]


def test_fig4_end_to_end_sharing_stops_at_the_group_prefix():
    trace = _trace(FIG4)  # token-granular blocks below
    grp = _run(trace, B=1, token_budget=4096)
    # prompt 3 shares b with its leader (prompt 2) but not c, which only b+c+f's group shares (it is
    # in the cache, put there by prompt 4, the b+c+f leader); prompt 4 reuses b across groups
    assert grp.requests["cached_tokens"].tolist() == [0, 0, 1, 1, 8, 1]
    cache = _run(trace, B=1, token_budget=4096, options={"share": "cache"})
    assert cache.requests["cached_tokens"].tolist() == [0, 0, 2, 2, 8, 1]
    assert cache.summary["prefix_sharing_ratio"] == pytest.approx(13 / 40)  # every level, as vLLM's cache


def test_groups_stay_on_one_replica():
    trace = _grouped_trace(groups=5, degree=4, shuffle=1)
    r = _run(trace, replicas=2)
    groups = trace.unit_sym[trace.unit_offsets[:-1]]
    for g in np.unique(groups):
        assert len(set(r.requests["replica"][groups == g].tolist())) == 1
    assert set(r.requests["replica"].tolist()) == {0, 1}
    assert int(r.requests["cached_tokens"].sum()) == 5 * 3 * 64


def test_tight_memory_finishes_and_shared_attention_only_changes_cost():
    trace = _grouped_trace(groups=4, degree=6, prefix=64, distinct=40)
    base = _run(trace, capacity_tokens=400, token_budget=64)
    what_if = _run(trace, capacity_tokens=400, token_budget=64, options={"shared_attention": "true"})
    assert np.isfinite(base.requests["finish_s"]).all()
    assert base.summary["output_tokens"] == what_if.summary["output_tokens"]
    assert what_if.summary["makespan_s"] <= base.summary["makespan_s"]


def test_prefix_is_pinned_while_members_wait():
    from blendsim.sim.kv import KVCache
    from blendsim.sim.seq import RequestRecords

    # one group: 32-token prefix (2 blocks) + 16 distinct; the leader makes one token and is done
    trace = _trace([[(1, 32), (10, 16)], [(1, 32), (11, 16)], [(1, 32), (12, 16)]], out=[1, 4, 4])
    pol = _policy(trace, block_size=16)
    pol._finalize()
    cfg = EngineConfig(token_budget=48, block_size=16, admission="greedy", max_seqs=0)
    kv = KVCache(pol.ctx.tree, 100, 16)
    s = pol.make_scheduler(0, kv=kv, cfg=cfg, prompt_len=trace.input_len.tolist(),
                           output_len=trace.output_len.tolist(), records=RequestRecords(3))
    kv = s.kv  # the policy's cache (its matches can be capped)
    for r in np.argsort(pol.rank()).tolist():
        s.requeue(r)
    b = s.schedule(0.0)
    assert [c[0] for c in b.prefill] == [0]  # members wait for the leader's prefix
    s.update(b, 1.0)
    assert s.rec.n_finished == 1  # the leader is gone, yet its prefix is held for the members
    assert kv.cache_blocks == 2 and kv.evictable == 0 and len(s.pinned) == 1
    b = s.schedule(1.0)
    assert [(c[0], c[3]) for c in b.prefill] == [(1, 32), (2, 32)]  # both hit the prefix
    assert not s.pinned and kv.evictable == 0  # now the members hold it themselves
    kv.check()


def test_pins_give_way_when_they_hold_the_whole_cache():
    """Two groups' leaders cache their prefixes in one step and both prefixes are pinned: the 8-token
    cache is all pins and the first leader's last prompt token finds no block. The pins are let go (the
    run finishes) instead of "can neither grow nor make room"."""
    from blendsim.sim.models import get_model

    prompts = [[(1, 4), (1000 + i, 1)] for i in range(4)] + [[(2, 4), (1004 + i, 1)] for i in range(2)]
    trace = from_columns(input_len=[5] * 6, output_len=[1] * 6, prompts=prompts)
    cfg = RunConfig(policy="batchllm", model="tiny", hardware="cpu", block_size=1, token_budget=16,
                    kv_capacity_override=8 * get_model("tiny").kv_bytes_per_token)
    r = run_simulation(trace, cfg)
    assert np.isfinite(r.requests["finish_s"]).all() and len(r.requests["finish_s"]) == 6
