"""The dual scanner: BlendServe's per-replica scheduler (sec. 5.3-5.4, Alg. 3).

Two pointers walk the density-sorted request sequence toward each other: the left one from the
compute-intensive end, the right one from the memory-intensive end (each a heap over the sequence
positions of the waiting requests, so a preempted request comes back at its place). Whenever a pointer
enters another merged unit, M (the KV cache) is split into M_L and M_R from rho(rt) and the two units'
densities, and Alg. 3 gives each side its prompt-token rate C_L / C_R (``partition.py``).

Admission, per step: first each side at its Alg. 3 rate (a token bucket, so a rate below one request
per step still admits one every few steps); then, with ``fill``, the rest of the step's token budget
to any side whose share has room, which saturates the shares and re-admits at once when a request
finishes early (sec. 5.4). A side's share holds its running requests booked at p + d_est / 2 (Alg. 3's
average KV; ``footprint=peak`` books p + d_est). Inside the shares a regular scheduler admits, as the
preprint puts it (sec. 3.4): the engine's reserve rule, over the newcomer's lifetime (``_fits_horizon``).

Online adjustment (sec. 5.4): a request that outlives its estimate is re-estimated as running as long
again (its booking grows); a left-side one that has run past ``relocate`` times its first estimate
("severely underestimated") is relocated to M_R. These events happen at known decode clocks, so the
engine's fast-forward stops at them. Decoding and preemption are the engine's.

Step balance (``balance`` > 0, an extension; off by default): while memory-intensive requests wait,
a step takes no more prompt tokens than keep its compute time within ``balance`` times its memory
time, so compute work is not spent in steps whose memory side idles (the KV ramp-up at the start).

Memory cap (``mem_cap="balanced"``, an extension; the default): Alg. 3 partitions M as if memory were
the only limit, but a step also has NanoFlow's fixed token budget. When the KV cache holds more than a
full-budget step can read within its compute time (llama-3-8b on an A100-80GB: 845K tokens, above its
462K-token cache, so the paper's setting is unchanged), M_L and M_R are shares of that amount instead:
filling the rest with memory-intensive requests would only make every step memory-bound and leave
the compute-intensive ones for a compute-only tail. ``mem_cap="kv"`` is Alg. 3 literally.

Warm-up (``warmup="barrier"``): the sampled requests run first, in DFS order, with the engine's reserve
admission; the scan starts once they have all finished (their lengths fed the estimates).
"""

from __future__ import annotations

import heapq

import numpy as np

from blendsim.policies.blendserve.adjust import LEFT, RIGHT, WARM, OnlineAdjust
from blendsim.policies.blendserve.memguard import FluidPeak
from blendsim.policies.blendserve.partition import dual_scan_budgets
from blendsim.sim.cost import largest_fit
from blendsim.sim.scheduler import Scheduler


class _Waiting:
    """What the engine sees of the waiting requests: their number."""

    def __init__(self):
        self.n = 0

    def __len__(self) -> int:
        return self.n


def own_prompt_list(tree) -> list:
    """Per request, the tokens of its prompt the dual scan books (at least 1): the prompt less its shared prefix."""
    return [x if x > 1 else 1 for x in tree.own_prompt_tokens().astype(np.int64).tolist()]


