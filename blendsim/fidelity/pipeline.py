"""Price a recorded pipeline-parallel row under parameters theta.

A pipelined replica's makespan is not the sum of its steps: batches of several virtual engines overlap in the
stages. Per recorded batch k, with ``a_k`` virtual engines holding work when it started (how full the pipe
was), stage times ``t_{s,k}`` and hand-offs ``x_k``, a batch adds to the replica's time

    max(max_s t_{s,k}, (sum_s t_{s,k} + sum x_k) / a_k)

-- the slowest stage when the pipe is full enough to hide the rest, else its share of one virtual engine's
cycle -- plus, once, the first batch's cycle beyond that (the pipe filling). The engine's recurrence
(``sim.engine.PipelinedReplica``) gives exactly this for batches that repeat (tests/test_pipeline.py's cases);
for mixed batches it is an approximation, so the pricer scales it by the ratio of the simulated makespan to the
formula at the parameters the row was simulated with: exact there, the formula's sensitivity elsewhere.

Stage times come from a :class:`~blendsim.fidelity.price.RowPricer` per stage (the stage's layers, embedding or
LM head; the engine overhead on the first stage only); hand-offs use ``link_eff`` like the TP collectives.
"""

from __future__ import annotations

import numpy as np

from blendsim.sim.cost import combine_times, net_share
from blendsim.sim.efficiency import Efficiency

from .price import RowPricer
from .runner import RowSchedule


class PipelineRowPricer:
    """Makespan of one recorded pipelined row as a function of the fitted parameters. Its replicas' batches are
    priced end to end in one pass per stage (``replica_times``), so that fitting can stack several rows of one
    deployment into one pricer."""

    def __init__(self, sched: RowSchedule, dep, profile, params: dict):
        from dataclasses import replace

        self.sched = sched
        self.dep = dep
        self.profile = profile
        reps = sched.replicas
        self.lengths = np.array([len(rep["weight"]) for rep in reps], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        cat = {k: np.concatenate([rep[k] for rep in reps]) for k in reps[0]} if reps else {}
        one = replace(sched, replicas=[cat] if cat else [])
        self.stages = [RowPricer(one, dep.at_stage(i), profile) for i in range(dep.pp)]
        self.weight = cat.get("weight", np.zeros(0))
        self.active = np.maximum(cat.get("active", np.zeros(0)), 1.0)
        self.tokens = cat.get("num_tokens", np.zeros(0))
        self.params = params  # those the row was simulated with (the scale is exact there)
        self.scale = 1.0
        self.scale = sched.makespan_s / self.makespan(params) if sched.makespan_s > 0 else 1.0

    def compressed(self) -> PipelineRowPricer:
        """A cheaper pricer of the same schedule for fitting: batches whose features agree within 1% and that
        found the pipe equally full merged into one weighted entry (the first batch, whose cycle fills the
        pipe, kept on its own); scaled, like this one, to the simulated makespan."""
        if getattr(self, "_compressed", None) is None:
            from dataclasses import replace

            sizes = self.profile.graph_sizes_for(self.dep)
            reps = [_compress_batches(rep, sizes) for rep in self.sched.replicas]
            self._compressed = PipelineRowPricer(replace(self.sched, replicas=reps), self.dep, self.profile,
                                                 self.params)
        return self._compressed

    def _times(self, params: dict):
        """Per-stage step seconds and hand-off seconds of every recorded batch (all replicas end to end)."""
        prof = self.profile
        eff = Efficiency.lookup(params, prof.regime, self.dep.hardware.name)
        kappa = self.dep.hardware.overlap_interference if eff.kappa is None else eff.kappa
        link = eff.link_eff if eff.link_eff is not None else 1.0
        net = net_share(self.dep.hardware, kappa)
        per_stage = []
        server = 0.0 * self.tokens
        for i, st in enumerate(self.stages):
            t = 0.0 * self.tokens
            for c in st.components(params):  # one part: the replicas end to end
                t = combine_times(prof.mode, kappa, c["compute"], c["memory"], c["other"], c["comm"], net)
                if i == 0:  # the step's engine overhead, on the first stage
                    t = t + c["overhead"]
                    server = c["server"]
            per_stage.append(t)
        hand = 0.0 * self.tokens
        for j in range(self.dep.pp - 1):
            bw, lat = self.dep.pp_link(j)
            hand = hand + lat + self.dep.pp_bytes(self.tokens) / (bw * link)
        return per_stage, hand, server

    def replica_times(self, params: dict) -> np.ndarray:
        """Per replica, unscaled: its batches' times plus, once, its first batch's cycle beyond that; an API server
        beside the engine (``EngineProfile.server_s``) makes a batch last at least its work (the engine's gate)."""
        st, hand, server = self._times(params)
        out = np.zeros(len(self.lengths))
        ne = self.lengths > 0
        if ne.any():
            cycle = sum(st) + hand
            per = np.maximum(np.maximum(np.max(np.stack(st), axis=0), cycle / self.active), server)
            first = self.starts[ne]
            out[ne] = np.add.reduceat(self.weight * per, first) + (cycle - per)[first]
        return out

    def makespan(self, params: dict) -> float:
        return max(0.0, float(np.max(self.replica_times(params), initial=0.0))) * self.scale

    def bound(self, params: dict) -> dict:
        """Share of the makespan by what bounds the stages' steps (all stages and replicas together)."""
        tot = {k: 0.0 for k in ("compute", "memory", "other", "comm", "overhead", "server")}
        for st in self.stages:
            for k, v in st.bound(params).items():
                tot[k] += v / len(self.stages)
        return tot  # a server stage is on every stage's components: its share is the replica's


def _compress_batches(rep: dict, graph_sizes: tuple) -> dict:
    """One replica's recorded batches with those in the same bin merged at their weighted mean features. A bin:
    token, sequence and decode counts each within 1% (as ``price._compress``), the same number of active
    virtual engines, the same CUDA-graph batch size for decode-only batches; the first batch is its own bin."""
    from blendsim.sim.engines import graph_pad

    from .runner import FIELDS

    n = len(rep["weight"])
    cols = [(np.arange(n) > 0).astype(float), rep["active"]]
    cols += [np.round(np.log1p(rep[k]) * 100) for k in ("num_tokens", "num_prefill_tokens", "num_prefill_seqs",
                                                          "num_decode", "num_logits")]
    if graph_sizes:
        dec = rep["num_prefill_seqs"] == 0
        cols.append(np.where(dec, graph_pad(rep["num_decode"].astype(np.int64), graph_sizes), -1))
    _, inv = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
    inv = inv.ravel()
    w = rep["weight"]
    W = np.bincount(inv, weights=w)
    out = {k: np.bincount(inv, weights=w * rep[k]) / W for k in (*FIELDS, "active")}
    out["num_prefill_seqs"] = np.round(out["num_prefill_seqs"])
    out["weight"] = W
    return out


__all__ = ["PipelineRowPricer"]
