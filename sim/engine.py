"""The simpy cluster: one process per replica, one arrival process, a router.

A replica's step is three calls — ``batch = scheduler.schedule(now)``, ``seconds = executor.run(batch)``,
``scheduler.update(batch, now + seconds)`` — and simpy advances the clock. Replicas only interact
through arrivals (the router reads replica state when a request arrives), so between two arrivals a
replica runs its steps back to back on a local clock and yields one ``env.timeout`` for all of them;
an offline run (everything at t=0) is one timeout per replica. A request that arrives while a step is
running is seen at the next step boundary, as in a real engine.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import simpy

from blendsim.sim.batch import Batch, prefill_sums
from blendsim.sim.errors import UserError


class SimExecutor:
    """Prices a Batch with a cost model: ``run(batch) -> seconds``."""

    def __init__(self, cost_model):
        self.cm = cost_model
        self.last = (0.0, 0.0)  # compute and memory seconds of the last step

    def run(self, batch: Batch) -> float:
        tp, pairs, pkv = prefill_sums(batch.prefill)
        D = batch.num_decode
        t, comp, mem = self.cm.step(tp + D, tp, len(batch.prefill), pairs, pkv, D, batch.decode_ctx_sum,
                                    batch.num_logits, batch.prefill)
        self.last = (comp, mem)
        return t

    def run_decodes(self, D: int, ctx_sums: np.ndarray):
        """Seconds, compute and memory of a run of pure-decode steps (fast-forward)."""
        return self.cm.decode_many(D, ctx_sums)


SPILL_ROWS = 1 << 16  # a spilling StepLog writes its rows to disk once it holds this many (4.5 MB)
CHECK_MASK = 4095  # a replica reports progress and offers its log a spill when its step number & this is 0


class StepLog:
    """Per-step records of one replica, column-wise, in typed ``array.array`` columns.

    A step costs 72 bytes (nine 8-byte numbers), not the ~290 of nine Python lists of boxed numbers, so a
    multi-million-step run keeps its log in a quarter of the memory. The float columns are float64 and the
    count columns int64: what ``np.asarray`` made of the lists, so the step table is byte-identical.
    ``cols`` is a dict of numpy views of the columns (no copy): read it once the replica is done, since an
    array that is viewed cannot grow.

    With ``spill_dir`` the log does not grow with the run: :meth:`spill_if_full` (called by the replica every
    4096 steps) moves its rows, once there are :data:`SPILL_ROWS`, to one raw file per column in a temporary
    folder under ``spill_dir`` (removed with the log), and ``cols`` is then a :class:`SpilledColumns`
    mapping that reads a column from disk when asked.
    """

    COLUMNS = ("t_end_s", "dt_s", "compute_s", "memory_s", "num_tokens", "num_prefill_tokens",
               "num_decode", "num_prefill_seqs", "kv_used_blocks")
    FLOATS = frozenset(("t_end_s", "dt_s", "compute_s", "memory_s"))

    def __init__(self, spill_dir=None):
        self._arrays = {c: array("d" if c in self.FLOATS else "q") for c in self.COLUMNS}
        # bound appends in column order: the replica loop calls them directly
        self.appends = tuple(self._arrays[c].append for c in self.COLUMNS)
        self.spill_dir = spill_dir
        self._folder = None  # the temporary folder of the spilled rows (made at the first spill)
        self.spilled = 0  # rows on disk (they precede the rows in memory)

    def append(self, t_end, dt, comp, mem, tokens, prefill_tokens, decode, prefill_seqs, kv_used) -> None:
        a = self.appends
        a[0](t_end)
        a[1](dt)
        a[2](comp)
        a[3](mem)
        a[4](tokens)
        a[5](prefill_tokens)
        a[6](decode)
        a[7](prefill_seqs)
        a[8](kv_used)

    def extend(self, **arrays) -> None:
        for k, v in arrays.items():
            col = self._arrays[k]
            dt = np.float64 if col.typecode == "d" else np.int64
            col.frombytes(np.ascontiguousarray(np.asarray(v), dtype=dt).tobytes())

    def spill_if_full(self) -> None:
        if self.spill_dir is not None and len(self._arrays["dt_s"]) >= SPILL_ROWS:
            self.spill()

    def spill(self) -> None:
        """Append the rows in memory to the column files and empty the columns (the same array objects, so the
        replica's bound appends stay valid)."""
        n = len(self._arrays["dt_s"])
        if not n:
            return
        if self._folder is None:
            import shutil
            import tempfile
            import weakref

            Path(self.spill_dir).mkdir(parents=True, exist_ok=True)
            self._folder = Path(tempfile.mkdtemp(prefix=".blendsim-steps-", dir=self.spill_dir))
            weakref.finalize(self, shutil.rmtree, str(self._folder), True)
        for c, a in self._arrays.items():
            with open(self._folder / c, "ab") as f:
                a.tofile(f)
            del a[:]
        self.spilled += n

    def column_path(self, c: str) -> Path:
        return self._folder / c

    @property
    def cols(self):
        if self.spilled:
            return SpilledColumns(self)
        return {c: np.frombuffer(a, dtype=np.float64 if a.typecode == "d" else np.int64)
                for c, a in self._arrays.items()}

    def last_t_end(self) -> float:
        tail = self._arrays["t_end_s"]
        if len(tail) or not self.spilled:
            return tail[-1]
        return float(np.fromfile(self.column_path("t_end_s"), dtype=np.float64, count=1,
                                 offset=8 * (self.spilled - 1))[0])

    def __len__(self) -> int:
        return self.spilled + len(self._arrays["dt_s"])


class SpilledColumns(Mapping):
    """A spilled :class:`StepLog`'s columns: ``cols[name]`` reads the whole column (disk rows, then the rows
    in memory) as a new numpy array; :meth:`rows` reads a range of rows of one column."""

    def __init__(self, log: StepLog):
        self._log = log
        self.n = len(log)

    def __getitem__(self, c: str) -> np.ndarray:
        return self.rows(c, 0, self.n)

    def __iter__(self):
        return iter(self._log.COLUMNS)

    def __len__(self) -> int:
        return len(self._log.COLUMNS)

    def rows(self, c: str, lo: int, hi: int) -> np.ndarray:
        log = self._log
        if c not in log._arrays:
            raise KeyError(c)
        dt = np.float64 if c in log.FLOATS else np.int64
        out = np.empty(max(hi - lo, 0), dtype=dt)
        a, b = min(lo, log.spilled), min(hi, log.spilled)
        if b > a:
            out[:b - a] = np.fromfile(log.column_path(c), dtype=dt, count=b - a, offset=8 * a)
        if hi > log.spilled:
            tail = np.frombuffer(log._arrays[c], dtype=dt)
            out[b - a:] = tail[max(lo - log.spilled, 0):hi - log.spilled]
        return out


class Replica:
    """One model instance: a scheduler, an executor and a log of its steps.

    ``max_steps`` (0: none) caps the replica's steps: a policy that stops making progress (a livelock:
    the same request preempted and re-admitted forever) then fails with a clear error instead of
    running without end. Tests set it relative to the trace's tokens.
    """

    max_steps: int = 0

    def __init__(self, idx: int, scheduler, executor, fast_forward: bool = True, on_step=None, progress=None,
                 max_steps: int | None = None, kv_load: str = "stall", spill_dir=None):
        if max_steps is not None:
            self.max_steps = max_steps
        self.idx = idx
        self.scheduler = scheduler
        self.executor = executor
        self.log = StepLog() if spill_dir is None else StepLog(spill_dir)  # spill_dir: the log's rows go to disk
        self._spills = spill_dir is not None
        self.fast_forward = fast_forward and hasattr(executor, "run_decodes")
        self.on_step = on_step  # callable(replica, batch, t_end), e.g. to record the schedule
        self.progress = progress  # callable(), called every 4096 steps (CHECK_MASK)
        self.wakeup: simpy.Event | None = None
        # host/disk KV loads: layer-wise prefetch (overlap), else stall; asynchronous (vLLM V1's connectors): the
        # loading request waits out of the steps (Scheduler.loading), where its scheduler admits through the engine's
        # own path (ASYNC_LOADS), else its loads are priced as overlap
        self.overlap_loads = kv_load in ("overlap", "async")
        scheduler.async_loads = kv_load == "async" and getattr(scheduler, "ASYNC_LOADS", True)
        self.load_stall_s = 0.0  # step time added waiting for KV loads (sim.kv_tiers)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def queue_counts(self) -> tuple[int, int]:
        """Waiting and running requests (for the stuck-replica message)."""
        return len(self.scheduler.waiting), len(self.scheduler.running)

    def deliver(self, req: int, now: float) -> None:
        self.scheduler.requeue(req)
        self.scheduler.rec.routed_s[req] = now
        if self.wakeup is not None and not self.wakeup.triggered:
            self.wakeup.succeed()

    def run_until(self, now: float, horizon: float) -> float:
        """Run steps from ``now`` while a step can start before ``horizon``; the new local time."""
        sched, ex, kv = self.scheduler, self.executor, self.scheduler.kv
        a_t, a_dt, a_c, a_m, a_tok, a_pt, a_d, a_ps, a_kv = self.log.appends
        cap = self.max_steps
        every_4096 = self.progress is not None or self._spills
        mask = CHECK_MASK
        tiered = kv.tiered
        while now < horizon:
            if cap and sched.step_no >= cap:
                raise RuntimeError(f"replica {self.idx} ran {sched.step_no} steps, the cap (max_steps) with "
                                   f"{len(sched.running)} requests running and {len(sched.waiting)} waiting: "
                                   "the policy makes no progress (a livelock)")
            b = sched.schedule(now)
            if b is None:
                t = sched.load_ready_at()
                if t > now:  # nothing runs until an asynchronous load arrives (or a request does)
                    now = t if t < horizon else horizon
                    continue
                break
            if tiered:
                check_step_waits(sched, b, now)
            dt = ex.run(b)
            if b.load_s:
                dt = self._wait_loads(dt, b.load_s)
            now += dt
            used = kv.used  # what the step held: before update frees the requests it finished
            sched.update(b, now)
            comp, mem = ex.last
            a_t(now)
            a_dt(dt)
            a_c(comp)
            a_m(mem)
            a_tok(b.num_tokens)
            a_pt(b.num_tokens - b.num_decode)
            a_d(b.num_decode)
            a_ps(len(b.prefill))
            a_kv(used)
            if self.on_step is not None:
                self.on_step(self, b, now)
            if every_4096 and not b.step & mask:
                if self.progress is not None:
                    self.progress()
                if self._spills:
                    self.log.spill_if_full()
            if self.fast_forward and sched.quiescent():
                now = self._fast_forward(now, horizon)
        return now

    def _wait_loads(self, dt: float, load_s: float) -> float:
        """The step's time when its KV loads take ``load_s``: after them (stall), or the longer of the two
        when each layer's load overlaps the previous layer's compute (overlap)."""
        t = (load_s if load_s > dt else dt) if self.overlap_loads else load_s + dt
        self.load_stall_s += t - dt
        return t

    def _fast_forward(self, now: float, horizon: float) -> float:
        if now >= horizon:  # a request arrived during the last step: the next one must see it (run_until)
            return now
        sched = self.scheduler
        k, needs = sched.decode_run(1 << 20)
        if k < 2:
            return now
        D = sched.n_dec
        ctx = (sched.dec_S + D * sched.tau) + D * np.arange(k, dtype=np.int64)
        times, comp, mem = self.executor.run_decodes(D, ctx)
        # the clock as a step-by-step run moves it, one addition a step ((now + t0) + t1 ...), to the last bit
        ends = np.add.accumulate(np.concatenate(((now,), times)))[1:]
        if math.isfinite(horizon):
            starts_before = int(np.searchsorted(ends, horizon, side="left")) + 1
            k = min(k, starts_before)
        used0 = sched.kv.used
        needs = needs[:k]
        sched.advance_decode(needs, (now, float(ends[0])) if k > 1 else (now,))
        self.log.extend(t_end_s=ends[:k], dt_s=times[:k], compute_s=comp[:k] + 0 * times[:k],
                        memory_s=mem[:k], num_tokens=[D] * k, num_prefill_tokens=[0] * k, num_decode=[D] * k,
                        num_prefill_seqs=[0] * k, kv_used_blocks=(used0 + np.cumsum(needs)).tolist())
        if self._spills:
            self.log.spill_if_full()
        return float(ends[k - 1])


def users_scheduler(sched) -> str:
    """``Class (file)`` of a scheduler a user wrote (not one of blendsim's own), else "": what a message about a
    request the engine could not run or finish names."""
    import sys

    cls = type(sched)
    mod = str(getattr(cls, "__module__", ""))
    where = getattr(sys.modules.get(mod), "__file__", None) or mod  # a file policy's module is named by its digest
    return "" if mod.startswith("blendsim.") else f"{cls.__qualname__} ({where})"


class PipelinedReplica:
    """One pipeline-parallel replica: ``pp`` stages of GPUs and up to ``pp`` batches in flight.

    As vLLM's virtual engines (and TensorRT-LLM's micro-batches) fill the pipe, the replica runs several
    *virtual engines* (``ves``: Replicas, each with its own scheduler, KV share and step log; the router sees
    them as replicas). A virtual engine schedules its next batch when its previous one leaves the last stage;
    the batch then occupies each stage in turn for that stage's time (``pricer``: ``sim.pipeline.StagePricer``),
    handed from stage to stage over the link between them, and waits when a stage is still busy with an
    earlier batch (stages serve batches in the order they entered the pipe, as the point-to-point sends do).
    With one virtual engine busy a step costs the sum of the stages and hand-offs; with the pipe full it costs
    the slowest stage; at the end of a job, as virtual engines run dry, the bubble shows. A step that loads KV
    from host/disk tiers delays each stage by what is left of that stage's own load when it takes the batch up (:meth:`_through`).
    """

    def __init__(self, idx: int, ves: list[Replica], pricer, fast_forward: bool = True):
        self.idx = idx
        self.ves = ves
        self.pricer = pricer
        self.free = [0.0] * pricer.stages  # when each stage finishes its last batch
        self.server_free = 0.0  # when an API server beside the engine has done the last batch's work
        self.ready = [0.0] * len(ves)  # when each virtual engine's last batch leaves the pipe
        self.fast_forward = fast_forward and hasattr(pricer, "run_decodes")
        self._run: list = [None] * len(ves)  # a virtual engine's pending run of pure-decode steps
        self._wakeup = None

    @property
    def wakeup(self):
        return self._wakeup

    @wakeup.setter
    def wakeup(self, ev) -> None:
        self._wakeup = ev
        for ve in self.ves:
            ve.wakeup = ev

    def has_work(self) -> bool:
        return any(r is not None for r in self._run) or any(ve.has_work() for ve in self.ves)

    def queue_counts(self) -> tuple[int, int]:
        return (sum(len(ve.scheduler.waiting) for ve in self.ves), sum(len(ve.scheduler.running) for ve in self.ves))

    def _through(self, t: float, times, xfer, server: float = 0.0, loads=None, ve=None) -> float:
        """Send a batch ready at ``t`` through the stages; the time it leaves the last one. With an API server beside
        the engine (``server``: its work for the batch), the batch enters no sooner than the server has done the
        previous batch's: the server paces the pipe, its work not in series with the stages.

        ``loads`` (a step that loads KV from host/disk tiers): when each stage's own loads of the step arrive
        (``TieredKVCache.stage_ready``; every stage moves its own layers' share over its own links, from when the
        step was scheduled). A stage waits for what is left of its load when it takes the batch up, by the rule of
        one stage (``Replica._wait_loads``: after it, or the longer of the two under overlap); ``ve.load_stall_s``
        adds the wait, in stage-seconds (the summary divides by the stages)."""
        if server:
            if self.server_free > t:
                t = self.server_free
            self.server_free = t + server
        free = self.free
        for s, dt in enumerate(times):
            if s:
                t += xfer[s - 1]
            if free[s] > t:
                t = free[s]
            if loads is not None and loads[s] > t:  # what is left of the stage's load when it starts the batch
                dt = ve._wait_loads(dt, loads[s] - t)
            t += dt
            free[s] = t
        return t

    def run_until(self, now: float, horizon: float) -> float:
        """Issue batches that their virtual engines are ready to start before ``horizon``; the next time the
        replica needs the clock (the earliest ready virtual engine with work), or when its last batch ends."""
        ves, ready, runs = self.ves, self.ready, self._run
        skip = set()  # virtual engines with work but no batch they can run (stuck, as Replica reports)
        while True:
            best, bt = -1, math.inf
            for v, ve in enumerate(ves):
                if v not in skip and (runs[v] is not None or ve.scheduler.has_work()):
                    t = ready[v] if ready[v] > now else now
                    if t < bt:
                        best, bt = v, t
            if best < 0 or bt >= horizon:
                break
            if runs[best] is not None:
                if len(ves[best].scheduler.waiting) == runs[best][9]:
                    self._run_step(best, bt)
                    continue
                self._end_run(best)  # a request arrived since the run began: the next step must see it
            ve = ves[best]
            sched = ve.scheduler
            if ve.max_steps and sched.step_no >= ve.max_steps:
                raise RuntimeError(f"replica {self.idx} (virtual engine {ve.idx}) ran {sched.step_no} steps, the cap "
                                   f"(max_steps): the policy makes no progress (a livelock)")
            b = sched.schedule(bt)
            if b is None:
                t = sched.load_ready_at()
                if t > bt:  # its next batch waits for an asynchronous load
                    ready[best] = t
                    continue
                skip.add(best)
                continue
            if sched.kv.tiered:
                check_step_waits(sched, b, bt)
            times, xfer, comp, mem = self.pricer.run(b)
            end = self._through(bt, times, xfer, self.pricer.server_s(b.num_logits, b.num_decode),
                                sched.kv.stage_loads(bt) if b.load_s else None, ve)
            used = sched.kv.used  # what the step held: before update frees the requests it finished
            sched.update(b, end)
            ready[best] = end
            ve.log.append(end, end - bt, comp, mem, b.num_tokens, b.num_tokens - b.num_decode, b.num_decode,
                          len(b.prefill), used)
            if ve.on_step is not None:
                ve.on_step(ve, b, end)
            if not b.step & CHECK_MASK:
                if ve.progress is not None:
                    ve.progress()
                if ve._spills:
                    ve.log.spill_if_full()
            if self.fast_forward and ve.fast_forward and sched.quiescent():
                self._start_run(best)
        for v, r in enumerate(runs):
            if r is not None:
                self._end_run(v)
        if best >= 0:
            return bt
        return max(now, max(ready))

    # ---- fast-forward: a virtual engine's run of pure-decode steps, priced at once -------------------
    def _start_run(self, v: int) -> None:
        sched = self.ves[v].scheduler
        k, needs = sched.decode_run(1 << 20)
        if k < 2:
            return
        D = sched.n_dec
        ctx = (sched.dec_S + D * sched.tau) + D * np.arange(k, dtype=np.int64)
        times, xfer, comp, mem = self.pricer.run_decodes(D, ctx)
        used = (sched.kv.used + np.cumsum(needs)).tolist()
        self._run[v] = [0, k, needs, [t.tolist() for t in times], xfer, comp.tolist(), mem.tolist(), used, D,
                        len(sched.waiting), [], self.pricer.server_s(D, D)]

    def _run_step(self, v: int, t0: float) -> None:
        r = self._run[v]
        j, k = r[0], r[1]
        if j < 2:
            r[10].append(t0)  # the first two steps' starts (Scheduler.advance_decode)
        end = self._through(t0, [t[j] for t in r[3]], r[4], r[11])
        self.ready[v] = end
        D = r[8]
        self.ves[v].log.append(end, end - t0, r[5][j], r[6][j], D, 0, D, 0, r[7][j])
        r[0] = j + 1
        if j + 1 == k:
            self._end_run(v)

    def _end_run(self, v: int) -> None:
        """Apply the steps of ``v``'s run that were issued (the rest are scheduled afresh)."""
        r = self._run[v]
        self._run[v] = None
        if r[0]:
            self.ves[v].scheduler.advance_decode(r[2][:r[0]], r[10])
        if self.ves[v]._spills:
            self.ves[v].log.spill_if_full()


def pipelined_units(replicas: list[Replica], pp: int, pricer, fast_forward: bool = True) -> list | None:
    """With ``pp`` > 1, group each ``pp`` consecutive Replicas (virtual engines) into a PipelinedReplica (each with
    its own stages, all priced by ``pricer``); None (the Replicas run themselves) when ``pp`` is 1."""
    if pp == 1:
        return None
    return [PipelinedReplica(g, replicas[g * pp:(g + 1) * pp], pricer, fast_forward)
            for g in range(len(replicas) // pp)]


def check_step_waits(sched, b, now: float) -> None:
    """With host/disk KV tiers: stop in one line where ``sched.schedule`` formed the step at ``now`` without waiting for
    the KV it loads (no ``_tiers_step``, a load wait left out of ``load_s``, or, under kv_load async, a chunk for a
    request whose load is still on its way)."""
    loading = sched.loading
    if (sched.kv.now != now or (sched._load_ready > now and not b.load_s)
            or (loading and any(loading.get(c[0], 0.0) > now for c in b.prefill))):
        raise UserError(step_former_message(sched))


def step_former_message(sched) -> str:
    """The one line for a scheduler whose ``schedule`` formed a step without its host/disk KV loads' wait."""
    cls = type(sched)
    return (f"scheduler {cls.__module__}.{cls.__qualname__}: its schedule() formed a step without waiting for the KV "
            f"loads it admits from the host/disk tiers: call self._tiers_step(now) first and pass "
            f"self._load_wait(now) as the Batch's load_s; under kv_load async a request whose load is on its way "
            f"(self.loading) gets no chunk, or set ASYNC_LOADS = False where it admits through a path of its own "
            f"(docs/writing-a-policy.md, 'Your own scheduler')")


class Cluster:
    """N replicas, a router and the arrival process on one simpy Environment."""

    def __init__(self, replicas: list[Replica], router, arrivals: np.ndarray, route_order: np.ndarray,
                 units: list | None = None):
        self.env = simpy.Environment()
        self.replicas = replicas  # what the router routes to (a pipelined replica's virtual engines)
        self.units = units or replicas  # what runs steps: Replicas, or PipelinedReplicas owning them
        self.router = router
        self.arrivals = arrivals
        self.route_order = route_order  # request indices in the order they are handed to the router
        self.next_arrival = 0.0
        self.arrivals_done = False

    def run(self) -> float:
        env = self.env
        env.process(self._arrival_process())
        procs = [env.process(self._replica_process(r)) for r in self.units]
        env.run()
        for p in procs:
            if not p.ok:
                raise p.value
        return max((r.log.last_t_end() for r in self.replicas if len(r.log)), default=0.0)

    def _arrival_process(self):
        env = self.env
        order = self.route_order
        t = self.arrivals[order]
        # groups of equal arrival time, in routing order
        cuts = np.flatnonzero(np.diff(t)) + 1
        starts = np.r_[0, cuts]
        ends = np.r_[cuts, len(order)]
        for g, (a, b) in enumerate(zip(starts, ends)):
            ta = float(t[a])
            if ta > env.now:
                yield env.timeout(ta - env.now)
            for req in order[a:b].tolist():
                i = self.router.route(req, env.now)
                self.replicas[i].deliver(req, env.now)
            self.next_arrival = float(t[ends[g]]) if b < len(order) else math.inf
        self.next_arrival = math.inf
        self.arrivals_done = True
        for r in self.replicas:
            if r.wakeup is not None and not r.wakeup.triggered:
                r.wakeup.succeed()

    def _replica_process(self, rep: Replica):
        env = self.env
        while True:
            if rep.has_work():
                local = rep.run_until(env.now, self.next_arrival)
                if local > env.now:
                    yield env.timeout(local - env.now)
                    continue
            if self.arrivals_done:
                if rep.has_work():
                    waiting, running = rep.queue_counts()
                    own = users_scheduler(rep.ves[0].scheduler if hasattr(rep, "ves") else rep.scheduler)
                    raise UserError(
                        f"replica {rep.idx} is stuck with {waiting} waiting and {running} running "
                        f"requests and no step it can run " + (
                            f"(the policy's scheduler {own} offers none of them: its next_candidate() returned None, "
                            f"or its admission refuses them)" if own else
                            "(KV cache too small for the requests left?)")
                    )
                return
            rep.wakeup = env.event()
            yield rep.wakeup
            rep.wakeup = None


__all__ = ["Cluster", "PipelinedReplica", "SPILL_ROWS", "SpilledColumns", "pipelined_units", "Replica", "SimExecutor",
           "StepLog", "users_scheduler"]
