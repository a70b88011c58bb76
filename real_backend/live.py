"""Run a policy live on the device: the engine's replicas step with :class:`TorchExecutor` instead of
``SimExecutor``, so every step's time is measured, and the next step is formed at the measured clock.

This wires the same pieces ``blendsim.runner.run_simulation`` wires (policy, prefix tree, KV cache, scheduler,
router, simpy cluster), with the scheduler recording its events so each replica's executor mirrors its
KV cache live. It is meant for small runs (tests, spot checks); ``blendsim validate`` replays a
simulated schedule instead, which compares predicted and measured times step by step.
"""

from __future__ import annotations

from dataclasses import dataclass

from blendsim.real_backend.executor import DeviceRuntime, TorchExecutor


@dataclass
class LiveRun:
    """What a live run leaves: per replica its step log, scheduler and executor."""

    replicas: list  # sim.engine.Replica (log: measured dt_s per step)
    makespan_s: float


def run_live(run, num_replicas: int, runtime: DeviceRuntime, *, repeats: int = 1, on_step=None) -> LiveRun:
    """Run a prepared run (``blendsim.runner.prepare_run``'s result) on ``num_replicas`` replicas with
    measured step times.

    ``on_step(replica, batch, t_end)`` is called after every step (e.g. to check invariants).
    """
    from blendsim.sim.engine import Cluster, Replica
    from blendsim.sim.errors import UserError
    from blendsim.sim.kv import KVCache
    from blendsim.sim.seq import RequestRecords

    trace, eng, dep, tree, blocks, policy = (run.trace, run.engine, run.deployment, run.tree, run.num_blocks,
                                             run.policy)
    if run.tiers is not None:
        raise UserError("host/disk KV tiers (--host-kv-gb, --disk-kv-gb) are simulated only: the live device "
                        "runs its GPU cache alone")
    if dep.model != runtime.spec:
        raise UserError(f"the runtime holds {runtime.spec.name}/{runtime.spec.dtype}, the run asks for "
                        f"{dep.model.name}/{dep.model.dtype}")
    B = eng.block_size
    rec = RequestRecords(trace.n)
    replicas = []
    for i in range(num_replicas):
        kv = KVCache(tree, blocks, B, eng.prefix_caching, retain=eng.prefix_retain)
        sched = policy.make_scheduler(i, kv=kv, cfg=eng, prompt_len=trace.input_len.tolist(),
                                      output_len=trace.output_len.tolist(), records=rec, record=True,
                                      output_hint=trace.output_len_hint.tolist())
        ex = TorchExecutor(runtime, trace, tree, B, blocks, events=sched.events, repeats=repeats)
        replicas.append(Replica(i, sched, ex, fast_forward=False, on_step=on_step))
    cluster = Cluster(replicas, policy.make_router(replicas), trace.arrival_s, run.route_order)
    return LiveRun(replicas, cluster.run())


__all__ = ["LiveRun", "run_live"]
