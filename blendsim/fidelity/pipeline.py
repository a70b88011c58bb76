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

from blendsim.sim.cost import combine_times
from blendsim.sim.efficiency import Efficiency

from .price import RowPricer
from .runner import RowSchedule


class PipelineRowPricer:
    """Makespan of one recorded pipelined row as a function of the fitted parameters."""

    def __init__(self, sched: RowSchedule, dep, profile, params: dict):
        self.sched = sched
        self.dep = dep
        self.profile = profile
        self.stages = [RowPricer(sched, dep.at_stage(i), profile) for i in range(dep.pp)]
        self.active = [np.maximum(rep["active"], 1.0) for rep in sched.replicas]
        self.tokens = [rep["num_tokens"] for rep in sched.replicas]
        self.scale = 1.0
        self.scale = sched.makespan_s / self.makespan(params) if sched.makespan_s > 0 else 1.0

    def compressed(self) -> PipelineRowPricer:
        return self  # the batches' pipe fill would be lost in merged steps

    def _times(self, params: dict):
        """Per replica: weights, per-stage step seconds and hand-off seconds of every recorded batch."""
        prof = self.profile
        eff = Efficiency.lookup(params, prof.regime, self.dep.hardware.name)
        kappa = self.dep.hardware.overlap_interference if eff.kappa is None else eff.kappa
        link = eff.link_eff if eff.link_eff is not None else 1.0
        per_stage = []
        for i, st in enumerate(self.stages):
            rows = []
            for c in st.components(params):
                t = combine_times(prof.mode, kappa, c["compute"], c["memory"], c["other"], c["comm"])
                rows.append(t + (c["overhead"] if i == 0 else 0.0))
            per_stage.append(rows)
        out = []
        for r, rep in enumerate(self.sched.replicas):
            hand = 0.0 * self.tokens[r]
            for j in range(self.dep.pp - 1):
                bw, lat = self.dep.pp_link(j)
                hand = hand + lat + self.dep.pp_bytes(self.tokens[r]) / (bw * link)
            out.append((rep["weight"], [per_stage[i][r] for i in range(self.dep.pp)], hand))
        return out

    def makespan(self, params: dict) -> float:
        best = 0.0
        for (w, st, hand), a in zip(self._times(params), self.active):
            cycle = sum(st) + hand
            slow = np.max(np.stack(st), axis=0)
            per = np.maximum(slow, cycle / a)
            fill = float(cycle[0] - per[0]) if len(per) else 0.0
            best = max(best, float(np.dot(w, per)) + fill)
        return best * self.scale

    def bound(self, params: dict) -> dict:
        """Share of the makespan by what bounds the stages' steps (all stages together)."""
        tot = {k: 0.0 for k in ("compute", "memory", "other", "comm", "overhead")}
        for st in self.stages:
            for k, v in st.bound(params).items():
                tot[k] += v / len(self.stages)
        return tot


__all__ = ["PipelineRowPricer"]
