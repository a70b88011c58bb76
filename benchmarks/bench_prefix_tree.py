"""Prefix-tree build time for a BlendServe-scale trace (target: 400,000 requests in under 10 s).

    python benchmarks/bench_prefix_tree.py [--requests 400000] [--repeat 5]

Builds the trace with the blendserve recipe (segment prompts: per-source system prompts, MMLU subject
prefixes, unique tails) and, separately, a token-id trace with a shared 500-token system prompt, then
times ``PrefixTree(trace)`` and the queries the policies use (s_o, DFS order, subtree sharing).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from _data import add_data_option  # noqa: E402 (benchmarks/_data.py, beside this script)

from blendsim.sim.prefix_tree import PrefixTree
from blendsim.workloads.recipes import synthesize
from blendsim.workloads.trace import from_columns


def timeit(fn, repeat: int) -> tuple[float, float, float]:
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), min(ts), max(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400_000)
    ap.add_argument("--token-requests", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=5)
    add_data_option(ap)
    a = ap.parse_args()
    trace = synthesize("blendserve", density=1.1, sharing=0.35, requests=a.requests)
    rows = [("build, blendserve segments", *timeit(lambda: PrefixTree(trace), a.repeat))]
    tree = PrefixTree(trace)
    rows.append(("s_o + DFS order + subtree sharing", *timeit(
        lambda: (tree.optimal_sharing_ratio(), tree.dfs_order(), tree.sharing_ratio()), a.repeat)))
    rng = np.random.default_rng(0)
    sys_prompt = list(range(500))
    prompts = [sys_prompt + rng.integers(0, 30000, int(k)).tolist() for k in rng.integers(5, 300, a.token_requests)]
    tok = from_columns(input_len=[len(p) for p in prompts], output_len=[1] * len(prompts), prompts=prompts)
    rows.append((f"build, {a.token_requests} token-id prompts", *timeit(lambda: PrefixTree(tok), a.repeat)))
    print(f"{a.requests} blendserve requests, {tree.num_nodes} nodes, s_o = {tree.optimal_sharing_ratio():.4f}")
    print(f"{'operation':40s} {'median s':>9s} {'min':>7s} {'max':>7s}")
    for name, med, lo, hi in rows:
        print(f"{name:40s} {med:9.3f} {lo:7.3f} {hi:7.3f}")
    print(f"target: build of {a.requests} requests < 10 s: {'met' if rows[0][1] < 10 else 'MISSED'}")


if __name__ == "__main__":
    main()
