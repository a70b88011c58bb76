"""Engine speed under pipeline parallelism: a PP2 run against the same job at PP1, timed as whole processes.

    python benchmarks/bench_pipeline.py [--requests 100000] [--repeat 3]

``blendsim workloads synth blendserve --requests N`` then ``blendsim simulate --policy dfs`` on llama-3-70b /
h100-80gb, ``--tp 4`` with ``--pp 1`` and with ``--pp 2`` (two virtual engines per replica, every batch priced
stage by stage and chained through the pipeline). Target: the PP2 run costs at most 2x the PP1 run's wall time.
The runs alternate (PP1, PP2, PP1, ...) so a drift in the machine's speed touches both; the ratio is the median
of the pairs' ratios.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import timed  # noqa: E402  (one whole-process timer for the benchmarks)

TARGET = 2.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    exe = shutil.which("blendsim") or sys.exit("blendsim is not installed (pip install -e .)")
    tmp = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    try:
        trace = tmp / "bs.parquet"
        subprocess.run([exe, "workloads", "synth", "blendserve", "--requests", str(args.requests), "-o", str(trace)],
                       check=True, stdout=subprocess.DEVNULL)

        def cmd(pp: int) -> list[str]:
            return [exe, "simulate", str(trace), "--policy", "dfs", "--model", "llama-3-70b", "--hardware",
                    "h100-80gb", "--tp", "4", "--pp", str(pp), "-o", str(tmp / f"run-pp{pp}"), "--force"]

        pairs = [(timed(cmd(1)), timed(cmd(2))) for _ in range(args.repeat)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    w1 = [a[0] for a, _ in pairs]
    w2 = [b[0] for _, b in pairs]
    ratio = statistics.median(b[0] / a[0] for a, b in pairs)
    print(f"{'job':40s} {'median s':>9s} {'min':>7s} {'max':>7s} {'peak MB':>8s}")
    for name, w, runs in ((f"PP1: blendserve {args.requests} req, tp4", w1, [a for a, _ in pairs]),
                          (f"PP2: blendserve {args.requests} req, tp4 pp2", w2, [b for _, b in pairs])):
        print(f"{name:40s} {statistics.median(w):9.2f} {min(w):7.2f} {max(w):7.2f} {max(m for _, m in runs):8.0f}")
    ok = ratio <= TARGET
    print(f"PP2 / PP1 wall time: {ratio:.2f} (target <= {TARGET}): {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
