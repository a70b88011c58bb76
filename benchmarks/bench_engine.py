"""Engine speed: a BlendServe-scale job and the Vidur comparison, timed as whole processes.

    python benchmarks/bench_engine.py [--requests 400000] [--repeat 3]

A. ``blendsim workloads synth blendserve --requests 400000`` then ``blendsim simulate --policy dfs`` on
   llama-3-8b / a100-80gb: target under 60 s wall and 4 GB peak memory on a 2-core machine.
B. The first 10,000 requests of ../shared/data/azure_llm_inference_2023_conv.csv, all at t=0, Sarathi
   with a 512-token budget and at most 512 sequences: Vidur takes 20.1 s wall on this machine for the
   same job; target at least 20x faster (whole process, 1.005 s).

Timings are medians over ``--repeat`` runs of the whole ``blendsim`` process (start-up, reading the
trace, simulating, writing the run directory); peak memory is the largest child's max RSS.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _data import add_data_option, data_file  # noqa: E402 (benchmarks/_data.py, beside this script)
from _proc import timed  # noqa: E402 (benchmarks/_proc.py, beside this script)

VIDUR_S = 20.1
AZURE = "azure_llm_inference_2023_conv.csv"


def bench(cmd: list[str], repeat: int) -> tuple[float, float, float, float]:
    runs = [timed(cmd) for _ in range(repeat)]
    walls = [r[0] for r in runs]
    return statistics.median(walls), min(walls), max(walls), max(r[1] for r in runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400_000)
    ap.add_argument("--repeat", type=int, default=3)
    add_data_option(ap)
    args = ap.parse_args()
    azure = data_file(args.data, AZURE)  # before any work: a missing file is one line, not a traceback
    exe = shutil.which("blendsim") or sys.exit("blendsim is not installed (pip install -e .)")
    tmp = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    rows = []
    try:
        trace = tmp / "bs.parquet"
        subprocess.run([exe, "workloads", "synth", "blendserve", "--requests", str(args.requests), "-o", str(trace)],
                       check=True, stdout=subprocess.DEVNULL)
        med, lo, hi, mem = bench([exe, "simulate", str(trace), "--policy", "dfs", "--model", "llama-3-8b",
                                  "--hardware", "a100-80gb", "-o", str(tmp / "run-a")], args.repeat)
        rows.append((f"A: blendserve {args.requests} req, dfs", med, lo, hi, mem, "< 60 s, < 4096 MB",
                     med < 60 and mem < 4096))
        az = tmp / "azure10k.parquet"
        subprocess.run([exe, "workloads", "load", str(azure), "--format", "azure", "--limit", "10000", "-o", str(az)],
                       check=True, stdout=subprocess.DEVNULL)
        med, lo, hi, mem = bench([exe, "simulate", str(az), "--policy", "sarathi", "--token-budget", "512",
                                  "--max-seqs", "512", "--offline", "-o", str(tmp / "run-b")], args.repeat)
        rows.append(("B: azure conv 10K, sarathi 512", med, lo, hi, mem,
                     f">= 20x Vidur's {VIDUR_S} s ({VIDUR_S / med:.1f}x)", VIDUR_S / med >= 20))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'job':36s} {'median s':>9s} {'min':>7s} {'max':>7s} {'peak MB':>8s}  target")
    for name, med, lo, hi, mem, target, ok in rows:
        print(f"{name:36s} {med:9.2f} {lo:7.2f} {hi:7.2f} {mem:8.0f}  {target}  {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
