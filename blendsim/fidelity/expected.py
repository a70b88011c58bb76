"""Making the expected-error table (``blendsim.sim.expected``) from a ``blendsim fidelity --json`` run.

Remake it after a refit with::

    blendsim fidelity blendsim/fidelity/training.csv blendsim/fidelity/catalogue.csv --only 'trtllm-*' \\
        --only 'vllm-*' --only 'sglang-*' --only 'deepspeed-*' --json > fid.json
    python -m blendsim.fidelity.expected fid.json blendsim/fidelity/training.csv \\
        blendsim/fidelity/catalogue.csv -o sim/expected_error.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from blendsim.sim.expected import CV, KIND, params_sha256, read_table


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

    from .catalogue import engine_release_key
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
    groups: dict[str, dict[str, tuple[list, list]]] = {"profile": {}, "deployment": {}, "profile_deployment": {},
                                                        "all": {}}
    for rid, err in sorted(cv["rows"].items()):
        r = byid[rid]
        prof = modelled_profile(engine_release_key(r), params) or r.engine
        dep = deployment_key(r)
        for kind, key in (("profile", prof), ("deployment", dep), ("profile_deployment", f"{prof} on {dep}"),
                          ("all", "")):
            lo, fi = groups[kind].setdefault(key, ([], []))
            lo.append(err)
            if rid in fit:
                fi.append(fit[rid])
    every = groups.pop("all")[""]
    return {"kind": KIND, "params_sha256": params_sha, "cv": CV, "all": _stats(*every),
            **{k: {g: _stats(*v) for g, v in sorted(d.items())} for k, d in groups.items()}}


def main(argv: list[str] | None = None) -> int:
    import argparse

    from blendsim.sim.errors import UserError

    from .catalogue import read_catalogue

    ap = argparse.ArgumentParser(prog="python -m blendsim.fidelity.expected",
                                 description="Make the expected-error table from a `blendsim fidelity --json` run.",
                                 epilog=__doc__[__doc__.index("Remake it"):],
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
    if a.out.exists() and read_table(a.out) is None:
        print(f"blendsim: error: {a.out} exists and is not an expected-error table; not replaced", file=sys.stderr)
        return 2
    a.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {a.out}: {table['all']['n']} runs, {len(table['deployment'])} deployments, "
          f"{len(table['profile'])} engine profiles")
    return 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["build", "main"]
