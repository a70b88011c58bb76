"""BatchLLM's group-based scheduling on one replica (sec. 4.3.1, 4.3.3).

Three queues feed each step, in this order: decodes (the engine runs them first), the *distinct
prompt queue* and the *common prefix queue*. Continuing prefill chunks go before both (the engine's
rule: active requests first). A prefix-sharing group enters the common queue as its first request,
the *leader*, which carries the group's common prefix; the other members wait, parked, until the
leader's prefix blocks are in the KV cache, then move to the distinct queue and hit those blocks.
Plain requests (groups of one, prefixes under a block) are ordinary entries of the common queue.

Admission (Alg. 2) is limited by KV memory, not by a request count: a prefill is admitted while the
token budget has room and the KV in use, counting the whole remaining prompt of every prefilling
request, is under ``kv_threshold`` of the cache. The public fork's count-based rule (vLLM's 256
sequences + 100) is ``batching=count``.

NOTE (how the common prefix request is expressed here): the fork runs the prefix as a separate
prefix-only request. Here the leader computes the prefix and then its own distinct tokens — the
prefix's tokens and KV are the same; what differs is that the leader's distinct part follows in the
same stream of chunks. The group's prefix is *pinned* (held with a cache reference) from the moment
the leader's prefix is cached until every waiting member is admitted; the members' own references then
keep it until the last of them finishes, which is the paper's "common KV released when the group
completes". Under memory pressure the pins give way first: before a running request is preempted,
or when nothing can run, pinned prefixes become evictable (our choice; the fork holds the common
request's KV until the group ends, which can deadlock a too-small cache).
"""

from __future__ import annotations

import heapq
from collections import deque

from blendsim.sim.scheduler import Scheduler

IDLE, PENDING, OPEN = 0, 1, 2  # a group's session on a replica


class GroupQueue:
    """The waiting side of the three queues: the distinct prompt queue (``ready``: (request,
    session) pairs), the common prefix queue (``common``: a heap of (rank, request)) and the members
    parked until their group's prefix is computed (``parked``: group -> [(rank, request)])."""

    def __init__(self):
        self.ready: deque = deque()
        self.common: list = []
        self.parked: dict[int, list] = {}
        self.n_parked = 0

    def __len__(self) -> int:
        return len(self.ready) + len(self.common) + self.n_parked

    def __iter__(self):
        yield from (r for r, _ in self.ready)
        yield from (r for _, r in sorted(self.common))
        for lst in self.parked.values():
            yield from (r for _, r in lst)


