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


def pct(x: float) -> str:
    """A share as the tables print it: whole percent from 9.5%, one decimal below."""
    return f"{100 * x:.0f}%" if abs(x) >= 0.095 else f"{100 * x:.1f}%"


def _runs(n: int) -> str:
    return f"{n} run" + ("" if n == 1 else "s")


def _say(g: dict) -> str:
    s = g["loso_signed_median"]
    lean = f", typically {pct(abs(s))} too {'fast' if s > 0 else 'slow'}" if abs(s) >= 0.05 else ""
    return f"{pct(g['loso_median'])} over {_runs(g['n'])} {g['of']} (p90 {pct(g['loso_p90'])}{lean})"


# what a group is, in the words of a table column
SCOPE_WORDS = {"profile_deployment": "this engine on this split", "deployment": "this split, any engine",
               "profile": "this engine, any GPU", "all": "every run"}
HEAD = "expected error (median |error| of published runs, each predicted by a fit without its source): "


def _all_groups(profile: str | None, deployment: str, t: dict) -> list[dict]:
    """Every group of the table that holds runs like this one, most specific first (any size)."""
    out = []
    for scope, key, of in (("profile_deployment", f"{profile} on {deployment}", f"of {profile} on {deployment}"),
                           ("deployment", deployment, f"on {deployment} with any engine"),
                           ("profile", profile, f"of {profile} on any GPU"),
                           ("all", None, "of every engine and GPU")):
        st = t["all"] if scope == "all" else (t[scope].get(key) if key else None)
        if st:
            out.append({"scope": scope, "of": of, **st})
    return out


def groups(profile: str | None, deployment: str, table: dict | None = None) -> list[dict]:
    """The groups that speak for a run, most specific first: this engine profile on this deployment, this
    deployment with any engine, this profile on any GPU, every run; each ``{"scope", "of", n, loso_median,
    loso_p90, loso_signed_median, in_sample_median}``. A group of fewer than :data:`MIN_RUNS` runs is left out, and
    so is the deployment's when its runs are all this profile's, and the profile's when its runs are all on this
    deployment (either holds the same runs as this profile on this deployment: the same figures twice). Empty where
    no table applies (see :func:`load`)."""
    t = table if table is not None else load()
    if not t:
        return []
    g = [x for x in _all_groups(profile, deployment, t) if x["n"] >= MIN_RUNS]
    if g and g[0]["scope"] == "profile_deployment":  # a wider group of as many runs holds the same ones
        g = [g[0], *(x for x in g[1:] if x["scope"] == "all" or x["n"] != g[0]["n"])]
    return g


def expected(profile: str | None, deployment: str, table: dict | None = None) -> dict | None:
    """The group that speaks for a run (:func:`groups`): this profile on this deployment where it has
    :data:`MIN_RUNS` runs, else the worse (larger median) of the deployment's and the profile's, as either may carry
    the error; every run where neither has enough. ``profile_runs`` counts the profile's runs on any GPU (0: an
    engine no published run measured, which only other engines' runs speak for). None where no table applies."""
    t = table if table is not None else load()
    g = groups(profile, deployment, t)
    if not g:
        return None
    x = g[0] if g[0]["scope"] == "profile_deployment" else max(g[:-1] or g, key=lambda x: x["loso_median"])
    return {**x, "profile_runs": t["profile"].get(profile, {}).get("n", 0) if profile else 0}


def expected_body(profile: str | None, deployment: str, table: dict | None = None,
                  alias: str | None = None) -> str | None:
    """:func:`expected_line` without its head (a report names several engines and deployments under one)."""
    t = table if table is not None else load()
    g = groups(profile, deployment, t)
    if not g:
        return None
    every = {x["scope"]: x for x in _all_groups(profile, deployment, t)}
    parts = [f"{alias} prices as {profile}"] if alias else []
    if profile and "profile" not in every:
        parts.append(f"no published run of {profile}")
    pd_ = every.get("profile_deployment")
    if pd_ and pd_["n"] < MIN_RUNS:
        parts.append(f"only {_runs(pd_['n'])} of {profile} on {deployment} ({pct(pd_['loso_median'])})")
    elif not pd_ and "profile" in every and "deployment" in every:  # neither absence above says this one
        parts.append(f"no published run of {profile} on {deployment}")
    dep = every.get("deployment")
    if not dep:
        parts.append(f"no published run on {deployment}")
    elif dep["n"] < MIN_RUNS:
        parts.append(f"only {_runs(dep['n'])} on {deployment} ({pct(dep['loso_median'])})")
    parts += [_say(x) for x in g if x["scope"] != "all"]
    parts.append(f"{pct(t['all']['loso_median'])} over all {t['all']['n']}")
    return "; ".join(parts)


