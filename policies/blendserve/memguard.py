"""Peak-KV prediction for admission: will a newcomer fit at every moment of its life?

The "regular scheduler" inside each memory share (BlendServe preprint sec. 3.4; NanoFlow sec. 4.2
predicts peak memory from expected output lengths before admitting) needs a guard against filling the
physical KV cache. Every running request is modelled as a fluid: its context grows one token per
decode step until its expected finish F_i, when its whole context is freed. For a newcomer with r
expected output tokens, the extra KV over its lifetime [now, now + r] is

    delta(t) = (t - now) * (alive(t) + 1) - sum_{F_i <= t} ctx_i(now) + prompt still to allocate,

and it is admitted when max_t delta(t) fits the free (and evictable) KV. Requests are kept in bins of
``width`` decode steps by expected finish, so a check costs one numpy pass over the bins ahead, and
requests finishing inside a bin are counted alive to its end (conservative).

NOTE: the engine's own reserve rule books every running request's whole remaining growth and ignores
that others finish meanwhile; for a video request that decodes for 50,000 steps that is twice its
steady-state need, and it kept the memory-intensive side of the dual scan at half its share.
"""

from __future__ import annotations

import numpy as np


class FluidPeak:
    """Running requests binned by expected finish clock: count and sum of (context - clock)."""

    def __init__(self, width: int = 64):
        self.W = width
        self.cnt = np.zeros(1024)
        self.sk = np.zeros(1024)
        self.where: dict[int, tuple[int, float]] = {}  # request -> (bin, K)

    def add(self, req: int, ctx: float, clock: int, finish: int) -> None:
        """``req`` holds ``ctx`` tokens at decode clock ``clock`` and is expected to finish at ``finish``."""
        b = max(finish, clock) // self.W
        if b >= len(self.cnt):
            grow = max(b + 1, 2 * len(self.cnt)) - len(self.cnt)
            self.cnt = np.concatenate([self.cnt, np.zeros(grow)])
            self.sk = np.concatenate([self.sk, np.zeros(grow)])
        k = ctx - clock
        self.cnt[b] += 1
        self.sk[b] += k
        self.where[req] = (b, k)

    def remove(self, req: int) -> None:
        b, k = self.where.pop(req, (-1, 0.0))
        if b >= 0:
            self.cnt[b] -= 1
            self.sk[b] -= k

    def move(self, req: int, finish: int) -> None:
        """A new expected finish for ``req`` (its context law is unchanged)."""
        b, k = self.where.pop(req)
        self.cnt[b] -= 1
        self.sk[b] -= k
        self.add(req, k, 0, finish)

    def peak_extra(self, clock: int, prompt: float, out: float) -> float:
        """Largest extra KV (tokens) over ``out`` steps if a newcomer with ``prompt`` tokens still to
        allocate and ``out`` expected output tokens joins at ``clock``."""
        W = self.W
        b0 = clock // W
        cnt, sk = self.cnt[b0:], self.sk[b0:]
        if not len(cnt):
            return prompt + out
        alive = np.cumsum(cnt[::-1])[::-1]  # requests finishing in this bin or later
        done_cnt = np.cumsum(cnt) - cnt  # in earlier bins: finished by this bin's start
        done_k = np.cumsum(sk) - sk
        nb = min(len(cnt), int(out) // W + 1)
        t = np.minimum((b0 + 1 + np.arange(nb)) * W - clock, out)  # steps from now to each bin's end
        delta = t * (alive[:nb] + 1) - (done_k[:nb] + clock * done_cnt[:nb]) + prompt
        end = out + prompt - (sk.sum() + clock * cnt.sum())  # past the last bin: everyone else done
        return float(max(delta.max(), end))


__all__ = ["FluidPeak"]