class BatchLLMScheduler(Scheduler):
    """Group sessions, the three queues and memory-centric admission; see the module docstring.

    ``plan`` is the policy's offline result: ``group_of`` (per request, -1 for a plain request),
    ``rank`` (per request), ``prefix_tokens`` and ``pin_nodes`` (per group), ``hit_cap`` (per
    request: most cache blocks it may reuse, -1 for no cap), ``kv_threshold`` (fraction of the KV
    blocks, 0 for none), ``seq_cap`` (running requests, 0 for none) and ``shared_attention``."""

    # its hit caps lock a group's whole cached prefix node while a member reuses only part of it: a member whose
    # prefix loads asynchronously (kv_load "async") and waits out of the steps while others are admitted can come
    # back to a cache it can no longer grow in (found by tests/test_kv_tiers.py's property test on a 16-token
    # cache); its loads are priced as overlap instead (sim.engine.Replica)
    ASYNC_LOADS = False

    def __init__(self, *, plan, **kw):
        kw["queue"] = GroupQueue()
        super().__init__(**kw)
        self.q = kw["queue"]
        self.group_of = plan.group_of
        self.rank = plan.rank
        self.prefix_tokens = plan.prefix_tokens
        self.pin_nodes = plan.pin_nodes
        self.hit_cap = plan.hit_cap
        self.threshold = int(plan.kv_threshold * self.kv.total) if plan.kv_threshold > 0 else 0
        self.seq_cap = plan.seq_cap
        self.state: dict[int, int] = {}  # group -> PENDING / OPEN (absent: IDLE)
        self.session: dict[int, int] = {}  # group -> id of its current session
        self.waiting_members: dict[int, int] = {}  # OPEN group -> its members still in ``ready``
        self.pinned: set = set()  # groups whose prefix is pinned
        self.leading: dict[int, int] = {}  # leader request -> its PENDING group
        self._sessions = 0
        self._from_ready = False
        self._now = 0.0
        self.prefix_runs: dict[int, int] = {}  # group -> times its prefix was opened (tests, stats)
        # sec. 4.4 what-if: decoders per group whose prefix KV is shared, and the KV tokens a
        # prefix-shared attention kernel would not read again: sum over groups of (n - 1) x prefix
        self.shared_attention = plan.shared_attention
        self.dec_in_group: dict[int, int] = {}
        self.shared_ctx = 0
        if self.shared_attention:
            self.fast_forward_ok = False  # the engine's fast-forward prices the full decode context

    # ---- arrivals and preemptions ----------------------------------------------------------
    def requeue(self, req: int) -> None:
        q = self.q
        if req in self.resume:  # preempted: it was active, so it goes first (sec. 4.3.1)
            q.ready.appendleft((req, -1))
            return
        g = self.group_of[req]
        if g < 0:
            heapq.heappush(q.common, (self.rank[req], req))
            return
        st = self.state.get(g, IDLE)
        if st == IDLE:  # the first member to arrive carries the group's prefix
            self.state[g] = PENDING
            self.leading[req] = g
            heapq.heappush(q.common, (self.rank[req], req))
        elif st == PENDING:
            q.parked.setdefault(g, []).append((self.rank[req], req))
            q.n_parked += 1
        else:
            q.ready.append((req, self.session[g]))
            self.waiting_members[g] += 1

    # ---- admission (Alg. 2) -----------------------------------------------------------------
    def next_candidate(self) -> int | None:
        if self.seq_cap and len(self.running) >= self.seq_cap:
            self.blocked = True
            return None
        if self.threshold and self._kv_committed() >= self.threshold:
            # NOTE: while only decodes run, KV use only grows, so this stays true until a finish:
            # setting ``blocked`` lets the engine fast-forward the pure-decode stretch.
            self.blocked = True
            return None
        q = self.q
        if q.ready:
            self._from_ready = True
            return q.ready[0][0]
        self._from_ready = False
        return q.common[0][1] if q.common else None

    def take_candidate(self, req: int) -> None:
        if self._from_ready:
            _, sess = self.q.ready.popleft()
            g = self.group_of[req]
            if sess >= 0 and self.session.get(g) == sess:
                self.waiting_members[g] -= 1
        else:
            heapq.heappop(self.q.common)

    def on_admit(self, s, now: float) -> None:
        if self._from_ready:
            g = self.group_of[s.req]
            if self.state.get(g) == OPEN and self.waiting_members[g] == 0:
                self._close(g, now)

    def max_hit_blocks(self, req: int) -> int:
        """BatchLLM shares only the first-level prefix: a request may reuse its group's common prefix
        and nothing deeper (sec. 4.2: the other levels are expanded during token batching)."""
        cap = self.hit_cap[req]
        return cap if cap >= 0 else super().max_hit_blocks(req)

    def max_insert_blocks(self, s) -> int:
        """Only blocks within the request's cap enter the prefix cache: with ``share=group`` that is
        the group's common prefix (offered by its leader); distinct parts stay private and are freed
        when the request finishes, as in the fork.

        NOTE: without this cap a request that recomputes blocks another request cached deeper down
        would lock the cached copies *and* hold its private ones (twice the memory)."""
        cap = self.hit_cap[s.req]
        return cap if cap >= 0 else super().max_insert_blocks(s)

    def _kv_committed(self) -> int:
        """KV blocks in use plus those the prefilling requests' remaining prompts will take."""
        B = self.B
        m = self.kv.used
        for s in self.prefilling:
            m += -(-(s.target - s.computed) // B)
        return m

    # ---- group sessions -----------------------------------------------------------------------
    def update(self, batch, now: float) -> None:
        super().update(batch, now)
        leading = self.leading
        if leading:
            for s in self._chunk_seqs:
                g = leading.get(s.req)
                if g is not None and s.computed >= self.prefix_tokens[g]:
                    del leading[s.req]
                    self._open(g, now)

    def _open(self, g: int, now: float) -> None:
        """The leader's prefix blocks are cached: the parked members become distinct prompts."""
        q = self.q
        members = sorted(q.parked.pop(g, ()))
        q.n_parked -= len(members)
        self.prefix_runs[g] = self.prefix_runs.get(g, 0) + 1
        if not members:
            del self.state[g]
            return
        self._sessions += 1
        sess = self.session[g] = self._sessions
        self.state[g] = OPEN
        self.waiting_members[g] = len(members)
        q.ready.extend((r, sess) for _, r in members)
        kv = self.kv
        for x in self.pin_nodes[g]:
            kv.lock(x, now)
        self.pinned.add(g)

    def _close(self, g: int, now: float) -> None:
        """Every waiting member is admitted: they hold the prefix themselves from now on."""
        del self.state[g], self.waiting_members[g]
        if g in self.pinned:
            self._unpin(g, now)

    def _unpin(self, g: int, now: float) -> None:
        self.pinned.discard(g)
        self.kv.unlock_all(self.pin_nodes[g], now)

    # ---- memory pressure: pins give way first ----------------------------------------------------
    def schedule(self, now: float):
        self._now = now
        b = super().schedule(now)
        if b is None and self.pinned and len(self.q):
            self._drop_pins()  # stuck on memory the pins hold: let them go
            b = super().schedule(now)
        if b is not None and self.shared_ctx and b.num_decode:
            # NOTE: a cost what-if, not the engine's definition of decode_ctx_sum (the sum of the
            # decodes' contexts): the prefix-shared kernel reads each group's prefix KV once per step.
            b.decode_ctx_sum -= self.shared_ctx
        return b

    def _reserve_decode(self, now: float) -> None:
        if self.pinned:
            kv = self.kv
            if self.buckets[-self.tau % self.B] > kv.total - kv.cache_blocks - kv.private + kv.evictable:
                self._drop_pins()
        super()._reserve_decode(now)

    # ---- prefix-shared attention (sec. 4.4), an optional cost what-if -----------------------------
    def _prefill_done(self, s, now: float, step: int) -> None:
        super()._prefill_done(s, now, step)
        if self.shared_attention and s.req in self.dec:
            g = self.group_of[s.req]
            if g >= 0 and s.shared * self.B >= self.prefix_tokens[g]:
                n = self.dec_in_group.get(g, 0)
                self.dec_in_group[g] = n + 1
                if n:
                    self.shared_ctx += self.prefix_tokens[g]
                s.side = 1

    def _leave_decode(self, s) -> int:
        if s.side == 1:
            s.side = 0
            g = self.group_of[s.req]
            n = self.dec_in_group[g] - 1
            self.dec_in_group[g] = n
            if n:
                self.shared_ctx -= self.prefix_tokens[g]
        return super()._leave_decode(s)

    def pick_victim(self):
        """Before a running request is preempted for memory, pinned prefixes become evictable."""
        if self.pinned:
            self._drop_pins()
        return super().pick_victim()

    def free_held(self, now: float) -> bool:
        """Prefills stalled with nothing decoding: the pinned prefixes go first (a cache just above the
        largest request can otherwise be held entirely by pins, e.g. two groups whose leaders both cached
        their prefixes in one step)."""
        if not self.pinned:
            return False
        self._now = now
        self._drop_pins()
        return True

    def _drop_pins(self) -> None:
        for g in sorted(self.pinned):
            self._unpin(g, self._now)


__all__ = ["BatchLLMScheduler", "GroupQueue"]
