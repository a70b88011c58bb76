"""BlendServe's resource-aware prefix tree (sec. 5.1-5.2): densities and the layer-wise sort.

Built on top of the static ``blendsim.sim.prefix_tree.PrefixTree`` (never rebuilt): every request becomes a leaf
hanging under the node where its prompt ends (node id ``m + r`` for request r, after the ``m`` static
nodes), so requests and shared-prefix subtrees are sorted together, as in the paper's tree where leaves
are requests. A split (``split.py``) detaches a request leaf (``moved[r]``) or a whole static node with
its subtree (``moved_node[v]``, Alg. 2's unit) and re-attaches it under the root; the static arrays are
never changed. Moves are kept as an *effective* parent (``eparent``: the root for moved nodes) and
effective levels (``elevel``), and every aggregate, the sort and the preorder walk that tree. A moved
node v is a root child that computes the path above it (``start[v]`` tokens) once, for its whole
subtree, and keeps the sharing inside it, exactly as a prefix-tree node whose edge held those
``start[v] + tokens[v]`` tokens (a tree built directly in that shape has the same aggregates).

Per node, over the requests below it (estimated output lengths):
rho(R) = (1 - s_R) * sum Comp / sum Mem, with sim.density's Comp and Mem and s_R the subtree's optimal
sharing ratio (``PrefixTree.sharing_ratio``: each node's tokens once plus the path above the subtree).
A request leaf alone shares nothing (s = 0). Layer-wise sort (Alg. 1): the children of every node in
descending density; ties (e.g. all-infinite densities of one-token outputs, which read no KV) keep the
order of first appearance. All of it is vectorised level by level.
"""

from __future__ import annotations

import numpy as np

from blendsim.sim.density import comp_time, density, mem_time


def level_groups(level: np.ndarray) -> list[np.ndarray]:
    """Indices grouped by level (ascending index inside a group)."""
    order = np.argsort(level, kind="stable")
    counts = np.bincount(level, minlength=int(level.max(initial=0)) + 1)
    return np.split(order, np.cumsum(counts)[:-1])


