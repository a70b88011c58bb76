"""AccelGen's remaining time T_r (sec. 4.3) and the running statistics it is estimated from.

T_r is the time a request may still wait before it must run to meet its SLO. Every T_r here is held
as an absolute *key* — the latest start time — so that ``T_r = key - now`` and the order of waiting
requests by T_r never changes while they wait (the paper re-sorts only when a request enters the queue
or gets a chunk; between those events all T_r shrink at the same rate).

* Online request, before its first token (a new prompt, a partly prefilled one, or one preempted
  before its first token): ``key = arrival + SLO_TTFT - N_ck * T_max``, ``N_ck = ceil(S_r / L_c)``.
* Online request after its first token that was preempted (a TG task to recompute):
  ``key = t0 + SLO_TBT - N_ck * T_max``, t0 = when it re-entered the queue (the preemption).
* A running TG task ("returned" each iteration, T_w = 0, N_ck = 1): ``T_r = SLO_TBT - T_max``.
* JCT SLO (offline): at first enqueue, ``T_e = N_ck T_max + S_g (T_max + P_max P)`` and the allowed wait
  per iteration ``a = (SLO_JCT - T_e) / (N_ck + S_g)``. Carrying over excess or unused wait between
  iterations, as the paper prescribes, makes iteration k's deadline
  ``arrival + (k + 1) a + k_c T_max + k_g (T_max + P_max P)`` after k_c chunks and k_g decode iterations.

NOTE: choices the paper leaves open — a request with several SLOs takes the smallest key; a request
with no SLO at all is best effort, keyed ``arrival + best_effort_slack`` (infinite by default: after
every SLO request, FCFS among themselves); an online request with a TTFT SLO but no TBT SLO gets the
paper's default TBT of 0.1875 s; TTFT is always measured from arrival (the metric's definition), also
after a preemption before the first token.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

INF = math.inf
DEFAULT_OUTPUT = 256  # predicted output tokens before any request has finished on the replica


class SloBook:
    """The trace's SLO columns as Python lists (infinite = none), shared by all replicas."""

    def __init__(self, trace, default_tbt: float, jct_output: str = "hint"):
        def col(a):
            return np.where(np.isfinite(a), a, INF).tolist()

        self.arrival = trace.arrival_s.tolist()
        self.prompt = trace.input_len.tolist()
        self.ttft = col(trace.ttft_slo_s)
        self.tbt = col(trace.tbt_slo_s)
        self.jct = col(trace.jct_slo_s)
        # the TBT used for budgets and TG keys: the request's own, else the paper's default for online
        # requests (those with a TTFT SLO), else none
        self.tbt_eff = [b if b < INF else (default_tbt if f < INF else INF)
                        for b, f in zip(self.tbt, self.ttft, strict=True)]
        self.hint = trace.output_len_hint.tolist()
        self.oracle = trace.output_len.tolist() if jct_output == "oracle" else None


class StepStats:
    """Per-replica running estimates: T_max (largest step time over a sliding window of steps), L_c
    (exponential average of the lengths of chunks that cut a prompt), P (preemptions per decode token),
    P_max (longest preemption, from eviction until the request's next token) and the mean output length
    of finished requests (for S_g)."""

    def __init__(self, t_pf: float, s_pf: int, window: int, alpha: float):
        self.t_init = t_pf
        self.window = window
        self._win: deque = deque()  # (step, seconds), seconds decreasing: the window's max is in front
        self.l_c = float(s_pf)
        self.alpha = alpha
        self.tg_tokens = 0
        self.preempted = 0
        self.p_max = 0.0
        self.fin_sum = 0
        self.fin_n = 0

    @property
    def t_max(self) -> float:
        return self._win[0][1] if self._win else self.t_init

    @property
    def p(self) -> float:
        return self.preempted / self.tg_tokens if self.tg_tokens else 0.0

    def step_done(self, step: int, seconds: float, decodes: int) -> None:
        w = self._win
        while w and w[-1][1] <= seconds:
            w.pop()
        w.append((step, seconds))
        while w[0][0] <= step - self.window:
            w.popleft()
        self.tg_tokens += decodes

    def chunk_cut(self, n: int) -> None:
        self.l_c += self.alpha * (n - self.l_c)

    def n_chunks(self, tokens: int) -> int:
        return -(-tokens // max(1, int(self.l_c))) if tokens > 0 else 0

    def mean_output(self) -> int:
        return self.fin_sum // self.fin_n if self.fin_n else DEFAULT_OUTPUT


class Slack:
    """Keys and remaining times of one replica's requests."""

    def __init__(self, book: SloBook, stats: StepStats, best_effort_slack: float = INF):
        self.book = book
        self.st = stats
        self.best_effort_slack = best_effort_slack
        self.plans: dict[int, tuple] = {}  # JCT requests: (a, chunk cost, token cost, per-iteration SLO)

    def plan(self, r: int) -> tuple:
        """The JCT conversion of request ``r``, made once, when it first enters the queue."""
        pl = self.plans.get(r)
        if pl is None:
            b, st = self.book, self.st
            if b.oracle is not None:
                s_g = b.oracle[r]
            else:
                s_g = b.hint[r] if b.hint[r] >= 0 else st.mean_output()
            n_ck = max(1, st.n_chunks(b.prompt[r]))
            t_max = st.t_max
            c_tok = t_max + st.p_max * st.p
            t_e = n_ck * t_max + s_g * c_tok
            iters = n_ck + s_g
            pl = self.plans[r] = ((b.jct[r] - t_e) / iters, t_max, c_tok, b.jct[r] / iters)
        return pl

    def key(self, r: int, rem: int, tg: bool, t0: float, k_c: int, k_g: int) -> float:
        """Latest start time of request ``r`` with ``rem`` tokens left to prefill; ``tg``: it had
        produced a token before (re-entered the queue at ``t0`` by preemption); ``k_c`` chunks and
        ``k_g`` decode iterations done."""
        b = self.book
        key = INF
        if tg:
            slo = b.tbt_eff[r]
            if slo < INF:
                key = t0 + slo - self.st.n_chunks(rem) * self.st.t_max
        elif b.ttft[r] < INF:
            key = b.arrival[r] + b.ttft[r] - self.st.n_chunks(rem) * self.st.t_max
        if b.jct[r] < INF:
            key = min(key, self._jct_key(r, k_c, k_g))
        if key == INF:
            key = b.arrival[r] + self.best_effort_slack
        return key

    def decoder_tr(self, r: int, now: float, k_c: int, k_g: int) -> float:
        """T_r of a running TG task: it returns to the queue every iteration with T_w = 0, N_ck = 1."""
        b = self.book
        tr = b.tbt_eff[r] - self.st.t_max if b.tbt_eff[r] < INF else INF
        if b.jct[r] < INF:
            tr = min(tr, self._jct_key(r, k_c, k_g) - now)
        if tr == INF:
            tr = b.arrival[r] + self.best_effort_slack - now
        return tr

    def budget_slo(self, r: int, jct_budget: bool) -> float:
        """The iteration-level SLO request ``r`` imposes on a batch it is in (Eq. 6's SLO)."""
        slo = self.book.tbt_eff[r]
        if jct_budget and self.book.jct[r] < INF:
            slo = min(slo, self.plan(r)[3])
        return slo

    def _jct_key(self, r: int, k_c: int, k_g: int) -> float:
        a, c_chunk, c_tok, _ = self.plan(r)
        return self.book.arrival[r] + (k_c + k_g + 1) * a + k_c * c_chunk + k_g * c_tok


__all__ = ["DEFAULT_OUTPUT", "INF", "Slack", "SloBook", "StepStats"]
