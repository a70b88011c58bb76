"""Robust least-squares fit of the few named, bounded parameters, and leave-one-group-out validation.

Free parameters (``sim/engine_params.json`` layout):

* per GPU architecture present in the rows (``params["arch"]``: H100 and H200 share Hopper's): ``gemm_eff``,
  ``mem_eff``, ``attn_mem_eff`` (``blendsim.sim.efficiency``); ``moe_eff`` and ``moe_mem_eff`` (only with MoE
  rows), ``lowp_eff`` (only with rows whose weights are quantised);
* global: ``attn_eff``, ``ew_eff``, ``link_eff`` (only when a row uses tensor parallelism) and ``a2a_eff``
  (only with expert-parallel rows);
* per overlapping regime: ``kappa`` (interference);
* per engine version whose profile lists them as fitted (``blendsim.sim.engines``): ``fixed_s``, ``per_seq_s``,
  under the profile's ``overhead_key`` (``params["engine"]["vllm@0.6"]``; TensorRT-LLM's versions share
  ``trtllm``); and, with rows run behind a server that works beside the engine, ``server_token_s`` and
  ``server_request_s`` under its ``server_key``, named there without the prefix
  (``params["engine"]["trtllm@0.8:server"]["token_s"]``).

Residual of a row: ``log(predicted / measured)``, under a robust loss (:data:`LOSS`); a weak prior (``PRIOR`` x
log-distance from the preset's value) keeps a parameter the rows barely see near its physical default. A parameter
no training row exercises (an architecture held out in leave-one-hardware-out) stays at the preset (:func:`transfer`).

Cross-validation (:func:`cross_validate`) is honest by construction: each fold's fit starts from the presets
(``base={}``: not from the shipped parameters, not from a fit on all rows) and its residuals hold only the
other groups' rows (tests/test_fidelity_fast_cv.py changes a held-out group's measurements and checks that
its predictions stay bit-identical). What makes a fold cheap is only what does not depend on the
measurements: each row is simulated once, its compressed pricer is built once and reused by every fold,
rows of one deployment and engine profile are priced together in one pass (:class:`_Stack`,
:class:`_PipeStack`), and a finite-difference step re-prices only the rows that read the stepped parameter.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from blendsim.sim.efficiency import BOUNDS, measured, runs_at_lowp_eff
from blendsim.sim.engines import PROFILES, VERSIONS

PRIOR = 0.1
HW_PARAMS = ("gemm_eff", "mem_eff", "attn_mem_eff", "moe_eff", "moe_mem_eff", "lowp_eff")
MOE_HW_PARAMS = ("moe_eff", "moe_mem_eff")  # only for rows of MoE models
# the efficiencies are the architecture's (one die, its memory controllers and one kernel library: H100 and H200
# alike; the presets carry each part's own peaks), fitted under params["arch"][arch]
# ew_eff is global: how far engines fuse the small elementwise kernels is the engines' (and as a fraction of HBM
# bandwidth about the same on every GPU), and per GPU it trades against the weight-streaming bandwidth
GLOBAL_PARAMS = ("attn_eff", "link_eff", "ew_eff")
# a step's CPU loop; an upper bound below five times the profile's prior is raised to that, so a slow Python loop
# can be fitted as well as a fast one: the priors of the Python loops come from one published time split taken
# at an assumed batch (sim.engines _V0_LOOP: vLLM 0.5's 36 us per sequence), and the per-step work of the same
# code differs severalfold between hosts (CPU clock, Python version)
ENGINE_BOUNDS = {"fixed_s": (0.0, 5e-3), "per_seq_s": (0.0, 20e-6), "per_token_s": (0.0, 1e-6)}
LOOP_HEADROOM = 5.0
# an API server's own work beside the engine (EngineProfile.server_s): up to 1 ms per streamed token (a server
# capped at 1,000 tokens a second) and 50 ms per request
SERVER_BOUNDS = {"server_token_s": (0.0, 1e-3), "server_request_s": (0.0, 50e-3)}
SERVER_AT_BOUND = (f"a server stage's upper bound is the most blendsim lets an API server's own work cost "
                   f"({SERVER_BOUNDS['server_token_s'][1] * 1e3:g} ms per streamed token, "
                   f"{SERVER_BOUNDS['server_request_s'][1] * 1e3:g} ms per request), not a measurement: a stage there "
                   f"takes on what the model misses on that engine's served rows")
# what a fitted engine loop at its upper bound means (``fidelity --params``; README "Parameters at a bound")
LOOP_AT_BOUND = (f"an engine loop's upper bound is the most blendsim lets that loop cost "
                 f"({ENGINE_BOUNDS['fixed_s'][1] * 1e3:g} ms fixed, {ENGINE_BOUNDS['per_seq_s'][1] * 1e6:g} us per "
                 f"sequence, or {LOOP_HEADROOM:g} times its prior where that is more), not a measurement: a loop "
                 f"there takes on what the model misses on that engine's rows")


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


def at_bound(value: float, bounds, rel: float = 1e-3) -> str | None:
    """``"lower"`` / ``"upper"`` when ``value`` sits within ``rel`` of its bounds' span of one end, else None."""
    if not bounds:
        return None
    lo, hi = bounds
    tol = rel * max(hi - lo, 1e-12)
    return "lower" if value <= lo + tol else "upper" if value >= hi - tol else None