class ResourceTree:
    """Request leaves over a static prefix tree, with densities, sorting and moved (split) leaves.

    ``active`` masks the requests that take part (warm-up requests already served are left out).
    After :meth:`sort`: ``seq`` (active requests in sorted leaf order), ``rho_seq`` (their leaf
    densities) and the preorder used by ``split`` and ``units``.
    """

    def __init__(self, tree, d_est: np.ndarray, rates, active: np.ndarray | None = None):
        self.tree = t = tree
        self.m, self.n = t.num_nodes, t.n_requests
        self.rates = rates
        self.p = t.trace.input_len.astype(np.float64)
        self.d = np.asarray(d_est, dtype=np.float64)
        self.comp = comp_time(self.p, self.d, rates)
        self.mem = mem_time(self.p, self.d, rates)
        self.rho_leaf = density(self.comp, self.mem)
        self.active = np.ones(self.n, dtype=bool) if active is None else np.asarray(active, dtype=bool)
        self.moved = np.zeros(self.n, dtype=bool)  # request leaves moved under the root
        self.moved_node = np.zeros(self.m, dtype=bool)  # static nodes (whole subtrees) moved under the root
        self.levels = level_groups(t.level)
        self._eff_key = None
        self._effective()
        first = np.full(self.m, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, t.req_node, np.arange(self.n))
        for idx in self.levels[:0:-1]:
            np.minimum.at(first, t.parent[idx], first[idx])
        self.first = first  # first request below each node: the tie-break (order of appearance)

    # ---- effective tree (moved nodes hang under the root) -----------------------------------
    def _effective(self) -> None:
        """``eparent``, ``elevel`` and ``elevels`` of the static nodes with the moved ones under the root
        (recomputed only when ``moved_node`` changed)."""
        key = np.flatnonzero(self.moved_node).tobytes()
        if key == self._eff_key:
            return
        self._eff_key = key
        t = self.tree
        if not self.moved_node.any():
            self.eparent, self.elevel, self.elevels = t.parent, t.level, self.levels
            return
        par = np.where(self.moved_node, 0, t.parent)
        par[0] = -1
        lvl = np.zeros(self.m, dtype=np.int64)
        for idx in self.levels[1:]:  # static parents come first; moved nodes' parent is the root
            lvl[idx] = lvl[par[idx]] + 1
        self.eparent, self.elevel, self.elevels = par, lvl, level_groups(lvl)

    # ---- aggregates ------------------------------------------------------------------------
    def up(self, cols: np.ndarray) -> np.ndarray:
        """Per static node, the sum over its (effective) subtree of per-node values (1-D or 2-D)."""
        self._effective()
        acc = np.array(cols, dtype=np.float64)
        par = self.eparent
        for idx in self.elevels[:0:-1]:
            np.add.at(acc, par[idx], acc[idx])
        return acc

    def per_node(self, values: np.ndarray) -> np.ndarray:
        """Subtree sums of a per-request quantity: stay requests under their node, moved ones at
        the root, inactive ones nowhere."""
        stay = self.active & ~self.moved
        acc = self.up(np.bincount(self.tree.req_node, weights=np.where(stay, values, 0.0), minlength=self.m))
        acc[0] += float(np.sum(values[self.active & self.moved]))
        return acc

    def aggregate(self) -> None:
        """Recompute counts, sharing and density of every static node (moved leaves and subtrees
        excluded from their old ancestors; at the root, a moved subtree recomputes its path once)."""
        t = self.tree
        stay = self.active & ~self.moved
        rn = t.req_node
        cols = np.stack([np.bincount(rn, weights=np.where(stay, v, 0.0), minlength=self.m)
                         for v in (np.ones(self.n), self.p, self.comp, self.mem)], axis=1)
        nterm = cols[:, 0].copy()
        acc = self.up(cols)
        mv = self.active & self.moved
        acc[0] += [mv.sum(), self.p[mv].sum(), self.comp[mv].sum(), self.mem[mv].sum()]
        self.cnt, self.P, comp, mem = acc.T
        self.alive = self.cnt > 0
        self.alive[0] = True
        # tokens a DFS computes for each subtree on its own (PrefixTree.computed_tokens_below, restricted
        # to the stay requests): every live node once, the path above once, +1 per duplicate prompt;
        # the root computes moved leaves whole and the path above every live moved subtree once
        dup = np.maximum(nterm - 1, 0)
        inside = self.up(t.tokens * self.alive + dup)
        self.computed = inside + t.start * self.alive
        self.computed[0] += self.p[mv].sum() + float(t.start[self.moved_node & self.alive].sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            keep = np.where(self.P > 0, self.computed / self.P, 1.0)  # 1 - s per node
        self.rho_node = density(comp, mem, 1.0 - keep)
        self.rho_node[~(self.cnt > 0)] = np.nan

    def sharing(self) -> float:
        """Optimal sharing ratio of the active requests in the current (split) tree."""
        return 0.0 if self.P[0] <= 0 else 1.0 - float(self.computed[0] / self.P[0])

    # ---- layer-wise sort (Alg. 1) ------------------------------------------------------------
    def sort(self) -> None:
        """Sort every node's children by descending density and lay the leaves out in DFS order."""
        t, m, n = self.tree, self.m, self.n
        rn = t.req_node
        self._effective()
        par = np.concatenate([self.eparent, np.where(self.moved, 0, rn)])
        par[0] = -1
        lvl = np.concatenate([self.elevel, np.where(self.moved, 1, self.elevel[rn] + 1)])
        inc = np.concatenate([self.alive, self.active])
        key = np.concatenate([-self.rho_node, -self.rho_leaf])
        key = np.where(np.isnan(key), np.inf, key)
        tie = np.concatenate([self.first, np.arange(n)])
        # subtree sizes in included nodes: static part bottom-up, leaves are 1
        stay = self.active & ~self.moved
        size_static = self.up(self.alive.astype(np.float64) + np.bincount(rn, weights=stay, minlength=m))
        size_static[0] += float((self.active & self.moved).sum())
        size = np.concatenate([size_static, np.ones(n)]).astype(np.int64)
        nodes = np.flatnonzero(inc)
        pre = np.zeros(m + n, dtype=np.int64)
        prev_sib = np.full(m + n, -1, dtype=np.int64)
        self._sorted_levels = []
        for idx in level_groups(lvl[nodes])[1:]:
            idx = nodes[idx]
            p_ = par[idx]
            o = np.lexsort((tie[idx], key[idx], p_))
            idx, p_ = idx[o], p_[o]
            first = np.r_[True, p_[1:] != p_[:-1]]
            prev_sib[idx[1:][~first[1:]]] = idx[:-1][~first[1:]]
            sz = size[idx]
            excl = np.cumsum(sz) - sz
            gs = np.flatnonzero(first)
            before = excl - np.repeat(excl[gs], np.diff(np.r_[gs, len(idx)]))
            pre[idx] = pre[p_] + 1 + before
            self._sorted_levels.append((idx, p_, first))
        self.ext_parent, self.pre, self.prev_sib, self.included = par, pre, prev_sib, inc
        node_at = np.full(int(inc.sum()), -1, dtype=np.int64)
        node_at[pre[nodes]] = nodes
        self.node_at = node_at
        act = np.flatnonzero(self.active)
        self.seq = act[np.argsort(pre[m + act], kind="stable")]
        self.rho_seq = self.rho_leaf[self.seq]

    def next_lca(self) -> np.ndarray:
        """For consecutive leaves (seq[i], seq[i+1]): (c1, c2, w) with w their lowest common ancestor
        and c1, c2 its children holding them. In preorder the node right after a leaf is c2."""
        a = self.m + self.seq[:-1]
        c2 = self.node_at[self.pre[a] + 1]
        return self.prev_sib[c2], c2, self.ext_parent[c2]

    def lcp(self) -> np.ndarray:
        """Prompt tokens each request in ``seq`` shares with the one before it (0 for the first,
        and for split leaves, which share no prefix where they now stand)."""
        out = np.zeros(len(self.seq))
        if len(self.seq) > 1:
            _, _, w = self.next_lca()
            t = self.tree
            wi = np.minimum(w, self.m - 1)
            out[1:] = np.where((w > 0) & (w < self.m), t.start[wi] + t.tokens[wi], 0.0)
        return out

    def unit_cost(self) -> np.ndarray:
        """Per extended node (m static nodes, then n request leaves), the prompt tokens it shares with
        stay requests outside it where it stands now: the end of its deepest (effective) strict
        ancestor that holds more stay requests than it does (0 at the root). Moving the node, with its
        whole subtree, under the root makes it recompute exactly these tokens once (its split cost,
        Alg. 2's len_prefix); the sharing inside it is kept. Call after :meth:`aggregate`."""
        t = self.tree
        self._effective()
        par, cnt = self.eparent, self.cnt
        end = (t.start + t.tokens).astype(np.float64)
        end[0] = 0.0
        cost = np.zeros(self.m)
        for idx in self.elevels[1:]:
            pa = par[idx]
            cost[idx] = np.where(cnt[pa] > cnt[idx], end[pa], cost[pa])
        rn = t.req_node
        leaf = np.where(cnt[rn] > 1, end[rn], cost[rn])
        leaf[self.moved] = 0.0
        return np.concatenate([cost, leaf])

    def shared_prefix(self) -> np.ndarray:
        """Per request, the prompt tokens it shares with other stay requests where it stands now:
        the end of the deepest node on its path that another stay request also uses. Moving the
        request under the root makes it recompute exactly these tokens (its split cost)."""
        return self.unit_cost()[self.m:]

    def node_fanout_product(self) -> np.ndarray:
        """Per extended node (static, then request leaves), the product of the number of children of
        every (effective) node above it: the divisor Alg. 2 has applied to t when it reaches it."""
        rn = self.tree.req_node
        self._effective()
        stay = self.active & ~self.moved
        kids = np.bincount(self.eparent[1:][self.alive[1:]], minlength=self.m).astype(np.float64)
        kids += np.bincount(rn, weights=stay, minlength=self.m)
        kids[0] += float((self.active & self.moved).sum())
        prod = np.ones(self.m)
        for idx in self.elevels[1:]:
            pa = self.eparent[idx]
            prod[idx] = prod[pa] * kids[pa]
        leaf = np.where(self.moved, np.maximum(kids[0], 1.0), prod[rn] * np.maximum(kids[rn], 1.0))
        return np.concatenate([prod, leaf])

    def fanout_product(self) -> np.ndarray:
        """Per request, the product of the number of children of every node above its leaf (the
        divisor Alg. 2 applies to the threshold on its way down)."""
        return self.node_fanout_product()[self.m:]


__all__ = ["ResourceTree", "level_groups"]
