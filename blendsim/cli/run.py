"""Commands of the simulator itself: ``cost`` (price one step), ``simulate`` and ``demo``."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from blendsim.options import check_seed, parse_opts

MODE_HELP = "Execution mode: sequential or overlap (default: the engine's -- overlap for nanoflow, else sequential)."
MODEL_HELP = "Model preset name (see `blendsim models`) or a HuggingFace config.json."
HW_HELP = "Hardware preset (see `blendsim hardware`)."
WEIGHTS_HELP = ("GEMM weight precision: bf16, fp16, fp8, fp4 or int4 (default: the model's; fp8/fp4 run at the "
                "device's FP8/FP4 tensor-core peak where it has one, int4 is dequantised to 16-bit; routed experts "
                "a checkpoint ships in their own precision keep it: gpt-oss's MXFP4).")
KV_DTYPE_HELP = "KV-cache dtype: bf16, fp16 or fp8 (default: the model's)."
SKEW_HELP = "MoE routing skew: 0 uniform, else the Zipf exponent of expert popularity."
EP_HELP = "Expert-parallel degree for MoE models (divides --tp; default 1: experts split like a dense MLP)."
# the fields an --engine key may override (sim.engines.OVERRIDABLE), for the help of every command taking --engine
KV_LOAD_HELP = "stall, overlap or async: how a tier load meets the step (default: the engine profile's)."
HOST_LINK_HELP = "Host link GB/s per GPU per direction (default: the hardware preset's, cited)."
DISK_READ_HELP = "NVMe read GB/s per GPU (default: the preset's, cited)."
DISK_WRITE_HELP = "NVMe write GB/s per GPU (default: the preset's, cited)."
ENGINE_FIELDS_HELP = ("fields fixed_s, per_seq_s, per_token_s, cuda_graph_max, serve (1: behind its API server), "
                      "server_token_s and server_request_s (that server's own work beside the engine, with serve=1), "
                      "async_scheduling (1: vLLM >= 0.10's), attn_dp (1: attention data-parallel over the TP "
                      "group, MoE models) override that profile (no NAME: from ideal)")
PP_HELP = ("Pipeline-parallel stages per replica (each --tp GPUs; a replica is --tp x --pp GPUs and runs --pp "
           "batches in flight; default 1).")


def cost_cmd(
    model: str = typer.Option("llama-3-8b", "--model", "-m", help=MODEL_HELP),
    hardware: str = typer.Option("a100-80gb", "--hardware", help=HW_HELP),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree: GPUs per pipeline stage (a replica is --tp x --pp GPUs)."),
    mode: str = typer.Option(None, "--mode", help=MODE_HELP),
    profile: Path = typer.Option(None, "--profile", help="Calibration profile JSON (default: roofline)."),
    prefill_tokens: int = typer.Option(0, "--prefill-tokens", help="New prompt tokens in the step (one chunk; give this "
                                          "and/or --decode-seqs)."),
    decode_seqs: int = typer.Option(0, "--decode-seqs", help="Decoding sequences in the step."),
    context: int = typer.Option(0, "--context", help="Context before each sequence's new tokens, in "
                                     "tokens."),
    engine: str = typer.Option("ideal", "--engine", help="Engine profile NAME[@VERSION][:field=value,...]: "
                               "ideal, vllm, vllm-v0, sglang, nanoflow, trtllm, deepspeed-fastgen, or a .json "
                               f"from blendsim calibrate engine; {ENGINE_FIELDS_HELP}."),
    dtype: str = typer.Option(None, "--dtype", help="Override the model's dtype (bf16, fp16, fp32 or fp8)."),
    weights: str = typer.Option(None, "--weights", help=WEIGHTS_HELP),
    kv_dtype: str = typer.Option(None, "--kv-dtype", help=KV_DTYPE_HELP),
    ep: int = typer.Option(1, "--ep", help=EP_HELP),
    pp: int = typer.Option(1, "--pp", help=PP_HELP),
    expert_skew: float = typer.Option(0.0, "--expert-skew", help=SKEW_HELP),
    token_budget: int = typer.Option(None, "--token-budget", help="Tokens of the largest step the engine plans "
                                                                 "memory for (default: the engine's)."),
    max_seqs: int = typer.Option(None, "--max-seqs", help="Sequences of the largest step the engine plans memory for "
                                                         "(default: the engine's)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Price one step and show its per-operator breakdown."""
    from blendsim.api import price_step

    out, rows, dep, cm = price_step(model, hardware, prefill_tokens=prefill_tokens, decode_seqs=decode_seqs,
                                    context=context, tp=tp, mode=mode, engine=engine, profile=profile, dtype=dtype,
                                    weights=weights, kv_dtype=kv_dtype, ep=ep, expert_skew=expert_skew, pp=pp,
                                    token_budget=token_budget, max_seqs=max_seqs)
    from blendsim.api import step_notes
    from blendsim.sim.deployment import split_label

    m = dep.model
    for note in step_notes(dep, cm, prefill_tokens, decode_seqs, context, expert_skew, out["max_seqs"]):
        typer.echo(f"note: {note}", err=True)
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    experts = f" (experts {m.expert_precision})" if m.expert_precision != m.weights else ""  # gpt-oss: MXFP4 experts
    prec = f"weights {m.weights}{experts}, KV {m.kv_dtype}"
    split = split_label(tp, pp, dep.ep)
    split += ", attention DP" if dep.dp > 1 else ""
    gpus = f"x{tp * pp}" + (f" ({split})" if split != f"TP{tp}" else "")
    t = Table(title=f"{m.name} on {dep.hardware.name} {gpus} ({prec}), {cm.mode}, {cm.timer_name}, engine {cm.engine.described}")
    for c in ("op", "scope", "GFLOP", "MB", "time (us)", "x layers (ms)"):
        t.add_column(c, justify="right" if c != "op" else "left")
    for r in rows:
        mult = r["layers"]
        scope = r["scope"] if mult in (1, m.num_layers) else f"{mult} layers"
        t.add_row(r["op"], scope, f"{r['flops'] / 1e9:.3f}", f"{r['bytes'] / 1e6:.3f}",
                  f"{r['time_s'] * 1e6:.1f}", f"{r['time_s'] * mult * 1e3:.3f}")
    c = Console()
    c.print(t)
    ms = {k: 1e3 * out[f"{k}_s"] for k in ("step_time", "compute", "memory", "other", "comm", "overhead", "server")}
    if ms["server"] and ms["server"] >= ms["step_time"]:  # the API server's pace, not the engine, sets the step
        c.print(f"step {ms['step_time']:.3f} ms: the API server's own work for it (streamed tokens and new requests, "
                f"beside the engine) outlasts the engine's {cm.mode} step of compute {ms['compute']:.3f}, memory "
                f"{ms['memory']:.3f}, other {ms['other']:.3f}, comm {ms['comm']:.3f} and engine {ms['overhead']:.3f} ms")
    elif cm.mode == "overlap":  # compute and memory share the SMs: the longer plus kappa of the shorter
        hi, lo = ("compute", "memory") if ms["compute"] >= ms["memory"] else ("memory", "compute")
        cmk = ms[hi] + cm.kappa * ms[lo] + cm.net * ms["comm"]
        comm = ("" if not ms["comm"] else f" + {cm.net:.3f} x comm {ms['comm']:.3f}" if cmk > ms["comm"] else
                f", under comm {ms['comm']:.3f} (the collectives, on their own SMs, are longer)")
        c.print(f"step {ms['step_time']:.3f} ms = {hi} {ms[hi]:.3f} + {cm.kappa:.3f} x {lo} {ms[lo]:.3f} (kappa: they "
                f"overlap){comm} + other {ms['other']:.3f} + engine {ms['overhead']:.3f} ms (overlap mode)")
    else:
        c.print(f"step {ms['step_time']:.3f} ms = compute {ms['compute']:.3f} + memory {ms['memory']:.3f} "
                f"+ other {ms['other']:.3f} + comm {ms['comm']:.3f} + engine {ms['overhead']:.3f} ms ({cm.mode} mode)")
        if ms["server"]:  # behind its server: that work runs beside the engine and sets the pace only above it
            c.print(f"the API server's own work for it (streamed tokens and new requests, beside the engine): "
                    f"{ms['server']:.3f} ms, shorter than the step, so it adds nothing")
    c.print("(operator classes, not what bounds them: compute = GEMMs and prompt attention, memory = decode "
            "attention and KV writes, other = norms, activations, rotary, embedding, comm = collectives; each "
            "operator is priced at the larger of its FLOP and byte times, so a decode step's weight-streaming GEMMs "
            "count as compute)", style="dim")
    if dep.pp > 1:
        for st in out["stages"]:
            c.print(f"stage {st['stage']} (layers {st['layers'][0]}-{st['layers'][1]}): "
                    f"{1e3 * st['step_time_s']:.3f} ms")
        paced = out["server_s"] > max(st["step_time_s"] for st in out["stages"])
        srv = f" (the API server's own work, {1e3 * out['server_s']:.3f} ms, paces the pipe)" if paced else ""
        c.print(f"hand-offs {', '.join(f'{1e3 * h:.3f} ms ({k})' for h, k in zip(out['handoff_s'], out['handoff_links']))}"
                f"; one batch in flight {1e3 * out['one_batch_in_flight_s']:.3f} ms, pipe full "
                f"{1e3 * out['pipe_full_step_s']:.3f} ms per step{srv}")


