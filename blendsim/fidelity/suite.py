"""Run a whole catalogue: simulate every row once, predict, summarise errors, refit, cross-validate."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from blendsim.sim.errors import UserError

from .catalogue import Row, Skip, build_workload, engine_version_key, read_catalogue, row_engine_key
from .fit import cross_validate, fit, predict
from .price import RowPricer
from .runner import reads_cost_model, simulate_row

SHIPPED_CATALOGUE = Path(__file__).with_name("catalogue.csv")
# the published TensorRT-LLM ~v1.0 table and SGLang/vLLM ShareGPT rows the shipped parameters were fitted on
SHIPPED_TRAINING = Path(__file__).with_name("training.csv")
SHIPPED_CATALOGUES = (SHIPPED_CATALOGUE, SHIPPED_TRAINING)
# cited rows the shipped parameters were NOT fitted on: an out-of-sample check (``blendsim fidelity
# validation.csv --no-cv`` predicts them with the shipped parameters); today GPUStack's gpt-oss runs, which became
# runnable after the fit (the gpt-oss presets); see CATALOGUE.md
SHIPPED_VALIDATION = Path(__file__).with_name("validation.csv")
# "deployment": the GPU and how a replica is split over it (``a100-80gb TP8``, ``rtx-pro-6000 TP4 x PP2``,
# ``h200 TP8, EP8``): where a bias follows the parallelism on one GPU rather than an engine or a source
GROUP_KEYS = ("source", "engine", "engine_version", "model", "hardware", "deployment")


@dataclass
class Suite:
    """A catalogue's rows, with a pricer for every row the simulator can run."""

    rows: list  # [Row]
    pricers: dict  # id -> RowPricer
    reasons: dict  # id -> why the row was skipped
    sim_s: float = 0.0
    wall: dict = field(default_factory=dict)  # id -> seconds to simulate
    notes: dict = field(default_factory=dict)  # id -> a note on how a predicted row was priced

    @property
    def ok(self) -> list:
        return [(r, self.pricers[r.id]) for r in self.rows if r.id in self.pricers]


def load_suite(paths, params: dict, progress=None, only: list[str] | None = None) -> Suite:
    """Read one catalogue or several (a list) and simulate every row once (with ``only``: the rows whose
    id matches one of these shell patterns)."""
    from fnmatch import fnmatchcase

    rows = []
    for path in (paths if isinstance(paths, (list, tuple)) else [paths]):
        rows += read_catalogue(path)
    if only:
        rows = [r for r in rows if any(fnmatchcase(r.id, pat) for pat in only)]
        if not rows:
            raise UserError(f"--only {' '.join(only)}: no catalogue row id matches")
    dup = sorted({r.id for r in rows if sum(x.id == r.id for x in rows) > 1})
    if dup:
        raise UserError(f"row id(s) {', '.join(dup[:5])} appear in more than one catalogue")
    from blendsim.runner import newer_than_modelled

    pricers, reasons, wall, notes = {}, {}, {}, {}
    t0 = time.perf_counter()
    for i, row in enumerate(rows):
        if progress:
            progress(i, len(rows), row.id)
        t = time.perf_counter()
        try:
            pricers[row.id] = prepare_row(row, params)
            note = newer_than_modelled(pricers[row.id].profile)  # a release past every modelled one: said
            if note:
                notes[row.id] = note[0]
        except Skip as e:
            reasons[row.id] = str(e)
        except UserError as e:
            reasons[row.id] = str(e)
        wall[row.id] = time.perf_counter() - t
    return Suite(rows, pricers, reasons, time.perf_counter() - t0, wall, notes)


