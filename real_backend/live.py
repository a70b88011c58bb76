"""Run a policy live on the device: the engine's replicas step with :class:`TorchExecutor` instead of
``SimExecutor``, so every step's time is measured, and the next step is formed at the measured clock.

This wires the same pieces ``sim.runner.run_simulation`` wires (policy, prefix tree, KV cache, scheduler,
router, simpy cluster), with the scheduler recording its events so each replica's executor mirrors its
KV cache live. It is meant for small runs (tests, spot checks); ``blendsim validate`` replays a
simulated schedule instead, which compares predicted and measured times step by step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from real_backend.executor import DeviceRuntime, TorchExecutor


@dataclass
class LiveRun:
    """What a live run leaves: per replica its step log, scheduler and executor."""

    replicas: list  # sim.engine.Replica (log: measured dt_s per step)
    makespan_s: float


def run_live(trace, cfg, runtime: DeviceRuntime, *, repeats: int = 1, on_step=None) -> LiveRun:
    """Run ``trace`` under ``cfg`` (a ``sim.runner.RunConfig``) with measured step times.

    ``on_step(replica, batch, t_end)`` is called after every step (e.g. to check invariants).
    """
    from policies.base import PolicyContext, get_policy
    from sim.cost import build_cost_model
    from sim.deployment import Deployment
    from sim.engine import Cluster, Replica
    from sim.errors import UserError
    from sim.hardware import get_hardware
    from sim.kv import KVCache
    from sim.models import get_model
    from sim.prefix_tree import PrefixTree
    from sim.runner import engine_config
    from sim.seq import RequestRecords

    if cfg.offline:
        trace = trace.offline()
    policy_cls = get_policy(cfg.policy)
    eng = engine_config(cfg, policy_cls)
    dep = Deployment(get_model(cfg.model, cfg.dtype), get_hardware(cfg.hardware), cfg.tp,
                     gpu_memory_utilization=eng.gpu_memory_utilization, max_batched_tokens=eng.token_budget,
                     max_seqs=eng.max_seqs or 1024, kv_capacity_override=cfg.kv_capacity_override)
    if dep.model != runtime.spec:
        raise UserError(f"the runtime holds {runtime.spec.name}/{runtime.spec.dtype}, the run asks for "
                        f"{dep.model.name}/{dep.model.dtype}")
    cm = build_cost_model(dep, cfg.mode, cfg.engine or policy_cls.default_engine, cfg.profile)
    tree = PrefixTree(trace)
    B = eng.block_size
    blocks = dep.num_blocks(B)
    need = -(-(trace.input_len + trace.output_len) // B)
    if need.max() > blocks:
        raise UserError(f"a request needs {int(need.max())} KV blocks, a replica holds {blocks}")
    ctx = PolicyContext(trace=trace, tree=tree, deployment=dep, cost_model=cm, engine=eng, replicas=cfg.replicas,
                        seed=cfg.seed, options=dict(cfg.options), num_blocks=blocks)
    policy = policy_cls(ctx)
    policy.prepare()
    policy._finalize()
    rec = RequestRecords(trace.n)
    replicas = []
    for i in range(cfg.replicas):
        kv = KVCache(tree, blocks, B, eng.prefix_caching)
        sched = policy.make_scheduler(i, kv=kv, cfg=eng, prompt_len=trace.input_len.tolist(),
                                      output_len=trace.output_len.tolist(), records=rec, record=True,
                                      output_hint=trace.output_len_hint.tolist())
        ex = TorchExecutor(runtime, trace, tree, B, blocks, events=sched.events, repeats=repeats)
        replicas.append(Replica(i, sched, ex, fast_forward=False, on_step=on_step))
    cluster = Cluster(replicas, policy.make_router(replicas), trace.arrival_s,
                      np.lexsort((policy._rank, trace.arrival_s)))
    return LiveRun(replicas, cluster.run())


__all__ = ["LiveRun", "run_live"]
