"""AccelGen's SelectRequests (Alg. 2) and the dynamic-chunking fill (sec. 4.2), as a scheduler mixin.

After the urgent requests, a window of candidates — those within T_r^1 + gamma of the first, at most
``max_window`` — is offered to Alg. 2: long or partly prefilled prompts get a chunk reaching S_b or
filling the free KV, short ones must fit whole, and the candidate whose (compute, KV) demand is nearest
to the free (compute, KV) joins, repeatedly, while one fits. Compute is in tokens ("available GPU
resource represented by # of tokens"), also under ``budget_model=eq4``, where a candidate's D_c is the
chunk that fits the Eq. 4 budget at its offset (measuring both axes in pivot-token equivalents of
Eq. 4 operations instead left every result of bench_accelgen.py unchanged). If compute is still left,
candidates are then taken in T_r order, any prompt cut where the step reaches S_b (sec. 4.2's
token-by-token selection), so a step holds exactly S_b tokens (eq4: S_b's operations) whenever work
and KV allow.
"""

from __future__ import annotations

from blendsim.policies.accelgen.batching import chunk_len, nearest, new_blocks


class SelectMixin:
    """Needs the AccelGenScheduler's ``q``, ``prm``, ``_room``, ``_take`` and the engine state."""

    def _select(self, now: float, chunks: list, seqs: list) -> bool:
        """Returns whether candidates were left waiting (for the step statistics)."""
        prm, B = self.prm, self.B
        if self._room(-1) <= 0 or not self._can_place():
            return len(self.q) > 0
        first = self.q.pop()
        if first is None:
            return False
        entries = [first]
        # NOTE: Eq. 6's SLO_min covers the queue's head too (sec. 4.2: the first queued request has the
        # most stringent SLO, so S_b need not change as the batch fills)
        self._slo_floor = self._budget_slo(first[2])
        lim = first[0] + prm.gamma
        while len(entries) < prm.max_window:
            e = self.q.pop(below=lim)
            if e is None:
                break
            entries.append(e)
        rows = [self._row(e[2]) for e in entries]
        taken = [False] * len(rows)  # got a chunk (its entry is gone: re-keyed or finished prefill)
        tried = [False] * len(rows)  # considered for a chunk this step
        if prm.distance == "normalized":
            scale = (max(1, self.n_dec + self._ptok + self._room(-1)), self.kv.total * B)
        else:
            scale = (1.0, 1.0)
        while self.prm.select == "euclid":
            a_c = self._room(-1)
            free = self.kv.available
            if a_c <= 0 or not self._can_place():
                break
            demands = [None if tried[i] else self._demand(row, free, False) for i, row in enumerate(rows)]
            i = nearest(a_c, free * B, demands, scale)
            if i is None:
                break
            tried[i] = True
            taken[i] = self._take(rows[i][0], demands[i][0], rows[i][3], now, chunks, seqs) > 0
        # fill to S_b in T_r order: the rest of the window, then further candidates
        i = 0
        scanned = 0
        while self._room(-1) > 0 and self._can_place():
            if i == len(rows):
                if scanned >= prm.max_window:
                    break
                e = self.q.pop()
                if e is None:
                    break
                scanned += 1
                entries.append(e)
                rows.append(self._row(e[2]))
                taken.append(False)
                tried.append(False)
            if not tried[i]:
                d = self._demand(rows[i], self.kv.available, True)
                if d is not None:
                    tried[i] = True
                    taken[i] = self._take(rows[i][0], d[0], True, now, chunks, seqs) > 0
            i += 1
        left = False
        for e, t in zip(entries, taken, strict=True):
            if not t:
                self.q.restore(e)
                left = True
        return left or len(self.q) > 0

    def _can_place(self) -> bool:
        """Whether any candidate could get a chunk's KV: a free (or evictable) block, or a partly
        prefilled prompt with room left in its last block (it needs no new block). NOTE: testing only
        the free blocks here livelocked a prompt that filled the KV cache: its last chunk, which needs
        no new block, was never offered, and the stall breaker preempted and re-admitted it forever."""
        if self.kv.available > 0:
            return True
        B, inb = self.B, self._in_batch
        return any(s.computed % B for s in self.prefilling if s.req not in inb)

    def _row(self, r: int) -> tuple:
        """(request, tokens in KV or cached, tokens left, chunkable, new long prompt) of a candidate."""
        s = self.running.get(r)
        if s is not None:
            return r, s.computed, s.target - s.computed, True, False
        target = self.P[r] + self.resume.get(r, 0)
        c = self.kv.match(self.kv.path_of(r), (target - 1) // self.B) * self.B
        long_p = self.P[r] >= self.prm.long_prompt
        return r, c, target - c, long_p, long_p

    def _demand(self, row: tuple, free: int, fill: bool):
        """``(D_c, D_m)`` of a candidate row now, or None when it cannot join: ERA, sequence cap,
        compute or KV. ``fill``: chunk any prompt (sec. 4.2's token-by-token fill)."""
        r, c, rem, chunkable, long_new = row
        if self._running_only and r not in self.running:
            return None
        if long_new and self.long_active and self.prm.era != "off":
            self._era_hit = True
            return None
        if self.cfg.max_seqs and r not in self.running and len(self.running) >= self.cfg.max_seqs:
            return None
        a_c = self._room(r, c)
        if a_c <= 0:
            return None
        if chunkable or fill:
            n = chunk_len(rem, a_c, c, free, self.B)
            if n <= 0:
                return None
        else:
            n = rem
            if n > a_c or new_blocks(c, n, self.B) > free:
                return None
        return n, new_blocks(c, n, self.B) * self.B


__all__ = ["SelectMixin"]
