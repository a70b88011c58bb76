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


class StepLog:
    """Per-step records of one replica, column-wise."""

    COLUMNS = ("t_end_s", "dt_s", "compute_s", "memory_s", "num_tokens", "num_prefill_tokens",
               "num_decode", "num_prefill_seqs", "kv_used_blocks")

    def __init__(self):
        self.cols = {c: [] for c in self.COLUMNS}

    def append(self, t_end, dt, comp, mem, tokens, prefill_tokens, decode, prefill_seqs, kv_used) -> None:
        c = self.cols
        c["t_end_s"].append(t_end)
        c["dt_s"].append(dt)
        c["compute_s"].append(comp)
        c["memory_s"].append(mem)
        c["num_tokens"].append(tokens)
        c["num_prefill_tokens"].append(prefill_tokens)
        c["num_decode"].append(decode)
        c["num_prefill_seqs"].append(prefill_seqs)
        c["kv_used_blocks"].append(kv_used)

    def extend(self, **arrays) -> None:
        for k, v in arrays.items():
            self.cols[k].extend(v.tolist() if isinstance(v, np.ndarray) else v)

    def __len__(self) -> int:
        return len(self.cols["dt_s"])


class Replica:
    """One model instance: a scheduler, an executor and a log of its steps.

    ``max_steps`` (0: none) caps the replica's steps: a policy that stops making progress (a livelock:
    the same request preempted and re-admitted forever) then fails with a clear error instead of
    running without end. Tests set it relative to the trace's tokens.
    """

    max_steps: int = 0

    def __init__(self, idx: int, scheduler, executor, fast_forward: bool = True, on_step=None, progress=None,
                 max_steps: int | None = None):
        if max_steps is not None:
            self.max_steps = max_steps
        self.idx = idx
        self.scheduler = scheduler
        self.executor = executor
        self.log = StepLog()
        self.fast_forward = fast_forward and hasattr(executor, "run_decodes")
        self.on_step = on_step  # callable(replica, batch, t_end), e.g. to record the schedule
        self.progress = progress  # callable(), called every 4096 steps
        self.wakeup: simpy.Event | None = None

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def deliver(self, req: int, now: float) -> None:
        self.scheduler.requeue(req)
        self.scheduler.rec.routed_s[req] = now
        if self.wakeup is not None and not self.wakeup.triggered:
            self.wakeup.succeed()

    def run_until(self, now: float, horizon: float) -> float:
        """Run steps from ``now`` while a step can start before ``horizon``; the new local time."""
        sched, ex, log, kv = self.scheduler, self.executor, self.log, self.scheduler.kv
        append = log.append
        cap = self.max_steps
        while now < horizon:
            if cap and sched.step_no >= cap:
                raise RuntimeError(f"replica {self.idx} ran {sched.step_no} steps, the cap (max_steps) with "
                                   f"{len(sched.running)} requests running and {len(sched.waiting)} waiting: "
                                   "the policy makes no progress (a livelock)")
            b = sched.schedule(now)
            if b is None:
                break
            dt = ex.run(b)
            now += dt
            sched.update(b, now)
            comp, mem = ex.last
            pt = b.num_tokens - b.num_decode
            append(now, dt, comp, mem, b.num_tokens, pt, b.num_decode, len(b.prefill), kv.used)
            if self.on_step is not None:
                self.on_step(self, b, now)
            if self.progress is not None and not b.step & 4095:
                self.progress()
            if self.fast_forward and sched.quiescent():
                now = self._fast_forward(now, horizon)
        return now

    def _fast_forward(self, now: float, horizon: float) -> float:
        sched = self.scheduler
        k, needs = sched.decode_run(1 << 20)
        if k < 2:
            return now
        D = sched.n_dec
        ctx = (sched.dec_S + D * sched.tau) + D * np.arange(k, dtype=np.int64)
        times, comp, mem = self.executor.run_decodes(D, ctx)
        ends = now + np.cumsum(times)
        if math.isfinite(horizon):
            starts_before = int(np.searchsorted(ends, horizon, side="left")) + 1
            k = min(k, starts_before)
        used0 = sched.kv.used
        needs = needs[:k]
        sched.advance_decode(needs)
        self.log.extend(t_end_s=ends[:k], dt_s=times[:k], compute_s=comp[:k] + 0 * times[:k],
                        memory_s=mem[:k], num_tokens=[D] * k, num_prefill_tokens=[0] * k, num_decode=[D] * k,
                        num_prefill_seqs=[0] * k, kv_used_blocks=(used0 + np.cumsum(needs)).tolist())
        return float(ends[k - 1])


class Cluster:
    """N replicas, a router and the arrival process on one simpy Environment."""

    def __init__(self, replicas: list[Replica], router, arrivals: np.ndarray, route_order: np.ndarray):
        self.env = simpy.Environment()
        self.replicas = replicas
        self.router = router
        self.arrivals = arrivals
        self.route_order = route_order  # request indices in the order they are handed to the router
        self.next_arrival = 0.0
        self.arrivals_done = False

    def run(self) -> float:
        env = self.env
        env.process(self._arrival_process())
        procs = [env.process(self._replica_process(r)) for r in self.replicas]
        env.run()
        for p in procs:
            if not p.ok:
                raise p.value
        return max((r.log.cols["t_end_s"][-1] for r in self.replicas if len(r.log)), default=0.0)

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
                    s = rep.scheduler
                    raise UserError(
                        f"replica {rep.idx} is stuck with {len(s.waiting)} waiting and {len(s.running)} running "
                        f"requests and no step it can run (KV cache too small for the requests left?)"
                    )
                return
            rep.wakeup = env.event()
            yield rep.wakeup
            rep.wakeup = None


__all__ = ["Cluster", "Replica", "SimExecutor", "StepLog"]
