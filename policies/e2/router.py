"""E2, Preble's global scheduler (sec. 3.2, Alg. 1-2), as the engine's router.

Per arrival: match the prompt in the global tree (``tree.GlobalTree``: only requests already seen);
**exploit** when the matched tokens outnumber the missed ones — the replicas the deepest matched node
is routed to, the cheapest by load cost if several — else **explore**: a decode-heavy replica when
prefill/decode balancing finds one (30 s prefix-hit ratio >= ``pd_threshold``), otherwise the replica
of least load cost L + M + P (Alg. 2): L its load in the window H (``load``), M the prefill time of what
its LRU cache would evict to make room, weighted by how many of its recent requests used it (``evict``),
P the new request's own prefill on it. Then post-assignment rebalancing and prefix autoscaling
(``balance``).

What the router reads of a replica — the feedback Preble's global scheduler gets from its local
schedulers: the ``feedback`` stream of admissions, finishes and evictions (``local.E2Scheduler``), only
entries stamped no later than the arrival being routed; and its prefix cache (``blendsim.sim.kv.KVCache``:
cached blocks per node, free blocks, the LRU heap) for the tokens a replica holds of a prompt and for
M — the state the global tree mirrors through eviction messages. Never the output lengths of
unfinished requests, nor anything about requests not yet arrived.
"""

from __future__ import annotations

from collections import deque

from blendsim.policies._tiercost import load_s
from blendsim.policies.base import Router, register_router
from blendsim.policies.e2.balance import Balancer, OverloadDetector
from blendsim.policies.e2.codeload import CodeLoad
from blendsim.policies.e2.evict import lru_victims
from blendsim.policies.e2.load import OutputStats, PaperLoad
from blendsim.policies.e2.local import ADMIT, EVICT, FINISH
from blendsim.policies.e2.timing import TimeModel
from blendsim.policies.e2.tree import GlobalTree
from blendsim.policies.option import OURS, Option
from blendsim.sim.errors import UserError

HIT_WINDOW_S = 30.0  # prefill/decode balancing's hit-ratio window (Preble's code)

OPTIONS = {
    "window_s": Option(180.0, "history window H in seconds (paper: 3 minutes)", source='paper (3-minute window)'),
    "cost": Option("lmp", "load cost terms: lmp = L + M + P (paper, Alg. 2); lm = L + M (Preble's code)", source='paper Alg. 2 (lmp); lm = Preble code'),
    "load": Option("paper", "L: paper = per-request PT(missed) + DT(mean output) over H; code = per key node "
                      "miss x count x PT(node) / routed replicas + outstanding x output x TPOT", source='paper; code = Preble code'),
    "eviction_cost": Option(True, "include M, the cost of what the replica's LRU would evict", source='paper (M term)'),
    "pd_balance": Option(True, "explored requests go to a decode-heavy replica (hit ratio >= pd_threshold)", source='paper and Preble code'),
    "pd_threshold": Option(0.7, "30 s prefix-hit ratio above which a replica counts as decode-heavy", source='Preble code (paper gives none)'),
    "rebalance": Option(True, "post-assignment load adjustment: rebalancing key nodes from the heaviest replica "
                        "(false also turns autoscaling off)", source='paper and Preble code'),
    "th_bal": Option(1.5, "rebalance when the heaviest load >= th_bal x the lightest", source='Preble code (paper gives none)'),
    "autoscale": Option("paper", "replicate an overloaded prefix on the lightest replica: paper = the prefix of "
                           "each assigned request when overloaded; code = only inside rebalancing, for a "
                           "heavy replica with one movable node; off", source='paper; code = Preble code'),
    "overload_signal": Option("queue", "autoscaling trigger: queue = mean queueing time doubles over H (paper); "
                                 "ttft = mean TTFT doubles (Preble's code)", source='paper (queue); ttft = Preble code'),
    "exploit": Option("paper", "exploit rule: paper = missed < matched tokens (Alg. 1: a fully matched prompt "
                         "exploits); code = the matched leaf's own tokens < the tokens before it when the "
                         "whole prompt matched (Preble's code)", source='paper Alg. 1; code = Preble code'),
    "route_map": Option("evict", "a replica leaves a prefix's route map: evict = when its cache evicts the prefix "
                           "(paper); window = when no request through it is left in H (Preble's code)", source='paper (evict); window = Preble code'),
    "groups": Option(10, "local scheduler: number of priority groups P (1 = FCFS)", source='Preble code (paper gives none)'),
    "quota_unit": Option(1, "local scheduler: group g admits (g+1) x quota_unit per pointer visit "
                      "(paper's example: 1; Preble's code: 10)", source="paper's example (1); 10 = Preble code"),
    "tiers": Option("gpu", "a prefix held in a host/disk KV tier (--host-kv-gb): gpu = a miss, recomputed (the "
                           "paper); load = a hit that costs its load as the tiers charge it (host link; disk blocks "
                           "also read from the drive, the later of the two) in P, M and the local "
                           "priority groups", source=OURS, choices=("gpu", "load")),
}
CHOICES = {"cost": ("lmp", "lm"), "load": ("paper", "code"), "autoscale": ("paper", "code", "off"),
           "overload_signal": ("queue", "ttft"), "exploit": ("paper", "code"),
           "route_map": ("evict", "window"), "tiers": ("gpu", "load")}
