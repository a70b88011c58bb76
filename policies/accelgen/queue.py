"""The T_r-ordered queue of AccelGen's candidates: waiting requests and partly prefilled prompts.

Entries are ``(key, arrival, request, stamp)`` in a heap, key = latest start time (see ``slack``), ties
by arrival then request index. Re-keying a request pushes a new entry with a new stamp; older entries
of the request are skipped when they surface (lazy deletion), so every operation is O(log n).
"""

from __future__ import annotations

import heapq


class SlackQueue:
    """Candidates in ascending remaining time. ``len()`` counts waiting requests only (those holding no
    KV), as the engine's ``has_work`` and error messages expect of a wait queue."""

    def __init__(self, n: int):
        self._heap: list = []
        self._stamp = [0] * n
        self.n_wait = 0

    def push(self, req: int, key: float, tie: float) -> None:
        """(Re-)insert ``req`` with ``key``; any older entry of it becomes stale."""
        s = self._stamp[req] + 1
        self._stamp[req] = s
        heapq.heappush(self._heap, (key, tie, req, s))

    def drop(self, req: int) -> None:
        """Forget ``req`` (its entries become stale)."""
        self._stamp[req] += 1

    def pop(self, below: float | None = None):
        """Remove and return the first live entry (with key < ``below`` when given), or None."""
        h = self._heap
        st = self._stamp
        while h:
            e = h[0]
            if e[3] != st[e[2]]:
                heapq.heappop(h)
                continue
            if below is not None and not e[0] < below:
                return None
            return heapq.heappop(h)
        return None

    def restore(self, entry) -> None:
        """Put back an entry returned by :meth:`pop` (still live: its stamp is unchanged)."""
        heapq.heappush(self._heap, entry)

    def __len__(self) -> int:
        return self.n_wait

    def __iter__(self):
        """Live candidates in order (sorts a copy: tests and diagnostics only)."""
        st = self._stamp
        return (e[2] for e in sorted(self._heap) if e[3] == st[e[2]])


__all__ = ["SlackQueue"]
