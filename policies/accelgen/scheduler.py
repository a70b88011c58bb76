"""AccelGen's per-replica scheduler: Alg. 1 and 2 on top of the engine's chunked-prefill step.

One step (``schedule``):

1. S_b from Eq. 6 and the tightest iteration-level SLO of the batch (running requests, the queue's
   head and each request being added); ``budget_model=eq4`` measures the step against S_b in Eq. 4
   operations (each chunk and decode at its context, ``budget.py``), ``eq6`` in tokens. Running TG
   tasks stay in the batch; if they alone exceed the budget, the one with the largest T_r is
   preempted until they fit (Alg. 1 lines 2-4, compute); their KV for this step is reserved,
   preempting by largest T_r when short (lines 2-4, KV).
2. Urgent candidates (T_r < T_max) join in T_r order, each chunked at S_b (dynamic chunking). One
   that lacks KV or a sequence slot preempts running requests with a larger T_r, largest first
   (Alg. 1: the max-T_r member of the batch goes; when that is the urgent request itself, it waits).
3. SelectRequests (Alg. 2) on the rest: a window of candidates within T_r^1 + gamma of the first; long
   or partly prefilled prompts get a chunk that reaches S_b or fills the free KV; the candidate
   nearest to (free compute, free KV) is added, repeatedly, while one fits.
4. Dynamic chunking (sec. 4.2): if compute is left, the next candidates in T_r order are chunked to
   make the step exactly S_b tokens (as far as KV allows).

ERA (sec. 4.2): no new long prompt (>= ``long_prompt`` tokens) starts while another is being served,
urgent or not (``era_urgent=false``: urgent long prompts are exempt — Alg. 1 puts every urgent request
in the batch while sec. 4.2 states ERA without exception; the paper does not say which rule wins).

NOTE: the paper leaves open how urgent requests share compute; here they are chunked in T_r order and
preemption for compute only happens when the decodes alone exceed S_b, since preempting a TG task
frees one token and chunking an urgent prompt costs nothing. Victim selection scans the running
requests (at most ``max_seqs``) once per preemption: T_r of JCT requests changes every iteration, so
no static order exists.
"""

from __future__ import annotations

from blendsim.policies.accelgen.batching import chunk_len, new_blocks
from blendsim.policies.accelgen.budget import clamp_budget, eq4_budget, eq4_chunk, eq6_budget, largest_fit
from blendsim.policies.accelgen.params import MinBag, Params
from blendsim.policies.accelgen.queue import LONG, RUNNING, SHORT
from blendsim.policies.accelgen.select import SelectMixin
from blendsim.policies.accelgen.slack import INF, Slack, SloBook, StepStats
from blendsim.sim.batch import Batch
from blendsim.sim.scheduler import Scheduler


