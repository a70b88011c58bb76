"""Preble's E2 (policies/e2): the global scheduler's decisions on hand-made cases, and the local
priority-group scheduler. CPU only, no simulation longer than a second."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest

from blendsim.policies.base import PolicyContext
from blendsim.policies.e2.local import ADMIT, EVICT, FINISH, E2Scheduler, PriorityGroups
from blendsim.policies.e2.router import EXPLOIT, EXPLORE, OPTIONS, PD, E2Router
from blendsim.runner import RunConfig, run_simulation
from blendsim.sim.build_cost import build_cost_model
from blendsim.sim.deployment import Deployment
from blendsim.sim.hardware import get_hardware
from blendsim.sim.kv import KVCache
from blendsim.sim.models import get_model
from blendsim.sim.prefix_tree import PrefixTree
from blendsim.sim.seq import EngineConfig, RequestRecords
from blendsim.workloads.trace import from_columns
from tests.helpers import random_trace, tiny_capacity_bytes

DEP = Deployment(get_model("llama-3-8b"), get_hardware("a100-80gb"), 1, kv_capacity_override=10**12)
CM = build_cost_model(DEP, "sequential", "sglang")


def router(prompts, R=4, kv_tokens=1_000_000, **opts):
    """An E2 router over ``R`` stub replicas (a prefix cache and a feedback deque each)."""
    trace = from_columns(input_len=[sum(n for _, n in pr) for pr in prompts], output_len=[10] * len(prompts),
                         prompts=prompts)
    tree = PrefixTree(trace)
    reps = [SimpleNamespace(scheduler=SimpleNamespace(kv=KVCache(tree, kv_tokens, 1), feedback=deque()))
            for _ in range(R)]
    ctx = PolicyContext(trace=trace, tree=tree, deployment=DEP, cost_model=CM, engine=EngineConfig(block_size=1),
                        replicas=R)
    o = {k: opt.default for k, opt in OPTIONS.items()}
    o.update(opts)
    return E2Router(ctx, reps, opt=o)


def costs(r, req):
    path = r.tree.path(req)
    return [r.cost(i, path, r.P[req])[0] for i in range(r.R)]


# ---- global scheduler ---------------------------------------------------------------------------
def test_exploit_goes_to_the_prefix_holder_even_if_loaded():
    tool = [(1, 1000)]
    pr = [[(100, 500)], tool + [(10, 100)], [(101, 8000)], [(102, 8000)], [(103, 8000)], [(104, 8000)],
          tool + [(11, 100)]]
    r = router(pr)
    assert [r.route(q, 0.1 * q) for q in range(6)] == [0, 1, 2, 3, 0, 1]  # all explore: least L + M + P
    c = costs(r, 6)
    assert int(np.argmin(c)) in (2, 3)  # the replicas with one request are the cheapest ...
    assert r.route(6, 1.0) == 1  # ... but 1000 matched tokens > 100 missed: exploit the tool's replica
    assert r.counts == [1, 6, 0]


def test_explore_goes_to_the_cheapest_replica():
    pr = [[(100, 500)], [(101, 500)], [(102, 500)], [(1, 1000), (10, 100)], [(1, 1000), (11, 100)],
          [(1, 1000), (12, 1500)]]
    r = router(pr)
    for q in range(5):
        r.route(q, 0.1 * q)
    c = costs(r, 5)  # 1000 matched < 1500 missed: explore
    # replica 3 holds the prefix (smallest P) but carries two requests' L
    tm = r.tm
    assert c[3] > c[0] and c[0] == pytest.approx(r.load.load(0) + tm.prefill(2500, 0))
    assert r.route(5, 1.0) == int(np.argmin(c)) == 0
    assert r.counts[EXPLORE] == 5


def test_p_term_decides_between_equal_loads():
    pr = [[(100, 500)], [(101, 500)], [(101, 500), (200, 600)]]
    for cost, want in (("lmp", 1), ("lm", 0)):
        r = router(pr, R=2, cost=cost)
        assert [r.route(0, 0.0), r.route(1, 0.1)] == [0, 1]
        assert r.load.load(0) == r.load.load(1)
        # 500 matched < 600 missed: explore; replica 1 holds the 500 (smaller P) — only L+M+P sees it
        assert r.route(2, 0.2) == want


def test_full_match_exploits_by_the_paper_and_may_explore_by_the_code():
    """A prompt seen in full before: missed 0 < matched, so the paper exploits; Preble's code compares
    the matched leaf's own 1,000 tokens with the 100 before it and explores."""
    pr = [[(100, 800)], [(1, 100), (2, 1000)], [(1, 100), (3, 50)], [(101, 800)], [(1, 100), (2, 1000)]]
    for rule, how in (("paper", EXPLOIT), ("code", EXPLORE)):
        r = router(pr, R=2, exploit=rule, pd_balance=False)
        holders = [r.route(q, 0.1 * q) for q in range(4)]
        before = list(r.counts)
        r.route(4, 1.0)
        assert r.counts[how] == before[how] + 1, (rule, holders, r.counts)
    with pytest.raises(Exception, match="option exploit"):
        router(pr, exploit="sometimes")


