"""Commands of the simulator itself: ``cost`` (price one step), ``simulate`` and ``demo``."""

from __future__ import annotations

import json
from pathlib import Path

import typer

MODEL_HELP = "Model preset name (see `blendsim models`) or a HuggingFace config.json."
HW_HELP = "Hardware preset (see `blendsim hardware`)."


def cost_cmd(
    model: str = typer.Option("llama-3-8b", "--model", "-m", help=MODEL_HELP),
    hardware: str = typer.Option("a100-80gb", "--hardware", help=HW_HELP),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree (GPUs per replica)."),
    mode: str = typer.Option("sequential", "--mode", help="Execution mode: sequential or overlap."),
    profile: Path = typer.Option(None, "--profile", help="Calibration profile JSON (default: roofline)."),
    prefill_tokens: int = typer.Option(0, "--prefill-tokens", help="New prompt tokens in the step (one chunk)."),
    decode_seqs: int = typer.Option(0, "--decode-seqs", help="Decoding sequences in the step."),
    context: int = typer.Option(0, "--context", help="Context before each sequence's new tokens."),
    engine: str = typer.Option("ideal", "--engine", help="Engine overhead style: ideal, vllm, sglang, nanoflow."),
    dtype: str = typer.Option(None, "--dtype", help="Override the model's dtype (bf16, fp16, fp32)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Price one step and show its per-operator breakdown."""
    from sim.batch import BatchFeatures
    from sim.cost import build_cost_model
    from sim.errors import UserError

    if min(prefill_tokens, decode_seqs, context) < 0:
        raise UserError("--prefill-tokens, --decode-seqs and --context must be >= 0")
    if prefill_tokens == 0 and decode_seqs == 0:
        raise UserError("give --prefill-tokens and/or --decode-seqs")
    dep = _deployment(model, hardware, tp, dtype)
    cm = build_cost_model(dep, mode, engine, profile)
    prefill = [(0, prefill_tokens, context, 0)] if prefill_tokens else []
    f = BatchFeatures.from_parts(prefill, decode_seqs, decode_seqs * context, decode_seqs + (1 if prefill_tokens else 0))
    sc = cm.cost(f)
    rows = cm.breakdown(f)
    per_layer = [{k: r[k] for k in ("op", "flops", "bytes", "time_s")} for r in rows if r["scope"] == "layer"]
    whole = [{k: r[k] for k in ("op", "flops", "bytes", "time_s")} for r in rows if r["scope"] == "model"]
    out = {"step_time_s": sc.time_s, "compute_s": sc.compute_s, "memory_s": sc.memory_s, "other_s": sc.other_s,
           "comm_s": sc.comm_s, "overhead_s": sc.overhead_s, "layers": dep.model.num_layers, "mode": mode,
           "engine": cm.engine.name, "cost_model": cm.timer_name, "per_layer": per_layer, "whole_model": whole}
    for note in cm.notes():
        typer.echo(f"note: {note}", err=True)
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{dep.model.name} on {dep.hardware.name} x{tp}, {mode}, {cm.timer_name}, engine {cm.engine.name}")
    for c in ("op", "scope", "GFLOP", "MB", "time (us)", "x layers (ms)"):
        t.add_column(c, justify="right" if c != "op" else "left")
    for r in rows:
        mult = dep.model.num_layers if r["scope"] == "layer" else 1
        t.add_row(r["op"], r["scope"], f"{r['flops'] / 1e9:.3f}", f"{r['bytes'] / 1e6:.3f}",
                  f"{r['time_s'] * 1e6:.1f}", f"{r['time_s'] * mult * 1e3:.3f}")
    c = Console()
    c.print(t)
    c.print(f"step {sc.time_s * 1e3:.3f} ms = compute {sc.compute_s * 1e3:.3f} + memory {sc.memory_s * 1e3:.3f} "
            f"+ other {sc.other_s * 1e3:.3f} + comm {sc.comm_s * 1e3:.3f} + engine {sc.overhead_s * 1e3:.3f} ms "
            f"({mode} mode)")


def _deployment(model: str, hardware: str, tp: int, dtype: str | None = None, **kw):
    from sim.deployment import Deployment
    from sim.hardware import get_hardware
    from sim.models import get_model

    return Deployment(get_model(model, dtype), get_hardware(hardware), tp, **kw)


def register(app: typer.Typer) -> None:
    app.command("cost")(cost_cmd)
