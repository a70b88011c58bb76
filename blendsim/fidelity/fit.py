"""Least-squares fit of the few named, bounded parameters, and leave-one-group-out validation.

Free parameters (``sim/engine_params.json`` layout):

* per GPU architecture present in the rows (``params["arch"]``: H100 and H200 share Hopper's): ``gemm_eff``,
  ``mem_eff``, ``attn_mem_eff`` (``blendsim.sim.efficiency``); ``moe_eff`` and ``moe_mem_eff`` (only with MoE
  rows), ``lowp_eff`` (only with rows whose weights are quantised);
* global: ``attn_eff``, ``ew_eff``, ``link_eff`` (only when a row uses tensor parallelism) and ``a2a_eff``
  (only with expert-parallel rows);
* per overlapping regime: ``kappa`` (interference);
* per engine whose profile lists them as fitted (``blendsim.sim.engines``): ``fixed_s``, ``per_seq_s``.

Residual of a row: ``log(predicted / measured)``; a weak prior (``PRIOR`` x log-distance from the preset's
value) keeps a parameter the rows barely see near its physical default. A parameter of a group no
training row exercises (the held-out hardware, in leave-one-hardware-out) takes the mean of the same
parameter on the other hardware of its regime, or stays at the preset.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from blendsim.sim.efficiency import BOUNDS
from blendsim.sim.engines import PROFILES, VERSIONS

PRIOR = 0.1
HW_PARAMS = ("gemm_eff", "mem_eff", "attn_mem_eff", "moe_eff", "moe_mem_eff", "lowp_eff")
MOE_HW_PARAMS = ("moe_eff", "moe_mem_eff")  # only for rows of MoE models
# the efficiencies are the architecture's (one die, its memory controllers and one kernel library: H100 and H200
# alike; the presets carry each part's own peaks), fitted under params["arch"][arch]
ARCH_PARAMS = HW_PARAMS
# ew_eff is global: how far engines fuse the small elementwise kernels is the engines' (and as a fraction of HBM
# bandwidth about the same on every GPU), and per GPU it trades against the weight-streaming bandwidth
GLOBAL_PARAMS = ("attn_eff", "link_eff", "ew_eff")
ENGINE_BOUNDS = {"fixed_s": (0.0, 5e-3), "per_seq_s": (0.0, 20e-6), "per_token_s": (0.0, 1e-6)}


@dataclass(frozen=True)
class Param:
    """One free parameter: where it lives in the params dict, its bounds and its prior value."""

    path: tuple  # e.g. ("hardware", hw, name), ("global", name), ("regime", regime, "*", name), ("engine", e, name)
    lo: float
    hi: float
    prior: float

    @property
    def name(self) -> str:
        return ".".join(self.path)


# NOTE: link_eff (prior 0.7, bounds 0.2-1.0) prices every link a row's traffic crosses: TP all-reduces and EP
# all-to-alls, pipeline hand-offs, and the inter-node network when a group spans nodes (one fraction for all,
# as no catalogue row measures a network apart). For scale: H100 NVLink peer-to-peer copies reach 376-380 of
# 450 GB/s per direction (0.84; NVIDIA/nccl issue #1264's p2pBandwidthLatencyTest); collectives reach less.
def preset_value(name: str, hw) -> float:
    return {"gemm_eff": hw.compute_efficiency, "mem_eff": hw.memory_efficiency,
            "attn_mem_eff": hw.memory_efficiency, "attn_eff": hw.attention_compute_efficiency,
            "link_eff": 0.7, "kappa": hw.overlap_interference, "moe_eff": MOE_PRIOR, "a2a_eff": 0.7,
            "moe_mem_eff": hw.memory_efficiency, "lowp_eff": hw.compute_efficiency,
            "ew_eff": hw.elementwise_efficiency, "launch_s": hw.kernel_launch_s}[name]


# NOTE: moe_eff's prior: DeepGEMM's README (H800, FP8) has grouped contiguous-layout GEMMs at 4-8K rows per expert at
# 1,093-1,297 TFLOP/s against 1,025-1,304 for dense GEMMs of the same N and K (about 1), and masked-layout grouped
# GEMMs falling to 815-932 TFLOP/s at 256 rows per expert; 0.85 between the two.
MOE_PRIOR = 0.85
# NOTE: lowp_eff's prior is the preset's compute efficiency: DeepGEMM's FP8 GEMMs (README, H800) reach 590-1,358 of
# 1,979 TFLOP/s at 4,096 rows (0.30-0.69 by shape), about the fraction cuBLAS's BF16 GEMMs reach of theirs.


def free_params(rows: list) -> list[Param]:
    """The parameters the given (row, pricer) pairs exercise."""
    out: dict[tuple, Param] = {}

    def add(path, name, hw):
        out.setdefault(path, Param(path, *BOUNDS[name], preset_value(name, hw)))

    for _row, pr in rows:
        prof, hw = pr.profile, pr.dep.hardware
        moe = bool(getattr(pr.dep.model, "num_experts", 0))
        quant = pr.dep.model.weight_elem_bytes != pr.dep.model.dtype_bytes
        for n in HW_PARAMS:
            # gemm_eff only where a row's weights are 16-bit: on a row with quantised weights only the LM head and
            # the router run at it, too little to identify it (it stays at the preset there)
            if (n in MOE_HW_PARAMS and not moe) or (n == "lowp_eff" and not quant) or (n == "gemm_eff" and quant):
                continue
            add(("arch", hw.arch, n) if (n in ARCH_PARAMS and hw.arch) else ("hardware", hw.name, n), n, hw)
        for n in GLOBAL_PARAMS:
            if n == "link_eff" and pr.dep.tp == 1 and pr.dep.pp == 1:  # TP collectives and PP hand-offs
                continue
            add(("global", n), n, hw)
        if moe and pr.dep.ep > 1:
            add(("global", "a2a_eff"), "a2a_eff", hw)
        if prof.mode == "overlap":
            add(("regime", prof.regime, "*", "kappa"), "kappa", hw)
        for n in prof.fitted:
            default = getattr(VERSIONS.get((prof.name, prof.version), PROFILES[prof.name]), n)
            out.setdefault(("engine", prof.name, n), Param(("engine", prof.name, n), *ENGINE_BOUNDS[n], default))
    return [out[k] for k in sorted(out)]


def set_value(params: dict, path: tuple, value: float) -> None:
    d = params
    for k in path[:-1]:
        d = d.setdefault(k, {})
    d[path[-1]] = float(value)


def get_value(params: dict, path: tuple):
    d = params
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _scale(p: Param) -> float:
    return max(p.hi - p.lo, 1e-12)


def fit(rows: list, base: dict | None = None, select=None) -> dict:
    """Fitted parameters (a params dict) for (row, pricer) pairs, starting from ``base``; with ``select`` (a
    predicate on :class:`Param`) only the parameters it keeps are free, the rest stay at ``base``."""
    from scipy.optimize import least_squares

    base = copy.deepcopy(base or {})
    rows = [(r, pr.compressed()) for r, pr in rows]
    ps = [p for p in free_params(rows) if select is None or select(p)]
    if not ps:
        return base
    measured = np.array([r.value for r, _ in rows])

    def params_of(x):
        out = copy.deepcopy(base)
        for p, v in zip(ps, x):
            set_value(out, p.path, p.lo + v * _scale(p))
        return out

    # which free parameters each row reads: a finite-difference step re-prices only the rows it touches
    reads = [[k for k, p in enumerate(ps) if _reads(pr, p)] for _r, pr in rows]
    memo: dict = {}

    def row_pred(i, x):
        key = (i, tuple(x[k] for k in reads[i]))
        if key not in memo:
            r, pr = rows[i]
            memo[key] = predict(r, pr, params_of(x))
        return memo[key]

    def residuals(x):
        pred = np.array([row_pred(i, x) for i in range(len(rows))])
        res = np.log(pred / measured)
        prior = [PRIOR * np.log((p.lo + v * _scale(p) + 1e-9) / (p.prior + 1e-9)) if p.prior > 0 else PRIOR * v
                 for p, v in zip(ps, x)]
        return np.concatenate([res, prior])

    x0 = []
    for p in ps:
        v = get_value(base, p.path)
        v = p.prior if v is None else v
        x0.append(np.clip((v - p.lo) / _scale(p), 0.0, 1.0))
    sol = least_squares(residuals, np.array(x0), bounds=(0.0, 1.0), method="trf", x_scale=1.0,
                        diff_step=1e-3, max_nfev=60 * (len(ps) + 1))
    out = params_of(sol.x)
    out["bounds"] = {p.name: [p.lo, p.hi] for p in ps}
    return out


def _reads(pr, p: Param) -> bool:
    """Whether the row priced by ``pr`` depends on parameter ``p``."""
    kind = p.path[0]
    if kind == "hardware":
        return p.path[1] == pr.dep.hardware.name
    if kind == "arch":
        return p.path[1] == pr.dep.hardware.arch
    if kind == "engine":
        return p.path[1] == pr.profile.name
    if kind == "regime":
        return p.path[1] == pr.profile.regime and p.path[2] in ("*", pr.dep.hardware.name)
    return True


def predict(row, pricer, params: dict) -> float:
    """The row's metric under ``params``."""
    ms = pricer.makespan(params)
    s = pricer.sched
    if row.metric == "output_tok_s":
        v = s.output_tokens / ms
    elif row.metric == "total_tok_s":
        v = (s.input_tokens + s.output_tokens) / ms
    else:
        v = s.requests / ms
    return v / row.gpus if row.scope == "per_gpu" else v


def transfer(params: dict, rows: list) -> dict:
    """Give hardware without training rows the mean of the fitted hardware's efficiencies."""
    out = copy.deepcopy(params)
    hws = out.setdefault("hardware", {})
    known = [v for v in hws.values() if isinstance(v, dict)]
    for _row, pr in rows:
        hw = pr.dep.hardware.name
        if hw not in hws and known:
            hws[hw] = {n: float(np.mean([k[n] for k in known if n in k])) for n in HW_PARAMS
                       if any(n in k for k in known)}
    return out


def cross_validate(rows: list, key, base: dict | None = None) -> dict:
    """Leave-one-group-out predictions: ``{row id: predicted}``; ``key(row)`` names the group."""
    groups = sorted({key(r) for r, _ in rows})
    pred = {}
    for g in groups:
        train = [(r, p) for r, p in rows if key(r) != g]
        test = [(r, p) for r, p in rows if key(r) == g]
        if not train:
            continue
        prm = transfer(fit(train, base), test)
        for r, p in test:
            pred[r.id] = predict(r, p, prm)
    return pred


__all__ = ["HW_PARAMS", "Param", "cross_validate", "fit", "free_params", "predict", "transfer"]
