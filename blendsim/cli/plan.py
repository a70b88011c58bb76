"""``blendsim plan``: the cheapest deployment that finishes a batch job by its deadline (blendsim.plan)."""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import typer


def plan_cmd(
    trace: Path = typer.Argument(..., help="The job's trace (Parquet; see `blendsim workloads`). Every request "
                                           "is released at t=0 (an offline batch job)."),
    model: str = typer.Option("llama-3-8b", "--model", "-m", help="Model preset or a HuggingFace config.json."),
    deadline: str = typer.Option(..., "--deadline", help="When the job must be done: 30m, 24h, 2d, or seconds."),
    hardware: str = typer.Option(None, "--hardware", help="GPU kinds, comma list (default: every preset with a "
                                                         "price in the price file)."),
    max_gpus: int = typer.Option(64, "--max-gpus", help="Most GPUs for the job (replicas x TP x PP)."),
    engines: str = typer.Option(None, "--engines", help="Engine profiles, comma list (default: vllm,sglang,trtllm)."),
    policies: str = typer.Option(None, "--policies", help="Policies, comma list (default: dfs,random,blendserve); "
                                                             "your own as path/to/file.py:ClassName; a policy's "
                                                             "options as NAME[key=value,...], e.g. "
                                                             "'dfs[router=contiguous]'."),
    weights: str = typer.Option(None, "--weights", help="Weight precisions to try, comma list (default: the "
                                                       "model's)."),
    kv_dtype: str = typer.Option(None, "--kv-dtype", help="KV-cache dtypes to try, comma list (default: the "
                                                         "model's)."),
    tp: int = typer.Option(8, "--max-tp", "--tp", help="Largest tensor-parallel degree (powers of two up to it)."),
    pp: int = typer.Option(1, "--max-pp", "--pp", help="Largest pipeline-parallel degree (powers of two up to it; default 1: "
                                           "no pipelining)."),
    ep: int = typer.Option(8, "--max-ep", "--ep", help="Largest expert-parallel degree (MoE models; divides TP)."),
    budget: float = typer.Option(None, "--budget", help="Most USD the job may cost (optional)."),
    margin: str = typer.Option(None, "--margin", help="Meet the deadline with this share of the makespan to spare: "
                                                      "20% (or 0.2), or 'expected' for each deployment's expected "
                                                      "error (the median |error| of published runs of its engine "
                                                      "and split)."),
    prices: Path = typer.Option(None, "--prices", help="Price CSV with columns hardware,usd_per_gpu_hour (default: "
                                                      "the shipped on-demand list prices, blendsim/plan/prices.csv)."),
    billing_hour: bool = typer.Option(False, "--billing-hour", help="Bill every started hour in full."),
    sample: int = typer.Option(20_000, "--sample", help="Traces with more requests are searched on a seeded "
                                                        "sample of this many, extrapolated, and checked on full runs."),
    verify: int = typer.Option(2, "--verify", help="Full-trace runs that check the sampled estimates: the "
                                                   "recommended one always, up to VERIFY - 1 front neighbours, then "
                                                   "up to VERIFY near misses (estimates within the sampling error of "
                                                   "the deadline or the recommended's cost)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sample and of the policies."),
    jobs: int = typer.Option(None, "--jobs", "-j", help="Parallel simulations (default: CPU count)."),
    backend: str = typer.Option("local", "--backend", help="local (processes) or ray."),
    ray_address: str = typer.Option(None, "--ray-address", help="Ray cluster address (with --backend ray)."),
    out: Path = typer.Option(None, "-o", "--out", help="Folder for report.html, pareto.png and the answer JSON; a "
                                                       "rerun there resumes."),
    no_fidelity: bool = typer.Option(False, "--no-fidelity", help="Skip the catalogue check of each engine x GPU "
                                                                  "and the error to expect of each deployment."),
    as_json: bool = typer.Option(False, "--json", help="Print the answer as JSON."),
) -> None:
    """The cheapest deployment (GPU kind, TP/PP/EP, replicas, engine, policy, precision) that finishes TRACE by
    the deadline, with the Pareto front of makespan vs cost. Exits 1 (after the answer) when no deployment in
    the search space meets the deadline and budget, 2 when a deployment failed to simulate (a policy's error)."""
    from blendsim.plan import FailedDeploymentsWarning, plan
    from blendsim.plan.report import print_answer

    for line in _engine_notes(engines) + _powers_note(tp=tp, pp=pp, ep=ep):
        typer.echo(f"note: {line}", err=True)
    t0 = time.perf_counter()
    tty = sys.stderr.isatty()
    narrowed = bool(hardware and engines and policies)
    bar = _Progress(tty, hint=not narrowed)
    try:
        with bar, warnings.catch_warnings():
            # the failures line is said below, as an error: not again as a Python warning
            warnings.simplefilter("ignore", FailedDeploymentsWarning)
            answer = plan(trace, model, deadline, hardware=hardware, max_gpus=max_gpus, engines=engines,
                          policies=policies, weights=weights, kv_dtype=kv_dtype, max_tp=tp, max_pp=pp, max_ep=ep,
                          budget=budget, prices=prices, billing_hour=billing_hour, sample=sample, verify=verify,
                          seed=seed, jobs=jobs, backend=backend, ray_address=ray_address, out=out,
                          fidelity=not no_fidelity, progress=bar.update, margin=margin)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the workers are stopped; say what a rerun reuses
        from blendsim.sim.signals import interrupt_exit_code

        typer.echo(_interrupted_line(out, bar.done), err=True)
        raise typer.Exit(interrupt_exit_code()) from None
    # a deployment may be simulated twice (its sample, then the whole trace): the progress counts simulations
    ran = (f"{bar.done} simulation(s) run" if bar.done else
           f"every simulation reused from {out}" if out is not None and answer["simulated"] else "no simulation run")
    typer.echo(f"plan: {answer['simulated']} deployment(s) simulated in {time.perf_counter() - t0:.0f} s ({ran})"
               + (f"; report: {answer['report']}" if answer.get("report") else ""), err=True)
    if as_json:
        from blendsim.plan.report import _finite

        typer.echo(json.dumps(_finite(answer), indent=2, sort_keys=True, allow_nan=False))
    else:
        print_answer(answer)
    if answer["failures"]:  # a deployment that could not be simulated (a policy's error): exit 2, as sweep does
        from blendsim.plan import failures_line

        typer.echo(f"blendsim: error: {failures_line(answer, first=as_json)}", err=True)
        raise typer.Exit(2)
    rec = answer.get("recommended") or {}
    if not (rec.get("meets_deadline") and rec.get("within_budget")):  # no deployment meets the job: exit 1, for scripts
        raise typer.Exit(1)


