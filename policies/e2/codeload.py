"""The load of Preble's public code (``global_scheduler_with_time.py``), the ``load=code`` option.

Per key node k in the window H: prefill cost = miss rate (1 - matched / prompt tokens of its requests
in H) x its requests in H x PT(k's tokens after k's context), split evenly over the replicas k is
routed to; decode cost on replica i = k's requests outstanding on i x i's output length x i's median
TPOT of its last 200 finished requests (0.15 s before any). A replica's load sums both over the key
nodes routed to it, so routing a node elsewhere (rebalancing) takes its whole cost along, as the code
does. M counts key nodes only (miss x requests x PT(node)); other nodes evict for free.

NOTE: a node's share is re-spread over its route map at its own events (arrival, expiry, finish,
move); a route-map bit pruned by an eviction report takes effect at the node's next event. The code's
per-node decode length is the request's ``max_new_tokens``, unknown here: the replica's mean output.
"""

from __future__ import annotations

from blendsim.policies.e2.load import PaperLoad


class CodeLoad(PaperLoad):
    """Preble's code's load model (see the module docstring); window bookkeeping from PaperLoad."""

    def __init__(self, tree, tm, stats):
        super().__init__(tree, tm, stats)
        self.cnt: dict = {}  # key node -> [requests, matched tokens, prompt tokens] in H
        self.kref: dict = {}  # key node -> outstanding requests per replica
        self.share: dict = {}  # key node -> (mask, prefill cost, outstanding per replica) as spread
        self.pre = [0.0] * tree.R
        self.dref = [0] * tree.R

    def _prefill_cost(self, k: int) -> float:
        c = self.cnt.get(k)
        if not c:
            return 0.0
        miss = 1.0 - c[1] / c[2] if c[2] else 1.0
        return miss * c[0] * self.tm.prefill(self.tree.tokens[k], self.tree.start[k])

    def refresh(self, k: int) -> None:
        R = self.tree.R
        old = self.share.pop(k, None)
        if old is not None:
            self._spread(*old, -1)
        mask, cost = self.tree.alloc[k], self._prefill_cost(k)
        refs = self.kref.get(k)
        if mask and (cost or (refs and any(refs))):
            new = (mask, cost, tuple(refs) if refs else (0,) * R)
            self.share[k] = new
            self._spread(*new, 1)

    def _spread(self, mask: int, cost: float, refs: tuple, sign: int) -> None:
        per = sign * cost / bin(mask).count("1")
        for j in range(self.tree.R):
            if mask >> j & 1:
                self.pre[j] += per
                self.dref[j] += sign * refs[j]

    def record(self, k, i, pt, p, matched):
        c = self.cnt.get(k)
        if c is None:
            c = self.cnt[k] = [0, 0, 0]
        c[0] += 1
        c[1] += matched
        c[2] += p
        refs = self.kref.get(k)
        if refs is None:
            refs = self.kref[k] = [0] * self.tree.R
        refs[i] += 1
        acc = super().record(k, i, pt, p, matched)
        self.refresh(k)
        return acc

    def drop(self, acc, pt, p, matched):
        k = acc.k
        c = self.cnt[k]
        c[0] -= 1
        c[1] -= matched
        c[2] -= p
        if c[0] == 0:
            del self.cnt[k]
        super().drop(acc, pt, p, matched)
        self.refresh(k)

    def finished(self, k: int, i: int) -> None:
        refs = self.kref[k]
        refs[i] -= 1
        if not any(refs):
            del self.kref[k]
        self.refresh(k)

    def _per_ref(self, i: int) -> float:
        return self.stats.mean(i) * self.stats.tpot(i)

    def load(self, i: int) -> float:
        return self.pre[i] + self.dref[i] * self._per_ref(i)

    def loads(self) -> list[float]:
        return [self.load(i) for i in range(self.tree.R)]

    def node_load(self, i: int, k: int) -> float:
        sh = self.share.get(k)
        if sh is None or not sh[0] >> i & 1:
            return 0.0
        return sh[1] / bin(sh[0]).count("1") + sh[2][i] * self._per_ref(i)

    def nodes(self, i: int):
        return [k for k, sh in self.share.items() if sh[0] >> i & 1]

    def move(self, k, src, dst):
        super().move(k, src, dst)
        self.refresh(k)

    def evict_cost(self, i, x, blocks, left):
        t = self.tree
        if t.tokens[x] <= t.start[x]:
            return 0.0
        c = self.cnt.get(x)
        miss = 1.0 - c[1] / c[2] if c and c[2] else 1.0
        n = c[0] if c else t.ref[x * t.R + i]
        return miss * n * self.tm.prefill(t.tokens[x], t.start[x])


__all__ = ["CodeLoad"]