def free_params(rows: list) -> list[Param]:
    """The parameters the given (row, pricer) pairs exercise."""
    out: dict[tuple, Param] = {}

    def add(path, name, hw):
        # an architecture's parameter that a lent GPU or a published kernel benchmark measured takes the measured
        # range and centre (sim.efficiency MEASURED, PUBLISHED)
        m = (measured(path[1], name) if path[0] == "arch" else
             measured(path[2], name) if path[0] == "regime" and path[2] != "*" else None)
        out.setdefault(path, Param(path, *m) if m else Param(path, *BOUNDS[name], preset_value(name, hw)))

    for _row, pr in rows:
        prof, hw = pr.profile, pr.dep.hardware
        moe = bool(getattr(pr.dep.model, "num_experts", 0))
        m = pr.dep.model
        # a row exercises lowp_eff only where its quantised GEMMs run the kernels lowp_eff describes (a weight-only
        # format on a GPU with FP8/FP4 tensor cores runs at gemm_eff: sim.efficiency.runs_at_lowp_eff)
        quant = (runs_at_lowp_eff(hw, m.weights, m.weight_elem_bytes != m.dtype_bytes)
                 or (moe and runs_at_lowp_eff(hw, m.expert_precision, m.expert_elem_bytes != m.dtype_bytes)))
        for n in HW_PARAMS:
            # gemm_eff only where a row's weights are 16-bit: on a row with quantised weights only the LM head and
            # the router run at it, too little to identify it (it stays at the preset there)
            if (n in MOE_HW_PARAMS and not moe) or (n == "lowp_eff" and not quant) or (n == "gemm_eff" and quant):
                continue
            if n in MOE_HW_PARAMS and hw.arch:
                # the routed experts' grouped GEMM is the engine's own kernel (vLLM's and SGLang's fused Triton MoE,
                # TensorRT-LLM's CUTLASS grouped GEMM): its efficiencies per regime and architecture
                add(("regime", prof.regime, hw.arch, n), n, hw)
                continue
            add(("arch", hw.arch, n) if hw.arch else ("hardware", hw.name, n), n, hw)
        for n in GLOBAL_PARAMS:
            if n == "link_eff" and pr.dep.tp == 1 and pr.dep.pp == 1:  # TP collectives and PP hand-offs
                continue
            add(("global", n), n, hw)
        if moe and pr.dep.ep > 1:
            add(("global", "a2a_eff"), "a2a_eff", hw)
        if prof.mode == "overlap":
            add(("regime", prof.regime, "*", "kappa"), "kappa", hw)
        # an offline row frees the loop only where the profile fits it offline (EngineProfile.fit_offline)
        for n in (prof.fitted if prof.fit_offline or (prof.serve and prof.served_loop) else ()):
            default = getattr(VERSIONS.get((prof.name, prof.version), PROFILES[prof.name]), n)
            key = ("engine", prof.overhead_key, n)
            lo, hi = ENGINE_BOUNDS[n]
            out.setdefault(key, Param(key, lo, max(hi, LOOP_HEADROOM * default), default))
        for n in (prof.server_fitted if prof.serve else ()):  # a server stage beside the engine: its served rows
            key = ("engine", prof.server_key, n.removeprefix("server_"))  # engine.trtllm@0.8:server.token_s
            out.setdefault(key, Param(key, *SERVER_BOUNDS[n], getattr(VERSIONS[(prof.name, prof.version)], n)))
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