def test_exploit_among_several_holders_takes_the_cheapest():
    pr = [[(1, 400), (20, 500)], [(9, 300)], [(1, 400), (21, 500)], [(1, 400), (22, 100)]]
    r = router(pr, R=2)
    assert [r.route(q, 0.1 * q) for q in range(3)] == [0, 1, 1]  # request 2 explores to the lighter one
    assert r.tree.alloc[r.tree.path(3)[0]] == 0b11
    c = costs(r, 3)
    assert r.route(3, 1.0) == int(np.argmin(c))
    assert r.counts[EXPLOIT] == 1


def test_key_node_selection():
    # siblings make the node boundaries: system | tool | query, document | question, ...
    pr = [[(1, 100), (2, 1500), (3, 200)], [(1, 100), (2, 1500), (30, 200)], [(1, 100), (31, 5)],
          [(4, 2000), (5, 100)], [(4, 2000), (32, 100)],
          [(6, 100), (7, 50), (8, 300)], [(6, 100), (7, 50), (33, 300)], [(6, 100), (34, 5)],
          [(9, 100), (10, 50), (11, 60)], [(9, 100), (10, 50), (35, 60)], [(9, 100), (36, 5)]]
    r = router(pr)
    t = r.tree
    assert [len(t.path(q)) for q in (0, 3, 5, 8)] == [3, 2, 3, 3]
    keys = [t.path(q)[t.key_index(t.path(q))] for q in (0, 3, 5, 8)]
    # the tool; the document; 300 > 150 tokens before it: the leaf; 60 < 150 and 50 < 100: the root's child
    assert [t.tokens[k] for k in keys] == [1500, 2000, 300, 100]
    assert [t.level[k] for k in keys] == [2, 1, 3, 1]


def test_window_expires_old_entries():
    pr = [[(1, 1000), (10, 100)], [(50, 200)], [(1, 1000), (11, 100)], [(1, 1000), (12, 100)]]
    r = router(pr, R=2, window_s=180.0, pd_balance=False)
    t = r.tree
    tool = t.path(0)[0]
    assert r.route(0, 0.0) == 0
    r.replicas[0].scheduler.feedback.append((1.0, FINISH, 0, 0.1, 0.01, 10))  # r0 finished at t=1
    r.route(1, 2.0)
    assert t.win_n[tool] == 1 and t.ref[tool * 2] == 0 and t.alloc[tool] == 0b01
    assert r.route(2, 100.0) == 0 and r.counts[EXPLOIT] == 1  # still in the window: exploit
    r.replicas[0].scheduler.feedback.append((101.0, FINISH, 2, 0.1, 0.01, 10))
    before = r.load.n[:]
    r.route(3, 281.0)  # entries of t=0, 2 and 100 have left the 180 s window
    assert len(r.entries) == 1 and r.load.n[0] < before[0]
    assert r.counts[EXPLOIT] == 1  # the tool node was removed (no window entry, nothing cached): explore
    assert t.win_n[tool] == 1  # only request 3 now


