"""The T_r-ordered queue of AccelGen's candidates: waiting requests and partly prefilled prompts.

Entries are ``(key, arrival, request, stamp)``, key = latest start time (see ``slack``), ties by arrival
then request index. Re-keying a request pushes a new entry with a new stamp; older entries of the request
are skipped when they surface (lazy deletion), so every operation is O(log n).

The entries lie in three heaps by the request's *class*: a waiting short prompt (``SHORT``), a waiting
long prompt (``LONG``, which ERA holds back) and a running, partly prefilled prompt (``RUNNING``). An
entry is live while its stamp and its heap's class are the request's. :meth:`pop` returns the smallest
live entry over the three heaps, so the order is that of one heap. The classes let Alg. 1's urgent scan
pass over every waiting long prompt at once while ERA holds them, instead of popping and restoring each
of them every step (``AccelGenScheduler._urgent``).
"""

from __future__ import annotations

import heapq

SHORT, LONG, RUNNING = 0, 1, 2  # classes of a candidate (its entry's heap)


class SlackQueue:
    """Candidates in ascending remaining time. ``len()`` counts waiting requests only (those holding no
    KV), as the engine's ``has_work`` and error messages expect of a wait queue."""

    def __init__(self, n: int):
        self._heaps: tuple[list, list, list] = ([], [], [])
        self._stamp = [0] * n
        self._cls = [SHORT] * n
        self.n_wait = 0
        self.pushes = 0  # entries pushed so far
        self.pops = 0  # live entries popped so far (the work of the scans: tests)
        self.log: set | None = None  # when a set: entries pushed are added to it

    def push(self, req: int, key: float, tie: float, cls: int = SHORT) -> None:
        """(Re-)insert ``req`` with ``key`` in class ``cls``; any older entry of it becomes stale."""
        s = self._stamp[req] + 1
        self._stamp[req] = s
        self._cls[req] = cls
        e = (key, tie, req, s)
        heapq.heappush(self._heaps[cls], e)
        self.pushes += 1
        if self.log is not None:
            self.log.add(e)

    def drop(self, req: int) -> None:
        """Forget ``req`` (its entries become stale)."""
        self._stamp[req] += 1

    def set_class(self, req: int, cls: int) -> None:
        """``req``, whose live entry is out of the queue (popped), changed class: :meth:`restore` puts the
        entry back in the heap of ``cls``."""
        self._cls[req] = cls

    def has_entries(self) -> bool:
        """Whether any entry, live or stale, is queued."""
        h = self._heaps
        return bool(h[0] or h[1] or h[2])

    def top(self, cls: int):
        """The first live entry of class ``cls`` (left in the queue), or None."""
        h = self._heaps[cls]
        st, cl = self._stamp, self._cls
        while h:
            e = h[0]
            r = e[2]
            if e[3] == st[r] and cl[r] == cls:
                return e
            heapq.heappop(h)
        return None

    def pop(self, below: float | None = None):
        """Remove and return the first live entry (with key < ``below`` when given), or None."""
        best, bc = None, -1
        for c in (SHORT, LONG, RUNNING):
            e = self.top(c)
            if e is not None and (best is None or e < best):
                best, bc = e, c
        if best is None or (below is not None and not best[0] < below):
            return None
        self.pops += 1
        return heapq.heappop(self._heaps[bc])

    def pop_top(self, cls: int):
        """Remove and return the first live entry of class ``cls``, which :meth:`top` just returned."""
        self.pops += 1
        return heapq.heappop(self._heaps[cls])

    def pop_before(self, cls: int, bound: tuple, keep: set) -> list:
        """Remove and return the live entries of class ``cls`` that come before ``bound``, except those in
        ``keep`` (they stay)."""
        h = self._heaps[cls]
        st, cl = self._stamp, self._cls
        out, back = [], []
        while h and h[0] < bound:
            e = heapq.heappop(h)
            r = e[2]
            if e[3] == st[r] and cl[r] == cls:
                (back if e in keep else out).append(e)
        for e in back:
            heapq.heappush(h, e)
        self.pops += len(out)
        return out

    def restore(self, entry) -> None:
        """Put back an entry returned by :meth:`pop` (still live: its stamp is unchanged)."""
        heapq.heappush(self._heaps[self._cls[entry[2]]], entry)

    def __len__(self) -> int:
        return self.n_wait

    def __iter__(self):
        """Live candidates in order (sorts a copy: tests and diagnostics only)."""
        st, cl = self._stamp, self._cls
        live = [e for c, h in enumerate(self._heaps) for e in h if e[3] == st[e[2]] and cl[e[2]] == c]
        return (e[2] for e in sorted(live))


__all__ = ["LONG", "RUNNING", "SHORT", "SlackQueue"]
