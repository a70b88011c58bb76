"""Pricing a step of a pipeline-parallel replica: one time per stage and one per hand-off between stages.

Each stage is priced by its own cost model, built by the run's cost-model factory from the stage's view of the
deployment (``Deployment.at_stage``: its layers, the embedding on the first stage, the LM head on the last).
The engine overhead of a step (CPU scheduling and sampling, ``EngineProfile.overhead``) is paid once, on the
first stage; an API server beside the engine (``EngineProfile.server_s``) paces the batches entering the pipe. A
hand-off sends each GPU's slice of the hidden states and residual to the next stage (``Deployment.pp_bytes``)
over the link between them (``Deployment.pp_link``: the scale-up link inside a node, the network between nodes),
priced as one latency plus bytes over bandwidth.

The replica's engine loop (``sim.engine.PipelinedReplica``) chains these times through the stages.
"""

from __future__ import annotations

import numpy as np

from blendsim.sim.batch import prefill_sums


class StagePricer:
    """``run(batch) -> (stage seconds, hand-off seconds, compute s, memory s)`` of a ``pp``-stage replica."""

    def __init__(self, dep, cost_model_of):
        from dataclasses import replace

        self.dep = dep
        self.stages = dep.pp
        self.models = [cost_model_of(dep.at_stage(i)) for i in range(dep.pp)]
        # an API server beside the engine paces the replica, not a stage: a batch enters the pipe no sooner than the
        # server has done the previous batch's work (sim.engine.PipelinedReplica's gate; server_s below)
        self.engine = self.models[0].engine
        no_server = dict(server_token_s=0.0, server_request_s=0.0)
        for i, cm in enumerate(self.models):  # the step's engine overhead is paid once, on the first stage
            loop = {} if i == 0 else dict(fixed_s=0.0, per_seq_s=0.0, per_token_s=0.0)
            cm.set_engine(replace(cm.engine, **loop, **no_server))
        self.links = [dep.pp_link(i) for i in range(dep.pp - 1)]
        self._per_token = [2 * dep.model.hidden_size * dep.model.dtype_bytes / dep.tp / bw for bw, _ in self.links]
        self.last = (0.0, 0.0)

    def server_s(self, num_logits, num_decode):
        """The API server's work for a batch (``EngineProfile.server_s``): the least time between two batches entering
        the pipe; 0 without a server stage."""
        return self.engine.server_s(num_logits, num_decode)

    def handoffs(self, tokens: int) -> list[float]:
        """Seconds of each stage-to-stage transfer for a step of ``tokens`` tokens."""
        return [lat + tokens * pt for (_, lat), pt in zip(self.links, self._per_token)]

    def run(self, batch):
        tp, pairs, pkv = prefill_sums(batch.prefill)
        D = batch.num_decode
        T = tp + D
        times = []
        comp = mem = 0.0
        for cm in self.models:
            t, c, m = cm.step(T, tp, len(batch.prefill), pairs, pkv, D, batch.decode_ctx_sum, batch.num_logits,
                              batch.prefill)
            times.append(t)
            comp += c
            mem += m
        self.last = (comp, mem)
        return times, self.handoffs(T), comp, mem

    def run_decodes(self, D: int, ctx_sums: np.ndarray):
        """Per stage, the seconds of a run of pure-decode steps; the hand-offs; compute and memory seconds."""
        times, comp, mem = [], 0.0, 0.0
        for cm in self.models:
            t, c, m = cm.decode_many(D, ctx_sums)
            times.append(np.asarray(t, dtype=float) + 0 * ctx_sums)
            comp = comp + c
            mem = mem + m
        return times, self.handoffs(D), comp + 0 * ctx_sums, mem + 0 * ctx_sums


__all__ = ["StagePricer"]
