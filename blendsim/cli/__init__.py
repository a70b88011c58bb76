"""The ``blendsim`` command line (typer): the application layer owns every command.

Every typer command lives in this package, one module per feature area (``run``: cost, simulate,
policies, demo; ``workloads``; ``calibrate``; ``validate``; ``sweep``; ``reports``: report;
``fidelity``), with the shared pieces in ``kit``; they are mounted on one app here. Nothing outside
``blendsim.cli`` imports typer or a command module. Command bodies import their heavy modules lazily so
``blendsim --help`` and short commands start fast. A :class:`blendsim.sim.errors.UserError` anywhere ends the command with one line on
stderr and exit code 2.
"""

from __future__ import annotations

import json

import typer

from blendsim.cli.kit import UserErrorGroup

app = typer.Typer(
    name="blendsim",
    cls=UserErrorGroup,
    help="Simulate, calibrate and compare schedulers for offline batch LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    # help wraps at the terminal's width (COLUMNS when piped), not click's 80-column cap
    context_settings={"max_content_width": 200},
)


def _version(value: bool) -> None:
    if value:
        from blendsim.sim import __version__, _compiled

        typer.echo(f"blendsim {__version__}; {_compiled.describe()}")
        raise typer.Exit()


@app.callback()
def _root(ctx: typer.Context,
          debug: bool = typer.Option(False, "--debug", help="When your own policy or router fails, also print "
                                     "its full traceback (or set BLENDSIM_DEBUG=1)."),
          version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and which step path runs (compiled or pure "
                                       "Python; BLENDSIM_PURE_PYTHON=1 forces Python), and exit.")) -> None:
    """Simulate, calibrate and compare schedulers for offline batch LLM inference."""
    from blendsim.cli.kit import DEBUG_KEY

    ctx.meta[DEBUG_KEY] = debug


def _mount() -> None:
    from blendsim.cli.calibrate import register as register_calibrate
    from blendsim.cli.fidelity import register as register_fidelity
    from blendsim.cli.reports import register as register_reports
    from blendsim.cli.run import register as register_run
    from blendsim.cli.sweep import sweep_cmd
    from blendsim.cli.validate import register as register_validate
    from blendsim.cli.workloads import app as workloads_app

    app.add_typer(workloads_app, name="workloads", help="Synthesise, load and inspect request traces.")
    register_run(app)
    register_calibrate(app)
    register_validate(app)
    app.command("sweep")(sweep_cmd)
    register_reports(app)
    register_fidelity(app)
    from blendsim.cli.plan import register as register_plan

    register_plan(app)


