"""How well a quick CPU calibration of the tiny model predicts the CPU's own step times in a replay.

Calibrates the tiny model on the CPU (``blendsim calibrate --device cpu --model tiny --quick``), then replays a
shuffled 24-request trace with shared 128-token prefixes three times under the vllm policy (``blendsim
validate``, 512-token budget) and reports each replay's median |step error|, and the median of the three
against the target (under 15%). A shared host's speed drifts by 10-30% between processes, so when the target
is missed a fresh profile and three more replays decide: a model error misses again, a drift does not.
This target was a test's assertion before (issue 29 item 4: a busy machine must not fail a correct change);
the test now checks only that the replay runs and reports finite errors. Plain Python:

    python benchmarks/bench_validate_cpu.py [--runs 3] [--target 0.15]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from blendsim.workloads.trace import from_columns, write_trace


def groups_trace(groups: int = 4, per_group: int = 6, seed: int = 0, prefix: int = 128):
    """Requests in shuffled order, ``per_group`` of each sharing a ``prefix``-token segment."""
    rng = np.random.default_rng(seed)
    prompts, p, d = [], [], []
    for g in range(groups):
        for i in range(per_group):
            tail = int(rng.integers(16, 96))
            prompts.append([(g, prefix), (100 + g * per_group + i, tail)])
            p.append(prefix + tail)
            d.append(int(rng.integers(8, 40)))
    order = rng.permutation(len(p))
    return from_columns(input_len=np.asarray(p)[order], output_len=np.asarray(d)[order],
                        prompts=[prompts[i] for i in order])


def blendsim(*args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", "from blendsim.cli import main; main()", *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode:
        sys.exit(f"blendsim {' '.join(map(str, args))} failed: {r.stderr.strip()[-500:]}")
    return r


def replays(trace: Path, profile: Path, out: Path, runs: int) -> list[float]:
    meds = []
    for k in range(runs):
        r = blendsim("validate", trace, "--policy", "vllm", "--token-budget", "512", "--profile", profile,
                     "-o", out / f"val{k}", "--json")
        p = json.loads(r.stdout)["policies"]["vllm"]
        e = p["step_error"]
        meds.append(e["median_abs_err"])
        print(f"replay {k + 1}/{runs}: {e['steps']} steps, median |err| {e['median_abs_err']:.3f}, p90 "
              f"{e['p90_abs_err']:.3f}, mean {e['mean_err']:+.3f}, throughput err "
              f"{p['end_to_end']['throughput_err']:+.3f}")
    return meds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--target", type=float, default=0.15)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        trace = d / "t.parquet"
        write_trace(groups_trace(), trace)
        for attempt in ("profile", "fresh profile"):
            prof = d / f"{attempt.replace(' ', '_')}.json"
            blendsim("calibrate", "--device", "cpu", "--model", "tiny", "--quick", "-o", prof)
            meds = replays(trace, prof, d / attempt.replace(" ", "_"), a.runs)
            m = float(np.median(meds))
            print(f"{attempt}: median of {a.runs} replay medians {m:.3f} (target < {a.target:.2f}): "
                  f"{'met' if m < a.target else 'MISSED'}")
            if m < a.target:
                return 0
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
