"""What error to expect of a prediction: the fidelity suite's leave-one-source-out errors, by engine profile and by
deployment, shipped so that ``simulate`` and ``plan`` can say it next to the figure they print.

Leave-one-source-out (LOSO) predicts each published source's runs with parameters fitted without that source:
it is the error to expect on a setup no one has measured (README, "How close to real systems"). The shipped
table (:data:`TABLE_FILE`) is made from a ``blendsim fidelity ... --json`` run with the shipped parameters and
carries their SHA-256; when ``sim/engine_params.json`` changes without the table being remade, no error is
quoted (``tests/test_expected_error.py`` fails in CI first). Remake it after a refit with::

    blendsim fidelity blendsim/fidelity/training.csv blendsim/fidelity/catalogue.csv --only 'trtllm-*' \\
        --only 'vllm-*' --only 'sglang-*' --only 'deepspeed-*' --json > fid.json
    python -m blendsim.fidelity.expected fid.json blendsim/fidelity/training.csv \\
        blendsim/fidelity/catalogue.csv -o blendsim/fidelity/expected_error.json

Rows are grouped by the modelled engine profile they run on (``vllm@0.8``: a vLLM 0.9 row counts there), by
deployment (GPU and split, :func:`blendsim.fidelity.suite.deployment_key`) and by both. Errors are of
throughput, predicted / measured - 1: positive means the simulator is too fast (its makespan too short).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

TABLE_FILE = Path(__file__).with_name("expected_error.json")
KIND = "blendsim-expected-error"
CV = "leave_one_source_out"
# fewer runs than this in a group say too little for a median to be quoted as "expected"
MIN_RUNS = 3


def params_sha256(path: Path | None = None) -> str:
    """SHA-256 of a parameters file's bytes (default: the shipped ``sim/engine_params.json``)."""
    from blendsim.sim.engines import PARAMS_FILE

    return hashlib.sha256(Path(path or PARAMS_FILE).read_bytes()).hexdigest()


def _stats(loso: list[float], fit: list[float]) -> dict:
    a = np.abs(np.array(loso))
    return {"n": len(loso), "loso_median": round(float(np.median(a)), 4),
            "loso_p90": round(float(np.percentile(a, 90)), 4),
            "loso_signed_median": round(float(np.median(loso)), 4),
            "in_sample_median": round(float(np.median(np.abs(np.array(fit)))), 4) if fit else None}


def build(result: dict, rows, params_sha: str) -> dict:
    """The table from a ``fidelity --json`` result (with its leave-one-source-out run) and the catalogue rows it
    priced."""
    from blendsim.sim.engines import load_params, modelled_profile

    from .catalogue import engine_version_key
    from .suite import deployment_key

    cv = (result.get("cv") or {}).get(CV)
    if not cv or not cv.get("rows"):
        raise ValueError(f"the fidelity result has no cv.{CV} rows (run it without --no-cv)")
    fit = {x["id"]: x["error"] for x in result.get("rows", []) if x.get("status") == "ok"}
    params = load_params()
    byid = {r.id: r for r in rows}
    missing = sorted(set(cv["rows"]) - set(byid))
    if missing:
        raise ValueError(f"{len(missing)} row(s) of the result are in none of the catalogues given (first: "
                         f"{missing[0]})")
    groups: dict[str, dict[str, tuple[list, list]]] = {"profile": {}, "deployment": {}, "profile_deployment": {}}
    every: tuple[list, list] = ([], [])
    for rid, err in sorted(cv["rows"].items()):
        r = byid[rid]
        prof = modelled_profile(engine_version_key(r), params) or r.engine
        dep = deployment_key(r)
        for kind, key in (("profile", prof), ("deployment", dep), ("profile_deployment", f"{prof} on {dep}")):
            lo, fi = groups[kind].setdefault(key, ([], []))
            lo.append(err)
            if rid in fit:
                fi.append(fit[rid])
        every[0].append(err)
        if rid in fit:
            every[1].append(fit[rid])
    return {"kind": KIND, "params_sha256": params_sha, "cv": CV, "all": _stats(*every),
            **{k: {g: _stats(*v) for g, v in sorted(d.items())} for k, d in groups.items()}}


def _read(p: Path) -> dict | None:
    """The table at ``p``; None where it is absent or not one."""
    try:
        t = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return t if isinstance(t, dict) and t.get("kind") == KIND else None


def load(path: Path | None = None) -> dict | None:
    """The shipped table, or None where it is absent, of another kind, or made for other parameters."""
    t = _read(Path(path or TABLE_FILE))
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


def main(argv: list[str] | None = None) -> int:
    import argparse

    from blendsim.sim.errors import UserError

    from .catalogue import read_catalogue

    ap = argparse.ArgumentParser(prog="python -m blendsim.fidelity.expected",
                                 description="Make the expected-error table from a `blendsim fidelity --json` run.",
                                 epilog=__doc__[__doc__.index("Remake it"):__doc__.index("Rows are grouped")],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("result", type=Path, help="the fidelity --json output (with cross-validation)")
    ap.add_argument("catalogues", type=Path, nargs="+", help="the catalogue CSVs that run priced")
    ap.add_argument("-o", "--out", type=Path, required=True)
    a = ap.parse_args(argv)
    try:
        result = json.loads(a.result.read_text())
        rows = [r for c in a.catalogues for r in read_catalogue(c)]
        table = build(result, rows, params_sha256())
    except (OSError, ValueError, UserError) as e:
        print(f"blendsim: error: {e}", file=sys.stderr)
        return 2
    if a.out.exists() and _read(a.out) is None:
        print(f"blendsim: error: {a.out} exists and is not an expected-error table; not replaced", file=sys.stderr)
        return 2
    a.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {a.out}: {table['all']['n']} runs, {len(table['deployment'])} deployments, "
          f"{len(table['profile'])} engine profiles")
    return 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["KIND", "MIN_RUNS", "TABLE_FILE", "build", "expected", "expected_line", "groups", "load", "main", "of_summary", "params_sha256"]