def prepare_row(row: Row, params: dict) -> RowPricer:
    """Simulate ``row`` once; Skip (with the reason) when the simulator cannot run it."""
    from blendsim.sim.engines import PROFILES, get_profile

    if row.engine not in PROFILES:
        raise Skip(f"unknown engine {row.engine!r} (profiles: {', '.join(PROFILES)})")
    # the engine's version selects its profile (a version older than every modelled one: skipped). The pricer holds
    # it at its cited prior, not with ``params``' fitted loop baked in: a fit is priced with its own loops, and a loop
    # no training row of a fold reads (one whose only source is held out) stays at its prior there, never at the
    # shipped value that was fitted with the held-out rows (the loop does not change the deployment or the schedule)
    try:
        prof = get_profile(row_engine_key(row), {})
    except UserError as e:
        raise Skip(str(e)) from None
    if row.pp > 1:  # pipeline stages at the release the row states (its key names only MAJOR.MINOR)
        from dataclasses import replace

        from blendsim.sim.engines import pipeline_unmodelled

        from .catalogue import _stated_version

        why = pipeline_unmodelled(replace(prof, release=_stated_version(row) or prof.release))
        if why:
            raise Skip(f"pp {row.pp}: {why}")
    from .runner import deployment_for

    dep = deployment_for(row, prof)  # Skip/UserError before building a possibly large trace
    trace = build_workload(row)
    sched = simulate_row(row, trace, params)
    if dep.pp > 1:
        from .pipeline import PipelineRowPricer

        pr = PipelineRowPricer(sched, dep, prof, params)
    else:
        pr = RowPricer(sched, dep, prof)
    pr.sim_key = _key(pr, params)
    return pr


def _key(pr: RowPricer, params: dict) -> str:
    """What of ``params`` the row's cost model reads (a cost-aware plan changes only when this does)."""
    import json

    from blendsim.sim.efficiency import Efficiency

    eff = Efficiency.lookup(params, pr.profile.regime, pr.dep.hardware.name).to_dict()
    return json.dumps([eff, pr.profile.fitted_overhead(params)], sort_keys=True)


def predictions(suite: Suite, params: dict) -> dict:
    """``{row id: predicted}``; rows whose policy reads the cost model are re-simulated under ``params``."""
    out = {}
    for row, pr in suite.ok:
        if reads_cost_model(row.policy) and _key(pr, params) != pr.sim_key:
            pr = prepare_row(row, params)
            suite.pricers[row.id] = pr
        out[row.id] = predict(row, pr, params)
    return out


def _what(r) -> dict:
    """What a JSON row's numbers are: the metric (their unit) and the engine that ran it."""
    return {"metric": r.metric, "engine": r.engine, "engine_version": engine_version_key(r)}


def summarise(suite: Suite, pred: dict) -> dict:
    """The ``--json`` object: rows, median and p90 |error|, counts, and per-group errors."""
    rows = []
    for r in suite.rows:
        if r.id in pred:
            p = pred[r.id]
            rows.append({"id": r.id, "status": "ok", "reason": "", "predicted": p, "measured": r.value,
                         "error": p / r.value - 1.0, **_what(r),
                         "engine_profile": suite.pricers[r.id].profile.modelled,  # the profile that priced it
                         **({"note": suite.notes[r.id]}
                                                                      if r.id in suite.notes else {})})
        else:
            rows.append({"id": r.id, "status": "skipped", "reason": suite.reasons.get(r.id, "not predicted"),
                         "predicted": None, "measured": r.value, "error": None, **_what(r)})
    errs = np.array([abs(x["error"]) for x in rows if x["status"] == "ok"])
    out = {"rows": rows, "median_abs_error": _q(errs, 50), "p90_abs_error": _q(errs, 90),
           "n_ok": int(len(errs)), "n_skipped": len(rows) - int(len(errs))}
    by = {}
    byid = {r.id: r for r in suite.rows}
    for key in GROUP_KEYS:
        groups: dict = {}
        for x in rows:
            if x["status"] == "ok":
                groups.setdefault(_group(byid[x["id"]], key), []).append(abs(x["error"]))
        by[key] = {g: {"n": len(v), "median_abs_error": _q(np.array(v), 50), "p90_abs_error": _q(np.array(v), 90)}
                   for g, v in sorted(groups.items())}
    out["by"] = by
    return out