# Least-squares tolerance: the fit stops once an iteration lowers the cost (the summed loss of the log
# errors) by less than FTOL of itself. Measured on the 373 runnable rows of the training file + shipped
# catalogue (fit from the presets): at 1e-5 the in-sample predictions are within 0.09% of those at scipy's
# default 1e-8, in 15 iterations instead of 33.
FTOL = 1e-5

# Robust loss: each squared log error r^2 is replaced by 2 F_SCALE^2 (sqrt(1 + (r / F_SCALE)^2) - 1) (scipy's
# soft_l1): quadratic within ~10% of a row's measurement, linear beyond. Published runs include some that no
# modelled mechanism explains (e.g. TensorRT-LLM r24.06 on Llama-3.1-405B, 2-3x below the engine's other runs,
# which its source puts down to the image predating 405B optimisations); under plain least squares a few such rows
# move shared parameters (link_eff, ew_eff, MoE efficiencies) away from the bulk of the rows. Measured on the 596
# runnable rows of the shipped catalogues: in-sample median |error| 10.0% -> 8.5%, parameters at a bound 12 -> 9.
LOSS, F_SCALE = "soft_l1", 0.1


def fit(rows: list, base: dict | None = None, select=None, ftol: float = FTOL, loss: str = LOSS) -> dict:
    """Fitted parameters (a params dict) for (row, pricer) pairs, starting from ``base`` (a parameter ``base``
    lacks starts at its preset); with ``select`` (a predicate on :class:`Param`) only the parameters it keeps
    are free, the rest stay at ``base``. ``loss`` is scipy's name for the loss on the log errors (:data:`LOSS`;
    ``"linear"`` is plain least squares).

    Only ``rows`` are read: their compressed pricers (cached on the pricers, so cross-validation's folds
    compress each row once), rows of one deployment and engine profile priced together as one stacked
    schedule (:class:`_Stack`), and a finite-difference step re-pricing only the stacks whose rows read the
    stepped parameter."""
    from scipy.optimize import least_squares

    base = copy.deepcopy(base or {})
    rows = [(r, pr.compressed()) for r, pr in rows]
    ps = [p for p in free_params(rows) if select is None or select(p)]
    if not ps:
        return base
    measured = np.array([r.value for r, _ in rows])
    units = _units(rows, base)
    # which free parameters each unit's rows read: a finite-difference step re-prices only the units it touches
    reads = [[k for k, p in enumerate(ps) if _reads(u.pricer, p)] for u in units]
    memo: dict = {}
    last: list = [None, None]  # params_of's last (x, params): a Jacobian column re-prices many units at one x

    def params_of(x):
        key = x.tobytes()
        if last[0] != key:
            out = _copy_tree(base)
            for p, v in zip(ps, x):
                set_value(out, p.path, p.lo + v * _scale(p))
            last[:] = [key, out]
        return last[1]

    def residuals(x):
        pred = np.empty(len(rows))
        for u, (unit, rd) in enumerate(zip(units, reads)):
            key = (u, tuple(x[k] for k in rd))
            v = memo.get(key)
            if v is None:
                v = memo[key] = unit.predictions(params_of(x))
            pred[unit.index] = v
        res = np.log(pred / measured)
        prior = [PRIOR * np.log((p.lo + v * _scale(p) + 1e-9) / (p.prior + 1e-9)) if p.prior > 0 else PRIOR * v
                 for p, v in zip(ps, x)]
        return np.concatenate([res, prior])

    x0 = []
    for p in ps:
        v = get_value(base, p.path)
        v = p.prior if v is None else v
        x0.append(np.clip((v - p.lo) / _scale(p), 0.0, 1.0))
    sol = least_squares(residuals, np.array(x0), bounds=(0.0, 1.0), method="trf", x_scale=1.0, loss=loss,
                        f_scale=F_SCALE, diff_step=1e-3, ftol=ftol, max_nfev=60 * (len(ps) + 1))
    out = params_of(sol.x)
    out = copy.deepcopy(out)
    out["bounds"] = {p.name: [p.lo, p.hi] for p in ps}
    return out