class DualScanScheduler(OnlineAdjust, Scheduler):
    fast_forward_ok = True  # runs of decode steps only once nothing waits (quiescent)
    # it admits through its own path, not Scheduler._schedule_prefill: under kv_load "async" its loads are priced as
    # overlap (sim.engine.Replica)
    ASYNC_LOADS = False

    def __init__(self, *, plan, rho_rt: float, fill: str = "both", relocate: float = 2.0, footprint: str = "mean",
                 degenerate: str = "clip", guard: str = "fluid", balance: float = 0.0,
                 mem_cap: str = "balanced", cost_model=None, own_prompts: list | None = None, **kw):
        kw["queue"] = _Waiting()
        super().__init__(**kw)
        self.plan = plan
        self.rho_rt = rho_rt
        self.fill = fill
        self.relocate = relocate
        self.degenerate = degenerate
        self.guard = guard
        self.balance = balance
        self.cost_model = cost_model
        self._ctab = None  # compute time of a step by its token count (balance)
        self.fluid = FluidPeak()
        self.fp_frac = 1.0 if footprint == "peak" else 0.5  # booking: p + est (peak) or p + est / 2 (mean)
        # p: the prompt's own part, without the prefix it shares with other requests: the cache holds a shared
        # prefix once for its group, and the paper counts the dual scan's cost of sharing as "extra memory for a
        # single path" over one DFS (sec. 3.4), which this booking leaves out (the KV guard, _fits_kv, sees the
        # real cache); booking the prefix with every member admitted ~55 requests of an 8,000-token shared prefix
        # into a 462K-token cache left 90% empty (``own_prompts``: the policy's, one list for every replica)
        self.P_own = own_prompts if own_prompts is not None else own_prompt_list(self.kv.tree)
        self.est_cur: dict[int, float] = {}  # current output estimate of each running request
        self.M = self.kv.total * self.B  # Alg. 3's M (tokens): the KV capacity ...
        if mem_cap == "balanced" and cost_model is not None:  # ... or what a full step can read in time
            self.M = min(self.M, self._balanced_kv())
        self.left: list = []  # heap of sequence positions
        self.right: list = []  # heap of -positions
        self.warm: list = []  # heap of (dfs rank, request)
        self.taken: dict[int, bool] = {}
        self.warm_open = 0  # warm-up requests delivered and not finished
        self.foot = [0.0, 0.0, 0.0]  # footprint (tokens) of the running requests of each side
        self.n_side = [0, 0, 0]
        self.fp_cur: dict[int, float] = {}
        self.share = [0.0, 0.0, 0.0]  # M_L, M_R (tokens) at index LEFT, RIGHT
        self.rate = [0.0, 0.0, 0.0]  # C_L, C_R (prompt tokens per step)
        self.bucket = [0.0, 0.0, 0.0]
        self.bucket_cap = [0.0, 0.0, 0.0]
        self.bucket_step = 0
        self._units = None
        self.overrun: list = []  # heap of (decode clock, order, request, seq): a request outlives its estimate
        self.relocations = 0
        self.partitions = 0

    # ---- waiting structure ------------------------------------------------------------------
    def requeue(self, req: int) -> None:
        pl = self.plan
        if pl.warm[req]:
            if req not in self.resume:
                self.warm_open += 1
            heapq.heappush(self.warm, (pl.warm_pos[req], req))
        else:
            pos = pl.pos[req]
            heapq.heappush(self.left, pos)
            heapq.heappush(self.right, -pos)
        self.taken[req] = False
        self.waiting.n += 1

    def _head(self, side: int) -> int | None:
        h = self.left if side == LEFT else self.right
        seq, taken = self.plan.seq, self.taken
        while h:
            r = seq[h[0] if side == LEFT else -h[0]]
            if not taken[r]:
                return r
            heapq.heappop(h)
        return None

    # ---- engine hooks ----------------------------------------------------------------------
    def _admit(self, r: int, now: float):
        s = super()._admit(r, now)
        if not self.plan.warm[r]:
            s.est = int(round(self.plan.est[r]))
        return s

    def _schedule_prefill(self, budget: int, now: float, chunks: list, seqs: list) -> None:
        budget = self._continue_prefills(budget, now, chunks, seqs)  # continuing chunks first (the base rule)
        if budget < 0:
            return
        if self.warm_open:
            self._warmup(budget, now, chunks, seqs)
        elif self.waiting.n:
            if self.balance > 0 and self._head(RIGHT) is not None:
                budget = min(budget, self._balanced_room())
            self._scan(budget, now, chunks, seqs)

    def _balanced_room(self) -> int:
        """``balance``: the prompt tokens that keep this step's compute time within ``balance`` times its
        memory time (the decodes' KV reads), at least ``round_tokens`` (an extension, see __init__)."""
        cm, D = self.cost_model, self.n_dec
        if self._ctab is None:
            n = self.cfg.token_budget + 1
            self._ctab = np.maximum.accumulate([cm.step(t, t, 1, 0, 0, 0, 0, 1)[1] for t in range(n)])
        m = cm.step(D, 0, 0, 0, 0, D, self.dec_S + D * self.tau, D)[2] if D else 0.0
        T = int(np.searchsorted(self._ctab, self.balance * m, side="right")) - 1
        return max(T, self.cfg.round_tokens or 1) - D

    def _balanced_kv(self) -> int:
        """``mem_cap=balanced``: the most KV (tokens) a full token-budget step -- one decode reading it,
        the rest a prompt chunk -- can read without its memory time exceeding its compute time."""
        cm, B = self.cost_model, self.cfg.token_budget

        def gap(K):
            _, c, m = cm.step(B, B - 1, 1, (B - 1) * B // 2, B - 1, 1, K, 2)
            return m - c

        return largest_fit(gap, 0.0, 1 << 30)

    def _warmup(self, budget, now, chunks, seqs) -> None:
        cap = self.cfg.max_seqs
        while budget > 0:
            while self.warm and self.taken[self.warm[0][1]]:
                heapq.heappop(self.warm)
            if not self.warm or (cap and len(self.running) >= cap):
                self.blocked = True  # the barrier: nothing else runs until the warm-up is done
                return
            r = self.warm[0][1]
            n = self._take(r, WARM, budget, now, chunks, seqs, reserve=True)
            if n <= 0:
                self.blocked = True
                return
            budget -= n

    def _scan(self, budget, now, chunks, seqs) -> None:
        self._repartition()
        k = self.step_no - self.bucket_step
        if k:
            self.bucket_step = self.step_no
            for x in (LEFT, RIGHT):
                self.bucket[x] = min(self.bucket[x] + k * self.rate[x], self.bucket_cap[x])
        cap = self.cfg.max_seqs
        for paced in ((True, False) if self.fill != "none" else (True,)):
            open_ = [LEFT, RIGHT] if paced or self.fill == "both" else [LEFT]
            while budget > 0 and open_:
                for side in list(open_):
                    if budget <= 0:
                        break
                    r = self._head(side)
                    if (r is None or (cap and len(self.running) >= cap) or not self._fits(side, r)
                            or (paced and self.bucket[side] <= 0 and self.n_side[side])):
                        open_.remove(side)
                        continue
                    n = self._take(r, side, budget, now, chunks, seqs, reserve=self.guard != "none")
                    if n < 0:  # its expected growth does not fit: this side waits, the other goes on
                        open_.remove(side)
                        continue
                    if n == 0:  # the KV cache itself is full
                        self.blocked = True
                        return
                    budget -= n
                    if paced:
                        self.bucket[side] -= self.running[r].target
                    self._repartition()
        if budget > 0 and (self.fill == "both" or all(self.bucket[x] > 0 for x in (LEFT, RIGHT))):
            self.blocked = True  # only a finish, preemption or overrun can change the answer

    def quiescent(self) -> bool:
        """A run of pure decode steps only once no request waits: with requests waiting, what refuses the next
        one (the sides' shares and pacing, the growth guard, the reserve rule) moves with every decode step, and
        a step-by-step run would admit it at the first step where it fits (tests/test_fast_forward.py)."""
        return len(self.waiting) == 0 and super().quiescent()

    def _fits(self, side: int, r: int) -> bool:
        """The side's memory share admits ``r`` (always when the side runs nothing: progress)."""
        return (self.n_side[side] == 0
                or self.foot[side] + self.P_own[r] + self.plan.est[r] * self.fp_frac <= self.share[side])

    def _take(self, r, side, budget, now, chunks, seqs, reserve=False) -> int:
        """Admit ``r`` for ``side`` with its first chunk; returns the tokens granted, 0 when no KV block
        is left, -1 when the reserve rule refuses it.

        Follows the engine's protocol: ``_admit`` (match and lock), the checks, ``_commit_admission``,
        then ``_grow``."""
        s = self._admit(r, now)
        if reserve and self.running and not self._fits_kv(s, side):
            self._release_locks(s, now)
            return -1
        if not self._can_grow(s):
            self._release_locks(s, now)
            return 0
        self.taken[r] = True
        self.waiting.n -= 1
        s.side = side
        est = self.plan.est[r] if side != WARM else float(s.est)
        self.est_cur[r] = est
        fp = self.P_own[r] + est * self.fp_frac
        self.fp_cur[r] = fp
        self.foot[side] += fp
        self.n_side[side] += 1
        self._commit_admission(s, now)
        self.fluid.add(r, s.target, self.tau, self.tau + max(int(est) - s.generated, 1))
        c = s.computed
        n = s.target - c
        n = self._grow(s, n if n < budget else budget, now)
        chunks.append((r, n, c, s.hit))
        seqs.append(s)
        self.on_admit(s, now)
        return n

    def _fits_kv(self, s, side: int) -> bool:
        """The guard inside the shares: will the KV cache hold ``s`` as everything grows?"""
        if side == WARM:
            return self._fits_expected(s)  # the engine's own reserve rule during the warm-up
        if self.guard == "horizon":
            return self._fits_horizon(s)
        pending = s.target - s.computed
        for q in self.prefilling:
            pending += q.target - q.computed
        extra = self.fluid.peak_extra(self.tau, pending, max(s.est - s.generated, 1))
        return extra * self.cfg.reserve_ratio <= self.kv.available * self.B

    def _fits_horizon(self, s) -> bool:
        """Reserve admission over the newcomer's lifetime: KV must hold the rest of its prompt, its
        expected output, the prompts still prefilling and what the running requests are expected to
        grow while it runs (each at most one token per step, at most its own expected remainder).

        NOTE: the engine's reserve rule books every running request's whole expected remainder; with
        video requests expected to decode for tens of thousands of steps that would keep short
        compute-intensive requests out of memory the videos will not need for a long time."""
        growth = self.est_sum - self.gen_S - self.n_dec * self.tau - self.gen_P
        pending = 0
        for q in self.prefilling:
            pending += q.target - q.computed
        rem = max(s.est - s.generated, 1)
        growth = min(max(growth, 0), len(self.running) * rem)
        need = (s.target - s.computed) + pending + self.cfg.reserve_ratio * (rem + growth)
        return need <= self.kv.available * self.B

    def _repartition(self) -> None:
        """Recompute M_L, M_R, C_L, C_R when a pointer has entered another unit (Alg. 3)."""
        pl = self.plan
        rl, rr = self._head(LEFT), self._head(RIGHT)
        if rl is None:
            return
        ul, ur = pl.unit[rl], pl.unit[rr]
        if (ul, ur) == self._units:
            return
        self._units = (ul, ur)
        self.partitions += 1
        m_l, m_r, c_l, c_r = dual_scan_budgets(self.rho_rt, pl.unit_rho[ul], pl.unit_rho[ur], self.M,
                                               pl.unit_p[ul], pl.unit_d[ul], pl.unit_p[ur], pl.unit_d[ur],
                                               degenerate=self.degenerate)
        self.share[LEFT], self.share[RIGHT] = m_l, m_r
        self.rate[LEFT], self.rate[RIGHT] = c_l, c_r
        self.bucket_cap[LEFT] = c_l + pl.unit_p[ul]  # one step's rate plus one request
        self.bucket_cap[RIGHT] = c_r + pl.unit_p[ur]

    # ---- bookkeeping on finish, preemption and overrun ---------------------------------------
    def _drop(self, s) -> None:
        side = s.side
        self.fluid.remove(s.req)
        self.est_cur.pop(s.req, None)
        self.foot[side] -= self.fp_cur.pop(s.req, 0.0)
        self.n_side[side] -= 1

    def on_finish(self, s, now: float) -> None:
        self._drop(s)
        if s.side == WARM:
            self.warm_open -= 1
        # NOTE: a request that finishes with its prefill (one output token) frees its booking inside
        # update(); without this the engine would fast-forward past the admissions that frees up
        self.blocked = False

    def _preempt(self, s, now: float) -> None:
        self._drop(s)
        super()._preempt(s, now)


__all__ = ["DualScanScheduler", "LEFT", "RIGHT", "WARM"]
