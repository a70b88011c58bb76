"""``blendsim workloads``: synthesise, load and inspect traces."""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing
from pathlib import Path

import typer

from blendsim.cli.kit import UserErrorGroup


class _SynthGroup(UserErrorGroup):
    """``synth``: one subcommand per recipe, built on demand (recipe modules load numpy)."""

    def list_commands(self, ctx):
        from blendsim.workloads.recipes import recipe_names

        return recipe_names()

    def get_command(self, ctx, name):
        from blendsim.workloads.recipes import recipe_names

        if name not in recipe_names():
            return None
        one = typer.Typer(rich_markup_mode=None, add_completion=False)
        cmd = _synth_command(name)
        one.command(name, short_help=cmd.__doc__.split("\n")[0])(cmd)
        return typer.main.get_command(one)


app = typer.Typer(no_args_is_help=True, cls=UserErrorGroup, rich_markup_mode=None)
synth_app = typer.Typer(no_args_is_help=True, cls=_SynthGroup, rich_markup_mode=None,
                        help="Write a synthetic trace made by a named recipe (seeded: same options, same file).")
app.add_typer(synth_app, name="synth")

OUTPUT_HELP = "Where to write the trace (Parquet)."


@app.command("stats")
def stats_cmd(
    trace: Path = typer.Argument(..., help="Trace Parquet file."),
    model: str = typer.Option("llama-3-8b", "--model", "-m", help="Model for the compute density."),
    hardware: str = typer.Option("a100-80gb", "--hardware", help="Hardware for the compute density."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Requests, tokens, optimal sharing ratio s_o, compute density rho and the work bounds T_comp, T_mem and T_o
    of a trace on a model and GPU.

    With --json, a density that is unbounded (no decode memory traffic) is null, explained by
    compute_density_note.
    """
    import numpy as np

    from blendsim.runner import RunConfig, run_limits
    from blendsim.sim.density import trace_bounds
    from blendsim.sim.deployment import make_deployment
    from blendsim.sim.prefix_tree import PrefixTree
    from blendsim.workloads.trace import read_trace

    t = read_trace(trace, allow_empty=True)
    # sized as `simulate` sizes a run with its defaults (the default engine's limits), so a model that does not fit
    # says the same figure here, in `simulate` and in `cost`
    dep = make_deployment(model, hardware, tp,
                          **run_limits(RunConfig(policy="fcfs", model=model, hardware=hardware, tp=tp))[1])
    tree = PrefixTree(t)
    b = trace_bounds(t, dep, tree)
    out = t.summary()
    out.update({"optimal_sharing_ratio": tree.optimal_sharing_ratio(), "compute_density": b.density,
                "t_comp_s": b.t_comp_s, "t_mem_s": b.t_mem_s, "t_opt_s": b.t_opt_s, "model": dep.model.name,
                "hardware": dep.hardware.name, "meta": t.meta,
                "t_opt_note": ("the paper's T_o = max((1 - s_o) T_comp, T_mem), compute and memory perfectly "
                               "overlapped; a run's summary.json t_opt_s is its own lower bound, as its engine "
                               "runs the steps")})
    if not np.isfinite(b.density):
        # no decode step reads the KV cache (every output is 1 token, or no requests): rho = Comp / 0
        out["compute_density"] = None
        out["compute_density_note"] = ("unbounded: the trace has no decode memory traffic (every output is "
                                       "1 token, or it has no requests)")
    if as_json:
        typer.echo(json.dumps(out, indent=2, sort_keys=True, default=str, allow_nan=False))
        return
    from blendsim.reports.terminal import print_trace_stats

    print_trace_stats(out, str(trace))


@app.command("load")
def load_cmd(
    file: Path = typer.Argument(..., help="The trace file to convert (a .gz, .bz2 or .xz file is decompressed)."),
    fmt: str = typer.Option(..., "--format", "-f", help="Its format: burstgpt (CSV: Timestamp, Request tokens, "
                            "Response tokens), azure (CSV: TIMESTAMP, ContextTokens, GeneratedTokens), vidur (CSV: "
                            "arrived_at, num_prefill_tokens, num_decode_tokens), jsonl (prompt_token_ids, "
                            "output_len per line; optional id, arrival_s (kept as given; on every line or none), "
                            "output_len_hint, ttft_slo_s, tbt_slo_s, jct_slo_s, source; no other), mooncake (JSONL: "
                            "timestamp in ms, input_length, output_length, hash_ids of 512-token blocks) or hashed "
                            "(JSONL: input_length, hash_ids of "
                            "--block-size blocks; optional output_length, timestamp, request_id) or trace (a "
                            "blendsim Parquet trace, to apply --limit or --max-context to it)."),
    output: Path = typer.Option(..., "--output", "--out", "-o", help=OUTPUT_HELP),
    limit: int = typer.Option(None, "--limit", help="Keep only the first N requests.", min=1),
    block_size: int = typer.Option(None, "--block-size", help="mooncake/hashed: tokens per hashed block "
                                   "(mooncake: 512; ServeGen: 16)."),
    time_unit: str = typer.Option(None, "--time-unit", help="mooncake/hashed: unit of timestamp, s or ms "
                                  "(mooncake: ms)."),
    output_len: int = typer.Option(None, "--output-len", help="mooncake/hashed: output length of rows that "
                                   "have no output_length."),
    output_from: str = typer.Option(None, "--output-from", help="mooncake/hashed: sample missing output "
                                    "lengths (seeded) from FILE or FILE:COLUMN (a blendsim trace, a JSONL trace "
                                    "or a length CSV)."),
    seed: int = typer.Option(None, "--seed", help="Seed of --output-from's sampling (default 0)."),
    max_context: str = typer.Option(None, "--max-context", help="Context limit: N tokens, or a model whose "
                                    "context is used; requests with prompt + output beyond it are refused "
                                    "unless --long says otherwise."),
    long: str = typer.Option(None, "--long", help="With --max-context: skip (drop) or truncate requests that do "
                             "not fit, and report how many."),
) -> None:
    """Convert a real trace (BurstGPT, Azure, Vidur/Splitwise CSV, JSONL, Mooncake or another block-hash
    trace) into a blendsim trace.

    Requests without prompt content get unique prompts (no false sharing); block-hash traces share the
    blocks their ids share. BurstGPT rows with 0 response tokens are failed requests: they are skipped
    and counted. The trace keeps the file's stem as its name.
    """
    from blendsim.sim.io import check_output_file
    from blendsim.workloads.hashed import context_option, output_from_path, summary_rows
    from blendsim.workloads.loaders import load
    from blendsim.workloads.trace import write_trace

    # the files read: -o replaces neither (--output-from's FILE without its :COLUMN)
    check_output_file(output, inputs=[file, output_from_path(output_from)[0] if output_from is not None else None])
    opts = {"block_size": block_size, "time_unit": time_unit, "output_len": output_len,
            "output_from": output_from, "seed": seed}
    trace = context_option(load(file, fmt, limit, **{k: v for k, v in opts.items() if v is not None}),
                           max_context, long, str(file))
    write_trace(trace, output)
    extra = {"skipped failed rows": trace.meta["skipped_failed"]} if "skipped_failed" in trace.meta else {}
    extra.update(summary_rows(trace.meta))
    _summary(trace, output, f"loaded {file} ({fmt})", extra)


def _synth_command(name: str):
    """A typer command for recipe ``name``, its options taken from the recipe's options dataclass."""
    from blendsim.workloads.recipes import get_recipe

    recipe = get_recipe(name)
    hints = typing.get_type_hints(recipe.options)
    params = []
    for f in dataclasses.fields(recipe.options):
        default = ... if f.default is dataclasses.MISSING else f.default
        opt = typer.Option(default, "--" + f.name.replace("_", "-"), help=f.metadata.get("help", ""))
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=hints[f.name]))
    params.append(inspect.Parameter("output", inspect.Parameter.KEYWORD_ONLY, annotation=Path,
                                    default=typer.Option(..., "--output", "--out", "-o", help=OUTPUT_HELP)))

    def command(**kwargs) -> None:
        from blendsim.sim.io import check_output_file
        from blendsim.workloads.trace import write_trace

        output = check_output_file(kwargs.pop("output"))
        trace = recipe.make(**kwargs)
        write_trace(trace, output)
        _summary(trace, output, f"recipe {name}", {})

    command.__name__ = f"synth_{name}"
    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = f"{recipe.summary}\n\nEvery option is listed below; see workloads/recipes/{name}.py for sources."
    return command