def _copy_tree(d):
    """A copy of a params dict's nested dicts (leaves are numbers, strings or lists, shared)."""
    return {k: _copy_tree(v) if isinstance(v, dict) else v for k, v in d.items()}


class _Single:
    """One row's pricer as a fitting unit."""

    def __init__(self, i: int, row, pricer):
        self.index = np.array([i])
        self.rows = [row]
        self.pricer = pricer

    def predictions(self, params: dict) -> np.ndarray:
        return np.array([predict(self.rows[0], self.pricer, params)])


class _Stack:
    """Rows of one deployment and engine profile priced as one schedule: every replica's steps of every row
    end to end, one pass of the cost model over them, then each replica's sum and each row's slowest replica.
    Built only from plain :class:`RowPricer` rows (pipelined rows stay :class:`_Single`)."""

    def __init__(self, index: list, rows: list, pricers: list):
        from blendsim.sim.batch import FEATURE_FIELDS, BatchFeatures
        from blendsim.sim.ops import op_counts

        self.index = np.array(index)
        self.rows = rows
        self.scheds = [pr.sched for pr in pricers]
        ws, feats, tok0s, logit0s, starts, first = [], [], [], [], [], []
        n = 0
        for pr in pricers:
            first.append(len(starts))
            for w, f, _counts, tok0, logits0 in pr.parts:
                starts.append(n)
                n += len(w)
                ws.append(w)
                feats.append(f)
                tok0s.append(tok0)
                logit0s.append(logits0)
        feat = BatchFeatures(**{k: np.concatenate([np.broadcast_to(getattr(f, k), (len(w),))
                                                   for f, w in zip(feats, ws)]) for k in FEATURE_FIELDS})
        self.pricer = copy.copy(pricers[0])
        self.pricer.parts = [(np.concatenate(ws), feat, op_counts(self.pricer.shapes, feat), np.concatenate(tok0s),
                              np.concatenate(logit0s))]
        self.starts, self.first = np.array(starts), np.array(first)

    def predictions(self, params: dict) -> np.ndarray:
        ((w, t),) = self.pricer.step_times(params)
        per_replica = np.add.reduceat(w * t, self.starts)
        ms = np.maximum.reduceat(per_replica, self.first)
        return np.array([_metric(r, s, m) for r, s, m in zip(self.rows, self.scheds, ms)])


