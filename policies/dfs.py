"""``dfs``: the prefix tree's depth-first order (SGLang's DFS baseline; BlendServe's NanoFlow-DFS).

Visiting the tree depth-first gives every shared prefix the shortest reuse distance, which maximises
prefix sharing (SGLang sec. 3; BlendServe sec. 3.3). Children are visited in order of first
appearance, a node's own requests before its children's; with ``heavier_first`` children with more
requests below them go first (SGLang's ``dfs-weight`` priority).
"""

from __future__ import annotations

import numpy as np

from blendsim.policies.base import AssignedRouter, Policy, Router, register
from blendsim.policies.option import OURS, Option
from blendsim.sim.errors import UserError

ROUTERS = ("round-robin", "contiguous")


def added_work(tree, order: np.ndarray, input_len: np.ndarray, output_len: np.ndarray, dep) -> np.ndarray:
    """Per request, the seconds of work it adds when the requests run in ``order`` with every prefix kept: the compute
    of the prompt tokens it adds (``PrefixTree.prompt_tokens_added``; at least its prompt's last token, which an
    engine always computes) and of its output, plus the KV its decode steps read (``sim.density``'s Comp and Mem at
    the deployment's achievable rates). Both count: a stretch of long decodes is slow by its KV reads, one of long
    prompts by its compute, and a split by tokens alone gave a stretch of long decodes one engine (the blendserve
    recipe on four replicas: 19-25% slower than round robin)."""
    from blendsim.sim.density import Rates, comp_time, mem_time

    rates = Rates.of(dep)
    added = np.maximum(tree.prompt_tokens_added(order), 1.0)
    d = np.asarray(output_len, dtype=np.float64)
    return comp_time(added, d, rates) + mem_time(np.asarray(input_len, dtype=np.float64), d, rates)


def contiguous_split(order: np.ndarray, work: np.ndarray, engines: int) -> np.ndarray:
    """The engine of each request when ``engines`` engines take consecutive stretches of ``order`` of about equal
    ``work``: a request goes to the stretch that holds the middle of its work, so at most ``engines - 1`` prefix
    groups are cut, and a heavy request that starts just before a boundary goes on to the next, lighter stretch (by
    where its work starts, the blendserve recipe's two longest decodes both ended a stretch 23% over the mean, on
    four replicas: 482.4 s against 438.7 s by the middle)."""
    w = np.asarray(work, dtype=np.float64)[order]
    mid = np.cumsum(w) - w / 2.0
    total = float(w.sum())
    # (a boundary at a request's middle, up to rounding, starts the next stretch there)
    seg = (np.floor(mid * engines / total + 1e-9).astype(np.int64) if total > 0
           else np.arange(len(order), dtype=np.int64) * engines // max(len(order), 1))
    out = np.empty(len(order), dtype=np.int64)
    out[order] = np.minimum(seg, engines - 1)
    return out


@register("dfs")
class DFS(Policy):
    description = "prefix-tree depth-first order (maximal prefix sharing)"
    paper = "SGLang's dfs-weight schedule"
    needs_prefix_caching = True
    options = {
        "heavier_first": Option(False, "visit children with more requests first (SGLang dfs-weight)", source='SGLang code (dfs-weight); off = plain DFS'),
        "router": Option("round-robin", "how requests go to replicas and PP virtual engines: round-robin (every n-th "
                                        "request of the order in turn, so a prefix group of n or more requests is "
                                        "computed on every engine) or contiguous (offline runs: each engine takes one "
                                        "stretch of the order, of about equal work, a shared prefix counted once: a "
                                        "group is computed on one engine, at most engines - 1 groups are cut)",
                         source="round-robin: SGLang's default --load-balance-method for data parallelism; "
                                f"contiguous: {OURS}", choices=ROUTERS),
    }

    def rank(self) -> np.ndarray:
        tree = self.ctx.tree
        key = -tree.requests_below if self.opt["heavier_first"] else None
        order = tree.dfs_order(key)
        self._order = order
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        return rank

    def make_router(self, replicas: list) -> Router:
        if self.opt["router"] == "round-robin" or len(replicas) == 1:
            return super().make_router(replicas)
        t = self.ctx.trace
        if t.n and np.any(t.arrival_s > 0):  # the split is made up front: online it would give each engine a stretch
            # of time (one burst of a group after another) rather than a share of the work
            raise UserError("dfs --opt router=contiguous splits the whole trace's order before the run, for offline "
                            "runs: add --offline, or keep router=round-robin for a trace with arrivals")
        work = added_work(self.ctx.tree, self._order, t.input_len, t.output_len, self.ctx.deployment)
        return AssignedRouter(self.ctx, replicas, contiguous_split(self._order, work, len(replicas)))
