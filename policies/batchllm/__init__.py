"""``batchllm``: BatchLLM (Zheng et al., 2024) — global prefix sharing and throughput-oriented batching.

Offline, over the whole trace (``prepare``):

1. *Prefix identification and enlargement* (sec. 4.2, Alg. 1, ``grouping``): the compact prefix tree
   is rewritten bottom-up so its first level holds the prefixes that save the most tokens; each
   first-level node is a prefix-sharing group (common prefix + the members' distinct parts).
   ``summary_extra`` reports the token-saving ratio (Eq. 2) of the multi-level tree, of the naive and
   of the enlarged first level (the paper: 56% vs 55% on its snippet-generation workload).
2. *Groups of one, or whose prefix is under one KV block, become plain requests* (public fork: a KV
   block is the unit of sharing); the prefix of the others is shared in whole blocks.
3. *Group reordering* (sec. 4.3.2, Eq. 4): groups (a plain request is a group of one) run in
   descending ``R_group = 1 / (L_prefix + sum L_distinct)``, i.e. fewest prefill tokens first, so
   the decodes of early groups mix with the prefill chunks of later, longer ones; ties in tree order.
   Members of a group run in the tree's depth-first order; the first one is the group's leader.

Online, per replica (``scheduler.BatchLLMScheduler``): decodes, then continuing prefill chunks, then
the distinct prompt queue, then the common prefix queue (sec. 4.3.1); a group's members wait until its
leader has the prefix cached, then jump the queue; admission is capped by KV memory (Alg. 2), not by
a request count. Several replicas: a group stays on one replica (``GroupRouter``, least prefill
tokens first) — the paper runs one GPU; this is our choice.

Options (paper by default; the public fork's behaviour — microsoft/MixLLM branch batchllm_vllm_064,
see POLICY_NOTES.md — as alternatives):

* ``order``: ``r_group`` (Eq. 4, constant output length as the paper assumes), ``r_group_hint``
  (Eq. 3 with the trace's output-length hints: sum of hints / group prefill tokens; unknown hints
  count as the mean known hint, or 1), ``tree`` (the fork: groups in prefix-tree order; the paper's
  R_group reordering was not found in its code).
* ``batching``: ``memory`` (Alg. 2 with ``kv_threshold``) or ``count`` (the fork: at most vLLM's 256
  + 100 = 356 running requests; Alg. 2 was not found in its code).
* ``kv_threshold``: M_threshold as a fraction of the replica's KV blocks. The paper gives no value;
  0.9 is ours (it leaves a tenth of the cache for the decode growth of the admitted requests).
* ``share``: ``group`` (only the group's common prefix is reused, as the paper's single-level design;
  deeper sharing between distinct parts is recomputed) or ``cache`` (any cached block is reused, as
  vLLM's automatic prefix caching would if left on under the fork).
* ``enlarge``: run Alg. 1 (default) or take the compact tree's first level as it is (ablation).
* ``shared_attention``: BatchLLM's prefix-shared attention kernel (sec. 4.4), on by default because
  the paper's end-to-end results include it (sec. 6.2 credits it for part of the gain); off is the
  scheduling-only ablation, priced like any vLLM attention. The engine prices decode attention from
  the sum of the decodes' contexts; with the kernel each step's sum counts a group's prefix once for
  all its decoding members (whose prefix blocks are shared), and fast-forward is off. It is an
  approximation until the cost model carries shared KV reads itself (it also drops the prefix part's
  attention FLOPs, small next to its bytes in decode).

Engine defaults follow the paper's A100 setup and the fork: vLLM engine overhead, 2,048-token chunked
prefill budget (sec. 6.1), 16-token blocks, decode-first mixing, greedy admission (vLLM's) with
BatchLLM's own KV threshold, no engine request cap (Alg. 2 replaces it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blendsim.policies.base import Policy, Router, register
from blendsim.policies.batchllm.grouping import enlarge_first_level, first_level_saving, multi_level_saving
from blendsim.policies.batchllm.scheduler import BatchLLMScheduler
from blendsim.policies.option import Option

ORDERS = ("r_group", "r_group_hint", "tree")
BATCHING = ("memory", "count")
SHARE = ("group", "cache")
FORK_SEQ_CAP = 256 + 100  # the fork raises vLLM's max_num_seqs by 100


@dataclass(frozen=True)
class Plan:
    """What the replicas' schedulers need from ``prepare`` (see ``BatchLLMScheduler``)."""

    group_of: list  # per request: its shared group, -1 for a plain request
    rank: list  # per request: position in the global order
    prefix_tokens: list  # per shared group: common prefix in whole blocks, in tokens
    pin_nodes: list  # per shared group: static tree nodes holding its prefix blocks
    hit_cap: list  # per request: most cached blocks it may reuse (-1: no cap)
    unit_tokens: list  # per shared group: prefill tokens after sharing (routing load)
    kv_threshold: float
    seq_cap: int
    shared_attention: bool  # price decodes as if the prefix-shared attention kernel read each prefix once