# outcome codes of a routing decision
EXPLOIT, EXPLORE, PD = 0, 1, 2


@register_router("e2")
class E2Router(Router):
    """Preble's E2 global scheduler over the engine's replicas (see the module docstring)."""

    def __init__(self, ctx, replicas: list, opt: dict | None = None):
        super().__init__(ctx, replicas)
        o = {k: opt.coerce(k, ctx.options.get(k, opt.default)) for k, opt in OPTIONS.items()}
        o.update(opt or {})
        self.opt = o
        R = len(replicas)
        self.R = R
        self.H = float(o["window_s"])
        self.use_p = o["cost"] == "lmp"
        self.use_m = bool(o["eviction_cost"])
        self.pd = bool(o["pd_balance"])
        self.pd_thr = float(o["pd_threshold"])
        self.code_exploit = o["exploit"] == "code"
        kvs = [getattr(r.scheduler, "kv", None) for r in replicas]
        self.tree = GlobalTree(ctx.tree, R, kvs, o["route_map"])
        self.tm = TimeModel(ctx.cost_model)
        self.stats = OutputStats(R, self.H, self.tm)
        self.code_load = o["load"] == "code"
        self.load = (CodeLoad if self.code_load else PaperLoad)(self.tree, self.tm, self.stats)
        self.P = ctx.trace.input_len.tolist()
        self.entries: deque = deque()  # (t, path, replica, Acc, pt, prompt, matched): the window H
        n = ctx.trace.n
        self.path_of: list = [None] * n  # outstanding request -> its path
        self.key_of = [0] * n  # request -> key node
        self.hits = [deque() for _ in range(R)]  # (t, hit tokens, prompt tokens) of admissions
        self.hit_sum = [0] * R
        self.hit_p = [0] * R
        self.overload = OverloadDetector(self.H)
        for key, allowed in CHOICES.items():
            if o[key] not in allowed:
                raise UserError(f"option {key}: expected {' or '.join(allowed)}, got {o[key]!r}")
        if not o["window_s"] > 0:  # NaN: no
            raise UserError(f"option window_s: must be > 0, got {o['window_s']}")
        for k in ("th_bal", "groups", "quota_unit"):
            if not o[k] >= 1:
                raise UserError(f"option {k}: must be >= 1, got {o[k]}")
        if not 0 <= o["pd_threshold"] <= 1:
            raise UserError(f"option pd_threshold: a prefix-hit ratio, must be in [0, 1], got {o['pd_threshold']}")
        scaling = bool(o["rebalance"]) and o["autoscale"] != "off"
        self.track_ttft = scaling and o["overload_signal"] == "ttft"
        self.track_queue = scaling and not self.track_ttft
        self.balancer = Balancer(self, float(o["th_bal"]), o["autoscale"]) if o["rebalance"] else None
        # ours: with tiers=load a prefix in a host/disk tier costs its load as the replica's tiered cache charges
        # it (its links' per-block seconds: the host link, and the drive for disk blocks; _tiercost.load_s)
        self.tier_load = o["tiers"] == "load" and getattr(ctx, "tiers", None) is not None
        self.assigned = 0
        self.counts = [0, 0, 0]  # exploit, explore, pd
        self._feedback = [(i, r.scheduler.feedback) for i, r in enumerate(replicas)
                          if hasattr(r.scheduler, "feedback")]

    # ---- the decision ---------------------------------------------------------------------
    def route(self, req: int, now: float) -> int:
        self.sync(now)
        return self.decide(req, now)

    def sync(self, now: float) -> None:
        """Bookkeeping up to ``now``: apply the replicas' feedback, expire the window H. (Preble runs
        this in background threads, off the scheduling path.)"""
        self._drain(now)
        self._expire(now)

    def decide(self, req: int, now: float) -> int:
        """E2's decision for ``req`` (Alg. 1), recorded, then rebalancing and autoscaling."""
        tree = self.tree
        path = tree.path(req)
        p = self.P[req]
        k = tree.match(path)
        matched = tree.end[path[k - 1]] if k else 0
        if matched > p:
            matched = p
        missed = p - matched
        i = -1
        pt = None
        if self.code_exploit and missed == 0 and k:
            # NOTE: Preble's code compares the leaf its insertion returns -- on a full match the
            # deepest matched node -- by its own tokens against the tokens before it
            before = tree.end[path[k - 2]] if k > 1 else 0
            exploit = tree.end[path[k - 1]] - before < before
        else:
            exploit = missed < matched
        if exploit:
            mask = tree.holders(path, k)
            if mask:
                if mask & (mask - 1) == 0:  # a single holder
                    i = mask.bit_length() - 1
                else:
                    i, pt = self._cheapest([j for j in range(self.R) if mask >> j & 1], path, p)
                how = EXPLOIT
        if i < 0:
            how = EXPLORE
            if self.pd:
                j = self._decode_heavy(now)
                if j >= 0:
                    i, how = j, PD
            if i < 0:
                i, pt = self._cheapest(range(self.R), path, p)
        if pt is None:
            c = tree.cached_tokens(i, path)
            pt = self.tm.prefill(p - c if c < p else 0, c if c < p else p)
        self._record(req, path, i, pt, p, matched, now)
        self.counts[how] += 1
        return i

    def cost(self, i: int, path: list, p: int, L: float | None = None) -> tuple[float, float]:
        """(L + M + P, P) of putting a prompt of ``p`` tokens with ``path`` on replica ``i``
        (``L``: replica i's load when the caller has it)."""
        tree = self.tree
        c = tree.cached_tokens(i, path)
        if c > p:
            c = p
        extra = 0
        load = 0.0
        overlap = False
        if self.tier_load:  # tokens beyond the GPU's in a lower tier are loaded, not recomputed
            kv = tree.kvs[i]
            if kv is not None and kv.tiered:
                B = kv.block_size
                extra = min(kv.match_tiers(path, p // B) * B, p) - c
                if extra > 0:
                    # the match's disk blocks come last: those of them within the extra tokens are read from disk
                    disk = kv.last_split[1] * B
                    load = load_s(kv.links, kv.spec.ranks, extra / B, (disk if disk < extra else extra) / B)
                    overlap = kv.spec.load_mode == "overlap"
                else:
                    extra = 0
        P = self.tm.prefill(p - c - extra, c + extra)
        # the step that runs its first chunk waits for the load before its compute (stall), or runs the two side by
        # side, layer by layer (overlap: the engine's kv_load, sim.kv_tiers), and lasts the longer
        P = (P if P > load else load) if overlap else P + load
        total = (self.load.load(i) if L is None else L) + (P if self.use_p else 0.0)
        if self.use_m:
            kv = tree.kvs[i]
            if kv is not None:
                B = kv.block_size
                need = -(-p // B) - (c + extra) // B - kv.free
                if need > 0:
                    ec = self.load.evict_cost
                    tier = self.tier_load and kv.tiered
                    for x, nb, left in lru_victims(kv, need):
                        m = ec(i, x, nb, left)
                        if tier and m > 0:  # the victim goes to host: reusing it later costs a load
                            pre = self.tm.prefill(nb * B, (kv.blk_start[x] + left) * B)
                            m *= min(1.0, load_s(kv.links, kv.spec.ranks, nb) / pre) if pre > 0 else 1.0
                        total += m
        return total, P

    def _cheapest(self, cands, path: list, p: int) -> tuple[int, float]:
        best, best_c, best_p = -1, 0.0, 0.0
        loads = self.load.loads()
        cost = self.cost
        for j in cands:
            c, P = cost(j, path, p, loads[j])
            if best < 0 or c < best_c:
                best, best_c, best_p = j, c, P
        return best, best_p

    def hit_ratio(self, i: int, now: float) -> float:
        """Prefix-hit ratio of replica i's admissions in the last 30 s."""
        q = self.hits[i]
        lo = now - HIT_WINDOW_S
        while q and q[0][0] < lo:
            _, h, pp = q.popleft()
            self.hit_sum[i] -= h
            self.hit_p[i] -= pp
        return self.hit_sum[i] / self.hit_p[i] if self.hit_p[i] else 0.0

    def _decode_heavy(self, now: float) -> int:
        best, best_r = -1, -1.0
        for j in range(self.R):
            r = self.hit_ratio(j, now)
            if r > best_r:
                best, best_r = j, r
        return best if best_r >= self.pd_thr else -1

    # ---- bookkeeping ----------------------------------------------------------------------
    def _record(self, req, path, i, pt, p, matched, now) -> None:
        tree = self.tree
        kidx = tree.key_index(path)
        key = path[kidx]
        tree.assign(path, i)
        acc = self.load.record(key, i, pt, p, matched)
        self.entries.append((now, path, i, acc, pt, p, matched))
        self.path_of[req] = path
        self.key_of[req] = key
        self.assigned += 1
        if self.balancer is not None and len(path) - 1 - kidx < 3:
            self.balancer.after_assign(now, key, i)

    def _expire(self, now: float) -> None:
        lo = now - self.H
        q = self.entries
        tree, load = self.tree, self.load
        while q and q[0][0] < lo:
            _, path, i, acc, pt, p, matched = q.popleft()
            tree.expire(path, i)
            load.drop(acc, pt, p, matched)
        self.stats.expire(now)

    def _drain(self, now: float) -> None:
        """Apply the replicas' feedback stamped no later than ``now``."""
        key_of, path_of, pd, code = self.key_of, self.path_of, self.pd, self.code_load
        for i, fb in self._feedback:
            while fb and fb[0][0] <= now:
                t, kind, a, b, c, d = fb.popleft()
                if kind == ADMIT:
                    if pd:
                        self.hits[i].append((t, b, c))
                        self.hit_sum[i] += b
                        self.hit_p[i] += c
                    if self.track_queue:
                        self.overload.add(t, key_of[a], i, d)
                elif kind == FINISH:
                    self.tree.finish(path_of[a], i)
                    path_of[a] = None
                    if code:  # the code's load follows outstanding requests and TPOTs
                        self.load.finished(key_of[a], i)
                        self.stats.add(i, t, d, c)
                    else:
                        self.stats.add(i, t, d, None)
                    if self.track_ttft:
                        self.overload.add(t, key_of[a], i, b)
                elif kind == EVICT:
                    self.tree.evicted(i, a)

    def summary(self) -> dict:
        """Decision counts (deterministic)."""
        b = self.balancer
        return {"e2_exploit": self.counts[EXPLOIT], "e2_explore": self.counts[EXPLORE],
                "e2_pd_balanced": self.counts[PD], "e2_rebalance_moves": b.moves if b else 0,
                "e2_autoscaled": b.scaled if b else 0}


__all__ = ["E2Router", "OPTIONS"]
