"""The Python API: the CLI's commands as functions, for notebooks and scripts.

>>> import blendsim                                                          # doctest: +SKIP
>>> trace = blendsim.synthesize("blendserve", requests=2000, density=1.1, sharing=0.3, seed=0)
>>> r = blendsim.simulate(trace, policy="dfs", model="llama-3-8b", hardware="a100-80gb")
>>> r.summary["throughput_tok_s"], r.requests["finish_s"].max()
>>> r.write("runs/dfs")                      # the run directory `blendsim simulate -o` writes

Every function does what its command does, with the same defaults except where noted, and a user
mistake raises :class:`BlendsimError` (``blendsim.sim.errors.UserError``) whose ``str()`` is the very line
the command prints after ``blendsim: error:``. Policies are given as in ``--policy``: a registered
name, an installed package's entry point, ``"path/to/file.py:ClassName"``, or here also the class
itself (a subclass of :class:`blendsim.Policy`). See docs/api.md.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from blendsim.sim import checks as C
from blendsim.sim.errors import UserError

BlendsimError = UserError  # the one exception type of user mistakes (the CLI's one-line errors)

TRACE_FORMAT = "trace"  # blendsim's own Parquet trace (what `blendsim workloads` writes)


def _boundary(fn):
    """A public function whose call itself is checked: a missing, extra or unknown argument is a
    BlendsimError naming it (as Python's TypeError would, in one line); each function then checks its
    arguments' types and values with the command line's checks (``blendsim.sim.checks``)."""
    import functools
    import inspect

    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            sig.bind(*args, **kwargs)
        except TypeError as e:
            params = ", ".join(n for n in sig.parameters if n != "self")
            raise UserError(f"{fn.__qualname__}(): {e}; its arguments are {params or 'none'}") from None
        return fn(*args, **kwargs)

    return call


def _callback(fn, owner: str):
    """A user's ``progress`` function, wrapped so that an exception it raises (a wrong number of arguments, a bug in
    it) ends in one line naming its file and line, as a failing policy method does."""
    if fn is None:
        return None
    import functools

    from blendsim.policies._plugins import user_code_error

    @functools.wraps(fn)
    def call(*args):
        try:
            return fn(*args)
        except UserError:
            raise
        except (Exception, SystemExit) as e:
            raise user_code_error(owner, "progress()", fn, e) from e

    return call


# ---- traces ----------------------------------------------------------------------------------------
@_boundary
def load_trace(path, format: str | None = None, limit: int | None = None, **options):  # noqa: A002 (the CLI's --format)
    """Read a trace: blendsim's Parquet trace, or a trace of another format as `blendsim workloads
    load --format` reads it (burstgpt, azure, vidur, jsonl, mooncake, hashed). ``format=None`` goes by the file
    name (``.parquet``: blendsim's own, ``.jsonl``: jsonl), else takes a trace blendsim wrote whatever its name. ``limit`` keeps the first N requests. ``options``:
    the block-hash formats' settings, as the CLI's flags (``block_size``, ``time_unit``, ``output_len``,
    ``output_from``, ``seed``)."""
    from blendsim.workloads.loaders import FORMATS, load

    p = C.path(path, "load_trace: path")
    C.optional(C.text, format, "--format")
    C.optional(C.integer, limit, "--limit", 1)
    if p.is_dir():
        raise UserError(f"{p}: is a folder; give a trace file")
    from blendsim.sim.io import plain_suffix

    # a compressed file's format is its inner name's (x.jsonl.gz: jsonl; the loaders decompress)
    fmt = format or {".parquet": TRACE_FORMAT, ".jsonl": "jsonl"}.get(plain_suffix(p))
    if fmt is None and p.is_file():
        from blendsim.workloads.trace import is_trace_file

        fmt = TRACE_FORMAT if is_trace_file(p) else None  # a trace blendsim wrote, under another name
    if fmt is None:
        raise UserError(f"{p}: cannot tell the trace format from the name; give format= one of "
                        f"{', '.join(dict.fromkeys((TRACE_FORMAT, *FORMATS)))}")
    known = ("block_size", "time_unit", "output_len", "output_from", "seed")
    odd = sorted(set(options) - set(known))
    if odd:
        raise UserError(f"load_trace: unknown option {odd[0]!r}; the block-hash formats take {', '.join(known)}")
    # their types, as the other arguments' (a float block size or a string seed is one line, not a TypeError)
    for k, flag, lo in (("block_size", "--block-size", 1), ("output_len", "--output-len", 1), ("seed", "--seed", 0)):
        if options.get(k) is not None or (k == "seed" and k in options):
            C.integer(options[k], flag, lo, C.MAX_SEED if k == "seed" else None)
    C.optional(C.text, options.get("time_unit"), "--time-unit")
    if options.get("output_from") is not None:
        C.path(options["output_from"], "--output-from")
    if fmt != TRACE_FORMAT:
        return load(p, fmt, limit, **options)
    if options:
        raise UserError(f"load_trace: {sorted(options)[0]} applies to format mooncake or hashed, not {fmt}")
    from blendsim.workloads.trace import read_trace

    if limit is not None and limit < 1:
        raise UserError(f"--limit must be at least 1, got {limit}")
    trace = read_trace(p)
    if limit is None or limit >= trace.n:
        return trace
    from dataclasses import replace

    return replace(trace.head(limit), meta=trace.part_meta())  # the whole trace's measured figures are not its


@_boundary
def write_trace(trace, path) -> Path:
    """Write ``trace`` as blendsim's Parquet trace (what `blendsim simulate` reads)."""
    from blendsim.sim.io import check_output_file
    from blendsim.workloads.trace import Trace
    from blendsim.workloads.trace import write_trace as write

    if not isinstance(trace, Trace):
        raise UserError(f"write_trace: trace must be a blendsim Trace, got {C.describe(trace)}")
    _validate(trace, "write_trace")  # never a file load_trace would refuse
    return write(trace, check_output_file(C.path(path, "write_trace: path")))


def _validate(trace, where: str) -> None:
    """``trace.validate`` with a malformed Trace (columns of other lengths or types) said in one line too."""
    try:
        trace.validate(where)
    except UserError:
        raise
    except (TypeError, ValueError, IndexError) as e:
        raise UserError(f"{where}: not a well-formed Trace ({type(e).__name__}: {e}); build one with "
                        f"blendsim.make_trace") from None


@_boundary
def make_trace(*, input_len, output_len, prompts=None, ids=None, **optional):
    """A trace from Python columns: ``input_len`` and ``output_len`` per request; ``prompts[i]`` a list of
    token ids, or of ``(segment_id, length)`` pairs (requests that share leading segments share that
    prefix), or None (a unique prompt); ``ids``; optional columns ``arrival_s``, ``output_len_hint``,
    ``ttft_slo_s``, ``tbt_slo_s``, ``jct_slo_s`` and ``source`` (see workloads/trace.py)."""
    import dataclasses

    from blendsim.workloads.trace import Trace, from_columns

    known = tuple(f.name for f in dataclasses.fields(Trace) if f.default is not dataclasses.MISSING
                  or f.default_factory is not dataclasses.MISSING)  # the optional columns (and meta)
    unknown = sorted(set(optional) - set(known))
    if unknown:
        raise UserError(f"make_trace(): unknown column(s) {', '.join(unknown)}; besides input_len, output_len, "
                        f"prompts and ids it takes {', '.join(known)}")
    trace = from_columns(input_len=input_len, output_len=output_len, prompts=prompts, ids=ids, **optional)
    trace.validate("make_trace")
    if trace.n == 0:  # load_trace and simulate refuse one: never make or write a trace nothing can run
        raise UserError("make_trace(): no requests (input_len and output_len are empty)")
    return trace


@_boundary
def synthesize(recipe: str, **params):
    """The trace of a workload recipe, as `blendsim workloads synth RECIPE` makes it; ``params`` are
    the recipe's options with underscores (``requests=2000, density=1.1, sharing=0.3, seed=0``)."""
    from blendsim.workloads.recipes import synthesize as synth

    return synth(C.text(recipe, "recipe"), **params)


# ---- simulation --------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Result:
    """One simulation: ``summary`` (summary.json's dict), ``steps`` and ``requests`` (the tables of
    steps.parquet and requests.parquet as pandas DataFrames), ``schedule`` (with
    ``record_schedule=True``), ``notes`` (the cost model's remarks), ``cost_usd()`` (what its GPUs cost for its
    makespan) and ``write(run_dir)``."""

    run: object  # sim.rundir.RunResult

    @cached_property
    def summary(self) -> dict:
        from blendsim.sim.rundir import json_safe

        return json_safe(self.run.summary)  # summary.json's values: Python numbers, None for a figure a run lacks

    @property
    def notes(self) -> list:
        return list(self.run.notes)

    @property
    def trace(self):
        return self.run.trace

    @cached_property
    def expected_error(self) -> dict | None:
        """The error to expect of this run's throughput, from the fidelity suite's leave-one-source-out runs of
        its engine profile and deployment (``blendsim.sim.expected.of_summary``: ``scope``, ``of``, ``n``,
        ``loso_median``, ``loso_p90``, ``loso_signed_median``, ``in_sample_median``, ``profile_runs``,
        ``profile``, ``deployment``, ``line``); None for an online run, the ``ideal`` engine, a calibrated profile
        file or an engine key with overrides."""
        from blendsim.sim.expected import of_summary

        return of_summary(self.summary)

    @cached_property
    def steps(self):
        from blendsim.sim.rundir import steps_table

        return steps_table(self.run).to_pandas()

    @cached_property
    def requests(self):
        from blendsim.sim.rundir import requests_table

        return requests_table(self.run).to_pandas()

    @cached_property
    def schedule(self):
        from blendsim.sim.rundir import schedule_arrow

        tab = schedule_arrow(self.run)
        return None if tab is None else tab.to_pandas()

    @_boundary
    def cost_usd(self, usd_per_gpu_hour: float | None = None, *, prices=None, billing_hour: bool = False) -> float:
        """What the run's GPUs cost for its makespan, in US dollars, as `blendsim plan` prices a deployment: GPUs x
        hours x the price of one GPU-hour -- ``usd_per_gpu_hour`` where given, else the run's hardware in
        ``prices`` (a price file as `plan --prices` reads it; None: the shipped on-demand list prices,
        blendsim/plan/prices.csv, each with its source); ``billing_hour`` bills every started hour in full."""
        from blendsim.plan.prices import job_cost, read_prices

        C.boolean(billing_hour, "--billing-hour")
        if usd_per_gpu_hour is not None and prices is not None:
            raise UserError("Result.cost_usd(): give usd_per_gpu_hour or prices, not both")
        gpus = int(self.summary["gpus"])
        if usd_per_gpu_hour is None:
            table = read_prices(None if prices is None else C.path(prices, "--prices"))
            hw = self.summary["hardware"]
            p = table.price_of(hw, "the run's hardware",
                               f"give cost_usd(usd_per_gpu_hour=...) the price of a {hw} GPU-hour",
                               own="cost_usd(prices=FILE)")
            usd_per_gpu_hour, gpus = p.usd_per_gpu_hour, p.billed_gpus(gpus)  # whole instances, where it rents them
        price = C.number(usd_per_gpu_hour, "usd_per_gpu_hour", 0.0)
        return job_cost(gpus, price, float(self.summary["makespan_s"]), billing_hour)

    @_boundary
    def write(self, run_dir, force: bool = False) -> Path:
        """Write the run directory (summary.json, steps.parquet, requests.parquet, schedule.parquet)
        exactly as `blendsim simulate -o RUN_DIR [--force]` does; returns its path. As there, a run
        directory of another trace file is replaced only with ``force``, and so is a trace file's run directory by a
        run of a Trace object (whose trace no digest identifies)."""
        from blendsim.sim.rundir import check_run_dir, write_run

        run_dir = C.path(run_dir, "Result.write: run_dir")
        digest = self.summary.get("trace_sha256")
        check_run_dir(run_dir, digest, C.boolean(force, "--force"), trace_object=digest is None)
        return write_run(self.run, run_dir)

    def __repr__(self) -> str:
        s = self.summary
        return (f"Result(policy={s['policy']!r}, model={s['model']!r}, hardware={s['hardware']!r}, "
                f"n_requests={s['n_requests']}, makespan_s={s['makespan_s']:.4g}, "
                f"throughput_tok_s={s['throughput_tok_s']:.4g})")


@_boundary
def simulate(trace, policy="dfs", model: str = "llama-3-8b", hardware: str = "a100-80gb", progress=None,
             **run_options) -> Result:
    """Simulate ``trace`` (a Trace or a trace file's path) under ``policy`` on ``model`` x ``hardware``.

    ``run_options`` are `blendsim simulate`'s other options by their ``blendsim.runner.RunConfig``
    names: ``tp``, ``pp``, ``replicas``, ``mode``, ``engine``, ``profile``, ``dtype``, ``token_budget``,
    ``max_seqs``, ``block_size``, ``round_tokens``, ``mix``, ``prefix_caching`` (False for
    ``--no-prefix-cache``), ``prefix_retain``, ``gpu_memory_utilization``, ``fast_forward``,
    ``admission``, ``reserve_ratio``, ``kv_full`` (``preempt`` or ``stall``), ``offline``, ``seed``, ``record_schedule``, ``host_kv_gb`` and
    ``disk_kv_gb`` (host-memory and disk KV tiers per replica, GB), ``kv_load`` (``stall``, ``overlap`` or ``async``)
    and ``options`` (the policy's ``--opt`` settings as a dict). ``progress(finished_requests)`` is called now and then,
    and once more with every request finished.
    Unlike the CLI (``fcfs``), the default policy is ``dfs``. Given a file, summary.json records its
    SHA-256 as ``trace_sha256``, as the command does.
    """
    from blendsim.runner import RunConfig, run_simulation
    from blendsim.sim.rundir import file_sha256

    if progress is not None and not callable(progress):
        raise UserError(f"simulate: progress must be a function of the finished requests, got {C.describe(progress)}")
    if isinstance(model, os.PathLike):  # a config.json
        model = os.fspath(model)
    digest = file_sha256(trace) if isinstance(trace, (str, os.PathLike)) else None
    trace = _as_trace(trace)
    known = sorted(f.name for f in dataclasses.fields(RunConfig) if f.name not in ("policy", "model", "hardware"))
    unknown = sorted(set(run_options) - set(known))
    if unknown:
        raise UserError(f"simulate: unknown option(s) {', '.join(unknown)}; options are {', '.join(known)}")
    if isinstance(run_options.get("profile"), os.PathLike):
        run_options["profile"] = os.fspath(run_options["profile"])
    cfg = RunConfig(policy=policy, model=model, hardware=hardware, **run_options)  # checks every field
    run = run_simulation(trace, cfg, _callback(progress, "simulate"))
    if digest is not None:
        run.summary["trace_sha256"] = digest
    _warn_critical(run)
    return Result(run)


def _warn_critical(run) -> None:
    """The CLI's critical-path warning, for the API too: in ``Result.notes`` and as a Python warning."""
    import warnings

    from blendsim.sim.metrics import critical_path_warning

    w = critical_path_warning(run.summary)
    if w:
        run.notes.append(w)
        warnings.warn(w, UserWarning, stacklevel=_user_stacklevel())


def _as_trace(trace):
    from blendsim.workloads.trace import Trace

    if isinstance(trace, Trace):
        if trace.n == 0:
            raise UserError("the trace has no requests")
        # a Trace built or edited in Python (its arrays are writable) is checked as a file's would be: a negative
        # length or a NaN arrival is one line, not a negative throughput
        _validate(trace, "trace")
        return trace
    if isinstance(trace, (str, os.PathLike)):
        return load_trace(trace)
    raise UserError(f"trace: expected a blendsim Trace or a trace file's path, got {C.describe(trace)}")


# ---- sweeps ----------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class SweepResult:
    """A finished sweep: ``dir`` (the sweep directory), ``results`` (results.parquet as a DataFrame,
    one row per cell) and ``outcome`` (``blendsim.sweep.SweepOutcome``: cells run, skipped, timings)."""

    dir: Path
    outcome: object

    @cached_property
    def results(self):
        import pandas as pd

        return pd.read_parquet(self.outcome.results)

    @property
    def notes(self) -> list[str]:
        """The warnings `blendsim sweep` prints about its cells (a critical path dominating makespans)."""
        from blendsim.reports.terminal import sweep_warnings

        return sweep_warnings(self.dir)

    def __repr__(self) -> str:
        o = self.outcome
        return f"SweepResult(dir={str(self.dir)!r}, cells={o.total}, ran={o.ran}, skipped={o.skipped})"


@_boundary
def sweep(out, *, recipe: str = "blendserve", densities="0.80:1.40:0.05", sharing="0.05:0.45:0.10",
          policies=None, models="llama-3-8b", hardware="a100-80gb", requests: int = 40_000,
          mode: str | None = None, engine: str | None = None, engine_of: str | None = None,
          recipe_options: dict | None = None, seed: int = 0, jobs: int | None = None, backend: str = "local",
          ray_address: str | None = None, resume: bool = True, progress=None,
          fixed_trace: bool | None = None, seeds: int = 1, tp: int = 1, ep: int = 1, pp: int = 1,
          weights: str | None = None, kv_dtype: str | None = None, host_kv_gb: float = 0.0,
          disk_kv_gb: float = 0.0, replicas: int = 1, kv_load: str | None = None, host_link_gbps: float | None = None,
          disk_read_gbps: float | None = None, disk_write_gbps: float | None = None) -> SweepResult:
    """`blendsim sweep -o OUT`: every policy on a density x sharing grid of synthetic workloads.

    ``densities`` and ``sharing`` take a ``"start:stop:step"`` string, a comma list or numbers;
    ``policies``, ``models`` and ``hardware`` a comma list or a list. Policies run in worker
    processes, which import them by name, so a policy class of your own is passed as its file
    (``"path/to/file.py:ClassName"``; a class given directly must come from a file). Failed cells
    raise BlendsimError (all of them user mistakes) or RuntimeError, after the finished ones are
    kept in ``out`` (a rerun resumes); the error's ``result`` is the SweepResult of the cells that ran. ``progress(done, total)`` is called as cells finish.
    ``fixed_trace``: one trace per grid point, synthesised for the first model and hardware, run on
    every one (None: so when several models or hardware are given). ``seeds``: replicates per grid point.
    ``tp``, ``ep``, ``pp``, ``replicas``, ``weights``, ``kv_dtype``, ``host_kv_gb``, ``disk_kv_gb``, ``kv_load``,
    ``host_link_gbps``, ``disk_read_gbps``, ``disk_write_gbps``: as the command's options, for every cell. A policy's
    options go in its name, ``"dfs[router=contiguous]"``, as in the command's ``--policies``.
    """
    from blendsim.sweep.backends import make_backend
    from blendsim.sweep.driver import failure_line, run_sweep
    from blendsim.sweep.grid import SweepSpec, default_policies, precision_settings, tier_settings
    from blendsim.sweep.spec_check import check_spec
    from blendsim.sweep.store import check_sweep_dir

    out = C.path(out, "sweep: out")
    C.optional(C.integer, jobs, "--jobs", 1)
    C.text(recipe, "--recipe")
    if mode is not None:
        C.text(mode, "--mode")
    C.text(backend, "--backend")
    for v, flag in ((engine, "--engine"), (engine_of, "--engine-of"), (ray_address, "--ray-address")):
        C.optional(C.text, v, flag)
    C.boolean(resume, "--resume")
    if progress is not None and not callable(progress):
        raise UserError(f"sweep: progress must be a function of (done, total), got {C.describe(progress)}")
    if recipe_options is not None and not (isinstance(recipe_options, dict)
                                           and all(isinstance(k, str) for k in recipe_options)):
        raise UserError(f"--recipe-opt (recipe_options) must be a dict of option name -> value, got "
                        f"{C.describe(recipe_options)}")
    C.integer(seeds, "--seeds", 1)
    C.optional(C.boolean, fixed_trace, "--fixed-trace")
    for v, flag in ((tp, "--tp"), (ep, "--ep"), (pp, "--pp"), (replicas, "--replicas")):
        C.integer(v, flag, 1)
    for v, flag in ((weights, "--weights"), (kv_dtype, "--kv-dtype")):
        C.optional(C.text, v, flag)
    C.optional(C.text, kv_load, "--kv-load")
    # sizes may be 0 (no tier), speeds may not (a link of 0 GB/s moves nothing): each said as RunConfig says it
    tiers = tier_settings(
        kv_load=kv_load, **{k: None if v is None else float(C.number(v, flag, 0, lo_open=open_)) for k, v, flag, open_ in (
            ("host_kv_gb", host_kv_gb, "--host-kv-gb", False), ("disk_kv_gb", disk_kv_gb, "--disk-kv-gb", False),
            ("host_link_gbps", host_link_gbps, "--host-link-gbps", True),
            ("disk_read_gbps", disk_read_gbps, "--disk-read-gbps", True),
            ("disk_write_gbps", disk_write_gbps, "--disk-write-gbps", True))})
    pols = _names(policies, "--policies", _policy_spec) if policies is not None else default_policies()
    spec = check_spec(SweepSpec(
        recipe=recipe, densities=_values(densities, "--densities"), sharing=_values(sharing, "--sharing"),
        policies=pols, models=_names(models, "--models"), hardware=_names(hardware, "--hardware"),
        requests=C.integer(requests, "--requests", 1), mode=mode, engine=engine, engine_of=engine_of,
        seed=C.integer(seed, "--seed", 0, C.MAX_SEED), recipe_options=dict(recipe_options or {}),
        fixed_trace=fixed_trace, seeds=seeds, precision=precision_settings(weights, kv_dtype, tp, ep, pp, replicas),
        tiers=tiers))
    check_sweep_dir(out, spec, resume)
    outcome = run_sweep(spec, out, make_backend(backend, jobs, ray_address), resume=resume,
                        progress=_callback(progress, "sweep"))
    result = SweepResult(Path(out), outcome)
    if outcome.failures:
        err = (UserError if all(f["user_error"] for f in outcome.failures) else RuntimeError)(failure_line(outcome))
        err.result = result  # the cells that did run, as a SweepResult
        raise err
    import warnings

    for w in result.notes:
        warnings.warn(w, UserWarning, stacklevel=_user_stacklevel())
    return result


def _user_stacklevel() -> int:
    """The ``stacklevel`` that puts a warning at the user's line: the first frame outside this package, however
    many of blendsim's own frames (the _boundary wrapper, ``blendsim.sweep``'s callable module) lie between."""
    import sys

    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    f, level = sys._getframe(1), 1  # the caller's frame: level 1 for warnings.warn called there
    while f is not None and os.path.abspath(f.f_code.co_filename).startswith(here):
        f, level = f.f_back, level + 1
    return level


def _values(v, flag: str) -> tuple[float, ...]:
    from blendsim.sweep.grid import parse_values

    if isinstance(v, str):
        return parse_values(v, flag)
    try:
        items = [v] if not hasattr(v, "__iter__") else list(v)
    except TypeError:
        items = [v]
    values = [C.number(x, f"{flag} value") for x in items]
    return parse_values(",".join(repr(x) for x in values), flag) if values else parse_values("", flag)


def _names(v, flag: str, each=str) -> tuple[str, ...]:
    from blendsim.options import parse_names

    if isinstance(v, str):
        return parse_names(v, flag)
    if isinstance(v, type):
        v = [v]
    if not isinstance(v, (list, tuple)):
        raise UserError(f"{flag} must be a comma list or a list of names, got {C.describe(v)}")
    for x in v:
        if not (isinstance(x, str) and x.strip()) and not (isinstance(x, type) and each is not str):
            raise UserError(f"{flag} must list names (strings), got {C.describe(x)}")
    names = tuple(dict.fromkeys(each(x) for x in v))
    if not names:
        raise UserError(f"{flag}: give at least one name")
    return names


def _policy_spec(p) -> str:
    """A policy as a name a worker process can look up: a class becomes its registered name or its
    ``file.py:QualName`` (the file relative to the working folder where it lies under it, so the class and the
    ``"file.py:QualName"`` a user writes are one policy, run once and labelled as written)."""
    if not isinstance(p, type):
        return str(p)
    import inspect

    from blendsim.policies.base import Policy
    from blendsim.policies.registry import resolve_policy

    if not issubclass(p, Policy):
        raise UserError(f"policy {p.__qualname__}: not a subclass of blendsim.Policy")
    if p.__module__.split(".")[0] == "policies" and "name" in p.__dict__:
        return p.name
    try:
        f = inspect.getsourcefile(p)
    except (TypeError, OSError):  # a notebook's class: no source file
        f = None
    if not f or p.__module__ == "__main__" or "<" in p.__qualname__ or not Path(f).is_file():
        raise UserError(f"policy {p.__qualname__}: a sweep's and a plan's workers import policies by name; put the class "
                        f"in a file and pass 'path/to/file.py:ClassName'")
    path, cwd = Path(f).resolve(), Path.cwd().resolve()
    if path.is_relative_to(cwd):  # as the user would write it: relative to the working folder the workers share
        path = path.relative_to(cwd)
    spec = f"{path.as_posix()}:{p.__qualname__}"
    resolve_policy(spec)  # the file still defines it
    return spec


# ---- one step's cost ---------------------------------------------------------------------------------
@_boundary
def cost(model: str = "llama-3-8b", hardware: str = "a100-80gb", *, prefill_tokens: int = 0,
         decode_seqs: int = 0, context: int = 0, tp: int = 1, mode: str | None = None, engine: str = "ideal",
         profile=None, dtype: str | None = None, weights: str | None = None, kv_dtype: str | None = None,
         ep: int = 1, expert_skew: float = 0.0, pp: int = 1, token_budget: int | None = None,
         max_seqs: int | None = None) -> dict:
    """`blendsim cost --json`: the price of one step (a prefill chunk of ``prefill_tokens`` and/or
    ``decode_seqs`` decoding sequences, each after ``context`` tokens) and its per-operator rows. ``token_budget`` /
    ``max_seqs``: the largest step the engine plans memory for (default: the engine's), as `simulate` takes them."""
    if isinstance(model, os.PathLike):  # a config.json
        model = os.fspath(model)
    out, _rows, dep, cm = price_step(model, hardware, prefill_tokens=prefill_tokens, decode_seqs=decode_seqs,
                                      context=context, tp=tp, mode=mode, engine=engine, profile=profile,
                                      dtype=dtype, weights=weights, kv_dtype=kv_dtype, ep=ep,
                                      expert_skew=expert_skew, pp=pp, token_budget=token_budget, max_seqs=max_seqs)
    return {**out, "notes": step_notes(dep, cm, prefill_tokens, decode_seqs, context, expert_skew, out["max_seqs"])}


def step_notes(dep, cm, prefill_tokens: int, decode_seqs: int, context: int, expert_skew: float,
               max_seqs: int = 0) -> list[str]:
    """What `blendsim cost` says beside a step's price (:func:`cost` returns the same): the cost model's and the
    topology's notes, where the engine was calibrated, an inert --expert-skew or server field, and a step no replica
    could hold or the engine's scheduler would not run (``max_seqs``: its sequence cap, 0 none; the token budget is
    the deployment's)."""
    from blendsim.runner import (
        calibrated_elsewhere,
        inert_attn_dp,
        inert_serve,
        inert_server_fields,
        newer_than_modelled,
        overlap_what_if,
        skew_note,
    )

    m = dep.model
    prefill_tokens, decode_seqs, context = int(prefill_tokens), int(decode_seqs), int(context)  # checked by price_step
    notes = (list(cm.notes()) + dep.topology_notes() + calibrated_elsewhere(cm.engine, dep.hardware.name)
             + inert_server_fields(cm.engine) + inert_serve(cm.engine) + newer_than_modelled(cm.engine) + inert_attn_dp(cm.engine, dep)
             + skew_note(expert_skew, m) + overlap_what_if(cm.mode, cm.engine))
    held = decode_seqs * (context + 1) + (context + prefill_tokens if prefill_tokens else 0)
    if held > dep.kv_capacity_tokens:  # priced all the same: a step's time, not whether a replica can hold it
        notes.append(f"the step holds {held:,} tokens of KV, more than one replica's {dep.kv_capacity_tokens:,} "
                     f"({m.name} on {dep.hardware.name} x{dep.tp * dep.pp}): no engine could run it")
    seqs, tokens = decode_seqs + (1 if prefill_tokens else 0), decode_seqs + prefill_tokens
    over = ([f"{seqs:,} sequences, over its cap of {max_seqs:,} (--max-seqs)"] if max_seqs and seqs > max_seqs else []) + (
        [f"{tokens:,} tokens, over its {dep.max_batched_tokens:,}-token budget (--token-budget)"]
        if tokens > dep.max_batched_tokens else [])
    if over:  # priced all the same, as a what-if
        notes.append(f"the step runs {' and '.join(over)}: priced all the same, but the engine runs no step that "
                     f"large")
    longest = context + max(prefill_tokens or 0, 1 if decode_seqs else 0)  # a chunk's or a decode's context
    if longest > m.max_position_embeddings:  # as simulate refuses such a request
        notes.append(f"a context of {longest:,} tokens is beyond {m.name}'s {m.max_position_embeddings:,}: priced all "
                     f"the same, but the model cannot run it")
    return notes


def engine_memory_settings(engine: str, hardware: str, token_budget: int | None = None,
                           max_seqs: int | None = None, **run) -> dict:
    """The Deployment settings an engine's scheduler gives on ``hardware`` (KV fraction and what it is a fraction of,
    the largest step's tokens and sequences), as `simulate` sizes a replica under a policy that changes none of them
    (fcfs): so `cost` says the same of whether a model fits, and how much KV is left. ``run``: the RunConfig's model,
    tp and precision, where the engine's limits are each attention-DP rank's (``runner.attn_dp_ranks``)."""
    return _engine_limits(engine, hardware, token_budget, max_seqs, **run)[1]


def _engine_limits(engine: str, hardware: str, token_budget: int | None = None, max_seqs: int | None = None,
                   **run) -> tuple:
    """``(EngineConfig, Deployment settings)`` of a run under a policy that changes none of the engine's (fcfs):
    :func:`engine_memory_settings` with the scheduler's own caps beside them (`cost` reports them)."""
    from blendsim.runner import RunConfig, run_limits

    return run_limits(RunConfig(policy="fcfs", engine=engine, hardware=hardware, token_budget=token_budget,
                                max_seqs=max_seqs, **run))


def price_step(model, hardware, *, prefill_tokens, decode_seqs, context, tp, mode, engine, profile, dtype, weights,
               kv_dtype, ep, expert_skew, pp=1, token_budget=None, max_seqs=None):
    """What `blendsim cost` and :func:`cost` share: ``(summary dict, breakdown rows, deployment, cost model)``."""
    from blendsim.sim.batch import BatchFeatures
    from blendsim.sim.build_cost import build_cost_model
    from blendsim.sim.deployment import make_deployment
    from blendsim.workloads.trace import MAX_TOKENS

    C.text(model, "--model")
    C.text(hardware, "--hardware")
    # the checked values, as Python numbers (a numpy int32 would overflow in the operators' FLOP counts)
    prefill_tokens, decode_seqs, context = (C.integer(v, flag, 0, MAX_TOKENS) for v, flag in (
        (prefill_tokens, "--prefill-tokens"), (decode_seqs, "--decode-seqs"), (context, "--context")))
    tp = C.integer(tp, "--tp", 1, C.MAX_GPUS)
    ep = C.integer(ep, "--ep", 1, C.MAX_GPUS)
    pp = C.integer(pp, "--pp", 1, C.MAX_GPUS)
    expert_skew = C.number(expert_skew, "--expert-skew", 0.0)
    C.optional(C.text, mode, "--mode")
    C.text(engine, "--engine")
    for v, flag in ((dtype, "--dtype"), (weights, "--weights"), (kv_dtype, "--kv-dtype")):
        C.optional(C.text, v, flag)
    if profile is not None:
        profile = C.path(profile, "--profile")
    if prefill_tokens == 0 and decode_seqs == 0:
        raise UserError("give --prefill-tokens and/or --decode-seqs")
    token_budget = C.optional(C.integer, token_budget, "--token-budget", 1, MAX_TOKENS)
    max_seqs = C.optional(C.integer, max_seqs, "--max-seqs", 0, MAX_TOKENS)
    sched, limits = _engine_limits(engine, hardware, token_budget, max_seqs, model=model, tp=tp, dtype=dtype,
                                   weights=weights, kv_dtype=kv_dtype)
    dep = make_deployment(model, hardware, tp, dtype, weights, kv_dtype, ep=ep, expert_skew=expert_skew, pp=pp,
                          **limits)
    cm = build_cost_model(dep, mode, engine, str(profile) if profile is not None else None)
    prefill = [(0, prefill_tokens, context, 0)] if prefill_tokens else []
    f = BatchFeatures.from_parts(prefill, decode_seqs, decode_seqs * context,
                                 decode_seqs + (1 if prefill_tokens else 0))
    sc = cm.cost(f)
    rows = cm.breakdown(f)
    keep = ("op", "flops", "bytes", "time_s")
    m = dep.model
    # MoE/MLA models: each layer operator also says on how many layers it runs (dense-first, MoE layers)
    keep_layer = keep + (("layers",) if m.is_moe or m.is_mla else ())
    out = {"step_time_s": sc.time_s, "compute_s": sc.compute_s, "memory_s": sc.memory_s, "other_s": sc.other_s,
           "comm_s": sc.comm_s, "overhead_s": sc.overhead_s, "server_s": sc.server_s, "layers": m.num_layers,
           "mode": cm.mode,
           # overlap mode: step = max(c, m) + kappa min(c, m) + comm_share comm (or comm, when longer) + other + engine
           **({"kappa": float(cm.kappa), "comm_share": float(cm.net)} if cm.mode == "overlap" else {}),
           "engine": cm.engine.label, "engine_profile": cm.engine.modelled, "cost_model": cm.timer_name, "dtype": m.dtype, "weights": m.weights,
           "kv_dtype": m.kv_dtype, "ep": dep.ep, "attn_dp_gpus": dep.dp,
           # the engine's scheduler limits on one step (max_seqs 0: no cap but the KV pool), as simulate runs them
           "max_seqs": int(sched.max_seqs or 0), "token_budget": int(sched.token_budget),
           "per_layer": [{k: r[k] for k in keep_layer} for r in rows if r["scope"] == "layer"],
           "whole_model": [{k: r[k] for k in keep} for r in rows if r["scope"] == "model"]}
    if dep.pp > 1:
        out.update(pipeline_step(dep, f, lambda d: build_cost_model(d, mode, engine, str(profile) if profile is not None
                                                                    else None)))
    return out, rows, dep, cm


def pipeline_step(dep, f, cost_model_of) -> dict:
    """A pipelined replica's step: each stage's price, the hand-offs, the step alone in the pipe (their sum)
    and with the pipe full (the slowest stage)."""
    from blendsim.sim.pipeline import StagePricer

    sp = StagePricer(dep, cost_model_of)
    stages = []
    for i, cm in enumerate(sp.models):
        sc = cm.cost(f)
        a, b = dep.stage_range(i)
        stages.append({"stage": i, "layers": [a, b - 1], "step_time_s": sc.time_s, "compute_s": sc.compute_s,
                       "memory_s": sc.memory_s, "other_s": sc.other_s, "comm_s": sc.comm_s,
                       "overhead_s": sc.overhead_s})
    hand = sp.handoffs(f.num_tokens)
    server = float(sp.server_s(f.num_logits, f.num_decode))  # an API server beside the engine paces the pipe
    return {"pp": dep.pp, "stages": stages, "handoff_s": hand,
            "handoff_links": ["network" if dep.pp_crosses(i) else "scale-up" for i in range(dep.pp - 1)],
            "server_s": server,
            "one_batch_in_flight_s": max(sum(x["step_time_s"] for x in stages) + sum(hand), server),
            "pipe_full_step_s": max(max(x["step_time_s"] for x in stages), server)}


@_boundary
def policy_names() -> list[str]:
    """The policies known by name: this package's and those installed packages register."""
    from blendsim.policies.registry import policy_names as names

    return names()


__all__ = ["BlendsimError", "Result", "SweepResult", "cost", "load_trace", "make_trace", "policy_names", "simulate",
           "synthesize", "sweep", "write_trace"]
