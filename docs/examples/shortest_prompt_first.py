"""Shortest-prompt-first over the prefix tree: a policy in a file of its own (docs/writing-a-policy.md).

Plain shortest-prompt-first sorts requests by prompt length and scatters requests that share a
prefix. This one keeps the prefix tree's depth-first order, which computes every shared prefix once
while it is still cached, but visits a node's children by the shortest prompt below each, so short
requests finish early without giving up sharing.

    blendsim simulate trace.parquet --policy docs/examples/shortest_prompt_first.py:ShortestPromptFirst -o run
"""

from __future__ import annotations

import numpy as np

import blendsim


class ShortestPromptFirst(blendsim.Policy):
    name = "spf-tree"
    description = "prefix-tree depth-first order, subtrees with the shortest prompt first"
    options = {"reverse": (False, "visit subtrees in the opposite order (the longest shortest prompt first)")}

    def rank(self) -> np.ndarray:
        tree, trace = self.ctx.tree, self.ctx.trace
        # shortest prompt in each node's subtree: each request's end node, then folded up level by level
        shortest = np.full(tree.num_nodes, np.inf)
        np.minimum.at(shortest, tree.req_node, trace.input_len.astype(np.float64))
        for level in range(int(tree.level.max()), 0, -1):
            nodes = np.flatnonzero(tree.level == level)
            np.minimum.at(shortest, tree.parent[nodes], shortest[nodes])
        key = -shortest if self.opt["reverse"] else shortest
        order = tree.dfs_order(key)  # requests in DFS order, children by ascending key
        rank = np.empty(trace.n, dtype=np.int64)
        rank[order] = np.arange(trace.n)
        return rank
