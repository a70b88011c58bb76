"""AccelGen's per-replica settings and a small multiset for the tightest SLO of the running requests."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from blendsim.policies.accelgen.slack import INF


@dataclass(frozen=True, slots=True)
class Params:
    """AccelGen's settings for one replica (see the policy's options)."""

    s_pf: int  # pivot forward size (tokens)
    t_pf: float  # time of a pivot-size step (s)
    six_h: int = 0  # 6H of Eq. 4 (6 x the model width): needed by budget_model=eq4
    t_min: float = 0.0  # time of the cheapest step (one token): a tighter SLO cannot be met at all
    gamma: float = 0.75  # Alg. 2 window: T_r within T_r^1 + gamma (s)
    urgent_factor: float = 1.0  # urgent: T_r < urgent_factor x T_max
    long_prompt: int = 4096  # ERA: prompts at least this long are served one at a time
    era: str = "prefill"  # prefill: until its prefill ends; request: until it finishes; off
    max_window: int = 64  # candidates Alg. 2 (and the fill) look at per step
    tmax_window: int = 64  # steps over which T_max is the largest step time
    lc_alpha: float = 0.125  # weight of a new cut chunk in L_c
    jct_budget: bool = False  # JCT requests also bound S_b by their per-iteration share
    budget_model: str = "eq4"  # eq4: Eq. 6's budget in Eq. 4 operations (chunk context priced);
    #                             eq6: S_b tokens; cost: fit SLO_min on the cost model
    distance: str = "tokens"  # tokens (paper) or normalized (axes divided by S_b and KV capacity)
    best_effort_slack: float = INF  # key of a request without SLOs: arrival + this
    urgent_preempt: bool = True  # urgent requests preempt larger-T_r running ones (Alg. 1)
    era_urgent: bool = True  # ERA also holds back urgent long prompts
    order: str = "slack"  # slack: by T_r (sec. 4.3); fcfs: by arrival, nothing urgent (ablation /Order)
    select: str = "euclid"  # euclid: Alg. 2; order: take candidates in queue order (ablation /Batch)
    preempt_limit: int = 4  # a request preempted this often is spared the policy's own preemptions


class MinBag:
    """Multiset of floats with O(log n) add/remove and the minimum (infinite when empty)."""

    def __init__(self):
        self._h: list = []
        self._c: dict = {}

    def add(self, x: float) -> None:
        if x != INF:
            c = self._c.get(x, 0)
            self._c[x] = c + 1
            if c == 0:
                heapq.heappush(self._h, x)

    def remove(self, x: float) -> None:
        if x != INF:
            c = self._c[x] - 1
            if c:
                self._c[x] = c
            else:
                del self._c[x]

    def min(self) -> float:
        h, c = self._h, self._c
        while h and h[0] not in c:
            heapq.heappop(h)
        return h[0] if h else INF


__all__ = ["MinBag", "Params"]
