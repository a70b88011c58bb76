"""E2's time regressions (Preble App. B), taken from the engine's cost model.

Preble fits, per GPU and model, a prefill-time function of (new tokens, context) and a decode-time
function of context, from offline profiling of a single request (its Figs. 9-10: both about linear).
Here the cost model plays the profiled GPU: a prefill of ``n`` tokens after ``c`` cached ones is
priced as one step holding only that chunk (``CostModel.step``, equal to
``cost(BatchFeatures.prefill_only(n, c))``), and a decode token as a one-sequence decode step, which the
cost model makes exactly linear in the context, so two prices give its intercept and slope.
"""

from __future__ import annotations

_DECODE_PROBE = 8192  # context (tokens) of the second decode price that fixes the slope
_MEMO_MAX = 1 << 17  # memoised prefill prices (the same LRU victims are priced decision after decision)
PROFILE_TOKENS = 16384  # prompt lengths priced up front (the cost model's tables grow past it on demand)


class TimeModel:
    """``prefill(n, c)`` and ``decode(d, p)`` in seconds, from one replica's cost model."""

    def __init__(self, cost_model):
        self._step = cost_model.step
        self._memo: dict = {}
        a = self._step(1, 0, 0, 0, 0, 1, 0, 1)[0]
        b = (self._step(1, 0, 0, 0, 0, 1, _DECODE_PROBE, 1)[0] - a) / _DECODE_PROBE
        self.decode_a = a  # seconds per decode token at zero context
        self.decode_b = b  # extra seconds per decode token per context token
        self.prefill(PROFILE_TOKENS)  # NOTE: builds the cost model's tables once, not mid-run

    def prefill(self, n: int, c: int = 0) -> float:
        """Prefill time of ``n`` new prompt tokens after ``c`` tokens already in KV (0 when n == 0:
        a fully cached prompt costs nothing, as E2 treats reused computation)."""
        if n <= 0:
            return 0.0
        key = (n, c)
        t = self._memo.get(key)
        if t is None:
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            t = self._memo[key] = self._step(n, n, 1, n * c + n * (n + 1) // 2, c + n, 0, 0, 1)[0]
        return t

    def decode(self, d: float, p: float) -> float:
        """Time to generate ``d`` tokens one by one after a ``p``-token prompt (context p .. p+d-1)."""
        return d * (self.decode_a + self.decode_b * (p + (d - 1) / 2))


__all__ = ["TimeModel"]