class _PipeStack:
    """Pipelined rows of one deployment and engine profile priced as one: every row's replicas end to end in one
    :class:`~blendsim.fidelity.pipeline.PipelineRowPricer`, each row's slowest replica at its own scale."""

    def __init__(self, index: list, rows: list, pricers: list):
        from dataclasses import replace

        from .pipeline import PipelineRowPricer

        self.index = np.array(index)
        self.rows = rows
        self.scheds = [pr.sched for pr in pricers]
        self.scales = np.array([pr.scale for pr in pricers])
        reps = [rep for pr in pricers for rep in pr.sched.replicas]
        self.first = np.concatenate([[0], np.cumsum([len(pr.sched.replicas) for pr in pricers])[:-1]])
        sched = replace(pricers[0].sched, replicas=reps, makespan_s=0.0)  # scale 1: each row keeps its own
        self.pricer = PipelineRowPricer(sched, pricers[0].dep, pricers[0].profile, pricers[0].params)

    def predictions(self, params: dict) -> np.ndarray:
        ms = np.maximum(np.maximum.reduceat(self.pricer.replica_times(params), self.first), 0.0) * self.scales
        return np.array([_metric(r, s, m) for r, s, m in zip(self.rows, self.scheds, ms)])


def _units(rows: list, params: dict) -> list:
    """The rows as fitting units: rows of one deployment and profile stacked (plain rows in a :class:`_Stack`,
    pipelined ones in a :class:`_PipeStack`) where stacking prices them as one by one does (checked at
    ``params``, to 1e-9), every other row on its own."""
    from .pipeline import PipelineRowPricer
    from .price import RowPricer

    kinds = {RowPricer: _Stack, PipelineRowPricer: _PipeStack}
    groups: list = []  # [(kind, dep, profile, [indices])]
    singles = []
    for i, (_r, pr) in enumerate(rows):
        if type(pr) not in kinds or not pr.sched.replicas or any(len(rep["weight"]) == 0
                                                                 for rep in pr.sched.replicas):
            singles.append(_Single(i, *rows[i]))
            continue
        for kind, dep, prof, idx in groups:
            if kind is kinds[type(pr)] and dep == pr.dep and prof == pr.profile:
                idx.append(i)
                break
        else:
            groups.append((kinds[type(pr)], pr.dep, pr.profile, [i]))
    units = []
    for kind, _dep, _prof, idx in groups:
        if len(idx) == 1:
            units.append(_Single(idx[0], *rows[idx[0]]))
            continue
        one = np.array([predict(rows[i][0], rows[i][1], params) for i in idx])
        try:
            st = kind(idx, [rows[i][0] for i in idx], [rows[i][1] for i in idx])
            same = np.allclose(st.predictions(params), one, rtol=1e-9, atol=0.0)
        except (AttributeError, KeyError, TypeError, ValueError):  # a pricer laid out otherwise than stacking reads
            same = False
        if same:
            units.append(st)
        else:  # a pricer whose parts stacking does not reproduce: price its rows one by one
            units += [_Single(i, *rows[i]) for i in idx]
    return sorted(units + singles, key=lambda u: int(u.index[0]))


def _reads(pr, p: Param) -> bool:
    """Whether the row priced by ``pr`` depends on parameter ``p``."""
    kind = p.path[0]
    if kind == "hardware":
        return p.path[1] == pr.dep.hardware.name
    if kind == "arch":
        return p.path[1] == pr.dep.hardware.arch
    if kind == "engine":
        return p.path[1] == pr.profile.overhead_key or (pr.profile.serve and p.path[1] == pr.profile.server_key)
    if kind == "regime":
        return p.path[1] == pr.profile.regime and p.path[2] in ("*", pr.dep.hardware.name, pr.dep.hardware.arch)
    # global: as free_params adds them (tests/test_fidelity_fast_cv.py checks a row's prediction does not move
    # with a parameter this says it does not read)
    experts = getattr(pr.dep.model, "num_experts", 0)
    return {"link_eff": pr.dep.tp > 1 or pr.dep.pp > 1, "moe_eff": bool(experts),
            "a2a_eff": bool(experts) and pr.dep.ep > 1}.get(p.path[-1], True)


