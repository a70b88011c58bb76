"""One replica's scheduler: waiting queue, running sequences and KV; one Batch per step.

The rule is vLLM v1's: each running sequence's ``computed`` tokens catch up with its ``target``, paid
from one per-step token budget, running sequences first. Decoding sequences (one token each) always
run; what the budget leaves goes to prefill chunks — continuing ones first, then new admissions in
queue order. Prefix hits, chunk boundaries and recomputation after preemption are one code path.

Decoding sequences are kept in aggregate so a step costs time proportional to what changed, not to
the batch: a *decode clock* ``tau`` counts decode steps; a sequence that started decoding at clock
``tau0`` with context ``c0`` has context ``c0 + tau - tau0``; it needs a new KV block exactly when
that context is a multiple of the block size, so sequences are bucketed by ``(c0 - tau0) mod B``;
completions wait in a heap keyed by their last decode clock.

When a decode finds no KV block free for its next token, the engine's ``kv_full`` rule decides: preempt
the newest running request (vLLM), or (``stall``, DeepSpeed-MII 0.1) take the decode out of the aggregate
into the ``stalled`` queue, keeping its KV, until a block is free; when nothing at all can run, every
running request is flushed to recompute.

Policies customise admission through :meth:`next_candidate` / :meth:`take_candidate`, the victim of a
preemption through :meth:`pick_victim`, and can hook :meth:`on_admit` / :meth:`on_finish`.
"""

from __future__ import annotations

import heapq
from collections import deque

from blendsim.sim.batch import Batch
from blendsim.sim.kv import KVCache
from blendsim.sim.seq import STALLED, EngineConfig, RequestRecords, Seq, WaitQueue

INF = float("inf")

DEFAULT_EST_OUTPUT = 256  # expected output tokens before 16 requests have finished on a replica
UNLIMITED = 1 << 62