def expected_line(profile: str | None, deployment: str, table: dict | None = None,
                  alias: str | None = None) -> str | None:
    """One line: the LOSO median |error| of published runs of this engine profile on this deployment, on this
    deployment, of this profile and of all, and which of those have too few runs or none; None where no table
    applies (see :func:`load`). ``alias``: the profile the run was modelled by, where it prices exactly as
    ``profile`` (:func:`priced_as`), said first."""
    body = expected_body(profile, deployment, table, alias)
    return HEAD + body if body else None


# what names a profile and does not price it
_NAMING = ("name", "key", "release", "source", "fit_as")


def priced_as(engine: str, params: dict | None = None) -> str | None:
    """The other modelled profile whose published runs a run of ``engine`` has, where it prices exactly as that one:
    a profile that is another's under another name, sharing its fitted loop (``fit_as``) and every other parameter
    (``vllm-v0@0.6`` is ``vllm@0.6``, vLLM 0.6's V0 engine under its older name). None otherwise (``trtllm@0.8`` shares
    TensorRT-LLM's fitted loop, not the newest release's scheduler)."""
    from dataclasses import asdict

    from blendsim.sim.engines import get_profile, load_params
    from blendsim.sim.errors import UserError

    params = load_params() if params is None else params
    try:
        p = get_profile(engine, params)
        q = get_profile(p.fit_as, params) if p.fit_as else None
    except UserError:
        return None
    if q is None or q.modelled == p.modelled:
        return None
    a, b = asdict(p), asdict(q)
    return q.modelled if all(a[k] == b[k] for k in a if k not in _NAMING) else None


def of_engine(engine, hardware: str, tp: int, pp: int | None = 1, ep: int | None = 1, table: dict | None = None) -> dict | None:
    """:func:`expected` for a run of ``engine`` (an ``--engine`` value) on this GPU and split, with its ``line``
    (:func:`expected_line`) and ``profile`` and ``deployment``. None for what no fit priced as the table's runs
    were: ``ideal``, a calibrated profile file (it carries its own fit), a key with overrides (``vllm:fixed_s=...``
    is no longer the fitted profile), or where the shipped table does not apply."""
    from blendsim.sim.deployment import deployment_name
    from blendsim.sim.engines import is_profile_file, load_params, modelled_profile

    if engine is None or is_profile_file(engine) or ":" in str(engine):
        return None
    t = table if table is not None else load()
    params = load_params() if t else {}
    prof = modelled_profile(str(engine), params) if t else None
    if not prof or prof == "ideal":
        return None
    dep = deployment_name(hardware, tp, pp, ep)
    same = priced_as(str(engine), params)  # vllm-v0@0.6 is vllm@0.6: its runs speak for it
    x = expected(same or prof, dep, t)
    line = expected_line(same or prof, dep, t, alias=prof if same else None)
    return {**x, "profile": prof, "deployment": dep, "line": line} if x else None


def of_summary(s: dict) -> dict | None:
    """:func:`of_engine` for a run from its summary (summary.json's dict); None also for a run whose requests
    arrive over time (the published runs are offline) or one priced by another cost model."""
    if not s.get("offline", True) or s.get("cost_model") != "roofline+fitted":
        return None
    return of_engine(s.get("engine"), s["hardware"], s["tp"], s.get("pp"), s.get("ep"))


__all__ = ["CV", "HEAD", "KIND", "MIN_RUNS", "SCOPE_WORDS", "TABLE_FILE", "expected", "expected_body", "expected_line",
           "groups", "load", "of_engine", "of_summary", "params_sha256", "pct", "priced_as", "read_table"]