def test_route_map_forgets_on_eviction_by_the_paper_and_at_window_end_by_the_code():
    pr = [[(1, 1000), (10, 100)], [(1, 1000), (11, 100)]]
    for rule, kept in (("evict", False), ("window", True)):
        r = router(pr, R=2, route_map=rule, pd_balance=False)
        t = r.tree
        tool = t.path(0)[0]
        assert r.route(0, 0.0) == 0
        fb = r.replicas[0].scheduler.feedback
        fb.append((1.0, FINISH, 0, 0.1, 0.01, 10))
        fb.append((2.0, EVICT, tool, 0, 0, 0))  # replica 0's cache dropped the tool prefix
        r.sync(3.0)
        assert bool(t.alloc[tool] & 1) == kept, rule
        r.sync(200.0)  # request 0 has left the 180 s window: both rules forget the prefix now
        assert t.alloc[tool] == 0, rule


def _rebalance_router(on0: dict, on1: dict, **opts):
    """Tool A (100), B (200), C (300): requests placed by hand on replicas 0 and 1."""
    pr, place = [], []
    for rep, spec in ((0, on0), (1, on1)):
        for tool, n in spec.items():
            for _ in range(n):
                pr.append([(tool, 1000), (10_000 + len(pr), 50)])
                place.append(rep)
    pr += [[(200, 1000), (99_999, 50)]]  # a late request for tool B
    r = router(pr, R=2, pd_balance=False, **opts)
    bal, r.balancer = r.balancer, None
    for q, rep in enumerate(place):
        path = r.tree.path(q)
        r._record(q, path, rep, r.tm.prefill(50, 1000), 1050, 1000, 1.0)
    r.balancer = bal
    return r, len(place)


def test_rebalancing_moves_the_cheapest_key_node_when_heaviest_is_1_5x_lightest():
    r, n = _rebalance_router({100: 60, 200: 40}, {300: 10})
    t = r.tree
    A, B = t.path(0)[0], t.path(60)[0]
    r.balancer.after_assign(2.0, A, 0)
    assert r.balancer.moves == 1
    assert t.alloc[A] == 0b01 and t.alloc[B] == 0b10  # B (the cheaper) moved, then 60 < 1.5 x 50
    assert r.load.n == [60, 50]
    assert r.route(n, 3.0) == 1 and r.counts[EXPLOIT] == 1  # B's next request exploits replica 1


def test_no_rebalancing_below_th_bal():
    r, _ = _rebalance_router({100: 55, 200: 45}, {300: 80})
    r.balancer.after_assign(2.0, r.tree.path(0)[0], 0)
    assert r.balancer.moves == 0 and r.load.n == [100, 80]


def _overloaded_router(second_half_queue: float, on0=None, on1: int = 10, autoscale: str = "paper"):
    r, n = _rebalance_router(on0 or {100: 100}, {300: on1}, autoscale=autoscale)
    fb = r.replicas[0].scheduler.feedback
    # queueing times of tool A's admissions (feedback is time-ordered): 0.1 s in the window's first half
    fb.extend((10.0 + j, ADMIT, j, 1000, 1050, 0.1) for j in range(10))
    fb.extend((150.0 + j, ADMIT, 10 + j, 1000, 1050, second_half_queue) for j in range(10))
    r._drain(170.0)
    A = r.tree.path(0)[0]
    r.balancer.after_assign(170.0, A, 0)
    return r, A


@pytest.mark.parametrize("autoscale", ["paper", "code"])
def test_autoscaling_replicates_an_overloaded_prefix(autoscale):
    r, A = _overloaded_router(0.2, autoscale=autoscale)
    assert r.balancer.moves == 0  # moving A alone would only flip the imbalance
    assert r.balancer.scaled == 1 and r.tree.alloc[A] == 0b11


