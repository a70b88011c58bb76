"""How far to trust a planned point: the fidelity catalogue's error for that engine on that GPU.

For an engine x hardware pair, the shipped catalogues' rows of that pair (``blendsim/fidelity/catalogue.csv`` and
``training.csv``; rows whose engine and version resolve to the same modelled profile: ``vllm@0.6`` is vouched for
by vLLM 0.6.x rows, ``vllm`` by the newest modelled version's) are simulated as `blendsim fidelity` does (rows of
at most ``MAX_ROW_REQUESTS`` requests, so this takes seconds, not the quarter hour of the 400,000-request rows)
and their median |error| is reported with the row count. These rows are in-sample: the shipped efficiencies
were fitted on them. A pair with no rows says so ("untested"): its figures rest on the cost model's presets and
on other GPUs' fits.
"""

from __future__ import annotations

MAX_ROW_REQUESTS = 3000


def fidelity_of(pairs, model: str | None = None) -> dict:
    """``{"engine@hardware": {...}}`` for each ``(engine, hardware)`` in ``pairs``."""
    from blendsim.fidelity.catalogue import engine_release_key, read_catalogue
    from blendsim.fidelity.suite import SHIPPED_CATALOGUES, load_suite, predictions
    from blendsim.sim.engines import load_params, modelled_profile

    rows = [r for c in SHIPPED_CATALOGUES for r in read_catalogue(c)]
    params = load_params()
    # each row's modelled profile: a planned engine is vouched for by its own version's rows only
    modelled = {r.id: modelled_profile(engine_release_key(r), params) for r in rows}
    out = {}
    for engine, hw in sorted(set(pairs)):
        mine_prof = modelled_profile(engine, params) or engine
        all_rows = [r for r in rows if modelled[r.id] == mine_prof and r.hardware == hw]
        mine = [r for r in all_rows if r.requests <= MAX_ROW_REQUESTS]
        entry = {"engine": engine, "profile": mine_prof, "hardware": hw, "catalogue_rows": len(all_rows), "rows_checked": 0,
                 "median_abs_error": None, "max_abs_error": None, "same_model_rows": 0, "rows_over_cap":
                 len(all_rows) - len(mine), "rows_not_run": 0, "not_run_reason": ""}
        if mine:
            suite = load_suite(list(SHIPPED_CATALOGUES), params, only=[r.id for r in mine])
            pred = predictions(suite, params)
            why = [suite.reasons[r.id] for r in mine if r.id not in pred and r.id in suite.reasons]
            entry.update(rows_not_run=len(why), not_run_reason=why[0] if why else "")
            errs = sorted(abs(pred[r.id] / r.value - 1.0) for r in mine if r.id in pred)
            if errs:
                n = len(errs)
                entry.update(rows_checked=n, max_abs_error=errs[-1],
                             median_abs_error=(errs[n // 2] if n % 2 else (errs[n // 2 - 1] + errs[n // 2]) / 2))
            entry["same_model_rows"] = sum(1 for r in mine if r.id in pred and r.model == model)
        entry["summary"] = describe(entry)
        out[f"{engine}@{hw}"] = entry
    return out


def describe(e: dict) -> str:
    from blendsim.sim.engines import describe_engine

    if not e["catalogue_rows"]:
        return f"untested: no catalogue row of {describe_engine(e['engine'], e.get('profile'))} on {e['hardware']}"
    left = []  # the pair's rows not checked here, and why
    if e.get("rows_over_cap"):
        left.append(f"{e['rows_over_cap']} over {MAX_ROW_REQUESTS:,} requests (blendsim fidelity runs them)")
    if e.get("rows_not_run"):
        why = e["not_run_reason"]
        why = ("their length file is absent: set BLENDSIM_DATA to the folder holding it" if "does not exist" in why
               else why if len(why) <= 100 else why[:97] + "...")
        left.append(f"{e['rows_not_run']} that could not run here ({why})")
    if not e["rows_checked"]:
        return (f"not checked here: {e['catalogue_rows']} catalogue row(s) of the releases "
                f"{e.get('profile') or e['engine']} prices, on {e['hardware']}: "
                + "; ".join(left))
    return (f"median |error| {100 * e['median_abs_error']:.0f}% (max {100 * e['max_abs_error']:.0f}%) over "
            f"{e['rows_checked']} in-sample catalogue row(s) of the releases {e.get('profile') or e['engine']} prices, "
            f"on {e['hardware']}"
            + (f"; not checked: {'; '.join(left)}" if left else ""))


__all__ = ["MAX_ROW_REQUESTS", "describe", "fidelity_of"]
