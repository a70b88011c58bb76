"""How long the workload inputs take to build: the BlendServe recipe at the paper's 400,000 requests and the
Mooncake conversation trace's load. These budgets used to be asserted by tests; a busy CI machine must not fail a
correct change, so they are measured and reported here instead (the tests keep their functional checks).

    python benchmarks/bench_workloads.py [--data DIR] [--repeat 3]

Targets (each the median of --repeat runs, on an idle 2-core machine): the 400,000-request blendserve trace
(density 1.4, sharing 0.35) within 30 s; the Mooncake trace (12,031 requests) loaded within 5 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from blendsim.workloads.loaders import load
from blendsim.workloads.recipes import synthesize

SYNTH_BUDGET_S = 30.0
MOONCAKE_BUDGET_S = 5.0
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding the shared data files")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args(argv)
    ok = True
    took, t = timed(lambda: synthesize("blendserve", density=1.4, sharing=0.35, requests=400_000), a.repeat)
    ok &= took <= SYNTH_BUDGET_S
    print(f"blendserve 400,000 requests: {took:.2f} s (median of {a.repeat}; target <= {SYNTH_BUDGET_S:.0f} s) "
          f"{'PASS' if took <= SYNTH_BUDGET_S else 'FAIL'}")
    mooncake = a.data / "mooncake_conversation_trace.jsonl"
    if not mooncake.is_file():
        print(f"mooncake: {mooncake} not found (pass --data DIR); skipped")
    else:
        took, t = timed(lambda: load(mooncake, "mooncake"), a.repeat)
        ok &= took <= MOONCAKE_BUDGET_S
        print(f"mooncake load, {t.n:,} requests: {took:.2f} s (median of {a.repeat}; target <= "
              f"{MOONCAKE_BUDGET_S:.0f} s) {'PASS' if took <= MOONCAKE_BUDGET_S else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