def _group(row: Row, key: str) -> str:
    """A row's group; a source is grouped by its document (the text before the first comma), an engine version
    is the profile key the row selects (``vllm@0.6``), a deployment its GPU and split (:func:`deployment_key`)."""
    if key == "engine_version":
        return engine_version_key(row)
    if key == "deployment":
        return deployment_key(row)
    v = getattr(row, key)
    return v.split(",")[0].strip() if key == "source" else v


def deployment_key(row: Row) -> str:
    """A row's GPU and replica split: ``h100-80gb TP4 x PP2``, ``h200 TP8, EP8`` (TP1 for one GPU; replicas are not
    named, a data-parallel run's replicas being alike)."""
    from blendsim.sim.deployment import deployment_name

    return deployment_name(row.hardware, row.tp, row.pp, row.ep)


def _q(a: np.ndarray, q: float):
    return float(np.percentile(a, q)) if len(a) else None


CV_KEYS = {"model": lambda r: r.model, "hardware": lambda r: r.hardware,
           "source": lambda r: _group(r, "source"), "engine_version": engine_version_key}


def cv_summary(suite: Suite, key: str, jobs: int = 1) -> dict:
    """Leave-one-``key``-out errors; ``key`` is ``model``, ``hardware``, ``source`` (a source = its document)
    or ``engine_version``. Each fold's fit starts from the presets (never from shipped or all-rows parameters)
    and reads only the other groups' rows (``fit.cross_validate``)."""
    pred = cross_validate(suite.ok, CV_KEYS[key], base={}, jobs=jobs)
    s = summarise(Suite(suite.rows, suite.pricers, suite.reasons, notes=suite.notes), pred)
    out = {"median_abs_error": s["median_abs_error"], "p90_abs_error": s["p90_abs_error"], "n": s["n_ok"],
           "by": s["by"], "rows": {x["id"]: x["error"] for x in s["rows"] if x["status"] == "ok"}}
    groups = {CV_KEYS[key](r) for r, _ in suite.ok}
    # every fold would fit on nothing with one group: no row is predicted, and the output says why (None: fine)
    what = key.replace("_", " ")
    out["note"] = (None if len(groups) >= 2 else "no row could be priced" if not suite.ok else
                   f"needs rows of at least two {what}s to leave one out; the {len(suite.ok)} row(s) it could price "
                   f"are all of one {what}")
    return out


def refit(suite: Suite) -> dict:
    """Parameters fitted on every runnable row (from the presets)."""
    prm = fit(suite.ok, base={})
    prm["fitted_on"] = {"rows": len(suite.ok)}
    return prm


def fit_size(suite: Suite) -> tuple[int, int]:
    """``(runnable rows, free parameters)`` of a fit on ``suite``."""
    from .fit import free_params

    return len(suite.ok), len(free_params(suite.ok))


def check_fit_size(suite: Suite, what: str) -> None:
    """Refuse to keep a fit made on fewer runnable rows than it has free parameters (none at all: every
    row skipped): saved, it would replace every shipped constant with presets or guesses."""
    n, k = fit_size(suite)
    if n == 0 or n < k:
        why = (f"every one of the {len(suite.rows)} row(s) was skipped (first: "
               f"{next(iter(suite.reasons.values()), '?')[:100]})" if n == 0 else
               f"only {n} runnable row(s) for {k} free parameters")
        raise UserError(f"{what}: {why}; a fit needs at least one runnable row per free parameter, so nothing "
                        "was written")


__all__ = ["CV_KEYS", "GROUP_KEYS", "SHIPPED_CATALOGUE", "SHIPPED_CATALOGUES", "SHIPPED_TRAINING", "SHIPPED_VALIDATION", "Suite", "check_fit_size", "cv_summary", "deployment_key", "fit_size", "engine_version_key", "load_suite", "predictions", "refit",
           "summarise"]