def predict(row, pricer, params: dict) -> float:
    """The row's metric under ``params``."""
    return _metric(row, pricer.sched, pricer.makespan(params))


def _metric(row, s, ms: float) -> float:
    """The row's metric for its schedule ``s`` run in ``ms`` seconds."""
    if row.metric == "output_tok_s":
        v = s.output_tokens / ms
    elif row.metric == "total_tok_s":
        v = (s.input_tokens + s.output_tokens) / ms
    else:
        v = s.requests / ms
    return v / row.gpus if row.scope == "per_gpu" else v


def transfer(params: dict, rows: list) -> dict:
    """Give hardware without training rows the mean of the fitted hardware's efficiencies (a file fitted per
    hardware preset). Fits are per architecture now, and an architecture no training row ran keeps the presets:
    giving it the fitted architectures' mean instead was measured worse on the shipped rows (26 Nov 2026:
    leave-one-source-out 13.1% against 11.8%, leave-one-hardware-out 11.7% against 10.3%; an efficiency means
    different kernels on different GPUs, e.g. ``lowp_eff`` is Marlin's dequantising GEMM on Ampere and FP8/FP4
    tensor cores elsewhere)."""
    out = copy.deepcopy(params)
    hws = out.setdefault("hardware", {})
    known = [v for v in hws.values() if isinstance(v, dict)]
    for _row, pr in rows:
        hw = pr.dep.hardware.name
        if hw not in hws and known:
            hws[hw] = {n: float(np.mean([k[n] for k in known if n in k])) for n in HW_PARAMS
                       if any(n in k for k in known)}
    return out


def cross_validate(rows: list, key, base: dict | None = None, jobs: int = 1) -> dict:
    """Leave-one-group-out predictions: ``{row id: predicted}``; ``key(row)`` names the group.

    Each group's rows are predicted by a fit that starts from ``base`` (the presets when empty) and reads only
    the other groups' rows; nothing is carried from one fold to the next except each row's compressed pricer
    (a function of its own schedule alone). ``jobs`` > 1 fits folds in that many worker processes (forked,
    where the platform forks); the result does not depend on it."""
    folds = [g for g in sorted({key(r) for r, _ in rows}) if any(key(r) != g for r, _ in rows)]
    for _r, pr in rows:  # compress once here, so forked workers inherit the compressed pricers
        pr.compressed()
    pred = {}
    for part in _map_folds(_fold, [(rows, key, base, g) for g in folds], jobs):
        pred.update(part)
    return pred


def _fold(args) -> dict:
    rows, key, base, g = args
    train = [(r, p) for r, p in rows if key(r) != g]
    test = [(r, p) for r, p in rows if key(r) == g]
    prm = transfer(fit(train, base), test)
    return {r.id: predict(r, p, prm) for r, p in test}


_TASKS: list = []  # the folds a forked worker reads by index (inherited, never pickled)


def _run_task(i: int):
    fn, args = _TASKS[i]
    return fn(args)


def _map_folds(fn, tasks: list, jobs: int) -> list:
    """``[fn(t) for t in tasks]``, in ``jobs`` forked processes when ``jobs`` > 1 and the platform forks."""
    import multiprocessing as mp

    if jobs <= 1 or len(tasks) <= 1 or "fork" not in mp.get_all_start_methods():
        return [fn(t) for t in tasks]
    _TASKS[:] = [(fn, t) for t in tasks]
    try:
        from blendsim.sim.signals import worker_defaults

        # the driver alone answers Ctrl-C (it leaves the block, whose exit terminates the pool): a forked
        # worker would otherwise print its own KeyboardInterrupt traceback
        with mp.get_context("fork").Pool(min(jobs, len(tasks)), initializer=worker_defaults) as pool:
            return pool.map(_run_task, range(len(tasks)), chunksize=1)
    finally:
        _TASKS.clear()


__all__ = ["HW_PARAMS", "Param", "cross_validate", "fit", "free_params", "predict", "transfer"]
