"""The static prefix tree: s_o against a brute-force count, DFS order, aggregates, and the KV cache."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blendsim.sim.kv import KVCache
from blendsim.sim.prefix_tree import PrefixTree
from blendsim.workloads.trace import from_columns


def brute_force_sharing(prompts: list[list[int]]) -> float:
    """1 - computed/prompt tokens with an unbounded cache: every distinct token prefix once, plus one
    recomputed token per duplicate of an identical prompt (an engine always computes the last one)."""
    prefixes, counts = set(), {}
    for p in prompts:
        t = tuple(p)
        counts[t] = counts.get(t, 0) + 1
        prefixes.update(t[:k] for k in range(1, len(t) + 1))
    computed = len(prefixes) + sum(c - 1 for c in counts.values())
    return 1 - computed / sum(len(p) for p in prompts)


prompts_st = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=8), min_size=1, max_size=14)


@settings(max_examples=300, deadline=None)
@given(prompts_st)
def test_optimal_sharing_matches_brute_force_token_prompts(prompts):
    t = from_columns(input_len=[len(p) for p in prompts], output_len=[1] * len(prompts), prompts=prompts)
    tree = PrefixTree(t)
    assert tree.optimal_sharing_ratio() == pytest.approx(brute_force_sharing(prompts), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=4), min_size=1, max_size=12), st.data())
def test_segment_prompts_equal_their_token_expansion(paths, data):
    lengths = {s: data.draw(st.integers(1, 5)) for s in range(5)}
    seg = [[(s, lengths[s]) for s in p] for p in paths]
    # expand each segment into tokens unique to that segment
    tok = [[100 * s + k for s in p for k in range(lengths[s])] for p in paths]
    a = PrefixTree(from_columns(input_len=[sum(ln for _, ln in p) for p in seg], output_len=[1] * len(seg), prompts=seg))
    b = PrefixTree(from_columns(input_len=[len(p) for p in tok], output_len=[1] * len(tok), prompts=tok))
    assert a.optimal_sharing_ratio() == pytest.approx(b.optimal_sharing_ratio(), abs=1e-12)
    assert a.optimal_sharing_ratio() == pytest.approx(brute_force_sharing(tok), abs=1e-12)


def test_structure_and_dfs_order_by_hand():
    prompts = [[1, 2, 3, 4], [9, 9], [1, 2, 3, 5], [1, 2], [1, 2, 3, 4]]
    tree = PrefixTree(from_columns(input_len=[len(p) for p in prompts], output_len=[1] * 5, prompts=prompts))
    # root -> [1,2] (req 3 ends) -> [3] -> {[4] (reqs 0, 4), [5] (req 2)}; root -> [9,9] (req 1)
    assert tree.num_nodes == 6
    n12 = tree.req_node[3]
    assert tree.tokens[n12] == 2 and tree.start[n12] == 0 and list(tree.terminals(n12)) == [3]
    n4 = tree.req_node[0]
    assert tree.req_node[4] == n4 and tree.start[n4] == 3 and tree.tokens[n4] == 1
    # DFS: children in order of first appearance, a node's own requests before its children's
    assert list(tree.dfs_order()) == [3, 0, 4, 2, 1]
    assert tree.requests_below[0] == 5 and tree.requests_below[n12] == 4
    # subtree sharing of {0, 2, 4} under [1,2,3]: computed 3 + 1 + 1 + 1 (duplicate) = 6 of 12
    n3 = tree.parent[n4]
    assert tree.sharing_ratio()[n3] == pytest.approx(0.5)
    heavy = tree.dfs_order(-tree.requests_below)  # heavier children first
    assert list(heavy)[:1] == [3]


def test_subtree_sums_and_paths():
    rng = np.random.default_rng(1)
    prompts = [[int(x) for x in rng.integers(0, 3, rng.integers(1, 6))] for _ in range(60)]
    tree = PrefixTree(from_columns(input_len=[len(p) for p in prompts], output_len=[1] * 60, prompts=prompts))
    vals = rng.random(60)
    sums = tree.subtree_sum(per_request=vals)
    assert sums[0] == pytest.approx(vals.sum())
    for r in range(60):
        path = tree.path(int(tree.req_node[r]))
        assert sum(int(tree.tokens[x]) for x in path) == len(prompts[r])
        assert all(tree.start[x] == sum(int(tree.tokens[y]) for y in path[:i]) for i, x in enumerate(path))


def test_kv_cache_blocks_follow_the_tree():
    # two prompts share 40 tokens; with 16-token blocks the first two blocks are shareable
    t = from_columns(input_len=[50, 45], output_len=[1, 1], prompts=[[(1, 40), (2, 10)], [(1, 40), (3, 5)]])
    tree = PrefixTree(t)
    kv = KVCache(tree, num_blocks=10, block_size=16)
    shared = tree.req_node[0]
    path0 = kv.path_of(0)
    assert [kv.nblocks[x] for x in path0] == [2, 1]  # blocks ending at 16, 32 | 48
    assert kv.match(path0, 10) == 0
    kv.reserve(3)
    kv.lock(path0[0], 0.0)
    assert kv.insert(path0[0], 0, 2) == 2 and kv.private == 1 and kv.cache_blocks == 2
    assert kv.match(kv.path_of(1), 10) == 2  # the second request reuses both shared blocks
    kv.release(1)
    kv.unlock(path0[0], 1.0)
    assert kv.evictable == 2
    assert kv.evict(1) == 1 and kv.cached[path0[0]] == 1  # evicted from the node's tail
    kv.check()
    assert shared != path0[0]


def test_kv_cache_without_retention_frees_a_prefix_when_its_last_user_leaves():
    t = from_columns(input_len=[50, 45], output_len=[1, 1], prompts=[[(1, 40), (2, 10)], [(1, 40), (3, 5)]])
    kv = KVCache(PrefixTree(t), num_blocks=10, block_size=16, retain=False)
    p0, p1 = kv.path_of(0), kv.path_of(1)
    kv.reserve(3)
    kv.lock(p0[0], 0.0)
    kv.insert(p0[0], 0, 2)
    kv.lock(p1[0], 0.5)  # a second user while the first still runs: shares
    assert kv.match(p1, 10) == 2
    kv.unlock_all([p0[0]], 1.0)
    assert kv.cache_blocks == 2 and kv.evictable == 0  # still held by the second
    kv.unlock_all([p1[0]], 2.0)
    assert kv.cache_blocks == 0 and kv.match(p1, 10) == 0 and kv.evicted_blocks == 2
    kv.check()
