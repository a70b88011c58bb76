"""Preble's local scheduler (sec. 3.3, Alg. 3): a priority-group wait queue on one replica.

A waiting request belongs to one of P groups by the fraction of its prompt the replica's prefix cache
holds: group ceil(P x cached / prompt) - 1, group 0 without a hit (63 of 100 tokens cached with P = 10
is group 6 counting from 0, the paper's "priority six"). Admission walks a pointer from the top group
down, cyclically: group g may admit up to (g + 1) x ``quota_unit`` requests, first come first served
inside the group, before the pointer moves on (an empty group passes it on at once) — so over a cycle
the groups get requests in proportion to their priority (the paper's example: 10 from the top group,
9 from the next, ...). Everything else is the engine's: running requests first within the token
budget, chunked prefill, LRU eviction of cached leaves, preemption of the newest running request.

Groups are re-matched every step, as Alg. 3 asks, but only where something changed: a request's
cached prefix changes only when blocks of a node on its path enter or leave the cache, so the cache's
insert/evict events re-group exactly the waiting requests whose paths hold that node.

The scheduler also keeps the feedback Preble's global scheduler receives from a replica — admissions
(hit tokens, queueing time), finishes (TTFT, TPOT, output length) and evictions — in ``feedback``, a
time-ordered deque the router drains.
"""

from __future__ import annotations

import heapq
from collections import deque

from blendsim.sim.scheduler import Scheduler

ADMIT, FINISH, EVICT = 0, 1, 2  # feedback kinds


class PriorityGroups:
    """Waiting requests in P groups; FCFS (policy rank) inside each. Lazy heaps: a request lives in
    the group ``group[req]`` says, older heap entries for it are skipped."""

    def __init__(self, rank, groups: int):
        self._rank = rank.tolist() if hasattr(rank, "tolist") else list(rank)
        self.P = groups
        self.heaps: list[list] = [[] for _ in range(groups)]
        self.group: dict[int, int] = {}
        self.count = [0] * groups

    def __len__(self) -> int:
        return len(self.group)

    def put(self, req: int, g: int) -> None:
        old = self.group.get(req)
        if old == g:
            return
        if old is not None:
            self.count[old] -= 1
        self.group[req] = g
        self.count[g] += 1
        heapq.heappush(self.heaps[g], (self._rank[req], req))

    def head(self, g: int) -> int | None:
        heap, group = self.heaps[g], self.group
        while heap and group.get(heap[0][1]) != g:
            heapq.heappop(heap)
        return heap[0][1] if heap else None

    def remove(self, req: int) -> None:
        self.count[self.group.pop(req)] -= 1


class E2Scheduler(Scheduler):
    """One replica under Preble's local scheduler (see the module docstring)."""

    def __init__(self, *, groups: int = 10, quota_unit: int = 1, tier_groups: bool = False, **kw):
        if not isinstance(kw.get("queue"), PriorityGroups):
            q = kw.get("queue")
            rank = q._rank if q is not None and q._rank is not None else range(len(kw["prompt_len"]))
            kw["queue"] = PriorityGroups(rank, groups)
        super().__init__(**kw)
        self.G = groups  # NOTE: self.P is the engine's prompt lengths
        # ours (option tiers=load): a prefix in a host/disk tier counts as cached for the priority groups
        self._match = self.kv.match_tiers if tier_groups else self.kv.match
        self.quota_unit = quota_unit
        self.ptr = groups - 1  # the group admitting now
        self.taken = 0  # admitted from it since the pointer arrived
        self.by_node: dict[int, set] = {}  # node -> waiting requests whose path holds it
        self.paths: dict[int, list] = {}
        self.feedback: deque = deque()
        self._now = 0.0
        self._ff = False  # inside a fast-forwarded decode stretch (no clock at hand)
        self._late: list = []  # nodes evicted there, reported at the next step's start
        prev = self.kv.on_event

        def on_event(kind, node, idx, n):
            if prev is not None:
                prev(kind, node, idx, n)
            self._cache_changed(kind, node, idx)

        self.kv.on_event = on_event

    # ---- waiting queue --------------------------------------------------------------------
    def _group(self, req: int, path: list) -> int:
        """Priority group from the cached fraction of the prompt (the cache's own match)."""
        p = self.P[req]
        target = p + self.resume.get(req, 0)
        hit = self._match(path, (target - 1) // self.B) * self.B
        if hit <= 0 or p <= 0:
            return 0
        if hit > p:
            hit = p
        G = self.G
        g = (G * hit + p - 1) // p - 1
        return g if g < G else G - 1

    def requeue(self, req: int) -> None:
        path = self.kv.path_of(req)
        self.paths[req] = path
        by = self.by_node
        for x in path:
            s = by.get(x)
            if s is None:
                by[x] = {req}
            else:
                s.add(req)
        self.waiting.put(req, self._group(req, path))

    def _cache_changed(self, kind: str, node: int, idx: int) -> None:
        reqs = self.by_node.get(node)
        if reqs:
            w, paths = self.waiting, self.paths
            for r in reqs:
                w.put(r, self._group(r, paths[r]))
        if kind == "evict" and idx == 0:
            if self._ff:
                self._late.append(node)
            else:
                self.feedback.append((self._now, EVICT, node, 0, 0, 0))

    def next_candidate(self) -> int | None:
        w = self.waiting
        if not len(w):
            return None
        for _ in range(self.G + 1):
            g = self.ptr
            if self.taken < (g + 1) * self.quota_unit:
                r = w.head(g)
                if r is not None:
                    return r
            self.ptr = g - 1 if g > 0 else self.G - 1
            self.taken = 0
        return None

    def take_candidate(self, req: int) -> None:
        self.waiting.remove(req)
        by = self.by_node
        for x in self.paths.pop(req):
            s = by[x]
            s.discard(req)
            if not s:
                del by[x]
        self.taken += 1

    # ---- feedback to the global scheduler ---------------------------------------------------
    def schedule(self, now: float):
        self._now = now
        if self._late:
            self.feedback.extend((now, EVICT, x, 0, 0, 0) for x in self._late)
            self._late.clear()
        return super().schedule(now)

    def advance_decode(self, needs: list, starts=()) -> None:
        # NOTE: evictions for decode growth inside a fast-forwarded stretch are reported when the
        # next step starts (its end), never before they happen
        self._ff = True
        try:
            super().advance_decode(needs, starts)
        finally:
            self._ff = False

    def on_admit(self, s, now: float) -> None:
        r = s.req
        rec = self.rec
        if rec.preemptions[r] == 0:
            hit = s.hit if s.hit < s.p else s.p
            self.feedback.append((now, ADMIT, r, hit, s.p, now - rec.routed_s[r]))

    def on_finish(self, s, now: float) -> None:
        r = s.req
        rec = self.rec
        first = rec.first_token_s[r]
        tpot = (now - first) / (s.d - 1) if s.d > 1 else None
        self.feedback.append((now, FINISH, r, first - rec.routed_s[r], tpot, s.d))


__all__ = ["ADMIT", "EVICT", "E2Scheduler", "FINISH", "PriorityGroups"]
