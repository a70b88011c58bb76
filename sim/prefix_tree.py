"""The static prefix tree of a trace: a radix tree over all prompts, built once, column-wise.

It gives the optimal prefix sharing ratio s_o (every shared token computed once), the DFS request
order, and per-subtree aggregates (requests, p and d totals, sharing ratio, compute density) that the
offline policies sort and split on.

Construction is level-wise over prompt *units* (tokens or segments, see ``blendsim.workloads.trace``) with numpy:
at unit depth k, requests are grouped by (node at depth k-1, k-th unit); a group of one request ends
the request's path in a leaf holding its whole remaining prompt. Chains of single-child nodes are then
merged, giving a compressed radix tree. Node ids are ordered so a parent's id is below its children's.
"""

from __future__ import annotations

import numpy as np


class PrefixTree:
    """A compressed radix tree over a trace's prompts.

    Node 0 is the root (no tokens). For every node: ``parent``, ``tokens`` (its own edge tokens),
    ``start`` (tokens from the root to where the node begins), ``level`` (edges from the root), the
    children in ``child_offsets``/``child_index`` (CSR, in first-appearance order) and the requests whose
    prompt ends exactly at the node in ``term_offsets``/``term_index``. ``req_node[r]`` is request r's
    end node.
    """

    def __init__(self, trace):
        # trace: a workloads.trace.Trace, or anything with n, unit_offsets, unit_sym, unit_len, input_len
        self.trace = trace
        self.n_requests = trace.n
        self._build(trace.unit_offsets, trace.unit_sym, trace.unit_len, trace.input_len)
        self._index()

    # ---- public API -----------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.parent)

    def children(self, node: int) -> np.ndarray:
        return self.child_index[self.child_offsets[node]:self.child_offsets[node + 1]]

    def terminals(self, node: int) -> np.ndarray:
        return self.term_index[self.term_offsets[node]:self.term_offsets[node + 1]]

    def subtree_sum(self, per_request: np.ndarray | None = None, per_node: np.ndarray | None = None) -> np.ndarray:
        """Per node, the sum over its subtree of a per-request and/or per-node quantity."""
        acc = np.zeros(self.num_nodes, dtype=np.float64)
        if per_request is not None:
            acc += np.bincount(self.req_node, weights=per_request, minlength=self.num_nodes)
        if per_node is not None:
            acc += per_node
        for lvl in range(int(self.level.max(initial=0)), 0, -1):
            idx = self._by_level[lvl]
            np.add.at(acc, self.parent[idx], acc[idx])
        return acc

    @property
    def requests_below(self) -> np.ndarray:
        return self._requests_below

    def shared_prompt_tokens(self) -> np.ndarray:
        """Per request, how much of its prompt (from the start) lies on nodes another request's prompt also runs
        through: the part a prefix-shared attention kernel can read once for a whole group."""
        below = self._requests_below
        end = (self.start + self.tokens).astype(np.float64)
        out = np.zeros(self.num_nodes, dtype=np.float64)
        for lvl in range(1, int(self.level.max(initial=0)) + 1):  # parents before children
            idx = self._by_level[lvl]
            out[idx] = np.where(below[idx] >= 2, end[idx], out[self.parent[idx]])
        return out[self.req_node]

    def own_prompt_tokens(self) -> np.ndarray:
        """Per request, its prompt less the shared prefix (:meth:`shared_prompt_tokens`): the part no other request's
        prompt runs through."""
        return self.trace.input_len - self.shared_prompt_tokens()

    @property
    def computed_tokens_below(self) -> np.ndarray:
        """Prompt tokens a DFS with unbounded cache computes for a subtree processed on its own.

        Every node once, the path above the subtree's root once, and one recomputed token for each
        duplicate of an identical prompt (an engine always computes a prompt's last token to sample).
        """
        dup = np.maximum(np.diff(self.term_offsets) - 1, 0).astype(np.float64)
        inside = self.subtree_sum(per_node=self.tokens.astype(np.float64) + dup)
        return inside + self.start

    def sharing_ratio(self) -> np.ndarray:
        """Per node, the optimal sharing ratio of its subtree's requests: 1 - computed / prompt tokens."""
        p = self.subtree_sum(per_request=self.trace.input_len.astype(np.float64))
        with np.errstate(invalid="ignore", divide="ignore"):
            s = 1.0 - self.computed_tokens_below / p
        return np.where(p > 0, s, 0.0)

    def optimal_sharing_ratio(self) -> float:
        """s_o of the whole trace (BatchLLM Eq. 2 with a DFS order and unbounded cache)."""
        total = float(self.trace.input_len.sum())
        return 0.0 if total == 0 else 1.0 - float(self.computed_tokens_below[0]) / total

    def preorder(self, child_key: np.ndarray | None = None) -> np.ndarray:
        """Pre-order position of each node, children visited by ascending ``child_key``.

        Without a key, children come in order of their first request in the trace.
        """
        key = self._first_req if child_key is None else np.asarray(child_key)
        size = self.subtree_sum(per_node=np.ones(self.num_nodes)).astype(np.int64)
        pre = np.zeros(self.num_nodes, dtype=np.int64)
        for lvl in range(1, int(self.level.max(initial=0)) + 1):
            idx = self._by_level[lvl]
            par = self.parent[idx]
            o = np.lexsort((self._first_req[idx], key[idx], par))
            idx, par = idx[o], par[o]
            sz = size[idx]
            excl = np.cumsum(sz) - sz
            grp_start = np.flatnonzero(np.r_[True, par[1:] != par[:-1]])
            before = excl - np.repeat(excl[grp_start], np.diff(np.r_[grp_start, len(idx)]))
            pre[idx] = pre[par] + 1 + before
        return pre

    def dfs_order(self, child_key: np.ndarray | None = None) -> np.ndarray:
        """Requests in DFS order: a node's own requests first (trace order), then its children's."""
        pre = self.preorder(child_key)
        return np.lexsort((np.arange(self.n_requests), pre[self.req_node]))

    def prompt_tokens_added(self, order: np.ndarray) -> np.ndarray:
        """Per request, the prompt tokens it adds when the requests run in ``order`` with every prefix kept: those of the
        nodes it is the first in ``order`` to reach (a shared prefix counts once, at its group's first request)."""
        n = len(order)
        pos = np.empty(n, dtype=np.int64)
        pos[order] = np.arange(n)
        first = np.full(self.num_nodes, n, dtype=np.int64)  # per node, the earliest position of a request below it
        np.minimum.at(first, self.req_node, pos)
        for lvl in range(int(self.level.max(initial=0)), 0, -1):  # children before parents
            idx = self._by_level[lvl]
            np.minimum.at(first, self.parent[idx], first[idx])
        nodes = np.flatnonzero(first < n)
        nodes = nodes[nodes > 0]
        return np.bincount(order[first[nodes]], weights=self.tokens[nodes].astype(np.float64), minlength=n)

    def path(self, node: int) -> list[int]:
        """Nodes from the root's child down to ``node``."""
        out = []
        while node > 0:
            out.append(node)
            node = int(self.parent[node])
        return out[::-1]

    # ---- construction ---------------------------------------------------------------------
    def _build(self, offsets, sym, ulen, input_len) -> None:
        n = len(offsets) - 1
        counts = np.diff(offsets)
        cum = np.zeros(len(ulen) + 1, dtype=np.int64)
        np.cumsum(ulen, out=cum[1:])
        # ranks of unit symbols so (node, symbol) packs into one int64 key: the symbols themselves,
        # shifted, when their range allows (token ids: a vocabulary), else dense ranks (np.unique
        # sorts every unit, most of the build's time on token-id prompts); either keeps their order
        if len(sym):
            lo, hi = int(sym.min()), int(sym.max())
            if (hi - lo + 1) * (len(sym) + 1) < 2**62:
                rank, n_sym = (sym - lo if lo else sym), hi - lo + 1
            else:
                _, rank = np.unique(sym, return_inverse=True)
                n_sym = int(rank.max()) + 1
        else:
            rank, n_sym = np.zeros(0, dtype=np.int64), 1
        rank = np.asarray(rank, dtype=np.int64)  # no copy when it is already

        parent = [np.array([-1], dtype=np.int64)]
        tokens = [np.array([0], dtype=np.int64)]
        start = [np.array([0], dtype=np.int64)]
        term_req, term_node = [], []
        next_id = 1
        active = np.arange(n, dtype=np.int64)
        node = np.zeros(n, dtype=np.int64)
        node_start = np.zeros(1, dtype=np.int64)  # start + tokens of node ids, grown as we go
        k = 0
        while len(active):
            ending = counts[active] == k
            if ending.any():
                term_req.append(active[ending])
                term_node.append(node[ending])
                active, node = active[~ending], node[~ending]
                if not len(active):
                    break
            u = offsets[active] + k
            key = node * n_sym + rank[u]
            # NOTE: where no group splits (a shared system prompt, level after level) the keys arrive
            # sorted and the stable sort is the identity: check in O(n) instead of sorting
            order = np.arange(len(key)) if (key[1:] >= key[:-1]).all() else np.argsort(key, kind="stable")
            key_s = key[order]
            first = np.r_[True, key_s[1:] != key_s[:-1]]
            grp = np.cumsum(first) - 1
            n_new = int(grp[-1]) + 1
            sizes = np.bincount(grp, minlength=n_new)
            lead = order[first]  # index into active of each group's first member
            new_ids = next_id + np.arange(n_new)
            par = node[lead]
            single = sizes == 1
            # a single request's whole remaining prompt becomes one leaf edge
            remaining = input_len[active[lead]] - (cum[u[lead]] - cum[offsets[active[lead]]])
            tok = np.where(single, remaining, ulen[u[lead]])
            st = node_start[par]
            parent.append(par)
            tokens.append(tok)
            start.append(st)
            node_start = np.concatenate([node_start, st + tok])
            next_id += n_new
            member_new = new_ids[grp]  # per sorted member
            is_single = single[grp]
            term_req.append(active[order[is_single]])
            term_node.append(member_new[is_single])
            keep = order[~is_single]
            active, node = active[keep], member_new[~is_single]
            k += 1
        parent_a = np.concatenate(parent)
        tokens_a = np.concatenate(tokens)
        start_a = np.concatenate(start)
        t_req = np.concatenate(term_req) if term_req else np.zeros(0, dtype=np.int64)
        t_node = np.concatenate(term_node) if term_node else np.zeros(0, dtype=np.int64)
        self._compress(parent_a, tokens_a, start_a, t_req, t_node, n)

    def _compress(self, parent, tokens, start, t_req, t_node, n) -> None:
        """Merge every non-root node that has one child and no terminal request into that child."""
        m = len(parent)
        n_child = np.bincount(parent[1:], minlength=m)
        n_term = np.bincount(t_node, minlength=m)
        merge = (n_child == 1) & (n_term == 0)
        merge[0] = False
        up = parent.copy()  # nearest kept ancestor
        extra = np.zeros(m, dtype=np.int64)  # tokens of merged ancestors prepended to a node
        # parents precede children, and a chain is resolved top-down; do it by depth
        lvl = np.zeros(m, dtype=np.int64)  # depth in edges of the compressed tree
        for idx in _levels(parent)[1:]:
            p = parent[idx]
            mp = merge[p]
            up[idx] = np.where(mp, up[p], p)
            extra[idx] = np.where(mp, extra[p] + tokens[p], 0)
            lvl[idx] = lvl[up[idx]] + 1
        kept = ~merge
        new_id = np.cumsum(kept) - 1
        self.parent = np.where(np.arange(m) == 0, -1, new_id[np.maximum(up, 0)])[kept].astype(np.int64)
        self.tokens = (tokens + extra)[kept]
        self.start = (start - extra)[kept]
        self.level = lvl[kept]
        self.req_node = np.empty(n, dtype=np.int64)
        self.req_node[t_req] = new_id[t_node]

    def _index(self) -> None:
        nn = self.num_nodes
        self._by_level = [np.flatnonzero(self.level == lv) for lv in range(int(self.level.max(initial=0)) + 1)]
        # first request (trace order) below each node: children visited in order of appearance
        first = np.full(nn, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, self.req_node, np.arange(self.n_requests))
        for lvl in range(int(self.level.max(initial=0)), 0, -1):
            idx = self._by_level[lvl]
            np.minimum.at(first, self.parent[idx], first[idx])
        self._first_req = first
        kids = np.arange(1, nn)
        o = np.lexsort((first[kids], self.parent[kids]))
        self.child_index = kids[o]
        self.child_offsets = np.zeros(nn + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.parent[kids], minlength=nn), out=self.child_offsets[1:])
        o = np.argsort(self.req_node, kind="stable")
        self.term_index = o
        self.term_offsets = np.zeros(nn + 1, dtype=np.int64)
        np.cumsum(np.bincount(self.req_node, minlength=nn), out=self.term_offsets[1:])
        self._requests_below = self.subtree_sum(per_request=np.ones(self.n_requests)).astype(np.int64)


def node_path(parent: list, node: int) -> list[int]:
    """Nodes from the root's child down to ``node``, given parent ids as a Python list (the hot paths
    keep one: list indexing is several times faster than numpy's for single items)."""
    out = []
    while node > 0:
        out.append(node)
        node = parent[node]
    out.reverse()
    return out


def _levels(parent: np.ndarray) -> list[np.ndarray]:
    """Node ids grouped by depth in edges (parents have smaller ids than children)."""
    m = len(parent)
    levels = [np.array([0])]
    frontier = np.array([0])
    children_of = np.argsort(parent[1:], kind="stable") + 1
    cstart = np.searchsorted(parent[children_of], np.arange(m), side="left")
    cend = np.searchsorted(parent[children_of], np.arange(m), side="right")
    while True:
        cnt = cend[frontier] - cstart[frontier]
        if cnt.sum() == 0:
            break
        base = np.repeat(cstart[frontier], cnt)
        within = np.arange(cnt.sum()) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        nxt = children_of[base + within]
        levels.append(np.sort(nxt))
        frontier = nxt
    return levels


def build_tree(trace) -> PrefixTree:
    return PrefixTree(trace)


__all__ = ["PrefixTree", "build_tree"]
