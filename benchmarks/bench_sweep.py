"""Time the BlendServe grid sweep (sec. 6.5: 13 densities x 5 sharing ratios = 65 workloads).

    python benchmarks/bench_sweep.py                         # 65 workloads x 40,000 requests, --jobs 2
    python benchmarks/bench_sweep.py --requests 4000 --jobs 1 --out /tmp/bench-sweep
    python benchmarks/bench_sweep.py --mode overlap --engine-of blendserve --out runs/grid   # the README heatmap

Prints the wall time of the whole sweep, the worker CPU seconds it contained (synthesis, simulation and
writing), the machine's load and per-policy results. Target: under
15 minutes for dfs, random and blendserve at 40,000 requests with --jobs 2 on a 2-core machine. Not run
by CI. The sweep directory is kept with --out (resume and report it), else removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from _data import add_data_option  # noqa: E402 (benchmarks/_data.py, beside this script)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40_000)
    ap.add_argument("--densities", default="0.80:1.40:0.05")
    ap.add_argument("--sharing", default="0.05:0.45:0.10")
    ap.add_argument("--policies", default="dfs,random,blendserve")
    ap.add_argument("--mode", default="sequential")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--engine-of", default=None, help="run every policy on this policy's engine settings")
    ap.add_argument("--out", type=Path, default=None, help="sweep directory to keep (default: a temporary one)")
    add_data_option(ap)
    a = ap.parse_args()

    from blendsim.policies.registry import policy_names
    from blendsim.sweep import SweepSpec, check_spec, make_backend, parse_values, run_sweep

    known = set(policy_names())
    pols = tuple(p for p in a.policies.split(",") if p in known)
    missing = sorted(set(a.policies.split(",")) - known)
    if missing:
        print(f"note: not registered, left out: {', '.join(missing)}")
    spec = check_spec(SweepSpec("blendserve", parse_values(a.densities, "--densities"), parse_values(a.sharing, "--sharing"),
                                pols, ("llama-3-8b",), ("a100-80gb",), requests=a.requests, mode=a.mode,
                                engine_of=a.engine_of))
    out = a.out or Path(tempfile.mkdtemp(prefix="bench-sweep-")) / "sweep"
    n = len(spec.cells())
    print(f"{len(spec.workloads())} workloads x {len(pols)} policies ({', '.join(pols)}) = {n} cells, "
          f"{a.requests} requests each, --jobs {a.jobs}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    marks = {n * k // 10 for k in range(1, 11)}
    t0 = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if done in marks:
            marks.discard(done)
            print(f"  {done:4d}/{total} cells  {time.perf_counter() - t0:7.1f} s", flush=True)

    outcome = run_sweep(spec, out, make_backend("local", a.jobs), progress=progress)
    wall = time.perf_counter() - t0
    print(f"sweep: {wall:.1f} s wall ({wall / 60:.2f} min) for {outcome.ran} cells "
          f"({outcome.skipped} already done, {len(outcome.failures)} failed); {outcome.ran / wall:.3f} cells/s")
    print(f"in tasks (synthesis + cells, all workers): {outcome.task_wall_s:.1f} s wall, {outcome.task_cpu_s:.1f} s CPU "
          f"-> {outcome.task_cpu_s / a.jobs / 60:.2f} min on {a.jobs} uncontended cores")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    _per_policy(out)
    if a.out is None:
        shutil.rmtree(out.parent, ignore_errors=True)


def _per_policy(out: Path) -> None:
    import pyarrow.parquet as pq

    rows = pq.read_table(out / "results.parquet").to_pylist()
    for p in sorted({r["policy"] for r in rows}):
        mine = [r for r in rows if r["policy"] == p]
        steps = sum(r["steps"] for r in mine)
        tput = sum(r["throughput_tok_s"] for r in mine) / len(mine)
        print(f"  {p:11s} {len(mine)} cells, {steps / len(mine):,.0f} steps per cell, mean {tput:,.0f} tok/s")
    sizes = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"sweep directory: {sizes / 2**20:.0f} MiB; results.parquet {json.dumps(len(rows))} rows")


if __name__ == "__main__":
    main()