def _summary(trace, output: Path, what: str, extra: dict) -> None:
    import numpy as np
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    s = trace.summary()
    rows = {"requests": f"{s['requests']:,}", "input tokens (mean)": f"{s['input_tokens']:,} ({s['mean_input_len']:.1f})",
            "output tokens (mean)": f"{s['output_tokens']:,} ({s['mean_output_len']:.1f})",
            "sources": ", ".join(f"{k or '-'}: {v:,}" for k, v in s["sources"].items())}
    if trace.has_arrivals:
        span = float(trace.arrival_s.max() - trace.arrival_s.min())
        rows["arrivals"] = f"{span:.1f} s ({trace.n / span:.2f} req/s)" if span > 0 else "all at once"
    if trace.has_slos:
        rows["SLOs (ttft/tbt/jct)"] = " / ".join(str(int(np.isfinite(getattr(trace, f)).sum()))
                                                 for f in ("ttft_slo_s", "tbt_slo_s", "jct_slo_s"))
    measured = trace.meta.get("measured", {})
    for k in ("density", "sharing"):
        if k in measured:
            rows[f"measured {k}"] = f"{measured[k]:.4f}"
    rows.update({k: str(v) for k, v in extra.items()})
    from blendsim.reports.terminal import path_lines

    c = Console()
    # each path on lines of its own, broken after a "/" (a title would centre and cut them mid-word)
    head, _, src = what.partition(" ")
    lines = [head, *path_lines(src, c.width)] if head == "loaded" else [what]
    for line in [*lines, "->", *path_lines(output, c.width)]:
        c.print(Text(line), soft_wrap=True)
    tab = Table()
    tab.add_column("statistic", no_wrap=True)
    tab.add_column("value", justify="right")
    for k, v in rows.items():
        tab.add_row(k, v)
    c.print(tab)