def simulate_cmd(
    trace: Path = typer.Argument(..., help="Trace Parquet file (see `blendsim workloads`)."),
    policy: str = typer.Option("fcfs", "--policy", "-p", help="Scheduling policy (see `blendsim policies`), or "
                                                             "your own: path/to/file.py:ClassName."),
    model: str = typer.Option("llama-3-8b", "--model", "-m", help=MODEL_HELP),
    hardware: str = typer.Option("a100-80gb", "--hardware", help=HW_HELP),
    replicas: int = typer.Option(1, "--replicas", help="Model replicas (data parallelism)."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree: GPUs per pipeline stage (a replica is --tp x --pp GPUs)."),
    mode: str = typer.Option(None, "--mode", help=MODE_HELP),
    profile: Path = typer.Option(None, "--profile", help="Calibration profile JSON (default: roofline)."),
    engine: str = typer.Option(None, "--engine", help="Engine profile NAME[@VERSION][:field=value,...] that "
                                                       "prices the run: ideal, vllm, vllm-v0, sglang, nanoflow, trtllm, deepspeed-fastgen "
                                                       "(scheduler defaults, overheads, CUDA graphs, fitted kernel "
                                                       "efficiencies; the policy's own settings apply on top and are "
                                                       "printed; explicit options win), or a .json from blendsim "
                                                       f"calibrate engine; {ENGINE_FIELDS_HELP}. Default: ideal, for "
                                                       "every policy, so runs compare in one report."),
    token_budget: int = typer.Option(None, "--token-budget", help="New tokens per step, chunked prefill "
                                                                  "(default: the policy's)."),
    max_seqs: int = typer.Option(None, "--max-seqs", help="Running sequences per replica, 0 = no cap "
                                                          "(default: the policy's)."),
    block_size: int = typer.Option(None, "--block-size", help="KV block size in tokens (default: the policy's, "
                                                              "else the engine's, 16 for most); prefix hits are whole "
                                                              "blocks."),
    round_tokens: int = typer.Option(None, "--round-tokens", help="Trim step sizes to multiples of this "
                                                                  "(NanoFlow: 128)."),
    mix: str = typer.Option(None, "--mix", help="decode-first (chunked prefill) or prefill-first."),
    admission: str = typer.Option(None, "--admission", help="reserve (admit a request only where memory also "
                                                            "covers its expected decode growth) or greedy (admit "
                                                            "while its prompt fits, preempt later; default: the "
                                                            "policy's, else the engine's)."),
    prefix_cache: bool = typer.Option(None, "--prefix-cache/--no-prefix-cache",
                                      help="Turn prefix caching on or off (default: the engine's, or on for a policy "
                                           "that orders for prefix reuse)."),
    no_prefix_retain: bool = typer.Option(False, "--no-prefix-retain",
                                          help="Free a cached prefix as soon as no running request uses it "
                                               "(only requests in memory together share)."),
    dtype: str = typer.Option(None, "--dtype", help="Override the model's dtype."),
    weights: str = typer.Option(None, "--weights", help=WEIGHTS_HELP),
    kv_dtype: str = typer.Option(None, "--kv-dtype", help=KV_DTYPE_HELP),
    ep: int = typer.Option(1, "--ep", help=EP_HELP),
    pp: int = typer.Option(1, "--pp", help=PP_HELP),
    expert_skew: float = typer.Option(0.0, "--expert-skew", help=SKEW_HELP),
    offline: bool = typer.Option(False, "--offline", help="Release every request at t=0."),
    seed: int = typer.Option(0, "--seed", help="Seed of every random choice."),
    record_schedule: bool = typer.Option(False, "--record-schedule",
                                         help="Also write schedule.parquet (the Batches, for replay)."),
    opt: list[str] = typer.Option(None, "--opt", help="Policy option key=value (repeatable)."),
    host_kv_gb: float = typer.Option(0.0, "--host-kv-gb", help="Host-memory KV tier per replica, GB (0: none): "
                                                             "evicted prefix blocks spill there and load back."),
    disk_kv_gb: float = typer.Option(0.0, "--disk-kv-gb", help="Local-NVMe KV tier per replica, GB (0: none), "
                                                             "below the host tier."),
    kv_load: str = typer.Option(None, "--kv-load", help=KV_LOAD_HELP),
    host_link_gbps: float = typer.Option(None, "--host-link-gbps", help=HOST_LINK_HELP),
    disk_read_gbps: float = typer.Option(None, "--disk-read-gbps", help=DISK_READ_HELP),
    disk_write_gbps: float = typer.Option(None, "--disk-write-gbps", help=DISK_WRITE_HELP),
    out: Path = typer.Option(..., "-o", "--out", help="Run directory to write."),
    force: bool = typer.Option(False, "--force", help="Replace an -o run directory made from another trace."),
    as_json: bool = typer.Option(False, "--json", help="Print summary.json instead of a table."),
) -> None:
    """Simulate TRACE under a policy and write RUN_DIR/{summary.json, steps.parquet, requests.parquet}."""
    import sys

    from blendsim.runner import RunConfig, check_run_dir, run_simulation, write_run
    from blendsim.sim.rundir import file_sha256
    from blendsim.workloads.trace import read_trace

    check_seed(seed)
    t = read_trace(trace)
    digest = file_sha256(trace)
    check_run_dir(out, digest, force, inputs=[trace, profile])
    cfg = RunConfig(policy=policy, model=model, hardware=hardware, tp=tp, replicas=replicas, mode=mode,
                    engine=engine, profile=str(profile) if profile else None, dtype=dtype,
                    weights=weights, kv_dtype=kv_dtype, ep=ep, pp=pp, expert_skew=expert_skew,
                    token_budget=token_budget, max_seqs=max_seqs, block_size=block_size,
                    round_tokens=round_tokens, mix=mix, admission=admission, prefix_caching=prefix_cache,
                    prefix_retain=False if no_prefix_retain else None, offline=offline, seed=seed, record_schedule=record_schedule, options=parse_opts(opt),
                    host_kv_gb=host_kv_gb, disk_kv_gb=disk_kv_gb, kv_load=kv_load, host_link_gbps=host_link_gbps,
                    disk_read_gbps=disk_read_gbps, disk_write_gbps=disk_write_gbps)
    spill = next(p for p in Path(out).resolve().parents if p.is_dir())  # the step log's rows, as the run goes
    result = _with_progress(lambda progress: run_simulation(t, cfg, progress, spill_dir=spill), t.n,
                            sys.stderr.isatty())
    result.summary["trace_sha256"] = digest  # which trace made the run (-o refuses another without --force)
    write_run(result, out)
    for note in result.notes:
        typer.echo(f"note: {note}", err=True)
    if as_json:
        from blendsim.sim.expected import of_summary
        from blendsim.sim.metrics import critical_path_warning
        from blendsim.sim.rundir import json_safe

        x = of_summary(result.summary)  # not part of the run's record: the same run is re-judged after a refit
        if x:
            typer.echo(f"note: {x['line']}", err=True)
        warn = critical_path_warning(result.summary)  # stdout stays pure JSON: the warning goes beside it
        if warn:
            typer.echo(f"warning: {warn}", err=True)
        typer.echo(json.dumps(json_safe(result.summary), indent=2, sort_keys=True, allow_nan=False))
    else:
        print_summary(result.summary, out)


def _with_progress(fn, total: int, show: bool):
    if not show:
        return fn(None)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("simulating"), BarColumn(), TextColumn("{task.completed}/{task.total} requests"),
                  TimeElapsedColumn(), transient=True) as bar:
        task = bar.add_task("sim", total=total)
        return fn(lambda done: bar.update(task, completed=done))


