"""`blendsim plan`: the cheapest deployment that finishes an offline batch job by its deadline.

>>> import blendsim                                                          # doctest: +SKIP
>>> a = blendsim.plan("job.parquet", model="llama-3-8b", deadline="2h", hardware="a100-80gb,h100-80gb",
...                   max_gpus=8, engines="vllm,sglang", policies="dfs,random")
>>> a["recommended"]["gpus"], a["recommended"]["cost_usd"], a["recommendation"]

The search (``search.py``) enumerates GPU kind x TP/EP x replicas x engine x policy x precision, skips what
cannot fit or provably cannot win (lower bounds from ``sim.density``), simulates the rest with the sweep
backends (local processes or Ray), on a seeded sample of a large trace with a check on full runs; prices
come from ``prices.csv`` or the user's file (``prices.py``); ``report.py`` builds the answer and the HTML.
"""

from __future__ import annotations

import os
import re
import sys
import types
from pathlib import Path

from blendsim.api import _boundary
from blendsim.sim.errors import UserError

DEFAULT_ENGINES = ("vllm", "sglang", "trtllm")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_deadline(text) -> float:
    """``30m``, ``24h``, ``2d``, ``90s`` or plain seconds -> seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        v = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([smhd]?)\s*", str(text))
        if not m and str(text).strip().startswith("-"):
            raise UserError(f"--deadline {text!r}: must be a positive duration")
        if not m:
            raise UserError(f"--deadline {text!r}: give a duration like 30m, 24h, 2d, or seconds")
        v = float(m.group(1)) * UNITS[m.group(2) or "s"]
    if not v > 0:
        raise UserError(f"--deadline {text!r}: must be a positive duration")
    if v > MAX_DEADLINE_S:
        raise UserError(f"--deadline {text!r}: over {MAX_DEADLINE_S / 86400:,.0f} days (ten years), no deadline a "
                        f"job is planned against; give one up to {MAX_DEADLINE_S / 86400:,.0f}d")
    return v


MAX_DEADLINE_S = 3650 * 86400.0  # ten years: a longer deadline is a typo (1e30) or no deadline at all


def parse_margin(v):
    """``--margin`` as given: None, a share of the makespan (``0.2``, or ``"20%"`` up to ``"1000%"``; a bare
    number above 1 is refused, as ``10`` would mean 1000%) or ``"expected"``."""
    if v is None:
        return None
    text = str(v).strip().lower()
    if not text:
        raise UserError("--margin is empty: give a share of the makespan (0.2 or 20%) or 'expected'")
    if text == "expected":
        from blendsim.sim.expected import load

        if load() is None:
            raise UserError("--margin expected: no expected-error table applies to the shipped parameters (remake "
                            "sim/expected_error.json: python -m blendsim.fidelity.expected --help)")
        return "expected"
    pct = text.endswith("%")
    try:
        x = float(text[:-1]) / 100 if pct else float(text)
    except ValueError:
        raise UserError(f"--margin must be a share of the makespan (0.2 or 20%) or 'expected', got {v!r}") from None
    if not 0 <= x <= 10:
        raise UserError(f"--margin must be between 0% and 1000%, got {v!r}")
    if x > 1 and not pct:
        raise UserError(f"--margin {v}: a bare number is a share of the makespan (0 to 1); write {100 * x:g}% if "
                        f"you mean it")
    return x + 0.0  # -0 is 0


def margin_of(margin):
    """The function giving a candidate its margin (None: no margin): a fixed share, or its expected error (the
    median |error| of published runs of its engine and split; every run's median where none is quoted for it,
    as for ``ideal``, a profile file or a key with overrides: an engine no published run vouches for is not
    given less margin than one they do)."""
    if margin is None:
        return None
    if margin != "expected":
        return lambda c: margin
    from blendsim.sim.expected import load

    from .report import expected_errors

    everyone, expect = load()["all"]["loso_median"], expected_errors()

    def of(c):
        x = expect(c.settings())
        return x["loso_median"] if x else everyone
    return of


def trace_sha256(trace) -> str:
    """A digest of a trace's content (what a run reads of it): every request's id, lengths, prompt units, arrival,
    hint and SLOs."""
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    for name in ("input_len", "output_len", "unit_offsets", "unit_sym", "unit_len", "output_len_hint", "arrival_s",
                 "ttft_slo_s", "tbt_slo_s", "jct_slo_s"):
        a = getattr(trace, name, None)
        h.update(name.encode())
        if a is not None:
            h.update(np.ascontiguousarray(a).tobytes())
    h.update("\x00".join(map(str, trace.ids)).encode())
    return h.hexdigest()


def check_policy_spec(spec: str) -> str:
    """A plan's policy, ``NAME`` or ``NAME[key=value,...]``, checked and canonical (:func:`blendsim.policy_spec.canonical_policy`),
    so two spellings of one policy are one set of deployments."""
    from blendsim.policy_spec import canonical_policy

    return canonical_policy(spec)


@_boundary  # the API's call check: a misspelt argument is one line
def plan(trace, model: str = "llama-3-8b", deadline="24h", *, hardware=None, max_gpus: int = 64, engines=None,
         policies=None, weights=None, kv_dtype=None, max_tp: int | None = None, max_pp: int | None = None,
         max_ep: int | None = None, budget: float | None = None,
         prices=None, billing_hour: bool = False, sample: int = 20_000, verify: int = 2, seed: int = 0,
         jobs: int | None = None, backend: str = "local", ray_address: str | None = None, out=None,
         fidelity: bool = True, progress=None, prune: bool = True, margin=None, tp: int | None = None,
         pp: int | None = None, ep: int | None = None) -> dict:
    """`blendsim plan TRACE`: the answer as `--json` prints it (``pareto``, ``recommended``, ``candidates``,
    ``pruned``, ``sampling``, ...). ``hardware``, ``engines``, ``policies``, ``weights`` and ``kv_dtype`` take a
    comma list or a list (``policies`` also a policy class, as :func:`blendsim.sweep` takes one); ``max_tp``,
    ``max_pp`` and ``max_ep`` are upper limits (powers of two up to each; default 8, 1 and 8; ``max_pp`` 1: no
    pipelining), as ``--max-tp/--max-pp/--max-ep`` (``tp``, ``pp`` and ``ep`` are their older names). ``out`` writes the HTML report there and makes the search resumable.
    ``progress(simulated, deployment)`` is called as simulations finish (``progress(simulated, deployment,
    at_most)`` where it takes a third argument: the feasible deployments in the space, before pruning).
    ``margin``: a deployment meets the deadline only with this share of its makespan to spare (``0.2``, ``"20%"``),
    or ``"expected"``: with its expected error to spare (the median |error| of published runs of its engine and
    split, ``blendsim.sim.expected``; every run's median for an engine none is quoted for, such as ``ideal``)."""
    from blendsim.api import _as_trace, _callback, _names, _policy_spec
    from blendsim.options import parse_names
    from blendsim.sim import checks as C
    from blendsim.sim.models import get_model
    from blendsim.sweep.backends import make_backend
    from blendsim.sweep.grid import default_policies

    from .prices import read_prices
    from .report import build_answer, write_report
    from .search import run_search
    from .space import Space

    def names(v, flag, each=str):
        if v is None:
            return None
        return parse_names(v, flag, engines=flag == "--engines") if isinstance(v, str) else _names(v, flag, each)

    def limit(new, old, flag, default):
        if new is not None and old is not None:
            raise UserError(f"plan(): give {flag[2:].replace('-', '_')} or its older name {flag[6:]}, not both")
        return C.integer(new if new is not None else old if old is not None else default, flag, 1, C.MAX_GPUS)

    deadline_s = parse_deadline(deadline)
    margin = parse_margin(margin)
    tp, pp, ep = (limit(max_tp, tp, "--max-tp", 8), limit(max_pp, pp, "--max-pp", 1),
                  limit(max_ep, ep, "--max-ep", 8))
    C.integer(max_gpus, "--max-gpus", 1, C.MAX_GPUS)
    C.integer(sample, "--sample", 100)
    C.integer(verify, "--verify", 0)
    C.integer(seed, "--seed", 0, C.MAX_SEED)
    C.optional(C.integer, jobs, "--jobs", 1)
    C.optional(C.number, budget, "--budget", 0.0, lo_open=True)
    for v, flag in ((billing_hour, "--billing-hour"), (fidelity, "--fidelity"), (prune, "--prune")):
        C.boolean(v, flag)
    C.text(backend, "--backend")
    C.optional(C.text, ray_address, "--ray-address")
    if not isinstance(model, os.PathLike):  # a preset name, or a config.json as a path
        C.text(model, "--model")
    if progress is not None and not callable(progress):
        raise UserError(f"plan: progress must be a function of (simulated, deployment), got {C.describe(progress)}")
    table = read_prices(None if prices is None else C.path(prices, "--prices"))
    hw = names(hardware, "--hardware") or tuple(h for h in table.prices)
    from blendsim.sim.hardware import get_hardware

    for h in hw:
        get_hardware(h)
        table.price_of(h)
    eng, merged = _distinct_engines(names(engines, "--engines") or DEFAULT_ENGINES)
    pols = tuple(dict.fromkeys(check_policy_spec(p)
                               for p in (names(policies, "--policies", _policy_spec) or default_policies())))
    get_model(model)
    w = names(weights, "--weights") or ()
    kv = names(kv_dtype, "--kv-dtype") or ()
    for x in w:
        get_model(model, None, x, None)
    for x in kv:
        get_model(model, None, None, x)
    space = Space(str(model), hw, eng, pols, w, kv, max_gpus=int(max_gpus), max_tp=int(tp), max_pp=int(pp),
                  max_ep=int(ep))
    path = Path(trace) if isinstance(trace, (str, Path)) else None
    t = _as_trace(trace)
    store = None
    if out is not None:
        from blendsim.sim.rundir import file_sha256

        from .store import PlanStore

        if not isinstance(out, (str, os.PathLike)):
            raise UserError(f"plan: out must be a folder path, got {C.describe(out)}")
        # a file by its bytes, a Trace object by its content: another trace never reads this one's results
        digest = file_sha256(path) if path else trace_sha256(t)
        store = PlanStore(out, {"trace_sha256": digest, "n_requests": t.n,
                                "model": str(model), "sample": int(sample), "seed": int(seed)})
    be = make_backend(backend, jobs, ray_address)
    try:
        res = run_search(t, space, deadline_s, table, budget=budget, billing_hour=billing_hour, sample=int(sample),
                         verify=int(verify), seed=int(seed), backend=be, store=store, prune=prune,
                         progress=_callback(progress, "plan"),
                         trace_path=path, margin=margin_of(margin))
    except BaseException:
        from blendsim.sim.signals import uninterrupted

        with uninterrupted():  # a second Ctrl-C or SIGTERM must not leave workers running
            be.close(cancel=True)
        raise
    be.close()
    answer = build_answer(res, trace_path=path, n_requests=t.n, model=str(model), deadline_s=deadline_s,
                          budget=budget, prices=table, billing_hour=billing_hour, seed=int(seed), fidelity=fidelity,
                          margin=margin)
    if merged:
        answer["merged_engines"] = merged
    if out is not None:
        answer["report"] = str(write_report(answer, list(res.points.values()), Path(out)))
    if answer["failures"]:  # the search left these out: its answer may not be the job's (the CLI exits 2)
        import warnings

        from blendsim.api import _user_stacklevel

        warnings.warn(failures_line(answer), FailedDeploymentsWarning, stacklevel=_user_stacklevel())
    return answer


def _distinct_engines(keys) -> tuple[tuple, list]:
    """The engine keys that price differently, in the order given, and ``[{"engine", "as"}]`` for each left out because
    an earlier one prices exactly as it does (``vllm@0.9`` as ``vllm@0.8``: one profile, its settings and mechanics
    alike), so that one deployment is not simulated twice under two names. An unknown engine or version is one line."""
    from dataclasses import replace

    from blendsim.sim.engines import get_profile, pipeline_unmodelled

    kept, idents, merged = [], [], []
    for e in keys:
        prof = get_profile(e)
        # the release matters through the fields it sets and through what reads it: pipeline stages (vLLM V1 runs
        # them from 0.8.4, so vllm@0.8.2 and vllm@0.8.4 stay apart)
        ident = (replace(prof, key="", release=""), pipeline_unmodelled(prof))
        same = next((k for k, i in zip(kept, idents, strict=True) if i == ident), None)
        if same is None:
            kept.append(e)
            idents.append(ident)
        else:
            merged.append({"engine": e, "as": same})
    return tuple(kept), merged


class FailedDeploymentsWarning(UserWarning):
    """Raised by :func:`plan` when deployments failed to simulate (the CLI says it as an error instead)."""


def failures_line(answer: dict, first: bool = True) -> str:
    """One line for the deployments that failed to simulate (a policy's own error, most often): how many, and the
    first (``first``; the CLI has listed them as ``failed:`` lines already)."""
    f = answer["failures"]
    return (f"{len(f)} deployment(s) failed to simulate and are left out of the answer"
            + (f" (first: {f[0]['deployment']}: {f[0]['error']})" if first else " (the failed: lines above)"))


__all__ = ["FailedDeploymentsWarning", "failures_line", "margin_of", "parse_deadline", "parse_margin", "plan"]


class _CallablePlan(types.ModuleType):
    """``blendsim.plan`` is both this package and its ``plan`` function (whichever an import left there)."""

    def __call__(self, *args, **kwargs):
        return plan(*args, **kwargs)

    @property
    def __signature__(self):  # inspect.signature(blendsim.plan), an IDE's or notebook's hint: the function's
        import inspect

        return inspect.signature(plan)


sys.modules[__name__].__class__ = _CallablePlan
