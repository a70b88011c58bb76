"""``blendsim validate``: replay the simulator's schedule on a real device and compare step times."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def validate_cmd(
    trace: Path = typer.Argument(..., help="Trace Parquet file (keep it small: every step runs on the device)."),
    policy: str = typer.Option(None, "--policy", "-p", help="Scheduling policy (see `blendsim policies`), or "
                                                           "your own: path/to/file.py:ClassName (default: fcfs)."),
    policies: str = typer.Option(None, "--policies", help="Comma-separated policies; with two or more, the error "
                                                          "of the predicted speedup over the first is reported."),
    model: str = typer.Option("tiny", "--model", "-m", help="Model preset or HuggingFace config.json (random "
                                                            "weights, nothing is downloaded)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda (cuda:N)."),
    profile: Path = typer.Option(None, "--profile", help="Calibration profile JSON of this device and model "
                                                         "(default: the roofline)."),
    hardware: str = typer.Option(None, "--hardware", help="Hardware preset for the simulation (default: cpu, or "
                                                          "guessed from the GPU's name)."),
    dtype: str = typer.Option(None, "--dtype", help="Override the model's dtype (fp32, bf16, fp16)."),
    engine: str = typer.Option("ideal", "--engine", help="Engine overhead the simulator adds; the measured "
                                                         "forward has none, so keep ideal to compare kernels."),
    mode: str = typer.Option(None, "--mode", help="Execution mode of the cost model (default: the engine's)."),
    replicas: int = typer.Option(1, "--replicas", help="Replicas to simulate (replayed one after another)."),
    max_steps: int = typer.Option(None, "--max-steps", help="Replay at most this many steps per replica."),
    repeats: int = typer.Option(None, "--repeats", help="Forwards per step, median kept (default 3 on CPU, "
                                                        "1 on CUDA); re-running a step is idempotent."),
    op_every: int = typer.Option(8, "--op-every", help="Time every operator on every n-th step (0: never)."),
    threads: int = typer.Option(None, "--threads", help="CPU threads (default: the profile's, else 1)."),
    token_budget: int = typer.Option(None, "--token-budget", help="New tokens per step (default: the policy's)."),
    max_seqs: int = typer.Option(None, "--max-seqs", help="Running sequences per replica (default: the policy's)."),
    block_size: int = typer.Option(None, "--block-size", help="KV block size in tokens (default: the policy's)."),
    gpu_mem: float = typer.Option(None, "--gpu-memory-utilization", help="Fraction of device memory the "
                                                                         "simulated engine may use."),
    device_memory_gb: float = typer.Option(0.0, "--device-memory-gb", hidden=True,
                                           help="Plan with this much free device memory (testing)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the weights and of every random choice."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel stages (the replay runs on one device: only 1)."),
    out: Path = typer.Option(..., "-o", "--out", help="Validation folder to write."),
    as_json: bool = typer.Option(False, "--json", help="Print summary.json instead of a table."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines on stderr."),
) -> None:
    """Simulate TRACE, replay its schedule on the device, and write VAL_DIR/{summary.json, steps.parquet,
    ops.parquet}: predicted vs measured step times, per-operator-class and end-to-end errors."""

    from blendsim.sim.errors import UserError
    from blendsim.validate import ValidateConfig, run_validation

    if pp != 1:
        raise UserError(f"--pp {pp}: the replay runs each step's whole model on one device, so it cannot time "
                        f"pipeline stages; validate the stages' kernels with --pp 1 (simulate takes --pp)")
    if policy is not None and policies is not None:
        raise UserError("give --policy (one) or --policies (several), not both")
    from blendsim.options import parse_names

    if policy is not None and not policy.strip():
        raise UserError(f"--policy must be a policy name (see `blendsim policies`), got {policy!r}")
    names = parse_names(policies, "--policies") if policies is not None else (policy or "fcfs",)
    cfg = ValidateConfig(policies=names, model=model, hardware=hardware, device=device,
                         profile=str(profile) if profile else None, dtype=dtype, engine=engine, mode=mode,
                         replicas=replicas, max_steps=max_steps, repeats=repeats, op_every=op_every, threads=threads,
                         seed=seed, token_budget=token_budget, max_seqs=max_seqs, block_size=block_size,
                         gpu_memory_utilization=gpu_mem, device_memory_bytes=int(device_memory_gb * 2**30))
    from blendsim.progress import Progress

    # a terminal sees every step's line as before; a pipe gets the latest one every 10 s
    with Progress("validate", quiet=quiet) as bar:
        if quiet:
            say = None
        elif bar.tty:
            def say(text):
                typer.echo(text, err=True)
        else:
            def say(text):
                bar.update(0, detail=text)
        summary = run_validation(trace, cfg, out, say)
    if as_json:
        typer.echo(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print_summary(summary, out)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _abs(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def print_summary(s: dict, out: Path | None = None) -> None:
    """The rich table of a validation summary."""
    from rich.markup import escape
    from rich.table import Table

    from blendsim.reports.terminal import console

    c = console()  # the terminal's width, 80 when piped, like every other command
    dev = s.get("device", {})
    c.print("[bold]validate[/] " + escape(f"{s['model']} ({s['dtype']}) on {dev.get('name', '?')} "
                                           f"[{dev.get('kind')}], attention {s.get('attention_backend', '?')}, "
                                           f"hardware preset {s['hardware']}, {s.get('repeats')} forward(s) per step"))
    c.print("predicted vs measured step time (error = predicted / measured - 1; med and p90: of |error|)")
    t = Table(box=None, pad_edge=False, header_style="bold")  # two spaces between columns: 9 fit in 80
    for col in ("policy", "steps", "med err", "p90 err", "bias", "GEMM", "attn", "other", "tput err"):
        # figures never cut: a long policy name (path/to/file.py:Class) folds in its own column instead
        t.add_column(col, justify="left" if col == "policy" else "right", no_wrap=col != "policy", overflow="fold")
    for p, r in s["policies"].items():
        if not r.get("steps"):
            t.add_row(p, "0", *["-"] * 7)
            continue
        e, x, oc = r["step_error"], r["end_to_end"], r.get("op_class_error", {})
        t.add_row(p, f"{r['steps']}/{r['sim_steps']}", _abs(e.get("median_abs_err")), _abs(e.get("p90_abs_err")),
                  _pct(e.get("mean_err")), *(_pct(oc.get(k, {}).get("total_err")) for k in ("gemm", "attention", "other")),
                  _pct(x["throughput_err"]))
    c.print(t)
    for p, sp in s.get("speedup", {}).items():
        c.print(f"  speedup of {p} over {s['speedup_base']}: predicted {sp['speedup_pred']:.3f}x, measured "
                f"{sp['speedup_meas']:.3f}x, error {_pct(sp['speedup_err'])}"
                + (f" ({sp['over']})" if sp.get("over", "the whole trace") != "the whole trace" else ""))
    for p, r in s["policies"].items():
        if r.get("steps"):
            x = r["end_to_end"]
            c.print(f"  {p}: throughput predicted {x['throughput_pred_tok_s']:.1f} tok/s, measured "
                    f"{x['throughput_meas_tok_s']:.1f} tok/s (makespan {x['makespan_pred_s']:.3f} vs "
                    f"{x['makespan_meas_s']:.3f} s{'' if r['complete'] else ', replayed steps only'})")
        eff = r.get("efficiency", {})
        parts = []
        def of_peak(f) -> str:  # above 1: the probe (one large matmul or copy) ran slower than the model's kernels
            return (f"{_abs(f)} of the measured peak" if not (isinstance(f, (int, float)) and f > 1.0) else
                    f"{_abs(f)} of the probe's peak, which this device's probe underestimates")

        if "decode" in eff:
            parts.append(f"decode-only steps at {eff['decode']['achieved_bandwidth'] / 1e9:.1f} GB/s "
                         f"({of_peak(eff['decode']['fraction_of_peak'])})")
        if "prefill" in eff:
            parts.append(f"prefill-heavy steps at {eff['prefill']['achieved_flops'] / 1e12:.3f} TFLOP/s "
                         f"({of_peak(eff['prefill']['fraction_of_peak'])})")
        if parts:
            c.print(f"  {p}: " + "; ".join(parts))
    if s.get("nvml_summary", {}).get("samples"):
        n = s["nvml_summary"]
        c.print(f"  GPU: peak memory {n['mem_used_max_bytes'] / 2**30:.1f} GiB, SM clock median "
                f"{n['sm_clock_mhz_median']} MHz (min {n['sm_clock_mhz_min']}), power median {n['power_w_median']:.0f} W")
    if s["status"] != "complete":
        c.print(f"  [bold red]{s['status']}[/]: {s['reason']}")
    if out is not None:
        c.print(f"  wrote {out}/")


def register(app: typer.Typer) -> None:
    """Add ``blendsim validate`` to ``app``."""
    app.command("validate")(validate_cmd)
