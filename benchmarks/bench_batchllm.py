"""BatchLLM's microbenchmarks (sec. 6.1) in simulation: ``batchllm`` against ``vllm``.

Traces from the ``batchllm`` recipe (prefix/distinct 2000/200, 1000/1000, 200/2000 tokens, share
degree 4 and 16; 4,096 requests of 100 output tokens by default), llama-3-8b on a100-80gb, roofline
cost model. Columns:

* ``vllm``: the ``vllm`` policy as registered (8,192-token budget, 256 sequences); ``vllm@2k``: the
  paper's baseline settings (prefix caching + chunked prefill with a 2,048-token budget, sec. 6.1).
* ``batchllm``: the policy's defaults (the paper's system, prefix-shared attention kernel of sec. 4.4
  included); ``fork``: ``order=tree batching=count`` (the public code's scheduling); ``sched``:
  ``shared_attention=False``, BatchLLM's scheduling alone on vLLM's attention (an ablation).
* ``shuf``: the same requests in a random order (seeded): vLLM's LRU cache now has to keep a prefix
  alive between group members that arrive far apart (the paper's "premature eviction"); BatchLLM groups
  them globally either way.
* ``x``: speedups over ``vllm@2k`` (the paper's comparison); ``s``: prefix sharing ratio achieved
  (Eq. 2; ``shuf``: vllm@2k on the shuffled trace) and its optimum; ``pre``: preemptions (vllm@2k /
  batchllm); ``wall s``: seconds of simulation for the row's seven runs.

The saving ratios (Eq. 2) of the enlarged first level and of the full multi-level tree are printed for
a two-level workload at the end (instruction + document + question, the shape of sec. 4.2's example).

Not run by CI. ``python benchmarks/bench_batchllm.py [--requests 4096] [--modes sequential overlap]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _data import add_data_option  # noqa: E402 (benchmarks/_data.py, beside this script)

from blendsim.runner import RunConfig, run_simulation
from blendsim.workloads.recipes import synthesize
from blendsim.workloads.trace import Trace

SETTINGS = [(2000, 200), (1000, 1000), (200, 2000)]
DEGREES = (4, 16)
RUNS = {  # column -> (policy, RunConfig overrides)
    "vllm": ("vllm", {}),
    "vllm@2k": ("vllm", {"token_budget": 2048}),
    "batchllm": ("batchllm", {}),
    "fork": ("batchllm", {"options": {"order": "tree", "batching": "count"}}),
    "sched": ("batchllm", {"options": {"shared_attention": False}}),
}


def shuffled(trace: Trace, seed: int) -> Trace:
    return trace.take(np.random.default_rng(seed).permutation(trace.n))


def run(trace, policy, mode, overrides, model, hardware) -> tuple[dict, float]:
    t0 = time.perf_counter()
    cfg = RunConfig(policy=policy, model=model, hardware=hardware, mode=mode, engine="vllm", **overrides)
    return run_simulation(trace, cfg).summary, time.perf_counter() - t0


def row(res: dict) -> list[tuple[str, str]]:
    """(header, cell) pairs of one table row; ``res`` maps run name -> summary."""
    tp = {k: v["throughput_tok_s"] for k, v in res.items()}
    base = tp["vllm@2k"]
    s = {k: v["prefix_sharing_ratio"] for k, v in res.items()}
    return [
        *((k, f"{tp[k] / 1e3:.1f}") for k in RUNS),
        *((f"x {k}", f"{tp[k] / base:.2f}") for k in ("batchllm", "fork", "sched")),
        ("shuf vllm@2k", f"{tp['shuf vllm@2k'] / 1e3:.1f}"),
        ("shuf bllm", f"{tp['shuf batchllm'] / 1e3:.1f}"),
        ("x shuf", f"{tp['shuf batchllm'] / tp['shuf vllm@2k']:.2f}"),
        ("s vllm@2k", f"{s['vllm@2k']:.3f}"), ("s shuf", f"{s['shuf vllm@2k']:.3f}"),
        ("s bllm", f"{s['batchllm']:.3f}"), ("s_opt", f"{res['batchllm']['optimal_sharing_ratio']:.3f}"),
        ("pre v/b", f"{res['vllm@2k']['preemptions']}/{res['batchllm']['preemptions']}"),
    ]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4096)
    ap.add_argument("--output-len", type=int, default=100)
    ap.add_argument("--modes", nargs="+", default=["sequential", "overlap"])
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--hardware", default="a100-80gb")
    ap.add_argument("--seed", type=int, default=0)
    add_data_option(ap)
    a = ap.parse_args(argv)
    for mode in a.modes:
        print(f"\n## {a.model} on {a.hardware}, {mode} mode, "
              f"{a.requests} requests x {a.output_len} output tokens")
        print("throughput in thousands of tokens/s; x = speedup over vllm@2k")
        header = False
        for P, D in SETTINGS:
            for K in DEGREES:
                tr = synthesize("batchllm", prefix_len=P, distinct_len=D, share_degree=K, requests=a.requests,
                                output_len=a.output_len)
                sh = shuffled(tr, a.seed)
                res, wall = {}, 0.0
                jobs = [(c, tr, *RUNS[c]) for c in RUNS]
                jobs += [("shuf " + c, sh, *RUNS[c]) for c in ("vllm@2k", "batchllm")]
                for name, trace, pol, ov in jobs:
                    res[name], w = run(trace, pol, mode, ov, a.model, a.hardware)
                    wall += w
                cells = [("P/D", f"{P}/{D}"), ("sd", str(K)), *row(res), ("wall s", f"{wall:.1f}")]
                widths = [max(len(h), 6) for h, _ in cells]
                if not header:
                    print(" ".join(h.rjust(w) for (h, _), w in zip(cells, widths)))
                    header = True
                print(" ".join(c.rjust(w) for (_, c), w in zip(cells, widths)), flush=True)
    savings(a.seed)


def savings(seed: int) -> None:
    """Eq. 2's token-saving ratio: enlarged single level (Alg. 1) vs the multi-level tree (the paper,
    sec. 4.2 on its workload: 55% vs 56%), on instruction + document + question prompts."""
    from blendsim.policies.batchllm.grouping import (
        enlarge_first_level,
        first_level_saving,
        multi_level_saving,
    )
    from blendsim.sim.prefix_tree import PrefixTree
    from blendsim.workloads.trace import from_columns

    rng = np.random.default_rng(seed)
    prompts = []
    for i in range(4):  # instructions, 300-800 tokens
        ins = int(rng.integers(300, 800))
        for j in range(64):  # documents per instruction, 500-3000 tokens, 1-16 questions each
            doc = int(rng.integers(500, 3000))
            for _ in range(int(rng.integers(1, 17))):
                prompts.append([(i, ins), (1000 + 64 * i + j, doc), (10**6 + len(prompts), int(rng.integers(20, 120)))])
    tree = PrefixTree(from_columns(input_len=[sum(n for _, n in p) for p in prompts], output_len=[1] * len(prompts),
                                   prompts=prompts))
    multi = multi_level_saving(tree)
    naive = first_level_saving(tree, enlarge_first_level(tree, False))
    enlarged = first_level_saving(tree, enlarge_first_level(tree, True))
    print(f"\ntoken saving ratio (Eq. 2), {tree.n_requests} instruction + document + question prompts: "
          f"multi-level tree {multi:.3f}, first level as is {naive:.3f}, enlarged first level (Alg. 1) "
          f"{enlarged:.3f} (paper, its workload: 0.56 vs 0.55)")


if __name__ == "__main__":
    main()