@pytest.mark.parametrize("autoscale", ["paper", "code", "off"])
def test_no_autoscaling_without_overload(autoscale):
    r, A = _overloaded_router(0.19 if autoscale != "off" else 0.5, autoscale=autoscale)
    assert r.balancer.scaled == 0 and r.tree.alloc[A] == 0b01


@pytest.mark.parametrize("autoscale", ["paper", "code"])
def test_no_autoscaling_when_loads_are_within_th_bal(autoscale):
    r, A = _overloaded_router(0.2, on1=100, autoscale=autoscale)
    assert r.balancer.scaled == 0 and r.balancer.moves == 0


def test_paper_autoscaling_after_partial_rebalancing():
    # heavy replica 0 holds A (100 requests) and B (5): B moves, still out of balance, A is overloaded.
    # Preble's code replicates only a heavy replica's single movable node; the paper's trigger is A's own
    for autoscale, scaled in (("paper", 1), ("code", 0)):
        r, A = _overloaded_router(0.2, on0={100: 100, 200: 5}, autoscale=autoscale)
        assert r.balancer.moves == 1 and r.balancer.scaled == scaled
        assert r.tree.alloc[A] == (0b11 if scaled else 0b01)


def test_pd_balancing_sends_explored_requests_to_a_decode_heavy_replica():
    pr = [[(100 + q, 2000)] for q in range(4)]
    for hit, when, want_pd in ((900, 5.0, True), (600, 5.0, False), (900, -25.0, False)):
        r = router(pr, R=3)
        r.replicas[2].scheduler.feedback.append((when, ADMIT, 3, hit, 1000, 0.0))
        cheapest = int(np.argmin(costs(r, 0)))
        got = r.route(0, 10.0)
        assert (got == 2 and r.counts[PD] == 1) if want_pd else (got == cheapest == 0 and r.counts[PD] == 0)


# ---- local scheduler ----------------------------------------------------------------------------
def _sched(prompts, cached: dict, **kw):
    """An E2Scheduler over a token-granular cache holding ``cached`` {segment position: tokens}."""
    trace = from_columns(input_len=[sum(n for _, n in pr) for pr in prompts], output_len=[5] * len(prompts),
                         prompts=prompts)
    tree = PrefixTree(trace)
    kv = KVCache(tree, 100_000, 1)
    s = E2Scheduler(kv=kv, cfg=EngineConfig(block_size=1, token_budget=512), prompt_len=trace.input_len.tolist(),
                    output_len=trace.output_len.tolist(), queue=PriorityGroups(np.arange(trace.n), kw.pop("groups", 10)),
                    records=RequestRecords(trace.n), **kw)
    for req, tokens in cached.items():
        node = kv.path_of(req)[0]
        kv.reserve(tokens)
        kv.lock(node, 0.0)
        kv.insert(node, 0, tokens)
        kv.unlock(node, 0.0)
    return s


def test_group_from_cached_fraction():
    pr = [[(1, 63), (10, 37)], [(2, 10), (11, 90)], [(3, 11), (12, 89)], [(4, 100)], [(5, 1), (13, 99)],
          [(6, 50)]]
    s = _sched(pr, {0: 63, 1: 10, 2: 11, 3: 100, 4: 1})
    for q in range(len(pr)):
        s.requeue(q)
    # 63% -> 6 (the paper's "priority six"); 10% -> 0; 11% -> 1; whole prompt (last token recomputed) -> 9
    assert [s.waiting.group[q] for q in range(len(pr))] == [6, 0, 1, 9, 0, 0]


