"""What error to expect of a prediction: the fidelity suite's leave-one-source-out errors, by engine profile and by
deployment, shipped beside the parameters they were measured with (``expected_error.json`` next to
``engine_params.json``) so that ``simulate``, ``plan``, ``report`` and ``Result.expected_error`` can say it next
to the figure they print.

Leave-one-source-out (LOSO) predicts each published source's runs with parameters fitted without that source:
it is the error to expect on a setup no one has measured (README, "How close to real systems"). The table is
made by ``python -m blendsim.fidelity.expected`` from a ``blendsim fidelity ... --json`` run with the shipped
parameters and carries their SHA-256; when ``engine_params.json`` changes without the table being remade, no
error is quoted (``tests/test_expected_error.py`` fails in CI first).

Rows are grouped by the modelled engine profile they run on (``vllm@0.8``: a vLLM 0.9 row counts there), by
deployment (GPU and split, :func:`blendsim.sim.deployment.deployment_name`) and by both. Errors are of
throughput, predicted / measured - 1: positive means the simulator is too fast (its makespan too short).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

TABLE_FILE = Path(__file__).with_name("expected_error.json")
KIND = "blendsim-expected-error"
CV = "leave_one_source_out"
# fewer runs than this in a group say too little for a median to be quoted as "expected"
MIN_RUNS = 3


def params_sha256(path: Path | None = None) -> str:
    """SHA-256 of a parameters file's bytes (default: the shipped ``sim/engine_params.json``)."""
    from blendsim.sim.engines import PARAMS_FILE

    return hashlib.sha256(Path(path or PARAMS_FILE).read_bytes()).hexdigest()


def read_table(p: Path) -> dict | None:
    """The table at ``p``; None where it is absent or not one."""
    try:
        t = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return t if isinstance(t, dict) and t.get("kind") == KIND else None


def load(path: Path | None = None) -> dict | None:
    """The shipped table, or None where it is absent, of another kind, or made for other parameters."""
    t = read_table(Path(path or TABLE_FILE))
    return t if t and t.get("params_sha256") == params_sha256() else None


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if abs(x) >= 0.095 else f"{100 * x:.1f}%"


def _say(g: dict, what: str) -> str:
    s = g["loso_signed_median"]
    lean = f", typically {_pct(abs(s))} too {'fast' if s > 0 else 'slow'}" if abs(s) >= 0.05 else ""
    return f"{_pct(g['loso_median'])} over {g['n']} runs {what} (p90 {_pct(g['loso_p90'])}{lean})"


def groups(profile: str | None, deployment: str, table: dict | None = None) -> list[tuple[str, dict]]:
    """``[(what, stats)]`` of the groups that speak for a run, most specific first: this profile on this deployment,
    this deployment on any engine, this profile on any GPU, every run; a group of fewer than :data:`MIN_RUNS` runs
    is left out. Empty where no table applies (see :func:`load`)."""
    t = table if table is not None else load()
    if not t:
        return []
    found = [(f"of {profile} on {deployment}", t["profile_deployment"].get(f"{profile} on {deployment}")),
             (f"on {deployment}, any engine", t["deployment"].get(deployment)),
             (f"of {profile}, any GPU", t["profile"].get(profile) if profile else None),
             ("of every engine and GPU", t["all"])]
    return [(w, g) for w, g in found if g and g["n"] >= MIN_RUNS]


def expected(profile: str | None, deployment: str, table: dict | None = None) -> dict | None:
    """The stats of the group that speaks for a run, with ``of`` saying which: this profile on this deployment
    where it has :data:`MIN_RUNS` runs, else the worse (larger median) of this deployment on any engine and this
    profile on any GPU, as either may carry the error; every run where neither has enough. None where no table
    applies."""
    g = groups(profile, deployment, table)
    if not g:
        return None
    if g[0][0].startswith(f"of {profile} on "):
        what, st = g[0]
    else:
        what, st = max(g[:-1] or g, key=lambda x: x[1]["loso_median"])
    return {"of": what, **st}


def expected_line(profile: str | None, deployment: str, table: dict | None = None) -> str | None:
    """One line: the LOSO median |error| of published runs of this engine profile on this deployment, on this
    deployment, of this profile and of all; None where no table applies (see :func:`load`)."""
    t = table if table is not None else load()
    g = groups(profile, deployment, t)
    if not g:
        return None
    parts = [_say(st, what) for what, st in g[:-1]]
    if not any(what.startswith(f"on {deployment}") for what, _ in g):
        n = t["deployment"].get(deployment, {}).get("n", 0)
        parts.insert(0, f"only {n} published run(s) on {deployment}" if n else f"no published run on {deployment}")
    parts.append(f"{_pct(t['all']['loso_median'])} over all {t['all']['n']}")
    return ("expected error (median |error| of published runs, each predicted by a fit without its source): "
            + "; ".join(parts))


def of_summary(s: dict) -> dict | None:
    """The error to expect of a run's throughput from its summary (summary.json's dict): :func:`expected`'s group
    and ``line``, :func:`expected_line`. None for a run whose requests arrive over time (the published runs are
    offline), the plain roofline, a calibrated profile file, or where the shipped table does not apply."""
    from blendsim.sim.deployment import deployment_name
    from blendsim.sim.engines import is_profile_file

    if not s.get("offline", True) or s.get("cost_model") != "roofline+fitted" or is_profile_file(s.get("engine")):
        return None
    t = load()
    dep = deployment_name(s["hardware"], s["tp"], s.get("pp") or 1, s.get("ep") or 1)
    x = expected(s.get("engine_profile"), dep, t) if t else None
    return {**x, "line": expected_line(s.get("engine_profile"), dep, t)} if x else None

__all__ = ["CV", "KIND", "MIN_RUNS", "TABLE_FILE", "expected", "expected_line", "groups", "load", "of_summary", "params_sha256", "read_table"]