class Scheduler:
    """One replica's scheduler: the engine calls ``schedule(now)`` for each step's Batch and ``update(batch, now)``
    after it ran.

    Built with keywords only: ``queue`` (the waiting requests: a ``WaitQueue``, from a policy's
    ``self.wait_queue()``), ``replica`` (its index) and what the engine passes to ``Policy.make_scheduler`` as
    ``**kw``: ``kv`` (the replica's ``KVCache``), ``cfg`` (the ``EngineConfig`` in force), ``prompt_len`` and
    ``output_len`` (per request, lists), ``records`` (``RequestRecords``), ``record`` (whether the schedule is
    recorded) and ``output_hint`` (per request, or None). A subclass that adds keywords of its own takes
    ``**kw`` and calls ``super().__init__(**kw)``.

    A policy's hooks, each with the default rule: ``next_candidate()`` (the waiting request to admit next, an index
    or None: the queue's head), ``take_candidate(req)`` (it was admitted: remove it from the queue),
    ``pick_victim()`` (the running ``Seq`` to preempt when KV runs out, or None: the newest),
    ``on_admit(s, now)`` and ``on_finish(s, now)`` (nothing), ``requeue(req)`` (a new or preempted request
    waits: pushed on the queue), ``max_hit_blocks(req)`` and ``max_insert_blocks(s)`` (prefix-cache blocks
    a request may reuse or add: no limit) and ``free_held(now)``. State to read: ``running`` (request ->
    ``Seq``, in admission order), ``waiting`` (the queue), ``P`` and ``Dlen`` (prompt and output lengths), ``kv``.
    """

    fast_forward_ok = True  # False for policies whose decisions depend on the clock
    ASYNC_LOADS = True  # False for policies that admit through a path of their own (see self.loading)

    def __init__(self, *, kv: KVCache, cfg: EngineConfig, prompt_len: list, output_len: list,
                 queue: WaitQueue, records: RequestRecords, replica: int = 0, record: bool = False,
                 output_hint: list | None = None):
        self.kv = kv
        self.cfg = cfg
        self.B = kv.block_size
        self.P = prompt_len
        self.Dlen = output_len
        self.waiting = queue
        self.rec = records
        self.replica = replica
        self.record = record
        # the schedule, when recording: (step, kind, request, a, b, c) in the order things happen
        #   chunk   request, new_tokens, context_before, cached_tokens   (prefill chunk allocated)
        #   decode  request, context_before                              (one decode token)
        #   insert  request, node, first block index, blocks             (blocks enter the prefix cache)
        #   evict   -1, node, first block index, blocks                  (blocks leave the prefix cache)
        #   preempt request, tokens generated so far                     (its KV is freed)
        #   finish  request                                              (after the step: KV freed)
        self.events: list = []
        self._owner = -1  # request on whose behalf the cache is being changed
        if record:
            kv.on_event = lambda kind, node, idx, n: self.events.append(
                (self.step_no, kind, self._owner if kind == "insert" else -1, node, idx, n))
        self.running: dict[int, Seq] = {}  # admission order
        self.prefilling: list[Seq] = []
        self.dec: dict[int, Seq] = {}
        self.n_dec = 0
        self.dec_S = 0  # sum of (c0 - tau0) over decoders: their context sum is dec_S + n_dec * tau
        self.buckets = [0] * self.B
        self.fin_heap: list = []
        self.tau = 0
        self.step_no = 0
        self.blocked = False  # admission stopped for lack of memory or sequence slots
        # when reserve admission refused the next request: the KV (tokens) it needed for itself, besides the running
        # requests' expected growth, which pure decode steps shrink; INF when nothing but a finish can admit one
        self.reserve_need = INF
        # the request a refused admission locked and unlocked at this step (its cached prefix marked used then, LRU;
        # -1: none): a step-by-step run retries it every step, which advance_decode repeats where it orders evictions
        self.refused_req = -1
        self.resume: dict[int, int] = {}  # preempted request -> tokens it had generated
        self.hi_water = [0] * len(prompt_len)  # prompt positions ever computed or hit, per request
        self._order = 0
        self._resv_tau = -1  # decode clock whose decode blocks have been reserved
        self._chunk_seqs: list[Seq] = []
        # expected decode growth, for reserve admission: sum over running requests of expected output
        # minus tokens generated (decoders' generated tokens grow with the clock: gen_S + n_dec * tau)
        self.hint = output_hint
        self.est_sum = 0
        self.gen_S = 0
        self.gen_P = 0  # generated tokens of running requests that are not decoding (constant)
        self.fin_sum = 0  # outputs of finished requests, for the running-mean estimate
        self.fin_n = 0
        self.hit_tokens = 0  # prompt tokens served by the prefix cache (any tier) over all admissions
        self._load_ready = 0.0  # when this step's KV loads (host/disk tiers) have arrived
        # asynchronous KV loads (kv_load "async", vLLM V1's KV connectors): a request whose prefix is loading from a
        # lower tier holds its blocks but is left out of steps until its load has arrived (request -> that time);
        # set by the replica for schedulers that admit through _schedule_prefill (ASYNC_LOADS)
        self.async_loads = False
        self.loading: dict = {}
        # kv_full = "stall": decodes waiting for a free KV block, in the order they get one (out of the decode
        # aggregate; each keeps its KV, its context in c0 and its generated tokens in generated)
        self.stall = cfg.kv_full == "stall"
        self.stalled: deque = deque()
        self.flushes = 0  # times every running request was flushed because nothing could run (stall)

    # ---- the three-call step protocol -----------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def schedule(self, now: float) -> Batch | None:
        """Form the next step's Batch (None when there is nothing to run)."""
        chunks: list = []
        self.reserve_need = INF
        self.refused_req = -1
        self._chunk_seqs = seqs = []
        self._tiers_step(now)
        prefill_first = self.cfg.mix == "prefill-first"
        if (self.n_dec or self.stalled) and not prefill_first:  # stalled decodes may resume
            self._reserve_decode(now)
        D = 0 if prefill_first else self.n_dec
        budget = self.cfg.token_budget - D
        R = self.cfg.round_tokens
        if R and budget > 0 and (D + budget) >= R:
            budget = (D + budget) // R * R - D
        if budget > 0:
            self._schedule_prefill(budget, now, chunks, seqs)
        else:
            self.blocked = True  # decodes fill the budget: nothing is admitted until one finishes
        if prefill_first and not chunks and (self.n_dec or self.stalled):
            self._reserve_decode(now)
            D = self.n_dec
        if not chunks and D == 0:
            if self.loading and self.load_ready_at() > now:
                return None  # nothing to run until a loading prefix arrives (the replica waits: load_ready_at)
            if self.prefilling or self.stalled:
                # prefills (or stalled decodes) stuck on memory with nothing decoding: free what the policy
                # holds, else the newest running request (kv_full = "stall": every running request), and retry
                if self.free_held(now):
                    return self.schedule(now)
                if self.stall and len(self.running) > 1:
                    self._flush(now)
                    return self.schedule(now)
                v = self.pick_victim()
                if len(self.running) == 1 and self.prefilling and self._retakes_more(self.prefilling[0]):
                    self._preempt(self.prefilling[0], now)  # it frees its copies of blocks others cached since
                    return self.schedule(now)
                if v is None or len(self.running) < 2:  # it would only retake what it frees: no progress
                    stuck = (self.prefilling or self.stalled)[0].req
                    raise RuntimeError(f"replica {self.replica}: request {stuck} can neither grow nor make room "
                                       "(scheduler bug)")
                self._preempt(v, now)
                return self.schedule(now)
            return None
        logits = D
        for s in seqs:
            if s.computed == s.target:
                logits += 1
        decode = None
        if self.record and D:
            t = self.tau
            decode = [(s.req, s.c0 + t - s.tau0) for s in self.dec.values()]
            self.events.extend((self.step_no, "decode", r, c, 0, 0) for r, c in decode)
        return Batch(self.step_no, chunks, D, (self.dec_S + D * self.tau) if D else 0, logits, decode,
                     self._load_wait(now))

    def _retakes_more(self, s: Seq) -> bool:
        """Whether ``s`` (prefilling, alone and stuck on memory) would find more of its prompt cached if it were
        admitted again: it holds private copies of blocks another request put in the cache while ``s`` waited (for
        an asynchronous load, or between chunks), so preempting it and admitting it again frees them and makes
        progress (vLLM preempts the request it cannot allocate for, even the last one)."""
        if not s.private:
            return False
        cap = self.max_hit_blocks(s.req)
        most = (s.target - 1) // self.B
        return self.kv.match(s.path, most if most < cap else cap) > s.shared

    def load_ready_at(self) -> float:
        """When the first of the asynchronous loads still on their way arrives (0 when none is)."""
        return min(self.loading.values()) if self.loading else 0.0

    def _tiers_step(self, now: float) -> None:
        """A step is being formed at ``now``: evictions write from now on, and its KV loads start from none. Every
        ``schedule`` calls it first (a policy that forms its own steps too), and passes :meth:`_load_wait` as the
        Batch's ``load_s``."""
        if self.kv.tiered:
            self.kv.now = now
            self._load_ready = 0.0

    def _load_wait(self, now: float) -> float:
        """Seconds from ``now`` until the KV loads (host/disk tiers) of the step formed at ``now`` have arrived."""
        ready = self._load_ready
        return ready - now if ready > now else 0.0

    def update(self, batch: Batch, now: float) -> None:
        """Advance state after the step ran and ended at ``now``."""
        step = self.step_no
        if batch.num_decode:
            tau = self.tau
            heap = self.fin_heap
            while heap and heap[0][0] == tau:
                fin, _, _, s = heapq.heappop(heap)
                if s.fin == fin:
                    self._finish_decode(s, now, step)
            self.tau = tau + 1
        for s in self._chunk_seqs:
            if s.computed == s.target:
                self._prefill_done(s, now, step)
        self.step_no = step + 1
        # the step consumed its decode reservation; NOTE: when every decoder was preempted after the
        # reservation the clock did not move, and a stale mark made the next step's preemption of a
        # decoder give back a block that was never reserved (KV over-committed by one block)
        self._resv_tau = -1

    # ---- policy hooks ---------------------------------------------------------------------
    def next_candidate(self) -> int | None:
        """The waiting request to consider admitting next."""
        return self.waiting.peek()

    def take_candidate(self, req: int) -> None:
        """``req`` (from next_candidate) was admitted: remove it from the waiting structure."""
        self.waiting.pop()

    def pick_victim(self) -> Seq | None:
        """The running sequence to preempt when memory runs out: the newest (vLLM's rule)."""
        return next(reversed(self.running.values()), None)

    def free_held(self, now: float) -> bool:
        """Let go of KV the policy holds outside running requests (e.g. pinned prefixes) when prefills
        stall on memory with nothing decoding; True when something was let go (the step is retried)."""
        return False

    def on_admit(self, s: Seq, now: float) -> None:
        """``s`` was admitted at ``now``, into the step being formed (it holds its cached prefix)."""

    def on_finish(self, s: Seq, now: float) -> None:
        """``s`` finished in the step that ended at ``now`` (its KV is freed)."""

    def requeue(self, req: int) -> None:
        """A request (new, or preempted) goes to waiting."""
        self.waiting.push(req)

    def max_hit_blocks(self, req: int) -> int:
        """Most prefix-cache blocks ``req`` may reuse (e.g. BatchLLM shares only a group's prefix)."""
        return UNLIMITED

    def max_insert_blocks(self, s: Seq) -> int:
        """Most of its prompt's blocks ``s`` may put in the prefix cache (the rest stay private)."""
        return UNLIMITED

    # ---- admission and prefill ------------------------------------------------------------
    def _continue_prefills(self, budget: int, now: float, chunks: list, seqs: list) -> int:
        """Next chunks of the prompts already being prefilled, in order; the budget left, or -1 when
        the budget ran out or memory blocked one (then nothing new may start this step)."""
        loading = self.loading
        for s in list(self.prefilling):
            if loading:
                t = loading.get(s.req)
                if t is not None:
                    if t > now:
                        continue  # its KV is still on its way: not in this step
                    cap = self.cfg.max_seqs
                    if cap and len(self.running) - len(loading) >= cap:
                        continue  # arrived, but the running requests fill the sequence cap: it waits for a slot
                    del loading[s.req]
            if budget <= 0:
                return -1
            n = s.target - s.computed
            c = s.computed
            n = self._grow(s, n if n < budget else budget, now)
            if n == 0:
                self.blocked = True
                return -1
            chunks.append((s.req, n, c, 0))
            seqs.append(s)
            budget -= n
        self.blocked = False
        return budget

    def _schedule_prefill(self, budget: int, now: float, chunks: list, seqs: list) -> None:
        budget = self._continue_prefills(budget, now, chunks, seqs)
        if budget < 0:
            return
        cap = self.cfg.max_seqs
        reserve = self.cfg.admission == "reserve"
        while budget > 0:
            if cap and len(self.running) - len(self.loading) >= cap:  # vLLM counts a loading request as waiting
                self.blocked = True
                return
            r = self.next_candidate()
            if r is None:
                return
            s = self._admit(r, now)
            need = self._reserve_need(s) if reserve and self.running else 0.0
            refused = need > self.kv.available * self.B
            grows = self._can_grow(s)
            if refused or not grows:
                self._release_locks(s, now)
                self.blocked = True
                self.refused_req = r
                if grows:  # refused by the reserve rule alone (decode_run stops a run before it would admit)
                    self.reserve_need = self._reserve_own(s)
                return
            self.take_candidate(r)
            if self._commit_admission(s, now):  # its prefix loads asynchronously: a chunk once it has arrived
                self.on_admit(s, now)
                continue
            c = s.computed
            n = s.target - c
            n = self._grow(s, n if n < budget else budget, now)
            chunks.append((r, n, c, s.hit))
            seqs.append(s)
            budget -= n
            self.on_admit(s, now)

    def _admit(self, r: int, now: float) -> Seq:
        """A Seq for waiting request ``r`` with its cached prefix matched and locked. Nothing else is
        changed: on refusal, :meth:`_release_locks` undoes it; on acceptance call
        :meth:`_commit_admission`."""
        kv = self.kv
        g = self.resume.get(r, 0)
        p = self.P[r]
        path = kv.path_of(r)
        s = Seq(r, p, self.Dlen[r], path, p + g, g, self._order)
        cap = self.max_hit_blocks(r)
        hit = kv.match_tiers(path, min((s.target - 1) // self.B, cap))
        if hit:
            nb = kv.nblocks
            acc = i = 0
            while acc < hit:
                x = path[i]
                kv.lock(x, now)
                acc += nb[x]
                i += 1
            s.lock_n = i
            s.ins_i = i - 1
        s.shared = s.ins_j = hit
        s.hit = s.computed = hit * self.B
        if hit and kv.tiered:
            h, d = kv.last_split
            s.load = h + d
        h = self.hint[r] if self.hint is not None else -1
        s.est = h if h >= 0 else (self.fin_sum // self.fin_n if self.fin_n >= 16 else DEFAULT_EST_OUTPUT)
        return s

    def _can_grow(self, s: Seq) -> bool:
        """At least one more token of ``s`` fits (in its last block, or in a block that can be had), after
        the GPU blocks its host/disk hit loads into."""
        if s.load:
            return self.kv.available > s.load
        return s.computed % self.B != 0 or self.kv.available > 0

    def _commit_admission(self, s: Seq, now: float) -> bool:
        """``s`` (from :meth:`_admit`) joins the running sequences: bookkeeping and records. True when its prefix
        loads asynchronously (``async_loads``) and has not arrived by ``now``: the caller gives it no chunk; later
        steps do once it has (:meth:`_continue_prefills`)."""
        r = s.req
        self.resume.pop(r, None)
        s.order = self._order
        self._order += 1
        self.running[r] = s
        self.prefilling.append(s)
        self.est_sum += s.est
        self.gen_P += s.generated
        rec = self.rec
        if rec.admit_s[r] != rec.admit_s[r]:  # NaN: first admission
            rec.admit_s[r] = now
            rec.replica[r] = self.replica
        self.hit_tokens += s.hit
        later = False
        if s.load:  # host/disk blocks of the hit come back to the GPU before its first chunk runs
            t = self.kv.load(s.path, s.shared, now)
            if self.async_loads:
                if t > now:
                    self.loading[r] = t
                    later = True
            elif t > self._load_ready:
                self._load_ready = t
        if self.async_loads and s.lock_n and not later:
            # its hit reads blocks another request's load is still bringing back: vLLM caches a loading request's
            # blocks only once they have arrived (allocate_slots' delay_cache_blocks), so it waits for them too
            t = self.kv.arrives_at(s.path, s.lock_n)
            if t > now:
                self.loading[r] = t
                later = True
        hw = self.hi_water[r]
        h = s.hit if s.hit < s.p else s.p
        if h > hw:
            rec.cached_tokens[r] += h - hw
            self.hi_water[r] = h
        return later

    def _fits_expected(self, s: Seq) -> bool:
        """Reserve admission: memory must cover the rest of every running request — remaining prompt
        chunks and expected remaining output — plus all of ``s``, scaled by ``reserve_ratio``."""
        return self._reserve_need(s) <= self.kv.available * self.B

    def _reserve_need(self, s: Seq) -> float:
        """The KV (tokens) reserve admission needs free to admit ``s`` (:meth:`_fits_expected`); the expression
        :meth:`_reserve_own` splits, kept whole so admission rounds as it always did."""
        growth = self._growth()
        return (s.target - s.computed + s.load * self.B) + self.cfg.reserve_ratio * (s.est - s.generated + max(growth, 0))

    def _growth(self) -> int:
        """The running requests' expected growth: remaining prompt chunks and expected remaining output."""
        growth = self.est_sum - self.gen_S - self.n_dec * self.tau - self.gen_P
        for q in self.prefilling:
            growth += q.target - q.computed
        return growth

    def _reserve_own(self, s: Seq) -> float:
        """What of :meth:`_reserve_need` is ``s``'s own (its prompt, loads and expected output)."""
        return (s.target - s.computed + s.load * self.B) + self.cfg.reserve_ratio * (s.est - s.generated)

    def _grow(self, s: Seq, n: int, now: float) -> int:
        """Give ``s`` KV for ``n`` more tokens (fewer if memory is short); returns tokens granted."""
        B = self.B
        kv = self.kv
        c = s.computed
        have = -(-c // B)
        e = c + n
        need = -(-e // B) - have
        if need:
            free = kv.total - kv.cache_blocks - kv.private
            if need > free:
                avail = free + kv.evictable
                if need > avail:
                    n = (have + avail) * B - c
                    if n <= 0:
                        return 0
                    e = c + n
                    need = -(-e // B) - have
                if need > free:
                    kv.evict(need - free)
            kv.private += need
            s.private += need
        s.computed = e
        if self.record:
            self.events.append((self.step_no, "chunk", s.req, n, c, s.hit if c == s.hit else 0))
            self._owner = s.req
        # first-time vs recomputed tokens: prompt positions beyond the request's high-water mark are
        # new work; everything else (lost KV, re-generated output) is recomputation
        r = s.req
        p = s.p
        rec = self.rec
        rec.prefill_computed[r] += n
        hw = self.hi_water[r]
        if e > p:
            e = p
        if e > hw:
            new_first = e - (c if c > hw else hw)
            self.hi_water[r] = e
            if n > new_first:
                rec.recomputed_tokens[r] += n - new_first
        else:
            rec.recomputed_tokens[r] += n
        if c < p:
            self._insert(s, now)
        return n

    def _insert(self, s: Seq, now: float) -> None:
        """Put the prompt's newly completed full blocks into the prefix cache (at schedule time, so
        a request admitted later in the same step already hits them: intra-batch sharing)."""
        B = self.B
        done = (s.computed if s.computed < s.p else s.p) // B
        cap = self.max_insert_blocks(s)
        if done > cap:
            done = cap
        j = s.ins_j
        if done <= j:
            return
        kv = self.kv
        bs_, nb_ = kv.blk_start, kv.nblocks
        path = s.path
        i = s.ins_i
        while j < done:
            x = path[i]
            bs = bs_[x]
            end = bs + nb_[x]
            if j >= end:
                i += 1
                continue
            while s.lock_n <= i:
                kv.lock(path[s.lock_n], now)
                s.lock_n += 1
            cnt = (done if done < end else end) - j
            if s.contig:
                moved = kv.insert(x, j - bs, cnt)
                s.shared += moved
                s.private -= moved
                if kv.cached[x] < j - bs + cnt:
                    s.contig = False
            j += cnt
        s.ins_i = i
        s.ins_j = done

    def _prefill_done(self, s: Seq, now: float, step: int) -> None:
        self.prefilling.remove(s)
        self.gen_P -= s.generated
        s.generated += 1
        r = s.req
        rec = self.rec
        if s.generated > 1:  # resumed after a preemption: the wait counts as a gap between tokens
            gap = now - rec.preempted_s[r]
            if gap > rec.resume_gap_s[r]:
                rec.resume_gap_s[r] = gap
            rec.preempted_s[r] = float("nan")
        if rec.first_token_step[r] < 0:
            rec.first_token_s[r] = now
            rec.first_token_step[r] = step
        if s.generated >= s.d:
            self.kv.release(s.private)
            self._finish(s, now, step)
            return
        s.c0 = s.target
        self._enter_decode(s)

    def _enter_decode(self, s: Seq) -> None:
        """``s``, with context ``c0`` and ``generated`` tokens so far, joins the decode aggregate now."""
        tau0 = self.tau
        s.tau0 = tau0
        s.key = (s.c0 - tau0) % self.B
        s.fin = tau0 + s.d - s.generated - 1
        heapq.heappush(self.fin_heap, (s.fin, s.order, s.req, s))
        self.dec[s.req] = s
        self.n_dec += 1
        self.dec_S += s.c0 - tau0
        self.gen_S += s.generated - tau0
        self.buckets[s.key] += 1

    # ---- decode, finish, preemption ---------------------------------------------------------
    def _reserve_decode(self, now: float) -> None:
        """Blocks for this step's decode tokens; preempt (newest first) until they fit (kv_full = "stall":
        :meth:`_reserve_or_stall`)."""
        if self.stall:
            self._reserve_or_stall()
            return
        B = self.B
        need = self.buckets[-self.tau % B]
        kv = self.kv
        while need > kv.total - kv.cache_blocks - kv.private + kv.evictable:
            v = self.pick_victim()
            if v is None:
                break
            self._preempt(v, now)
            need = self.buckets[-self.tau % B]
        if need:
            kv.reserve(need)
        self._resv_tau = self.tau

    def _reserve_or_stall(self) -> None:
        """kv_full = "stall" (DeepSpeed-MII v0.1.1 mii/batching/ragged_batching.py): decodes are scheduled
        first, each taking a new KV block when its context crosses a block boundary; one that finds no block
        left is skipped this step (no token) and the others go on (_do_schedule_requests, ~lines 504-533: a
        decode whose query for one token gets nothing is passed over). Skipped requests stay at the front of
        the request buffer, so they have the first claim on blocks at the next steps (schedule_requests,
        ~:555-586): the stalled queue resumes first, in order; of the decodes crossing a boundary now, the
        newest admitted go without."""
        B = self.B
        kv = self.kv
        phase = -self.tau % B
        avail = kv.available
        q = self.stalled
        back = len(q) if len(q) < avail else avail  # stalled decodes that get their block now
        short = self.buckets[phase] - (avail - back)
        if short > 0:
            self._stall(short, phase)
        while back:
            s = q.popleft()
            self.gen_P -= s.generated
            self._enter_decode(s)  # its context is a multiple of B: it is counted in buckets[phase]
            back -= 1
        need = self.buckets[phase]
        if need:
            kv.reserve(need)
        self._resv_tau = self.tau

    def _stall(self, k: int, phase: int) -> None:
        """The ``k`` newest decoders that need a new block at this step (bucket ``phase``) leave the
        aggregate, keeping their KV, and queue in admission order for a block."""
        cross = []
        for s in self.dec.values():
            if s.key == phase:
                cross.append((s.order, s))
        cross.sort()  # orders are distinct
        tau = self.tau
        for _, s in cross[len(cross) - k:]:
            ctx = self._leave_decode(s)
            s.generated += tau - s.tau0
            s.c0 = ctx
            s.fin = STALLED
            self.gen_P += s.generated
            self.stalled.append(s)

    def _flush(self, now: float) -> None:
        """kv_full = "stall" with nothing able to run: every running request gives its KV back, newest
        first, and is re-queued to recompute its prompt and the tokens it generated (DeepSpeed-MII v0.1.1
        ragged_batching.py, "Deadlock detected", ~:577-582 with reset_request_status ~:604-619: each request
        becomes a new prompt of its prompt plus generated tokens, with max_new_tokens reduced to match)."""
        self.flushes += 1
        for s in reversed(list(self.running.values())):
            self._preempt(s, now)

    def _leave_decode(self, s: Seq) -> int:
        """Take ``s`` out of the decode aggregate; returns its context now."""
        del self.dec[s.req]
        self.n_dec -= 1
        self.dec_S -= s.c0 - s.tau0
        self.gen_S -= s.generated - s.tau0
        self.buckets[s.key] -= 1
        ctx = s.c0 + self.tau - s.tau0
        s.fin = -1
        return ctx

    def _finish_decode(self, s: Seq, now: float, step: int) -> None:
        ctx = self._leave_decode(s) + 1  # the last step wrote one more token's KV
        s.generated += self.tau - s.tau0 + 1
        self.kv.release(-(-ctx // self.B) - s.shared)
        self._finish(s, now, step)

    def _finish(self, s: Seq, now: float, step: int) -> None:
        r = s.req
        # what it held is free and its slot open: admission must be tried again before the next run of pure
        # decode steps (quiescent), as a step-by-step run does. Also after a refusal by the reserve rule alone: the
        # finish changes the refused request's own expected output (the mean of finished outputs, ``_admit``), so
        # the need its refusal saved (``reserve_need``, which decode_run checks) is stale
        self.blocked = False
        self._release_locks(s, now)
        del self.running[r]
        self.est_sum -= s.est
        self.fin_sum += s.d
        self.fin_n += 1
        rec = self.rec
        rec.finish_s[r] = now
        rec.finish_step[r] = step
        rec.generated[r] = s.generated
        rec.n_finished += 1
        if self.record:
            self.events.append((step, "finish", r, 0, 0, 0))
        self.on_finish(s, now)

    def _preempt(self, s: Seq, now: float) -> None:
        r = s.req
        self.blocked = False  # its KV is free and it waits again: admission must be tried before a run of decodes
        if s.fin >= 0:
            ctx = self._leave_decode(s)
            g = s.generated + self.tau - s.tau0
            # a block reserved for this step's decode token goes back too
            extra = 1 if self._resv_tau == self.tau and ctx % self.B == 0 else 0
            self.kv.release(-(-ctx // self.B) - s.shared + extra)
        elif s.fin == STALLED:
            self.stalled.remove(s)
            self.gen_P -= s.generated
            g = s.generated
            s.fin = -1
            self.kv.release(-(-s.c0 // self.B) - s.shared)
        else:
            self.prefilling.remove(s)
            self.gen_P -= s.generated
            g = s.generated
            self.kv.release(s.private)
            if self.loading:
                self.loading.pop(r, None)  # a load still on its way is wasted
        self._release_locks(s, now)
        del self.running[r]
        self.est_sum -= s.est
        self.resume[r] = g
        rec = self.rec
        rec.preemptions[r] += 1
        if rec.preempted_s[r] != rec.preempted_s[r]:  # NaN: its first preemption since its last token
            rec.preempted_s[r] = now
        if self.record:
            self.events.append((self.step_no, "preempt", r, g, 0, 0))
        self.requeue(r)

    def _release_locks(self, s: Seq, now: float) -> None:
        self.kv.unlock_all(s.path[:s.lock_n], now)
        s.lock_n = 0

    # ---- fast-forward of pure-decode stretches --------------------------------------------
    def quiescent(self) -> bool:
        """True when the next steps can only be pure decode steps until a sequence finishes:
        nothing is prefilling and admission is stuck (empty queue, no memory, no slots)."""
        return (self.fast_forward_ok and self.n_dec > 0 and not self.prefilling and not self.stalled
                and (self.blocked or len(self.waiting) == 0))

    def decode_run(self, limit: int) -> tuple[int, list]:
        """How many pure-decode steps (<= limit) can run before a finish or memory runs out, and the
        new blocks each of them needs."""
        heap = self.fin_heap
        while heap and heap[0][3].fin != heap[0][0]:
            heapq.heappop(heap)
        k = min(limit, heap[0][0] - self.tau) if heap else limit
        B = self.B
        avail = self.kv.available
        needs = []
        total = 0
        b, t = self.buckets, self.tau
        # a request that reserve admission refused fits once the decodes' expected remaining output has fallen
        # far enough: the run stops before the first step whose admission could pass (its own need, plus the
        # running requests' growth, which falls by n_dec a step; the free KV is what is free now less the blocks
        # earlier steps of the run take; no lost prefix hit counted, and a token of margin for rounding: so
        # never after it)
        own = self.reserve_need if self.blocked and len(self.waiting) else INF
        ratio = self.cfg.reserve_ratio
        growth = self._growth() if own < INF else 0
        D = self.n_dec
        for j in range(k):
            n = b[-(t + j) % B]
            if total + n > avail:
                break
            if own < INF:
                g = growth - D * j
                if own + ratio * (g if g > 0 else 0) <= (avail - total) * B + 1:
                    break
            total += n
            needs.append(n)
        return len(needs), needs

    def advance_decode(self, needs: list, starts=()) -> None:
        """Apply ``len(needs)`` pure-decode steps at once (no finishes among them); ``starts``: the times the first
        two of them start.

        A request refused admission is retried at every step of a step-by-step run, and the retry marks its
        cached prefix used at that step's start (LRU), before (prefill-first) or after (decode-first) the step's
        decode blocks are taken, evicting cache when short. After two retries its prefix is the newest cache and
        stays so, so the retries at the first two starts order every eviction of the run as step by step."""
        k = len(needs)
        kv = self.kv
        r = self.refused_req
        if not (r >= 0 and self.blocked and len(self.waiting) and len(starts) >= min(k, 2) and k):
            kv.reserve(sum(needs))
        else:
            first = self.cfg.mix == "prefill-first"
            taken = 0
            for j in range(min(k, 2)):
                if first:
                    self._retouch(r, starts[j])
                kv.reserve(needs[j])
                taken += needs[j]
                if not first:
                    self._retouch(r, starts[j])
            kv.reserve(sum(needs) - taken)
        self.tau += k
        self.step_no += k

    def _retouch(self, r: int, now: float) -> None:
        """The effect on the cache of a refused admission of ``r`` at ``now``: its prefix locked and unlocked."""
        s = self._admit(r, now)
        self._release_locks(s, now)


__all__ = ["Scheduler"]