def _interrupted_line(out: Path | None, done: int) -> str:
    """What an interrupted plan says: how many simulations finished, and whether a rerun reuses them."""
    ran = f"{done} simulation(s) finished"
    if out is None:
        return f"plan: interrupted; {ran}, none kept (without -o a plan keeps nothing: give -o DIR to make it resumable)"
    return f"plan: interrupted; {ran}, those that succeeded kept in {out}/cells/ -- run the same command again to resume"


def _powers_note(**limits) -> list[str]:
    """A note where a --max-tp/--max-pp/--max-ep limit is no power of two: the search takes the powers of two up to it."""
    out = []
    for k, v in limits.items():
        if isinstance(v, int) and v > 0 and v & (v - 1):
            p = 1 << (v.bit_length() - 1)
            out.append(f"--max-{k} {v}: the search tries the powers of two up to it, {k.upper()} 1..{p}")
    return out


def _engine_notes(engines: str | None) -> list[str]:
    """What simulate notes of each engine asked for (a release beyond every modelled one), once each."""
    if not engines:
        return []
    from blendsim.options import parse_names
    from blendsim.runner import newer_than_modelled
    from blendsim.sim.engines import get_profile
    from blendsim.sim.errors import UserError

    out: list[str] = []
    try:
        names = parse_names(engines, "--engines", engines=True)
    except UserError:
        return []  # plan says what is wrong with them
    for e in names:
        try:
            out += [n for n in newer_than_modelled(get_profile(e, {})) if n not in out]
        except UserError:
            continue
    return out


HINT_SPACE = 2000  # a search space this large, unnarrowed, gets a line saying how to narrow it


class _Progress:
    """A spinner with a count on a terminal; a line every 10 simulations when piped."""

    def __init__(self, tty: bool, hint: bool = False):
        self.tty = tty
        self._bar = None
        self._hint = hint  # say once, on a large space, which options narrow it
        self.done = 0  # simulations finished so far (an interrupted plan says how many)

    def __enter__(self):
        if self.tty:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._bar = Progress(SpinnerColumn(), TextColumn("plan: {task.completed} simulations{task.fields[of]}, "
                                                             "last {task.description}"),
                                 TimeElapsedColumn(), transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task("-", total=None, of="")
        return self

    def update(self, done: int, key: str, at_most: int) -> None:  # required: the search then passes its size
        # the space's size: the search prunes most of it, and a sampled trace adds full-trace checks
        self.done = done
        of = f" ({at_most:,} deployments in the space)" if at_most else ""
        if self._hint and at_most > HINT_SPACE:
            self._hint = False
            typer.echo(f"plan: {at_most:,} deployments in the space; --hardware, --engines and --policies narrow it "
                       f"(each not given searches all)", err=True)
        if self._bar is not None:
            self._bar.update(self._task, completed=done, description=key, of=of)
        elif done % 10 == 0:
            typer.echo(f"plan: {done} simulations{of} (last: {key})", err=True)

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_cmd)
