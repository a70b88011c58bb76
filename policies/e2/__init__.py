"""``e2``: Preble's distributed prompt scheduling — the E2 global scheduler and its local scheduler.

Preble (Srivatsa et al.) routes each request with E2 (exploitation + exploration, sec. 3.2): requests
whose prompt matches more already-seen tokens than it misses go to the replica holding that prefix;
the rest go to the replica of least load cost L + M + P over a history window H, unless prefill/decode
balancing sends them to a decode-heavy replica; post-assignment rebalancing and prefix autoscaling keep
replicas even. On each replica a local scheduler (sec. 3.3) orders the wait queue by priority groups
of cached-prompt fraction, serving groups in proportion to priority.

Modules: ``router`` (E2, Alg. 1-2), ``tree`` (the online global prefix tree), ``load`` (L over H),
``evict`` (M from the replica's LRU order), ``timing`` (prefill/decode regressions from the cost model),
``balance`` (rebalancing, autoscaling), ``local`` (the priority-group local scheduler).

Paper vs Preble's public code (WukLab/preble ``global_scheduler_with_time.py``). Defaults follow the
paper; options give the code's behaviour:

* cost = L + M + P (Alg. 2); ``cost=lm`` drops P as the code does.
* L = per request in H: PT(tokens missed on the replica at assignment) + DT(mean output length
  finished on the replica in H), DT from a single-request decode regression (App. B, Fig. 10);
  ``load=code``: per key node miss rate x requests in H x PT(node) / replicas routed to, plus
  outstanding requests x output x the replica's median TPOT (0.15 s before any finish); M then counts
  key nodes only, as the code does.
* M = prefill time of each node the replica's LRU would evict x (requests on the replica in H that
  used it / all its requests in H). The paper assumes memory is always full; we read the replica's
  free blocks, which is the same once its cache has filled (it never shrinks by itself).
* Exploit when missed < matched tokens with missed = prompt - matched (Alg. 1: a fully matched prompt
  exploits); ``exploit=code`` compares the leaf node's own tokens with the tokens before it, which
  differs on a full match (the deepest matched node is then the leaf). Candidates: the replicas the deepest
  matched node is routed to. A prefix leaves a replica's route map when the replica evicts it (paper:
  "cached ... until its eviction"); ``route_map=window`` keeps it until no request through it is left
  in H, as the code does.
* Autoscaling (``autoscale=paper``): when loads are still Th_bal apart after rebalancing ("even after
  the above load rebalancing") with the new request's replica the heaviest, its prefix is replicated
  on the lightest replica not holding it if its mean queueing time there doubled over H (second half of
  the window vs the first). ``autoscale=code``: only for a heavy replica with a single movable node;
  ``overload_signal=ttft``: the code's TTFT instead of queueing time.
* Prefill/decode balancing: 30 s prefix-hit ratio, threshold 0.7 (the code; the paper's ImbalR is left
  to profiling). NOTE: the rule ignores load; on ToolBench (~80% of prompt tokens shared) every replica
  passes 0.7, so explored requests all go to the one with the highest ratio (benchmarks/bench_e2.py
  shows what that costs under Zipf popularity). Rebalancing: Th_bal = 1.5, after 50 x replicas assignments, leaf < 3 levels below its
  key node, key nodes used by > 1 request in H (all from the code; the paper leaves them open).
* The router's ``sync`` (replica feedback, window expiry) runs on the routing path here; Preble runs that
  bookkeeping in background threads.
* Local scheduler: P = 10 groups; group g admits (g + 1) x ``quota_unit`` per pointer visit — 1 by
  default (the paper's example: 10, 9, ... from the top groups), 10 in the code. Token budget 512
  (Preble's chunked-prefill budget), token-granular prefix cache (SGLang's radix cache), SGLang's
  engine overhead.

Where the paper leaves choices open (also in the module docstrings): H's entries are requests at
assignment; "average output length" is over finished requests on the replica in H (the cluster's, then
256 tokens before any finish); the hit ratio for P/D balancing is over first admissions; the key node
is taken on the trace's static tree (see ``tree``).
"""

from __future__ import annotations

from blendsim.policies.base import Policy, register
from blendsim.policies.e2.local import E2Scheduler, PriorityGroups
from blendsim.policies.e2.router import OPTIONS, E2Router


@register("e2")
class E2(Policy):
    description = "Preble E2: prompt-aware exploit/explore routing + priority-group local scheduler"
    paper = "Preble (ICLR'25), E2 scheduler"
    needs_prefix_caching = True
    reads_cost_model = True
    engine_defaults = {"token_budget": 512, "block_size": 1, "prefix_caching": True, "mix": "decode-first"}
    options = OPTIONS
    scheduler_cls = E2Scheduler
    router = "e2"

    def make_router(self, replicas: list) -> E2Router:
        self._router = E2Router(self.ctx, replicas, opt=self.opt)
        return self._router

    def make_scheduler(self, replica: int, **kw) -> E2Scheduler:
        G = int(self.opt["groups"])
        return E2Scheduler(queue=PriorityGroups(self._rank, G), replica=replica, groups=G,
                           quota_unit=int(self.opt["quota_unit"]), **kw)

    def summary_extra(self) -> dict:
        r = getattr(self, "_router", None)
        return r.summary() if r is not None else {}


__all__ = ["E2"]
