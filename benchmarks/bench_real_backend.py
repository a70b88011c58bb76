"""How fast the real backend prepares and runs steps, and how close it gets to the device's peaks.

Three measurements (plain Python, torch and numpy):

* host work per step — building the ragged inputs (``SequenceBook.inputs``) and planning attention
  (``plan``) for a decode batch of ``--decode-seqs`` sequences of ``--context`` tokens, which a real
  engine does on the CPU every step; it must stay well under the step itself;
* the device-free dry run of a schedule's events (``peak_blocks``), events per second;
* forward passes of a prefill step and a decode step: device seconds, achieved FLOP/s
  and bytes/s from the cost model's accounting, as fractions of the measured copy and matmul peaks.

    python benchmarks/bench_real_backend.py [--device cpu] [--model tiny] [--decode-seqs 64] [--context 1024]
    python benchmarks/bench_real_backend.py --device cuda --model llama-3-8b --decode-seqs 256 --context 2048
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from _data import add_data_option  # noqa: E402 (benchmarks/_data.py, beside this script)


def _trace(n: int, prompt: int, out: int):
    from blendsim.workloads.trace import from_columns

    return from_columns(input_len=[prompt] * n, output_len=[out] * n)


def _decode_executor(rt, n: int, ctx: int, block_size: int):
    """An executor holding ``n`` sequences of ``ctx`` tokens (their KV allocated, not computed)."""
    from blendsim.real_backend.executor import TorchExecutor
    from blendsim.sim.batch import Batch
    from blendsim.sim.prefix_tree import PrefixTree

    trace = _trace(n, ctx, 4)
    ex = TorchExecutor(rt, trace, PrefixTree(trace), block_size, n * (-(-(ctx + 2) // block_size)))
    for r in range(n):
        ex.apply("chunk", r, ctx, 0, 0)
        ex.apply("decode", r, ctx, 0, 0)
    return ex, Batch(1, [], n, n * ctx, n, [(r, ctx) for r in range(n)])


def bench_host(rt, n: int, ctx: int, block_size: int) -> float:
    ex, batch = _decode_executor(rt, n, ctx, block_size)
    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        inp = ex.book.inputs(batch)
        ex.attn.plan(inp)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_dry_run() -> tuple[int, float]:
    from blendsim.real_backend.replay import load_schedule, peak_blocks
    from blendsim.runner import RunConfig, run_simulation
    from blendsim.sim.prefix_tree import PrefixTree
    from blendsim.workloads.trace import from_columns

    rng = np.random.default_rng(0)
    n = 400
    prompts = [[(int(rng.integers(0, 8)), 256), (1000 + i, int(rng.integers(16, 512)))] for i in range(n)]
    trace = from_columns(input_len=[sum(x for _, x in p) for p in prompts], output_len=rng.integers(16, 256, n),
                         prompts=prompts)
    res = run_simulation(trace, RunConfig(policy="dfs", model="tiny", hardware="cpu", record_schedule=True))
    sch = load_schedule(res.schedule)
    ev = sch.events[0]
    t0 = time.perf_counter()
    peak_blocks(ev, trace, PrefixTree(trace), sch.block_size, sch.capacity_blocks)
    return len(ev), time.perf_counter() - t0


def bench_forward(rt, peaks: dict, args) -> list:
    from blendsim.real_backend.compare import work
    from blendsim.sim.batch import Batch
    from blendsim.sim.deployment import Deployment
    from blendsim.sim.hardware import get_hardware
    from blendsim.sim.ops import Shapes

    spec = rt.spec
    shapes = Shapes.of(Deployment(spec, get_hardware("h100-80gb" if rt.device.type == "cuda" else "cpu")))
    rows = []
    ex, dec = _decode_executor(rt, args.decode_seqs, args.context, args.block_size)
    p = args.prefill_tokens
    from blendsim.real_backend.executor import TorchExecutor
    from blendsim.sim.prefix_tree import PrefixTree

    trace = _trace(1, p, 4)
    pre = TorchExecutor(rt, trace, PrefixTree(trace), args.block_size, -(-p // args.block_size) + 1)
    pre.apply("chunk", 0, p, 0, 0)
    cases = [("decode", ex, dec), ("prefill", pre, Batch(0, [(0, p, 0, 0)], 0, 0, 1))]
    for name, e, b in cases:
        e.repeats = 5
        rec = e.execute(b)
        flops, nbytes = work(shapes, spec.num_layers, b.features())
        rows.append((name, b.num_tokens, rec.measured_s, float(flops) / rec.measured_s / peaks["matmul_flops"],
                     float(nbytes) / rec.measured_s / peaks["mem_bandwidth"]))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--decode-seqs", type=int, default=64)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--prefill-tokens", type=int, default=512)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    add_data_option(ap)
    args = ap.parse_args(argv)

    from blendsim.real_backend.executor import DeviceRuntime
    from blendsim.real_backend.hwmon import measure_peaks
    from blendsim.real_backend.timing import pin_threads, steady_cpu
    from blendsim.sim.models import get_model

    if args.device == "cpu":
        pin_threads(args.threads)
        steady_cpu()
    rt = DeviceRuntime(get_model(args.model, args.dtype), args.device)
    peaks = measure_peaks(rt.clock, rt.model.dtype)
    print(f"{args.model} on {args.device} ({rt.clock.name}): measured peaks {peaks['mem_bandwidth'] / 1e9:.1f} GB/s "
          f"copy, {peaks['matmul_flops'] / 1e12:.3f} TFLOP/s matmul")
    host = bench_host(rt, args.decode_seqs, args.context, args.block_size)
    print(f"host prep + attention plan, {args.decode_seqs} decodes x {args.context} tokens: {host * 1e3:.3f} ms/step")
    n_ev, t_ev = bench_dry_run()
    print(f"dry run of a schedule: {n_ev:,} events in {t_ev:.3f} s ({n_ev / t_ev / 1e6:.2f} M events/s)")
    print(f"{'step':<10}{'tokens':>8}{'ms':>10}{'FLOP/s of peak':>16}{'bytes/s of peak':>17}")
    for name, tokens, sec, fl, bw in bench_forward(rt, peaks, args):
        print(f"{name:<10}{tokens:>8}{sec * 1e3:>10.2f}{100 * fl:>15.1f}%{100 * bw:>16.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