def print_summary(s: dict, out: Path | None = None) -> None:
    from blendsim.plan.prices import run_cost_line
    from blendsim.reports.terminal import print_run_summary

    print_run_summary(s, out, cost=run_cost_line(s))


def policies_cmd(name: str = typer.Argument(None, help="A policy: show its options, defaults and their sources.")) -> None:
    """List the scheduling policies; with NAME, that policy's options."""
    from blendsim.reports.terminal import print_policies

    print_policies(name)


def demo_cmd(
    out: Path = typer.Option(Path("blendsim-demo"), "-o", "--out", help="Folder for the trace, runs and report."),
    requests: int = typer.Option(40_000, "--requests", help="Requests in the synthetic workload (BlendServe "
                                                            "App. A.3's size; small traces are dominated by "
                                                            "their longest video's decode)."),
    density: float = typer.Option(1.1, "--density", help="Compute density rho of the workload."),
    sharing: float = typer.Option(0.35, "--sharing", help="Optimal prefix sharing ratio of the workload."),
    seed: int = typer.Option(0, "--seed", help="Seed of the workload and the policies."),
) -> None:
    """Synthesise a BlendServe workload and compare policies side by side on one engine (under a minute)."""
    from blendsim.demo import print_table, run_demo

    check_seed(seed)
    r = run_demo(out, requests=requests, density=density, sharing=sharing, seed=seed, echo=typer.echo)
    print_table(r["summaries"])
    typer.echo(f"runs in {out}/runs/" + (f"; report: {r['report']}" if r["report"] else ""))


def register(app: typer.Typer) -> None:
    app.command("cost")(cost_cmd)
    app.command("simulate")(simulate_cmd)
    app.command("policies")(policies_cmd)
    app.command("demo")(demo_cmd)