def test_group_quota_and_pointer():
    pr = [[(1, 950), (100 + q, 50)] for q in range(25)]  # 95% cached: group 9
    pr += [[(2, 450), (200 + q, 550)] for q in range(3)]  # 45%: group 4
    pr += [[(300 + q, 100)] for q in range(4)]  # nothing cached: group 0
    order = []
    for unit in (1, 10):
        s = _sched(pr, {0: 950, 25: 450}, quota_unit=unit)
        for q in range(len(pr)):
            s.requeue(q)
        assert [s.waiting.count[g] for g in (9, 4, 0)] == [25, 3, 4]
        got = []
        while (c := s.next_candidate()) is not None:
            s.take_candidate(c)
            got.append(c)
        order.append(got)
    g9, g4, g0 = list(range(25)), [25, 26, 27], [28, 29, 30, 31]
    # unit 1: group 9 admits 10, group 4 its 3 (quota 5), group 0 one; then around again
    assert order[0] == g9[:10] + g4 + g0[:1] + g9[10:20] + g0[1:2] + g9[20:] + g0[2:]
    # unit 10 (Preble's code): group 9 admits up to 100, so all of it first
    assert order[1] == g9 + g4 + g0


def test_groups_rematched_every_step_equal_a_full_rematch(monkeypatch):
    seen = {"checks": 0}
    orig = E2Scheduler.update  # patched on the policy's class: the compiled Scheduler's type is immutable

    def update(self, batch, now):
        orig(self, batch, now)
        if isinstance(self, E2Scheduler):
            for req, g in self.waiting.group.items():
                assert g == self._group(req, self.kv.path_of(req))
                seen["checks"] += 1

    monkeypatch.setattr(E2Scheduler, "update", update)
    rng = np.random.default_rng(5)
    trace = random_trace(rng, n=60, arrivals=True)
    run_simulation(trace, RunConfig(policy="e2", model="tiny", hardware="cpu", replicas=2, block_size=4,
                                    token_budget=64, kv_capacity_override=tiny_capacity_bytes(trace, 200, 4)))
    assert seen["checks"] > 50


def test_e2_keeps_more_prefix_sharing_than_round_robin():
    from blendsim.workloads.recipes import synthesize

    trace = synthesize("preble", kind="toolbench", requests=600, rate=20.0, prefixes=50)
    out = {}
    for pol in ("e2", "fcfs"):
        cfg = RunConfig(policy=pol, replicas=4, engine="sglang", token_budget=512, block_size=1)
        out[pol] = run_simulation(trace, cfg).summary
    assert out["e2"]["prefix_sharing_ratio"] > out["fcfs"]["prefix_sharing_ratio"] + 0.1
    assert out["e2"]["e2_exploit"] > out["e2"]["e2_explore"]


def test_feedback_is_causal_and_time_ordered(monkeypatch):
    """The router sees replica feedback in time order and never before it happened."""
    seen = {"events": 0}
    orig = E2Router._drain

    def drain(self, now):
        for _i, fb in self._feedback:
            ts = [e[0] for e in fb]
            assert ts == sorted(ts)
            seen["events"] += sum(t <= now for t in ts)
        orig(self, now)

    monkeypatch.setattr(E2Router, "_drain", drain)
    rng = np.random.default_rng(11)
    trace = random_trace(rng, n=80, arrivals=True)
    r = run_simulation(trace, RunConfig(policy="e2", model="tiny", hardware="cpu", replicas=2, block_size=1,
                                        token_budget=64, kv_capacity_override=tiny_capacity_bytes(trace, 100, 1)))
    assert seen["events"] > 20 and r.summary["evicted_blocks"] > 0


def test_eviction_in_a_fast_forwarded_stretch_is_reported_at_the_next_step():
    s = _sched([[(1, 100), (10, 5)]], {0: 100})
    node = s.kv.path_of(0)[0]
    s.kv.reserve(s.kv.free)  # memory full: the next decode blocks must evict the cached node
    s.schedule(1.0)  # a step at t = 1 (nothing to run)
    s.advance_decode([100])  # a fast-forwarded stretch evicts it, at some time after t = 1
    assert s.kv.cached[node] == 0 and not s.feedback
    s.schedule(2.5)  # the next step starts at t = 2.5: the eviction is reported then
    assert list(s.feedback) == [(2.5, EVICT, node, 0, 0, 0)]
