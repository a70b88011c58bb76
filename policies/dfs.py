"""``dfs``: the prefix tree's depth-first order (SGLang's DFS baseline; BlendServe's NanoFlow-DFS).

Visiting the tree depth-first gives every shared prefix the shortest reuse distance, which maximises
prefix sharing (SGLang sec. 3; BlendServe sec. 3.3). Children are visited in order of first
appearance, a node's own requests before its children's; with ``heavier_first`` children with more
requests below them go first (SGLang's ``dfs-weight`` priority).
"""

from __future__ import annotations

import numpy as np

from blendsim.policies.base import Policy, register
from blendsim.policies.option import Option


@register("dfs")
class DFS(Policy):
    description = "prefix-tree depth-first order (maximal prefix sharing)"
    paper = "SGLang's dfs-weight schedule"
    needs_prefix_caching = True
    options = {"heavier_first": Option(False, "visit children with more requests first (SGLang dfs-weight)", source='SGLang code (dfs-weight); off = plain DFS')}

    def rank(self) -> np.ndarray:
        tree = self.ctx.tree
        key = -tree.requests_below if self.opt["heavier_first"] else None
        order = tree.dfs_order(key)
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        return rank
