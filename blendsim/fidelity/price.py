"""Price a recorded schedule under parameters theta, and say which resource bounds it.

:class:`RowPricer` keeps a row's per-step operator counts (they do not depend on theta) and returns
the makespan for a parameters dict (``sim/engine_params.json``'s layout) in a few vectorised numpy
passes, which is what makes least squares over the whole catalogue cheap.
"""

from __future__ import annotations

import numpy as np

from blendsim.sim.batch import FEATURE_FIELDS as FIELDS
from blendsim.sim.batch import BatchFeatures
from blendsim.sim.build_cost import engine_timer
from blendsim.sim.cost import PARTS, combine_times, net_share, price_parts
from blendsim.sim.efficiency import Efficiency
from blendsim.sim.engines import graph_pad
from blendsim.sim.ops import Shapes, op_counts


class RowPricer:
    """Makespan of one recorded row as a function of the fitted parameters."""

    def __init__(self, sched, dep, profile, compress: bool = False):
        self.sched = sched
        self.dep = dep
        self.profile = profile
        self.layers = dep.model.num_layers
        self.shapes = shapes = Shapes.of(dep)
        self.parts = []
        for rep in sched.replicas:
            f = {k: rep[k].copy() for k in FIELDS}
            f["tokens0"] = f["num_tokens"].copy()  # unpadded: the per-token engine overhead
            f["logits0"] = f["num_logits"].copy()  # unpadded: the tokens an API server streams (server_s)
            sizes = profile.graph_sizes_for(dep)
            if sizes:  # decode-only steps run at the captured batch size
                dec = f["num_prefill_seqs"] == 0
                pad = graph_pad(f["num_decode"].astype(np.int64), sizes)
                f["num_tokens"] = np.where(dec, pad, f["num_tokens"])
                f["num_logits"] = np.where(dec, pad, f["num_logits"])
            w = rep["weight"]
            if compress:
                w, f = _compress(w, f)
            tok0, logits0 = f.pop("tokens0"), f.pop("logits0")
            feat = BatchFeatures(**f)
            counts = op_counts(shapes, feat)
            self.parts.append((w, feat, counts, tok0, logits0))

    def compressed(self) -> RowPricer:
        """A cheaper pricer of the same schedule for fitting (steps within 1% merged; see _compress)."""
        if getattr(self, "_compressed", None) is None:
            self._compressed = RowPricer(self.sched, self.dep, self.profile, compress=True)
        return self._compressed

    def components(self, params: dict) -> list[dict]:
        """Per replica: weights and per-step compute, memory, other, comm and overhead seconds."""
        prof = self.profile.with_params(self.profile.fitted_overhead(params))
        eff = Efficiency.lookup(params, prof.regime, self.dep.hardware.name)
        timer = engine_timer(self.dep, eff, prof)
        out = []
        for w, f, counts, tok0, logits0 in self.parts:
            acc = price_parts(timer, self.shapes, f, counts)
            ovh = prof.overhead(f.num_prefill_seqs + f.num_decode, tok0)
            out.append({"weight": w, **{k: np.asarray(acc[k], dtype=float) + 0 * w for k in PARTS},
                        "overhead": ovh + 0 * w, "server": prof.server_s(logits0, f.num_decode) + 0 * w})
        return out

    def step_times(self, params: dict) -> list:
        prof = self.profile
        eff = Efficiency.lookup(params, prof.regime, self.dep.hardware.name)
        kappa = self.dep.hardware.overlap_interference if eff.kappa is None else eff.kappa
        net = net_share(self.dep.hardware, kappa)
        res = []
        for c in self.components(params):
            t = combine_times(prof.mode, kappa, c["compute"], c["memory"], c["other"], c["comm"], net)
            res.append((c["weight"], np.maximum(t + c["overhead"], c["server"])))
        return res

    def makespan(self, params: dict) -> float:
        return max(float(np.dot(w, t)) for w, t in self.step_times(params))

    def bound(self, params: dict) -> dict:
        """Share of the makespan by what bounds each step: compute, memory, overhead or comm, or the API server where
        its own work outlasts the engine's step (``EngineProfile.server_s``)."""
        c = max(self.components(params), key=lambda c: float(np.dot(c["weight"], c["compute"] + c["memory"])))
        keys = ("compute", "memory", "other", "comm", "overhead")
        paced = c["server"] > sum(c[k] for k in keys)  # steps the server sets (against the parts' sum, as below)
        w = c["weight"] * ~paced
        tot = {k: float(np.dot(w, c[k])) for k in keys}
        tot["server"] = float(np.dot(c["weight"] * paced, c["server"]))
        s = sum(tot.values()) or 1.0
        return {k: v / s for k, v in tot.items()}


def _compress(w, f: dict):
    """Merge steps whose token, sequence and decode counts agree within 1% into one entry at their weighted
    mean features: exact where the step time is linear in them (attention, bandwidth-bound GEMMs), within
    a fraction of a percent elsewhere. Used for fitting only; reported predictions price every step."""
    names = ("num_tokens", "num_prefill_tokens", "num_prefill_seqs", "num_decode", "num_logits")
    # counts within 1% of each other share a bin (the fit needs ~0.5% accuracy, not exactness)
    keys = np.stack([np.round(np.log1p(f[k]) * 100) for k in names], axis=1)
    _, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.ravel()
    W = np.bincount(inv, weights=w)
    out = {k: np.bincount(inv, weights=w * f[k]) / W for k in (*FIELDS, "tokens0", "logits0")}
    for k in ("num_prefill_seqs",):
        out[k] = np.round(out[k])
    return W, out


__all__ = ["RowPricer"]
