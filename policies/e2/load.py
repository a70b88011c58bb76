"""E2's load accounting over the window H (Preble Alg. 2's L, and the per-prefix loads that
rebalancing and autoscaling move).

``PaperLoad`` (default) follows Alg. 2: L_i sums, over the requests assigned to replica i in the last H
seconds, their prefill time PT(missed tokens on i at assignment) and their decode time DT(mean output
length observed on i in H). Sums are kept per key node as well, so a rebalancing move carries a
prefix's load from one replica to another (``codeload.CodeLoad`` is Preble's code's variant). Updates
are O(path) per arrival and expiry; nothing scans the window.
"""

from __future__ import annotations

from collections import deque

DEFAULT_OUTPUT = 256  # tokens: expected output before any request has finished (sim.scheduler's value)


class Acc:
    """A key node's window sums on one replica; ``fwd`` points to where a move took them."""

    __slots__ = ("k", "rep", "pt", "n", "ps", "fwd")

    def __init__(self, k: int, rep: int):
        self.k, self.rep, self.pt, self.n, self.ps, self.fwd = k, rep, 0.0, 0, 0, None


class OutputStats:
    """Finished requests per replica: the window mean output length d_i (paper) with the decode-time
    coefficients it gives — one request's DT on replica i is A[i] + Bp[i] x its prompt length
    (A = d (a + b (d - 1) / 2), Bp = b d: ``TimeModel.decode``) — and the median of the last 200 TPOTs,
    0.15 s before any (code)."""

    def __init__(self, R: int, H: float, tm):
        self.H = H
        self.a, self.b = tm.decode_a, tm.decode_b
        self.q = [deque() for _ in range(R)]
        self.sum = [0] * R
        self.all_sum = self.all_n = 0
        self.A = [0.0] * R
        self.Bp = [0.0] * R
        self.tpots = [deque([0.15], maxlen=200) for _ in range(R)]
        self._tpot_med: list = [0.15] * R  # None when stale (recomputed on demand)
        self._oldest = float("inf")  # earliest finish still in some replica's window
        self.n_empty = R  # replicas without a finish in H (they follow the cluster mean)
        for i in range(R):
            self._set(i)

    def _set(self, i: int) -> None:
        d = self.mean(i)
        self.A[i] = d * (self.a + self.b * (d - 1) / 2)
        self.Bp[i] = self.b * d

    def add(self, i: int, t: float, out: int, tpot: float | None) -> None:
        q = self.q[i]
        if not q:
            self.n_empty -= 1
        q.append((t, out))
        if t < self._oldest:
            self._oldest = t
        self.sum[i] += out
        self.all_sum += out
        self.all_n += 1
        self._set(i)
        if self.n_empty:
            for j, qj in enumerate(self.q):
                if not qj:
                    self._set(j)
        if tpot is not None:
            self.tpots[i].append(tpot)
            self._tpot_med[i] = None

    def expire(self, now: float) -> None:
        lo = now - self.H
        if lo <= self._oldest:
            return
        for i, q in enumerate(self.q):
            if q and q[0][0] < lo:
                while q and q[0][0] < lo:
                    self.sum[i] -= q.popleft()[1]
                if not q:
                    self.n_empty += 1
                self._set(i)
        self._oldest = min((q[0][0] for q in self.q if q), default=float("inf"))

    def mean(self, i: int) -> float:
        """Mean output length finished on replica i in H; the cluster's, else DEFAULT_OUTPUT."""
        q = self.q[i]
        if q:
            return self.sum[i] / len(q)
        return self.all_sum / self.all_n if self.all_n else DEFAULT_OUTPUT

    def tpot(self, i: int) -> float:
        m = self._tpot_med[i]
        if m is None:
            s = sorted(self.tpots[i])
            h = len(s) // 2
            m = self._tpot_med[i] = s[h] if len(s) % 2 else (s[h - 1] + s[h]) / 2
        return m


class PaperLoad:
    """L_i = sum over requests on i in H of PT(missed) + DT(mean output on i)."""

    def __init__(self, tree, tm, stats: OutputStats):
        R = tree.R
        self.tree, self.tm, self.stats = tree, tm, stats
        self.pt = [0.0] * R
        self.n = [0] * R
        self.ps = [0] * R
        self.accs: list[dict] = [{} for _ in range(R)]  # replica -> key node -> current Acc

    def _decode(self, i: int, n: int, ps: int) -> float:
        return n * self.stats.A[i] + self.stats.Bp[i] * ps

    def load(self, i: int) -> float:
        st = self.stats
        return self.pt[i] + self.n[i] * st.A[i] + st.Bp[i] * self.ps[i]

    def loads(self) -> list[float]:
        """``load(i)`` of every replica."""
        st = self.stats
        return [pt + n * x + y * ps for pt, n, ps, x, y in zip(self.pt, self.n, self.ps, st.A, st.Bp)]

    def record(self, k: int, i: int, pt: float, p: int, matched: int) -> Acc:
        acc = self.accs[i].get(k)
        if acc is None:
            acc = self.accs[i][k] = Acc(k, i)
        acc.pt += pt
        acc.n += 1
        acc.ps += p
        self.pt[i] += pt
        self.n[i] += 1
        self.ps[i] += p
        return acc

    def drop(self, acc: Acc, pt: float, p: int, matched: int) -> None:
        while acc.fwd is not None:
            acc = acc.fwd
        i = acc.rep
        acc.pt -= pt
        acc.n -= 1
        acc.ps -= p
        self.pt[i] -= pt
        self.n[i] -= 1
        self.ps[i] -= p
        if acc.n == 0 and self.accs[i].get(acc.k) is acc:
            del self.accs[i][acc.k]

    def node_load(self, i: int, k: int) -> float:
        acc = self.accs[i].get(k)
        return 0.0 if acc is None else acc.pt + self._decode(i, acc.n, acc.ps)

    def nodes(self, i: int):
        """Key nodes with load on replica i."""
        return list(self.accs[i])

    def move(self, k: int, src: int, dst: int) -> None:
        """Carry key node k's window load from ``src`` to ``dst`` (a rebalancing move)."""
        a = self.accs[src].pop(k, None)
        if a is None:
            return
        b = self.accs[dst].get(k)
        if b is None:
            b = self.accs[dst][k] = Acc(k, dst)
        b.pt += a.pt
        b.n += a.n
        b.ps += a.ps
        self.pt[src] -= a.pt
        self.n[src] -= a.n
        self.ps[src] -= a.ps
        self.pt[dst] += a.pt
        self.n[dst] += a.n
        self.ps[dst] += a.ps
        a.pt, a.n, a.ps, a.fwd = 0.0, 0, 0, b

    def refresh(self, k: int) -> None:
        """The route map of ``k`` changed (nothing to redo: paper loads follow the requests)."""

    def finished(self, k: int, i: int) -> None:
        """A request with key node ``k`` finished on replica ``i`` (paper loads keep it for H)."""

    def evict_cost(self, i: int, x: int, blocks: int, left: int) -> float:
        """M's term for evicting ``blocks`` blocks of node x on replica i: their prefill time x the
        share of i's requests in H that used x."""
        n = self.n[i]
        if n == 0:
            return 0.0
        w = self.tree.win[x * self.tree.R + i]
        if w == 0:
            return 0.0
        kv = self.tree.kvs[i]
        B = kv.block_size
        return self.tm.prefill(blocks * B, (kv.blk_start[x] + left) * B) * w / n


__all__ = ["Acc", "DEFAULT_OUTPUT", "OutputStats", "PaperLoad"]