class AccelGenScheduler(SelectMixin, Scheduler):
    fast_forward_ok = False  # T_r depends on the clock
    # it admits through its own path, not Scheduler._schedule_prefill: under kv_load "async" its loads are priced as
    # overlap (sim.engine.Replica)
    ASYNC_LOADS = False

    def __init__(self, *, params: Params, book: SloBook, cost_model, **kw):
        super().__init__(**kw)
        if params.budget_model == "eq4" and params.six_h <= 0:
            raise ValueError("budget_model=eq4 needs Params.six_h (6 x the model width)")
        self.prm = params
        self.cm = cost_model
        self.book = book
        self.q = self.waiting  # a SlackQueue
        self.st = StepStats(params.t_pf, params.s_pf, params.tmax_window, params.lc_alpha)
        self.slack = Slack(book, self.st, params.best_effort_slack)
        self.slo_run = MinBag()  # iteration-level SLOs of the running requests
        self.n_chunks = [0] * len(self.P)
        self.n_preempt = [0] * len(self.P)  # preemptions of each request on this replica
        self.t_requeue: dict[int, float] = {}  # preempted request -> when it re-entered the queue
        self.t_evicted: dict[int, float] = {}  # preempted request -> first eviction since its last token
        self.long_active: set[int] = set()
        self.counts = dict.fromkeys(("steps", "budget_sum", "exact_steps", "short_steps", "urgent",
                                     "preempt_compute", "preempt_urgent", "era_deferred"), 0)
        self._now = 0.0
        self._in_batch: set[int] = set()
        self._later: list = []
        self._reserved = False
        self._ptok = 0
        self._attn4 = 0
        self._bcache: dict = {}
        self._era_hit = False
        self._running_only = False
        self._hold = False  # admissions paused after a stall until a prefill or a request ends
        self._slo_floor = INF
        self._sb_memo: dict = {}  # Eq. 6 budgets by SLO

    # ---- the step -------------------------------------------------------------------------
    def schedule(self, now: float, running_only: bool = False) -> Batch | None:
        self._now = now
        self._tiers_step(now)  # with host/disk KV tiers: writes issued now, this step's loads from none
        if not self.prefilling:
            self._hold = False
        self._running_only = running_only or self._hold  # admit no one (see the stall breaker)
        self._in_batch = set()
        self._later = []
        self._bcache = {}
        self._ptok = 0
        self._feat = [0, 0, 0]  # this step's prefill chunks: sequences, attention pairs, KV read
        self._attn4 = 0  # this step's chunks: sum of c (o + c), Eq. 3's query-key pairs (eq4)
        self._slo_floor = INF  # SLO of the queue's head once Alg. 2 looks at it (it bounds S_b too)
        self._era_hit = False
        chunks: list = []
        self._chunk_seqs = seqs = []
        cost = self.prm.budget_model == "cost"  # NOTE: time-based rooms never preempt for compute
        while not cost and self.n_dec > 1 and self._decodes_over(self.slo_run.min()):
            slo = self.slo_run.min()
            v = None if self._slo_lost_alone(slo) else self._victim(now, decoders_only=True, bounded=True)
            if v is None:
                break
            self._preempt(v, now)
            self.counts["preempt_compute"] += 1
        if self.n_dec or self.stalled:  # kv_full = "stall": stalled decodes have the first claim on freed blocks
            self._reserve_decode(now)
        self._reserved = True
        left = False
        if self.q.has_entries():
            if self.prm.order == "slack":
                self._urgent(now, chunks, seqs)
            left = self._select(now, chunks, seqs)
        if not chunks and not self.n_dec and self.prefilling:
            self._continue_prefill(now, chunks, seqs)
        self._reserved = False
        for r, s in self._later:
            self._push(r, s)
        D = self.n_dec
        if not chunks and D == 0:
            if self.prefilling or self.stalled:
                if len(self.running) < 2:  # preempting the only one frees nothing it would not retake
                    raise RuntimeError(f"accelgen: request {(self.prefilling or self.stalled)[0].req} can neither "
                                       "grow nor make room (scheduler bug)")
                if self.prefilling:
                    # partial prefills hold the KV and none can grow: free the newest, and admit no one until
                    # a prefill or a request ends, so the others grow into its blocks (as vLLM serves running
                    # requests first: else the victim, or another newcomer, retakes them and the prefills
                    # preempt one another in turn, recomputing their prompts many times)
                    self._preempt(self._stall_victim(), now)
                    self._hold = True
                else:  # kv_full = "stall", every decode waiting for a block: free all, as the engine does
                    self._flush(now)
                return self.schedule(now, running_only=True)
            return None
        self.blocked = False
        sb = D + self._ptok + self._room(-1)
        c = self.counts
        c["steps"] += 1
        c["budget_sum"] += sb
        c["exact_steps"] += D + self._ptok == sb
        c["short_steps"] += D + self._ptok < sb and left
        c["era_deferred"] += self._era_hit
        logits = D + sum(1 for s in seqs if s.computed == s.target)
        decode = None
        if self.record and D:
            t = self.tau
            decode = [(s.req, s.c0 + t - s.tau0) for s in self.dec.values()]
            self.events.extend((self.step_no, "decode", r, x, 0, 0) for r, x in decode)
        return Batch(self.step_no, chunks, D, (self.dec_S + D * self.tau) if D else 0, logits, decode,
                     self._load_wait(now))

    def _continue_prefill(self, now: float, chunks: list, seqs: list) -> None:
        """An empty step while prompts are part-prefilled: every candidate the window and the fill looked at was
        held back (ERA holds new long prompts while one runs, and a queue of them can fill the window) and the
        running prompt's entry lay beyond it. Its next chunk is then the only progress (else the stall breaker
        preempts the only running request, or a run of 200 requests stopped with 'can neither grow nor make
        room'): give the first running prompt that can take one its chunk."""
        for s in list(self.prefilling):
            r = s.req
            if r in self._in_batch:
                continue
            d = self._demand(self._row(r), self.kv.available, True)
            if d is None:
                continue
            self.q.drop(r)  # its queued entry goes stale: _take re-queues it (``_later``) if the prompt goes on
            if self._take(r, d[0], True, now, chunks, seqs) > 0:
                return
            self._push(r, s)

    def update(self, batch: Batch, now: float) -> None:
        self.st.step_done(self.step_no, now - self._now, batch.num_decode)
        super().update(batch, now)

    # ---- Alg. 1: urgent requests ------------------------------------------------------------
    def _urgent(self, now: float, chunks: list, seqs: list) -> None:
        """Alg. 1's urgent candidates (T_r < T_max) in T_r order: each gets a chunk or is passed over.

        The queue holds waiting long prompts apart (``queue.LONG``): while ERA holds them back (or the step
        admits no one, ``_running_only``) every one of them fails its check, so the scan passes over them
        without popping them, as the plain loop would one by one: ``skip[c]`` is the entry up to which class
        ``c``'s entries were so passed over (left in place, as if popped and restored). A step's work is
        then in the candidates that can run, not in the waiting long prompts (the scan was quadratic in
        them). A chunk that preempts (a victim re-enters the queue) or a class no longer held back first pops
        the entries passed over, so the scan goes on exactly as the plain loop."""
        limit = now + self.st.t_max * self.prm.urgent_factor
        q = self.q
        era = self.prm.era_urgent and self.prm.era != "off"
        ro = self._running_only
        failed = []
        skip = [None, None]  # SHORT, LONG: entries before this one were passed over
        pushes = q.pushes
        q.log = log = set()
        try:
            while True:
                held = (ro, ro or (era and bool(self.long_active)))
                if q.pushes != pushes or (skip[0] is not None and not held[0]) or (skip[1] is not None
                                                                                   and not held[1]):
                    for c in (SHORT, LONG):
                        if skip[c] is not None:
                            failed.extend(q.pop_before(c, skip[c], log))
                            skip[c] = None
                    pushes = q.pushes
                    log.clear()
                e, ec = q.top(RUNNING), RUNNING
                for c in (SHORT, LONG):
                    if not held[c]:
                        t = q.top(c)
                        if t is not None and (e is None or t < e):
                            e, ec = t, c
                if e is not None and not e[0] < limit:
                    e = None
                if held[1] and not ro and not self._era_hit:
                    # the waiting long prompts before e fail for ERA: the plain loop marked the step
                    t = q.top(LONG)
                    if t is not None and t[0] < limit and (e is None or t < e):
                        self._era_hit = True
                if e is None:
                    break
                for c in (SHORT, LONG):
                    if held[c]:
                        skip[c] = e
                q.pop_top(ec)  # e: only entries passed over come before it
                r = e[2]
                if ro and r not in self.running:
                    failed.append(e)
                    continue
                row = self._row(r)
                if row[4] and self.long_active and era:
                    self._era_hit = True
                    failed.append(e)
                    continue
                a_c = self._room(r, row[1])
                if a_c <= 0:
                    failed.append(e)
                    if self._room(-1) <= 0:
                        break  # the step is full
                    continue
                # NOTE: T_r < 0 means its SLO is lost whatever runs now: it goes first, but preempts no one
                above = e[0] - now if self.prm.urgent_preempt and e[0] >= now else None
                if self._take(r, a_c, True, now, chunks, seqs, room_above=above):
                    self.counts["urgent"] += 1
                else:
                    failed.append(e)
        finally:
            q.log = None
        for e in failed:
            q.restore(e)

    # ---- placing a chunk ------------------------------------------------------------------
    def _take(self, r: int, n: int, chunkable: bool, now: float, chunks: list, seqs: list,
              room_above: float | None = None) -> int:
        """Give candidate ``r`` a chunk of up to ``n`` tokens (admitting it if new); with ``room_above``
        (an urgent request's T_r) preempt running requests with a larger T_r for a slot or KV."""
        self._in_batch.add(r)
        s = self.running.get(r)
        new = s is None
        B = self.B
        if new:
            cap = self.cfg.max_seqs
            if cap and len(self.running) >= cap:
                v = None if room_above is None else self._victim(now, above=room_above, bounded=True)
                if v is None:
                    return 0
                self._preempt(v, now)
                self.counts["preempt_urgent"] += 1
            s = self._admit(r, now)
        c = s.computed
        n = min(n, s.target - c)
        load = s.load if new else 0  # blocks of its hit that come back from a host/disk KV tier first
        need = new_blocks(c, n, B) + load
        while room_above is not None and need > self.kv.available:
            v = self._victim(now, above=room_above, bounded=True)
            if v is None:
                break
            self._preempt(v, now)
            self.counts["preempt_urgent"] += 1
        if need > self.kv.available:
            n = chunk_len(n, n, c, self.kv.available - load, B) if chunkable and self.kv.available > load else 0
        if n <= 0:
            self._in_batch.discard(r)
            if new:
                self._release_locks(s, now)
            return 0
        if new:
            self._commit_admission(s, now)
            self.q.set_class(r, RUNNING)  # its entry, out of the queue now, goes back (if at all) as a running one's
        n = self._grow(s, n, now)
        if new:
            self.q.n_wait -= 1
            self.slo_run.add(self._budget_slo(r))
            if self.P[r] >= self.prm.long_prompt and self.prm.era != "off":
                self.long_active.add(r)
            chunks.append((r, n, c, s.hit))
            self.on_admit(s, now)
        else:
            chunks.append((r, n, c, 0))
        seqs.append(s)
        self._ptok += n
        f = self._feat
        f[0] += 1
        f[1] += n * c + n * (n + 1) // 2
        f[2] += c + n
        self._attn4 += n * (c + n)
        self.n_chunks[r] += 1
        if c + n < s.target:
            self.st.chunk_cut(n)
            self._later.append((r, s))
        return n

    # ---- budgets, keys, victims -----------------------------------------------------------
    def _budget(self, slo: float) -> int:
        """S_b (Eq. 6, in tokens) for a batch whose tightest iteration-level SLO is ``slo``."""
        p = self.prm
        key = (slo, p.s_pf, p.t_pf)
        sb = self._sb_memo.get(key)
        if sb is None:
            sb = self._sb_memo[key] = clamp_budget(eq6_budget(p.s_pf, p.t_pf, slo), self.cfg.token_budget,
                                                   self.cfg.round_tokens)
        return sb

    def _room(self, r: int, c: int = 0) -> int:
        """Tokens left in this step if request ``r`` (-1: none), with ``c`` tokens of context, joins:
        its SLO may tighten S_b. ``budget_model=eq4``: the chunk at offset ``c`` whose Eq. 4 operations
        fit what is left of W_b; ``cost``: the chunk the cost model fits in SLO_min. An empty step
        always takes at least one token (as Eq. 6's S_b >= 1), so a tiny budget cannot stall a replica."""
        slo = min(self.slo_run.min(), self._slo_floor)
        if r >= 0:
            slo = min(slo, self._budget_slo(r))
        bm = self.prm.budget_model
        if bm == "eq6" or (bm == "cost" and slo == INF):
            return self._budget(slo) - self.n_dec - self._ptok
        if bm == "cost":
            n = self._time_room(slo, c)
        else:
            n = min(eq4_chunk(self._eq4_budget(slo) - self._eq4_used(), c, self.prm.six_h),
                    self.cfg.token_budget - self.n_dec - self._ptok)
        if n <= 0 and self.n_dec + self._ptok == 0:
            return 1  # like Eq. 6's S_b >= 1: an empty step takes one token, else nothing ever runs
        return n

    def _eq4_budget(self, slo: float) -> int:
        """W_b = S_b (6H + S_pf): Eq. 6's budget in Eq. 4 operations (``budget.py``)."""
        return eq4_budget(self._budget(slo), self.prm.s_pf, self.prm.six_h)

    def _eq4_used(self) -> int:
        """Eq. 4 operations of this step so far (units of 4H per layer): every token's 6H, plus each
        chunk's c (o + c) and each decode's L + 1 query-key pairs."""
        D = self.n_dec
        w = self.prm.six_h * (D + self._ptok) + self._attn4
        return w + (self.dec_S + D * self.tau + D if D else 0)

    def _decodes_over(self, slo: float) -> bool:
        """Whether the running decodes alone exceed the budget (Alg. 1 lines 2-4: preempt)."""
        if self.prm.budget_model == "eq4":
            return self._eq4_used() > self._eq4_budget(slo)  # called before any chunk joins the step
        return self.n_dec > self._budget(slo)

    def _time_room(self, slo: float, c: int) -> int:
        """Largest chunk at context ``c`` that keeps this step's cost-model time within ``slo``."""
        D, tp, (npf, pairs, pkv) = self.n_dec, self._ptok, self._feat
        key = (slo, c, D, tp, npf)
        n = self._bcache.get(key)
        if n is None:
            Cd = self.dec_S + D * self.tau
            step = self.cm.step

            def t(x):
                return step(tp + x + D, tp + x, npf + 1, pairs + x * c + x * (x + 1) // 2, pkv + c + x, D, Cd,
                            D + npf + 1)[0]

            n = self._bcache[key] = largest_fit(t, slo, self.cfg.token_budget - D - tp)
        return n

    def _budget_slo(self, r: int) -> float:
        """The iteration-level SLO request ``r`` puts on a batch's S_b: none (INF) when no step can meet
        it — shorter than a one-token step (``t_min``, from the cost model) or than Eq. 6's time of
        one token (T_pf / S_pf): it is lost whatever the step holds, and shrinking every step for it
        would only slow the rest (down to one-token chunks recomputing preempted requests)."""
        slo = self.slack.budget_slo(r, self.prm.jct_budget)
        p = self.prm
        return slo if slo >= p.t_min and slo * p.s_pf >= p.t_pf else INF

    def _slo_lost_alone(self, slo: float) -> bool:
        """Whether the running requests whose SLO is ``slo`` (the batch's tightest) would exceed the
        budget even alone (one token each, at its context): then preempting others for them is futile."""
        if self.prm.budget_model != "eq4":
            return False  # one token always fits Eq. 6's S_b (>= 1)
        w_b = self._eq4_budget(slo)
        six_h, t = self.prm.six_h, self.tau
        for s in self.running.values():
            if self._budget_slo(s.req) == slo:
                ctx = s.c0 + t - s.tau0 if s.fin >= 0 else s.computed
                if six_h + ctx + 1 <= w_b:
                    return False
        return True

    def _push(self, r: int, s) -> None:
        if s is None:
            g = self.resume.get(r, 0)
            rem = self.P[r] + g
        else:
            g = s.generated
            rem = s.target - s.computed
        if self.prm.order == "fcfs":
            key = self.book.arrival[r]
        else:
            key = self.slack.key(r, rem, g > 0, self.t_requeue.get(r, 0.0), self.n_chunks[r], max(g - 1, 0))
        cls = RUNNING if r in self.running else LONG if self.P[r] >= self.prm.long_prompt else SHORT
        self.q.push(r, key, self.book.arrival[r], cls)

    def _tr(self, s, now: float) -> float:
        """T_r of a running request."""
        r = s.req
        if s.fin >= 0:
            gen = s.generated + self.tau - s.tau0
            return self.slack.decoder_tr(r, now, self.n_chunks[r], max(gen - 1, 0))
        g = s.generated
        return self.slack.key(r, s.target - s.computed, g > 0, self.t_requeue.get(r, 0.0), self.n_chunks[r],
                              max(g - 1, 0)) - now

    def _victim(self, now: float, decoders_only: bool = False, above: float = -INF, bounded: bool = False):
        """The running request outside this step's chunks with the largest T_r (> ``above``); ties
        go to the newest. Requests already preempted ``preempt_limit`` times are protected: never the
        victim of the policy's own preemptions (``bounded``: for compute or for an urgent request), and
        of a memory preemption only when no one else can go — then the newest of them (vLLM's rule), so
        the oldest keeps its KV and progresses."""
        best, best_tr, newest_protected = None, -INF, None
        inb = self._in_batch
        lim, npre = self.prm.preempt_limit, self.n_preempt
        for s in self.running.values():
            if s.req in inb or (decoders_only and s.fin < 0):
                continue
            if npre[s.req] >= lim:
                newest_protected = s  # running is in admission order
                continue
            tr = self._tr(s, now)
            if tr > above and (best is None or tr >= best_tr):
                best, best_tr = s, tr
        return newest_protected if best is None and not bounded else best

    def _stall_victim(self):
        """The partial prefill to free when none can grow: the newest admitted (vLLM's rule, as the paper
        leaves KV overflow to vLLM). NOTE: the largest T_r (Alg. 1's rule) is the prompt nearest to the
        end of its prefill (fewest chunks left): freeing it undid the most work, and in turn."""
        return next(reversed(self.prefilling))

    # ---- engine hooks ---------------------------------------------------------------------
    def pick_victim(self):
        return self._victim(self._now)

    def requeue(self, req: int) -> None:
        if req in self.resume:  # preempted: it re-enters the queue now
            self.t_requeue[req] = self._now
            self.t_evicted.setdefault(req, self._now)
        self.q.n_wait += 1
        self._push(req, None)

    def _preempt(self, s, now: float) -> None:
        r = s.req
        self.n_preempt[r] += 1
        if s.fin >= 0:
            self.st.preempted += 1  # (the engine returns a block reserved for its decode token)
        self.slo_run.remove(self._budget_slo(r))
        self.long_active.discard(r)
        super()._preempt(s, now)

    def _prefill_done(self, s, now: float, step: int) -> None:
        r = s.req
        self._hold = False
        self.q.drop(r)
        if self.prm.era == "prefill":
            self.long_active.discard(r)
        t = self.t_evicted.pop(r, None)
        if t is not None:
            self.st.p_max = max(self.st.p_max, now - t)
        self.t_requeue.pop(r, None)
        super()._prefill_done(s, now, step)

    def on_finish(self, s, now: float) -> None:
        r = s.req
        self._hold = False
        self.slo_run.remove(self._budget_slo(r))
        self.long_active.discard(r)
        self.st.fin_sum += s.d
        self.st.fin_n += 1


__all__ = ["AccelGenScheduler", "MinBag", "Params"]