@app.command("models")
def models_cmd(
    model: str = typer.Argument(None, help="A preset name or a HuggingFace config.json (default: list the presets)."),
    weights: str = typer.Option(None, "--weights", help="GEMM weight precision: bf16, fp16, fp8, fp4, int4."),
    kv_dtype: str = typer.Option(None, "--kv-dtype", help="KV-cache dtype: bf16, fp16, fp8."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the model presets, or print every derived figure of one model (parameters, active parameters,
    KV bytes per token in the chosen KV dtype, experts, MLA ranks)."""
    from blendsim.sim.models import PRESETS, get_model

    if model is not None:
        d = get_model(model, None, weights, kv_dtype).derived()
        if as_json:
            typer.echo(json.dumps(d, indent=2))
            return
        _print_fields(d, f"{d['name']}")
        return
    specs = [m.with_precision(weights, kv_dtype) if (weights or kv_dtype) else m for m in PRESETS.values()]
    if as_json:
        typer.echo(json.dumps([m.derived() for m in specs], indent=2))
        return
    rows = [{"name": m.name, "params": f"{m.params_total / 1e9:.1f}B", "active": f"{m.params_active / 1e9:.1f}B",
             "L": str(m.num_layers),
             "experts": f"{m.num_experts}{f'+{m.num_shared_experts}' if m.num_shared_experts else ''}"
                        f"/{m.experts_per_token}" if m.is_moe else "-",
             "heads": "MLA" if m.is_mla else f"{m.num_heads}/{m.num_kv_heads}",
             "weights": f"{m.expert_weights}*" if m.expert_weights else m.weights,
             "KV KiB": _kib(m.kv_bytes_per_token)} for m in specs]
    _print_rows(rows, "Model presets", "L: layers; experts: routed+shared/top-k; heads: query/KV heads (MLA: latent KV); "
                "weights: GEMM weights (*: the routed experts', the rest in the dtype); KV KiB: KV cache per token in the KV "
                "dtype (sliding-window layers: a window per sequence, not per token); every field: blendsim models NAME")


@app.command("hardware")
def hardware_cmd(
    name: str = typer.Argument(None, help="A preset to show in full, with its sources (default: list them)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the hardware presets: dense tensor-core peaks per precision, HBM, memory and interconnect."""
    from blendsim.sim.hardware import PRESETS, get_hardware

    if name is not None:
        h = get_hardware(name)
        if as_json:
            typer.echo(json.dumps(h.to_dict(), indent=2))
            return
        _print_fields(h.to_dict(), h.name)
        return
    if as_json:
        typer.echo(json.dumps([h.to_dict() for h in PRESETS.values()], indent=2))
        return

    def tf(x: float) -> str:
        return (f"{x / 1e12:,.0f}" if x >= 1e13 else f"{x / 1e12:.1f}") if x else "-"

    rows = [{"name": h.name, "BF16": tf(h.peak_flops), "FP8": tf(h.peak_flops_fp8), "FP4": tf(h.peak_flops_fp4),
             "HBM GB/s": f"{h.mem_bandwidth / 1e9:,.0f}", "mem GiB": f"{h.memory_bytes / 2**30:.0f}",
             "link GB/s": f"{h.link_bandwidth / 1e9:,.0f}" if h.link_bandwidth else "-"} for h in PRESETS.values()]
    _print_rows(rows, "Hardware presets", "dense tensor-core TFLOP/s per precision (- : none; FP8/FP4 then run "
                "dequantised at the BF16 peak); link: per direction; sources: blendsim hardware NAME")


@app.command("engines")
def engines_cmd(
    name: str = typer.Argument(None, help="An engine, NAME[@VERSION][:field=value,...] or a calibrated profile "
                               ".json: every mechanic and constant of the profile that prices it, with its sources "
                               "(default: list the profiles)."),
    hardware: str = typer.Option(None, "--hardware", help="With NAME: also what the engine sets on this GPU (its "
                                 "batch limits, KV fraction, CUDA-graph sizes)."),
    model: str = typer.Option(None, "--model", "-m", help="With NAME and --hardware: also the KV pool and the "
                              "requests the engine runs at once for this model."),
    tp: int = typer.Option(1, "--tp", help="With --hardware: the tensor-parallel degree of one replica."),
    pp: int = typer.Option(1, "--pp", help="With --hardware: the pipeline-parallel degree of one replica."),
    dtype: str = typer.Option(None, "--dtype", help="With --model: its activation dtype, as simulate takes it."),
    weights: str = typer.Option(None, "--weights", help="With --model: its GEMM weight precision, as simulate "
                                "takes it."),
    kv_dtype: str = typer.Option(None, "--kv-dtype", help="With --model: its KV-cache dtype, as simulate takes it."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the modelled engine profiles (NAME@VERSION): the releases each prices, its scheduler defaults and its
    per-step CPU loop as fitted; with NAME, every mechanic of the one it selects and where each comes from, and with
    --hardware (and --model) what it sets on that deployment."""
    from blendsim.sim.engines import (
        VERSIONS,
        describe_profile,
        get_profile,
        load_params,
        next_release,
        scheduler_left_open,
        version_order,
    )
    from blendsim.sim.errors import UserError

    params = load_params()
    if name is None and (hardware or model):
        raise UserError("engines: --hardware and --model describe one engine: give NAME (blendsim engines vllm "
                        "--hardware h100-80gb)")
    if model and not hardware:
        raise UserError("engines: --model needs --hardware (the GPU the model's KV pool is sized on)")
    if (dtype or weights or kv_dtype) and not model:
        raise UserError("engines: --dtype, --weights and --kv-dtype describe a --model; give one")
    if (tp != 1 or pp != 1) and not hardware:
        raise UserError("engines: --tp and --pp size a replica on a GPU: give --hardware too (blendsim engines vllm "
                        "--hardware h100-80gb --tp 4)")
    if name is not None:
        from blendsim.runner import newer_than_modelled

        prof = get_profile(name, params)
        d = describe_profile(prof, params)
        for line in newer_than_modelled(prof):  # a release beyond every modelled one: said, as simulate says it
            if as_json:
                d["note"] = line
            else:
                typer.echo(f"note: {line}", err=True)
        if hardware:
            d.update(_engine_on(prof, name, hardware, model, tp, pp, dtype, weights, kv_dtype))
        if as_json:
            typer.echo(json.dumps(d, indent=2))
            return
        _print_fields(d, d["engine"])
        return
    keys = sorted(VERSIONS, key=lambda nv: (nv[0], version_order(nv[1])))
    profs = [get_profile(f"{n}@{v}" if v else n, params) for n, v in keys]
    profiles = [describe_profile(prof, params) for prof in profs]
    if as_json:
        typer.echo(json.dumps(profiles, indent=2))
        return

    def until(name: str, version: str) -> str:
        return next_release(name, version) or "newest" if version else "-"

    def loop(d: dict) -> str:
        us = d["per_seq_s"] * 1e6
        return f"{d['fixed_s'] * 1e3:.2f}+{us:.{0 if us >= 10 else 1}f}" + ("*" if d["loop"].startswith("fitted") else "")

    def row(nv, prof, d: dict) -> dict:
        sched = {**scheduler_left_open(prof), **prof.scheduler}  # the profile's, else blendsim's default it leaves open
        return {"engine": d["engine"], "until": until(*nv), "loop": loop(d),
                "budget": "bench" if "limits_tuned_by" in d else "by GPU" if "token_budget_by_memory" in d
                else str(sched.get("token_budget") or "-"),
                "seqs": "bench" if "limits_tuned_by" in d else "pool" if "max_running" in d
                else str(sched.get("max_seqs") or "-"),
                "prefix": "yes" if sched.get("prefix_caching") else "no",
                "graphs": "by GPU" if "cuda_graph_max_by_memory" in d else str(d["cuda_graph_max"] or "eager")}

    rows = [row(nv, prof, d) for nv, prof, d in zip(keys, profs, profiles)]
    _print_rows(rows, "Engine profiles", "until: the next modelled release -- NAME@VERSION prices every release from "
                "its VERSION until that one, and NAME alone selects the newest; "
                "loop: the per-step CPU work the GPU waits for, offline, ms fixed + us per running sequence (*: fitted "
                "to the fidelity catalogue, else its cited prior); budget, seqs: most tokens and sequences a step "
                "(some engines take more on GPUs of 70 GiB and more; by GPU: by device memory; bench: trtllm-bench sets both "
                "from the dataset; pool: as many as the "
                "engine's request pool holds, from the KV pool and the model's context; -: no cap but the KV pool; "
                "what a profile leaves open shows blendsim's default); prefix: prefix caching on; "
                "graphs: largest CUDA-graph decode batch (by GPU: by device memory and TP); every field with its "
                "source: blendsim engines NAME@VERSION")


def _engine_on(prof, name: str, hardware: str, model: str | None, tp: int, pp: int, dtype: str | None = None,
               weights: str | None = None, kv_dtype: str | None = None) -> dict:
    """What the engine sets on one deployment (``blendsim engines NAME --hardware H [--model M]``), as `simulate` would
    size it under fcfs: its batch limits and KV fraction, its CUDA-graph sizes, and with a model its KV pool and the
    requests it runs at once."""
    from blendsim.policies.registry import resolve_policy
    from blendsim.runner import RunConfig, run_limits, running_from_pool
    from blendsim.sim import checks as C
    from blendsim.sim.deployment import make_deployment
    from blendsim.sim.engines import require_pipeline, sizes_text
    from blendsim.sim.hardware import get_hardware

    C.integer(tp, "--tp", 1, C.MAX_GPUS)
    C.integer(pp, "--pp", 1, C.MAX_GPUS)
    require_pipeline(prof, pp)  # what simulate and cost refuse is not sized here either
    hw = get_hardware(hardware)
    where = f"on {hw.name} TP{tp}" + (f" x PP{pp}" if pp > 1 else "") + (f", {model}" if model else "")
    out = {"deployment": where.removeprefix("on ")}
    if not model:
        sched = prof.scheduler_for(hw, tp=tp, pp=pp)
        out.update({f"here.{k}": v for k, v in sched.items() if k in ("token_budget", "max_seqs",
                                                                        "gpu_memory_utilization")})
        sizes = prof.graph_sizes(hw, tp)
    else:
        cfg = RunConfig(policy="fcfs", engine=name, hardware=hardware, model=model, tp=tp, pp=pp, dtype=dtype,
                        weights=weights, kv_dtype=kv_dtype)
        eng, limits = run_limits(cfg)
        dep = make_deployment(model, hardware, tp, dtype, weights, kv_dtype, pp=pp, **limits)
        eng = running_from_pool(eng, prof, dep, cfg, resolve_policy("fcfs").cls)
        out.update({"here.token_budget": eng.token_budget, "here.max_seqs": eng.max_seqs or "no cap",
                    "here.gpu_memory_utilization": eng.gpu_memory_utilization,
                    "here.kv_tokens": dep.kv_capacity_tokens})
        sizes = prof.graph_sizes_for(dep)
    out["here.cuda_graph_sizes"] = sizes_text(sizes, 12, 6, 3) if sizes else "none (eager)"
    return out


def _kib(n: float) -> str:
    return f"{n / 1024:,.1f}"


def _print_fields(d: dict, title: str) -> None:
    from rich.console import Console
    from rich.table import Table, box

    table = Table(title=title, box=box.SIMPLE_HEAD, show_header=False)
    table.add_column("field", no_wrap=True)
    table.add_column("value", overflow="fold")
    for k, v in d.items():
        table.add_row(k, _field_text(k, v))
    Console().print(table)


def _field_text(k: str, v) -> str:
    """A preset's field as a reader takes it: its unit from its name (FLOP/s, bytes/s, bytes, seconds), the raw
    value beside it; lists joined with commas."""
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    raw = f"{v:,}" if isinstance(v, int) and abs(v) >= 10_000 else f"{v:.4g}" if isinstance(v, float) else str(v)
    if not v:
        return raw
    if "flops" in k:
        return f"{v / 1e12:,.1f} TFLOP/s ({raw})"
    if k.endswith("bandwidth"):
        return f"{v / 1e9:,.1f} GB/s ({raw})"
    if k.endswith("bytes"):
        return f"{v / 2**30:,.1f} GiB ({raw})"
    if k.endswith("_s"):
        if v < 1e-6:
            return f"{v * 1e9:,.1f} ns ({raw})"
        if v < 1e-3:
            return f"{v * 1e6:,.1f} us ({raw})"
        return f"{v * 1e3:,.2f} ms ({raw})" if v < 1 else f"{v:,.3f} s"
    return raw


def _print_rows(rows: list[dict], title: str, legend: str = "") -> None:
    from rich.console import Console
    from rich.table import Table, box

    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for i, k in enumerate(rows[0]):
        table.add_column(k, no_wrap=True, justify="left" if i == 0 else "right")
    for r in rows:
        table.add_row(*(str(v) for v in r.values()))
    c = Console()
    c.print(table)
    if legend:
        c.print(legend, soft_wrap=False)


def get_app() -> typer.Typer:
    """The app with every feature's commands mounted (tests use this with typer's CliRunner)."""
    if not getattr(app, "_mounted", False):
        _mount()
        app._mounted = True
    return app


def main(argv: list[str] | None = None) -> None:
    """Console entry point. Every error ends in one line on stderr: a UserError (exit 2, see
    UserErrorGroup) and also the command line's own usage errors — a bad option value, an unknown
    option or command — which click would print as usage, hint and message on three lines (exit 2)."""
    import sys

    from blendsim.sim.signals import interrupt_exit_code, terminate_as_interrupt

    try:
        with terminate_as_interrupt():  # SIGTERM ends a command as Ctrl-C does: workers stopped, work kept
            rc = get_app()(args=argv, prog_name="blendsim", standalone_mode=False)
        if rc == 130:  # typer's exit code for an interrupt: 143 where a SIGTERM raised it
            rc = interrupt_exit_code()
    except KeyboardInterrupt:  # one outside typer's own handling (start-up, command building): as quiet
        sys.exit(interrupt_exit_code())
    except typer.Abort:
        typer.echo("blendsim: aborted", err=True)
        sys.exit(1)
    except typer.TyperException as e:  # click's usage errors (UsageError is not public in typer)
        if type(e).__name__ == "NoArgsIsHelpError":  # a bare group: its help, as click shows it
            e.show()
            sys.exit(e.exit_code)
        ctx = getattr(e, "ctx", None)
        path = ctx.command_path if ctx is not None else "blendsim"
        where = path.partition(" ")[2]
        msg = " ".join(e.format_message().split())
        typer.echo(f"blendsim: error: {where + ': ' if where else ''}{msg} (see '{path} --help')", err=True)
        sys.exit(e.exit_code)
    sys.exit(rc if isinstance(rc, int) and not isinstance(rc, bool) else 0)
