"""``blendsim sweep``: a density x sharing grid of workloads, every policy on each, one results table."""

from __future__ import annotations

from pathlib import Path

import typer

from blendsim.cli.run import (
    DISK_READ_HELP,
    DISK_WRITE_HELP,
    ENGINE_FIELDS_HELP,
    HOST_LINK_HELP,
    KV_LOAD_HELP,
    MODE_HELP,
)
from blendsim.sweep.grid import DEFAULT_POLICIES


def sweep_cmd(
    out: Path = typer.Option(..., "-o", "--out", help="Sweep directory (created, or resumed when it exists)."),
    recipe: str = typer.Option("blendserve", "--recipe", help="Workload recipe with density and sharing options."),
    densities: str = typer.Option("0.80:1.40:0.05", "--densities",
                                  help="Compute densities: start:stop:step (inclusive) or a comma list."),
    sharing: str = typer.Option("0.05:0.45:0.10", "--sharing",
                                help="Optimal prefix sharing ratios: start:stop:step (inclusive) or a comma list."),
    policies: str = typer.Option(None, "--policies",
                                 help=f"Comma list of policies (default: those of {','.join(DEFAULT_POLICIES)} "
                                      "that are registered; see `blendsim policies`); your own as "
                                      "path/to/file.py:ClassName; a policy's options as NAME[key=value,...], e.g. "
                                      "'dfs,dfs[router=contiguous]' (each its own cells)."),
    models: str = typer.Option("llama-3-8b", "--models", "-m", help="Comma list of model presets or config.json paths."),
    hardware: str = typer.Option("a100-80gb", "--hardware", help="Comma list of hardware presets."),
    weights: str = typer.Option(None, "--weights", help="GEMM weight precision of every model: bf16, fp16, fp8, "
                                                        "fp4 or int4 (default: each model's)."),
    kv_dtype: str = typer.Option(None, "--kv-dtype", help="KV-cache dtype: bf16, fp16 or fp8 (default: each "
                                                          "model's)."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree: GPUs per pipeline stage (a replica is --tp x --pp GPUs; default 1)."),
    ep: int = typer.Option(1, "--ep", help="Expert-parallel degree for MoE models (default 1)."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel stages per replica (default 1)."),
    replicas: int = typer.Option(1, "--replicas", help="Model replicas (data parallelism) of every cell; a "
                                                      "workload's density is of one replica."),
    requests: int = typer.Option(40_000, "--requests", help="Requests per workload (BlendServe App. A.3: 40,000)."),
    mode: str = typer.Option(None, "--mode", help=MODE_HELP),
    engine: str = typer.Option(None, "--engine", help="Engine profile NAME[@VERSION][:field=value,...] (trtllm, vllm, "
                                                      "vllm-v0, sglang, nanoflow, deepspeed-fastgen: scheduler "
                                                      "defaults, overheads, CUDA graphs, fitted kernel efficiencies; "
                                                      "policies keep their ordering), a .json from blendsim calibrate "
                                                      "engine, or ideal: one engine for every policy (default: ideal); "
                                                      f"{ENGINE_FIELDS_HELP}."),
    engine_of: str = typer.Option(None, "--engine-of", help="Run every policy on this policy's declared scheduler "
                                                            "settings (token budget, block size, rounding), so only "
                                                            "the scheduling differs (default: each its own)."),
    recipe_opt: list[str] = typer.Option(None, "--recipe-opt", help="Further recipe option key=value "
                                                                    "(e.g. source=azure-conv; repeatable)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the workloads and the policies."),
    host_kv_gb: float = typer.Option(0.0, "--host-kv-gb", help="Host-memory KV tier per replica, GB (0: none)."),
    disk_kv_gb: float = typer.Option(0.0, "--disk-kv-gb", help="Local-NVMe KV tier per replica, GB (0: none)."),
    kv_load: str = typer.Option(None, "--kv-load", help=KV_LOAD_HELP),
    host_link_gbps: float = typer.Option(None, "--host-link-gbps", help=HOST_LINK_HELP),
    disk_read_gbps: float = typer.Option(None, "--disk-read-gbps", help=DISK_READ_HELP),
    disk_write_gbps: float = typer.Option(None, "--disk-write-gbps", help=DISK_WRITE_HELP),
    jobs: int = typer.Option(None, "--jobs", "-j", help="Cells in parallel (local: worker processes, default: "
                                                        "CPU count; ray: tasks in flight, default: cluster CPUs)."),
    backend: str = typer.Option("local", "--backend", help="local (process pool) or ray (a Ray cluster)."),
    ray_address: str = typer.Option(None, "--ray-address", help="Ray cluster to use (e.g. ray://head:10001 "
                                                                "or auto; default: a local Ray for this run)."),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Keep finished cells of an earlier run "
                                                                  "of this sweep (--no-resume starts over)."),
    fixed_trace: bool = typer.Option(None, "--fixed-trace/--trace-per-model",
                                     help="Synthesise each grid point once, for the first model and hardware, and "
                                          "run that one trace everywhere, so models and hardware are compared on "
                                          "the same job (default: on when --models or --hardware lists more than "
                                          "one), or a trace per model and hardware that hits the grid's density "
                                          "on each."),
    seeds: int = typer.Option(1, "--seeds", help="Replicates per grid point (seeds --seed, --seed + 1, ...: "
                                                 "trace and policies); the report shows a 95% confidence "
                                                 "interval of each policy's throughput and speedup."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar or progress lines on stderr."),
) -> None:
    """Simulate every policy on a density x sharing grid of synthetic workloads; write OUT/results.parquet.

    Each cell (workload x policy x model x hardware) is a run directory under OUT/runs/; an
    interrupted sweep resumes where it stopped. Compare the policies with `blendsim report OUT`.
    """
    from blendsim.options import parse_names, parse_opts
    from blendsim.progress import Progress
    from blendsim.sim.errors import UserError
    from blendsim.sweep.backends import make_backend
    from blendsim.sweep.driver import describe, failure_line, run_sweep
    from blendsim.sweep.grid import (
        SweepSpec,
        default_policies,
        parse_values,
        precision_settings,
        tier_settings,
    )
    from blendsim.sweep.spec_check import check_spec
    from blendsim.sweep.store import check_sweep_dir

    if seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {seeds}")
    if jobs is not None and jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {jobs}")
    spec = check_spec(SweepSpec(
        recipe=recipe, densities=parse_values(densities, "--densities"), sharing=parse_values(sharing, "--sharing"),
        policies=parse_names(policies, "--policies") if policies is not None else default_policies(),
        models=parse_names(models, "--models"), hardware=parse_names(hardware, "--hardware"), requests=requests,
        mode=mode, engine=engine, engine_of=engine_of, seed=seed, recipe_options=parse_opts(recipe_opt, "--recipe-opt"),
        precision=precision_settings(weights, kv_dtype, tp, ep, pp, replicas), fixed_trace=fixed_trace, seeds=seeds,
        tiers=tier_settings(host_kv_gb=host_kv_gb, disk_kv_gb=disk_kv_gb, kv_load=kv_load,
                            host_link_gbps=host_link_gbps, disk_read_gbps=disk_read_gbps,
                            disk_write_gbps=disk_write_gbps)))
    check_sweep_dir(out, spec, resume)  # before a Ray cluster is started for nothing
    be = make_backend(backend, jobs, ray_address)
    n = len(spec.cells())
    if spec.fixed and len(spec.models) * len(spec.hardware) > 1:
        typer.echo(f"sweep: one trace per grid point, synthesised for {spec.settings()['fixed_trace']} and run on "
                   f"every model and hardware (--trace-per-model for a trace of each's own density)")
    typer.echo(f"sweep: {len(spec.workloads())} workload(s) x {len(spec.policies)} polic{'y' if len(spec.policies) == 1 else 'ies'}"
               f" = {n} cells, {spec.requests} requests each, {backend} backend, {be.capacity} in parallel")
    for line in policy_notes(spec):  # what each policy declares over the engine, as simulate prints it
        typer.echo(f"note: {line}", err=True)
    if spec.engine:  # a calibrated profile on another GPU than its own, as simulate says it
        from blendsim.runner import calibrated_elsewhere
        from blendsim.sim.engines import get_profile

        for hw in spec.hardware:
            for line in calibrated_elsewhere(get_profile(spec.engine), hw):
                typer.echo(f"note: {line}", err=True)
    try:
        with Progress("sweep", unit="cells", quiet=quiet) as bar:
            outcome = run_sweep(spec, out, be, resume=resume, progress=lambda done, total: bar.update(done, total))
    except KeyboardInterrupt:
        typer.echo(f"blendsim: interrupted; finished cells are kept in {out}/runs/ -- run the same command "
                   f"again to resume", err=True)
        from blendsim.sim.signals import interrupt_exit_code

        raise typer.Exit(interrupt_exit_code()) from None
    if outcome.write_error:
        raise UserError(f"{outcome.write_error}; the {outcome.ran + outcome.skipped} finished cell(s) are kept in "
                        f"{out}/runs/ -- make {out} writable and run the same command again")
    typer.echo(describe(outcome))
    if outcome.failures:
        if all(f["user_error"] for f in outcome.failures):
            first = outcome.failures[0]  # the cell the error line names, else the first with a traceback
            tb = first.get("traceback") or next((f["traceback"] for f in outcome.failures if f.get("traceback")), None)
            # the cell's user code (a policy) failed in a worker: its traceback is the cause --debug prints
            raise UserError(failure_line(outcome)) from (CellTraceback(tb) if tb else None)
        typer.echo(f"blendsim: error: {failure_line(outcome)}", err=True)
        raise typer.Exit(1)
    from blendsim.reports.terminal import err_console, say, sweep_warnings

    err = err_console()  # wrapped on words at the terminal's width
    for line in sweep_warnings(out):
        say(err, f"warning: {line}", 0)
    typer.echo(f"compare the policies: blendsim report {out} -o {out}/report")


class CellTraceback(Exception):
    """The traceback of a user's code that failed in a sweep worker, as text (the worker's exception is not
    sent back): the cause of the sweep's one-line error, which ``--debug`` prints."""

    def __str__(self) -> str:
        return "a cell's traceback, in its worker:\n" + str(self.args[0]).rstrip()


__all__ = ["sweep_cmd"]


def policy_notes(spec) -> list[str]:
    """The scheduler settings each policy of ``spec`` changes over its engine (on the first model and GPU),
    each once: ``simulate``'s notes, before the cells run."""
    from blendsim.policies.registry import resolve_policy
    from blendsim.runner import inert_tier_options, newer_than_modelled, scheduler_settings
    from blendsim.sim.engines import DEFAULT_ENGINE, get_profile
    from blendsim.sim.errors import UserError

    # an engine release beyond every modelled one: said once, as simulate says it (check_spec has checked the engine)
    out: list[str] = newer_than_modelled(get_profile(spec.engine or DEFAULT_ENGINE, {}))
    for p in spec.policies:
        try:
            cfg = spec.run_config(p, spec.models[0], spec.hardware[0])
            _, notes = scheduler_settings(cfg, resolve_policy(cfg.policy).cls)
        except UserError:
            continue  # the cells say what is wrong with it
        out += [n for n in notes + inert_tier_options(cfg) if n not in out]
    return out