@register("batchllm")
class BatchLLM(Policy):
    description = "BatchLLM: enlarged first-level prefix groups, R_group order, KV-threshold batching"
    paper = 'BatchLLM (Zheng et al., 2024)'
    needs_prefix_caching = True
    engine_defaults = {"token_budget": 2048, "max_seqs": 0, "block_size": 16, "prefix_caching": True,
                       "mix": "decode-first", "admission": "greedy"}
    options = {
        "order": Option("r_group", "r_group (Eq. 4), r_group_hint (Eq. 3 with output hints) or tree (fork)", source='paper Eq. 4 (r_group); tree = public code', choices=ORDERS),
        "batching": Option("memory", "memory (Alg. 2: KV threshold, no request cap) or count (fork: 356 requests)", source='paper Alg. 2 (memory); count = public code', choices=BATCHING),
        "kv_threshold": Option(0.9, "M_threshold of Alg. 2 as a fraction of the KV blocks (paper gives none)", source='ours (paper Alg. 2 gives no value)', lo=1e-9, hi=1.0),
        "share": Option("group", "group (reuse only the group's common prefix) or cache (reuse any cached block)", source='paper sec. 4.3 (group); cache = public code', choices=SHARE),
        "enlarge": Option(True, "enlarge the first-level prefixes with Alg. 1's dynamic programming", source='paper Alg. 1'),
        "shared_attention": Option(True, "sec. 4.4's prefix-shared attention kernel: decodes read each group's "
                                   "prefix KV once (False: scheduling only)", source='paper sec. 4.4'),
    }

    # ---- offline ------------------------------------------------------------------------------
    def prepare(self) -> None:
        tree, trace = self.ctx.tree, self.ctx.trace
        B = self.ctx.engine.block_size
        fl = self.first_level = enlarge_first_level(tree, self.opt["enlarge"])
        blocks = fl.prefix_len // B
        shared = (fl.size >= 2) & (blocks >= 1)  # the rest become plain requests
        sg = np.flatnonzero(shared)
        gmap = np.full(len(fl.anchor), -1, dtype=np.int64)
        gmap[sg] = np.arange(len(sg))
        group_of = gmap[fl.group_of]
        inside = group_of >= 0
        n, L, nb = fl.size[sg], fl.prefix_len[sg], blocks[sg]
        # prefill tokens per group after sharing: the prefix once, every member's distinct part
        unit_tokens = np.bincount(group_of[inside], weights=trace.input_len[inside], minlength=len(sg))
        unit_tokens -= (n - 1) * L
        if self.opt["share"] == "group":
            hit_cap = np.where(inside, np.append(nb, 0)[group_of], 0)
        else:
            hit_cap = np.full(trace.n, -1)
        memory = self.opt["batching"] == "memory"
        self.plan = Plan(
            group_of=group_of.tolist(), rank=self._order(group_of, unit_tokens, fl.anchor[sg]).tolist(),
            prefix_tokens=(nb * B).tolist(),
            pin_nodes=[self._pin_nodes(a, k) for a, k in zip(fl.anchor[sg], nb)],
            hit_cap=hit_cap.tolist(), unit_tokens=unit_tokens.tolist(),
            kv_threshold=self.opt["kv_threshold"] if memory else 0.0, seq_cap=0 if memory else FORK_SEQ_CAP,
            shared_attention=self.opt["shared_attention"])
        self._stats = self._statistics(fl, shared, n)

    def reads_shared_prefix_once(self) -> bool:
        return bool(self.opt["shared_attention"])

    def _order(self, group_of, unit_tokens, anchors) -> np.ndarray:
        """Rank of every request: units (shared groups, plain requests) by the chosen key, members
        in depth-first order within their unit."""
        tree, trace = self.ctx.tree, self.ctx.trace
        pre = tree.preorder()
        dfs_pos = np.empty(trace.n, dtype=np.int64)
        dfs_pos[tree.dfs_order()] = np.arange(trace.n)
        plain = group_of < 0
        # one unit per shared group and per plain request; unit's tree position = its anchor's
        tokens = np.where(plain, trace.input_len, 0).astype(np.float64)
        tokens[~plain] = np.asarray(unit_tokens, dtype=np.float64)[group_of[~plain]]
        where = np.where(plain, pre[tree.req_node], 0)
        where[~plain] = pre[anchors][group_of[~plain]]
        unit = np.where(plain, len(anchors) + np.arange(trace.n), group_of)
        mode = self.opt["order"]
        if mode == "tree":
            key = np.zeros(trace.n)
        elif mode == "r_group":
            key = tokens  # descending 1 / tokens
        else:
            hint = trace.output_len_hint.astype(np.float64)
            known = hint >= 0
            fill = hint[known].mean() if known.any() else 1.0
            est = np.where(known, hint, fill)
            unit_est = np.bincount(unit, weights=est)[unit]
            key = -unit_est / tokens  # descending R = decode / prefill
        order = np.lexsort((dfs_pos, unit, where, key))
        rank = np.empty(trace.n, dtype=np.int64)
        rank[order] = np.arange(trace.n)
        return rank

    def _pin_nodes(self, anchor: int, blocks: int) -> list:
        """Nodes on the root path of ``anchor`` that hold some of the first ``blocks`` blocks."""
        tree, B = self.ctx.tree, self.ctx.engine.block_size
        return [x for x in tree.path(int(anchor)) if int(tree.start[x]) // B < blocks
                and (int(tree.start[x]) + int(tree.tokens[x])) // B > int(tree.start[x]) // B]

    def _statistics(self, fl, shared, n) -> dict:
        tree, B = self.ctx.tree, self.ctx.engine.block_size
        naive = enlarge_first_level(tree, enlarge=False)
        trace = self.ctx.trace
        return {
            "batchllm_groups": int(shared.sum()),
            "batchllm_grouped_requests": int(n.sum()),
            "batchllm_plain_requests": int(trace.n - n.sum()),
            "batchllm_mean_share_degree": float(n.mean()) if len(n) else 0.0,
            "batchllm_saving_multi_level": multi_level_saving(tree),
            "batchllm_saving_first_level_naive": first_level_saving(tree, naive),
            "batchllm_saving_first_level": first_level_saving(tree, fl),
            "batchllm_saving_first_level_blocks": first_level_saving(tree, fl, B, min_size=2),
        }

    def rank(self) -> np.ndarray:
        return np.asarray(self.plan.rank)

    # ---- online -------------------------------------------------------------------------------
    def make_scheduler(self, replica: int, **kw):
        return BatchLLMScheduler(plan=self.plan, replica=replica, **kw)

    def make_router(self, replicas: list) -> Router:
        return GroupRouter(self.ctx, replicas, self.plan)

    def summary_extra(self) -> dict:
        return dict(self._stats)


class GroupRouter(Router):
    """A shared group goes whole to one replica: the one with the fewest prefill tokens so far (after
    sharing) when its first request is handed over; a plain request likewise."""

    def __init__(self, ctx, replicas, plan: Plan):
        super().__init__(ctx, replicas)
        self.plan = plan
        self.p = ctx.trace.input_len.tolist()
        self.load = [0] * len(replicas)
        self.home: dict[int, int] = {}

    def route(self, req: int, now: float) -> int:
        g = self.plan.group_of[req]
        if g >= 0 and g in self.home:
            return self.home[g]
        load = self.load
        i = load.index(min(load))
        load[i] += self.plan.unit_tokens[g] if g >= 0 else self.p[req]
        if g >= 0:
            self.home[g] = i
        return i


__all__ = ["BatchLLM", "GroupRouter", "Plan"]
