"""BatchLLM's explicit prefix identification (sec. 4.2): first-level prefix enlargement and groups.

The compact prefix tree (``blendsim.sim.prefix_tree.PrefixTree``) has many levels of sharing; BatchLLM keeps
one: every request belongs to one *prefix-sharing group* whose common prefix is computed once, and
everything after it is the request's distinct part. Using the root's children as the groups wastes
sharing deeper down, so Alg. 1 rewrites the tree bottom-up: for a node D, a child c and a grandchild
g, re-attaching g directly under D with tokens c+g ("fork c and merge it with g") gains
``(leaves(g) - 1) * len(g)`` shared tokens and costs ``len(c)`` (c's tokens are now computed once more);
the fork is done when the gain exceeds the cost. After the pass, the root's children are the groups.

The rewritten tree is held over the static tree's node ids: a node of the rewritten tree is named by
the static node where its tokens end (no two live nodes end at the same static node), so a group's
prefix is always a root path of the static tree and its length is that node's depth.

NOTE (choices the paper leaves open): ``leaves(g)`` counts requests (identical prompts count once
each); the test is strict (gain > cost), as written in Alg. 1 and in the public fork; each
grandchild is tested once, against the children c had after its own sub-problem was solved (a node
made by a fork is not tested again at the same level); a child left with a single child and no
request of its own is merged into that child, keeping the tree compact (as the fork does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FirstLevel:
    """The first level of a (possibly enlarged) prefix tree: one entry per group."""

    anchor: np.ndarray  # int64, per group: static node where the group's common prefix ends
    prefix_len: np.ndarray  # int64, per group: common prefix tokens (the anchor's depth)
    size: np.ndarray  # int64, per group: member requests
    group_of: np.ndarray  # int64, per request: its group


def enlarge_first_level(tree, enlarge: bool = True) -> FirstLevel:
    """Alg. 1 over ``tree`` (MaximizeReuse(root)); with ``enlarge=False`` the root's children as
    they are (the naive first level)."""
    if not enlarge:
        return _naive_first_level(tree)
    co = tree.child_offsets.tolist()
    ci = tree.child_index.tolist()
    kids = {d: ci[co[d]:co[d + 1]] for d in np.flatnonzero(np.diff(tree.child_offsets)).tolist()}
    vlen = tree.tokens.tolist()  # tokens of each node of the rewritten tree (named by its end node)
    leaves = tree.requests_below.tolist()
    nterm = np.diff(tree.term_offsets).tolist()
    # parents have smaller ids than children: descending ids solve every sub-problem first
    for d in sorted(kids, reverse=True):
        out = []
        for c in kids[d]:
            gk = kids.get(c)
            if not gk:
                out.append(c)
                continue
            lc = vlen[c]
            keep, forked = [], []
            for g in gk:
                (forked if (leaves[g] - 1) * vlen[g] > lc else keep).append(g)
            if not forked:
                out.append(c)
                continue
            for g in forked:  # a copy of c's tokens goes in front of g, which moves up to d
                vlen[g] += lc
                leaves[c] -= leaves[g]
            kids[c] = keep
            if nterm[c] == 0 and len(keep) <= 1:
                if keep:  # c would have one child: merge them (compact tree)
                    vlen[keep[0]] += lc
                    out.append(keep[0])
                del kids[c]
            else:
                out.append(c)
            out.extend(forked)
        kids[d] = out
    first = kids.get(0, [])
    gid = np.full(tree.num_nodes, -1, dtype=np.int64)
    for k, top in enumerate(first):
        stack = [top]
        while stack:
            x = stack.pop()
            gid[x] = k
            stack.extend(kids.get(x, ()))
    return _first_level(tree, np.asarray(first, dtype=np.int64), gid[tree.req_node])


def _naive_first_level(tree) -> FirstLevel:
    """The root's children of the compact tree as the groups (vectorised)."""
    top = np.arange(tree.num_nodes, dtype=np.int64)  # each node's ancestor on level 1
    order = np.argsort(tree.level, kind="stable")
    cuts = np.searchsorted(tree.level[order], np.arange(2, int(tree.level.max(initial=0)) + 2))
    for a, b in zip(cuts[:-1], cuts[1:]):  # level by level: a parent's entry is final before its children's
        idx = order[a:b]
        top[idx] = top[tree.parent[idx]]
    anchor = tree.children(0).astype(np.int64)
    gid = np.full(tree.num_nodes, -1, dtype=np.int64)
    gid[anchor] = np.arange(len(anchor))
    return _first_level(tree, anchor, gid[top[tree.req_node]])


def _first_level(tree, anchor: np.ndarray, group_of: np.ndarray) -> FirstLevel:
    assert (group_of >= 0).all(), "a request's end node is not in the rewritten tree"
    return FirstLevel(anchor=anchor, prefix_len=(tree.start + tree.tokens)[anchor],
                      size=np.bincount(group_of, minlength=len(anchor)).astype(np.int64), group_of=group_of)


def saving_ratio(prompt_tokens: int, saved_tokens: float) -> float:
    """BatchLLM Eq. 2 as a fraction: 1 - processed prefill tokens / logical prefill tokens."""
    return 0.0 if prompt_tokens <= 0 else float(saved_tokens) / float(prompt_tokens)


def multi_level_saving(tree) -> float:
    """Eq. 2 when every node of the compact tree is computed once (all levels shared)."""
    total = int(tree.trace.input_len.sum())
    return saving_ratio(total, total - int(tree.tokens.sum()))


def first_level_saving(tree, fl: FirstLevel, block_size: int = 1, min_size: int = 1) -> float:
    """Eq. 2 when only each group's common prefix is shared: computed once, every other token of
    every request computed by the request itself. With ``block_size`` > 1 the prefix is cut to whole
    blocks (the KV cache shares blocks) and groups under ``min_size`` members share nothing."""
    total = int(tree.trace.input_len.sum())
    shared = fl.prefix_len // block_size * block_size
    saved = np.where(fl.size >= min_size, (fl.size - 1) * shared, 0)
    return saving_ratio(total, int(saved.sum()))


__all__ = ["FirstLevel", "enlarge_first_level", "first_level_saving", "multi_level_saving", "saving_ratio"]
