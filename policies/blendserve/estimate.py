"""Output-length estimation by sampling over the prefix tree (BlendServe sec. 5.1).

A fraction ``frac`` of the requests is sampled; their true output lengths become known (the paper runs
them to completion in a warm-up and returns them). Every other request is estimated from the sampled
requests near it in the tree: a subtree with sampled requests uses their mean; a subtree with none
uses the mean of its sibling subtrees; if the siblings have none either, the parent's estimate (one
level up, recursively). Requests with ``output_len_hint >= 0`` (e.g. video generation, whose length is
fixed by frames and quality, sec. 5.4) use the hint exactly and count as known for their neighbours.

NOTE (choices the paper leaves open):
* "per subtree" sampling is stratified: the requests hanging under the same tree node (siblings) form
  a group and each group gets ``frac * size`` samples with stochastic rounding, so the expected sample
  is exactly ``frac`` of the trace, spread evenly over the tree, and seeded. Hinted requests are never
  sampled (their length is already known).
* a sampled request's own estimate is its true length (it has run); see the policy's ``warmup``
  option for whether it is then served again.
* when nothing at all is known (no hints, nothing sampled) every request gets ``default``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blendsim.policies.blendserve.restree import level_groups


@dataclass(frozen=True)
class Estimates:
    """Estimated output length of every request, and which requests were sampled or hinted."""

    d: np.ndarray  # float64 per request: the estimate (exact for sampled and hinted requests)
    sampled: np.ndarray  # bool per request: in the warm-up sample
    hinted: np.ndarray  # bool per request: output_len_hint >= 0


def sample_requests(tree, frac: float, rng: np.random.Generator, eligible: np.ndarray) -> np.ndarray:
    """Stratified sample: about ``frac`` of the eligible requests under every tree node."""
    n = tree.n_requests
    out = np.zeros(n, dtype=bool)
    idx = np.flatnonzero(eligible)
    if frac <= 0 or not len(idx):
        return out
    if frac >= 1:
        out[idx] = True
        return out
    group = tree.parent[tree.req_node[idx]]  # the node the request's own branch hangs under
    group = np.maximum(group, 0)  # a request ending at the root forms the root's group
    key = rng.random(len(idx))
    o = np.lexsort((key, group))
    g = group[o]
    first = np.r_[True, g[1:] != g[:-1]]
    starts = np.flatnonzero(first)
    sizes = np.diff(np.r_[starts, len(g)])
    quota = np.floor(frac * sizes + rng.random(len(sizes))).astype(np.int64)  # stochastic rounding
    rank = np.arange(len(g)) - np.repeat(starts, sizes)
    out[idx[o[rank < np.repeat(quota, sizes)]]] = True
    return out


def estimate_output(tree, output_len, hint, frac: float, seed: int, default: float = 256.0) -> Estimates:
    """Estimates of every request's output length (``output_len`` is read only for sampled rows)."""
    hint = np.asarray(hint)
    hinted = hint >= 0
    sampled = sample_requests(tree, frac, np.random.default_rng(seed), ~hinted)
    value = np.where(hinted, hint, np.asarray(output_len, dtype=np.float64))
    d = estimate_from_known(tree, hinted | sampled, value, default)
    return Estimates(d, sampled, hinted)


def estimate_from_known(tree, known: np.ndarray, value: np.ndarray, default: float = 256.0) -> np.ndarray:
    """Known requests keep ``value``; every other one gets the mean of the known requests of the
    deepest subtree around it that has any: its own node's subtree, else its siblings', else one level
    up, recursively (the root's mean, or ``default`` when nothing is known)."""
    m = tree.num_nodes
    rn = tree.req_node
    value = np.asarray(value, dtype=np.float64)
    term_sum = np.bincount(rn, weights=np.where(known, value, 0.0), minlength=m)
    term_cnt = np.bincount(rn, weights=known.astype(np.float64), minlength=m)
    ksum = tree.subtree_sum(per_node=term_sum)
    kcnt = tree.subtree_sum(per_node=term_cnt)
    kids_sum, kids_cnt = ksum - term_sum, kcnt - term_cnt  # known in a node's child subtrees only
    node_est = np.empty(m)
    node_est[0] = ksum[0] / kcnt[0] if kcnt[0] > 0 else default
    for idx in level_groups(tree.level)[1:]:
        par = tree.parent[idx]
        with np.errstate(invalid="ignore", divide="ignore"):
            own = ksum[idx] / kcnt[idx]
            sib = kids_sum[par] / kids_cnt[par]  # the node itself holds none when this is used
        node_est[idx] = np.where(kcnt[idx] > 0, own, np.where(kids_cnt[par] > 0, sib, node_est[par]))
    return np.maximum(np.where(known, value, node_est[rn]), 1.0)


__all__ = ["Estimates", "estimate_from_known", "estimate_output", "sample_requests"]
