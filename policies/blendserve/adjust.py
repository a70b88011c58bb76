"""Online adjustment of the dual scan (BlendServe sec. 5.4), as a mixin of the scheduler.

A running request whose output outgrows its estimate is re-estimated as running as long again (its
booking in its memory share grows with it); a left-side request that has run past ``relocate`` times
its first estimate -- severely underestimated -- is relocated from M_L to M_R. A request that finishes
early needs nothing here: its booking is freed at its finish and the scanner admits more.

Overruns happen at decode clocks known in advance (a decoding request's output grows one token per
step), so each is a heap event, and the engine's fast-forward of pure-decode steps stops at the next one.
"""

from __future__ import annotations

import heapq

WARM, LEFT, RIGHT = 0, 1, 2


class OnlineAdjust:
    """Needs from the scheduler: ``plan``, ``relocate``, ``fp_frac``, ``est_cur``, ``fp_cur``, ``foot``,
    ``n_side``, ``overrun`` (a list) and ``relocations`` (a counter)."""

    def schedule(self, now: float):
        if self.overrun:
            self._process_overruns()
        return super().schedule(now)

    def _prefill_done(self, s, now: float, step: int) -> None:
        super()._prefill_done(s, now, step)
        if s.fin >= 0 and s.side != WARM:
            self._arm(s, self.est_cur[s.req])

    def _arm(self, s, est: float) -> None:
        """Wake up when ``s`` has generated more than ``est`` tokens (decoding: generated =
        s.generated + tau - tau0)."""
        t_over = s.tau0 + int(est) - s.generated + 1
        heapq.heappush(self.overrun, (max(t_over, self.tau), s.order, s.req, s))

    def _process_overruns(self) -> None:
        """Requests that outlived their estimate: re-estimate them as running as long again (their
        booking grows accordingly) and, from the left share, relocate them to the right (sec. 5.4)."""
        h = self.overrun
        while h and h[0][0] <= self.tau:
            s = heapq.heappop(h)[3]
            r = s.req
            if s.fin < 0 or self.running.get(r) is not s:
                continue  # finished or preempted since
            g = s.generated + self.tau - s.tau0
            est = self.est_cur[r]
            while g > est:
                est *= 2.0
            self.est_cur[r] = est
            self.fluid.move(r, s.tau0 + int(est) - s.generated)
            self.est_sum += int(est) - s.est  # the engine's reserve rule sees the new estimate too
            s.est = int(est)
            severe = self.relocate > 0 and g > self.relocate * self.plan.est[r]
            side = RIGHT if (severe and s.side == LEFT) else s.side
            fp = self.P_own[r] + est * self.fp_frac
            self.foot[s.side] -= self.fp_cur[r]
            self.n_side[s.side] -= 1
            self.foot[side] += fp
            self.n_side[side] += 1
            self.fp_cur[r] = fp
            if side != s.side:
                self.relocations += 1
            s.side = side
            self._arm(s, est)

    def decode_run(self, limit: int):
        h = self.overrun
        while h and (h[0][3].fin < 0 or self.running.get(h[0][3].req) is not h[0][3]):
            heapq.heappop(h)
        if h:
            limit = min(limit, max(h[0][0] - self.tau, 0))
        return super().decode_run(limit)


__all__ = ["LEFT", "OnlineAdjust", "RIGHT", "WARM"]
