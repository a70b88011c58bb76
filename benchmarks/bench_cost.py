"""How fast the cost model prices steps.

Prices 1,000,000 realistic steps (mixed prefill chunks and decode batches) with the vectorised
``CostModel.cost_many`` and checks it stays under 5 s; also times the engine's scalar fast path
``CostModel.step``, the exact per-operator ``CostModel.cost`` and the decode fast-forward
``CostModel.decode_many``. Plain Python, no tools beyond numpy:

    python benchmarks/bench_cost.py [--batches 1000000] [--model llama-3-8b] [--hardware a100-80gb]

The step mix (seeded): 40% decode-only, 20% prefill-only, 40% mixed. A step has 1-4 prefill chunks
of 64-8192 tokens (log-uniform) after 0-16K tokens of context, and 1-1024 decoding sequences whose
mean context is 128-16K tokens; a chunk finishes its prompt (samples a token) with probability 1/2.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from _data import add_data_option  # noqa: E402 (benchmarks/_data.py, beside this script)

from blendsim.sim.batch import features_arrays
from blendsim.sim.cost import CostModel
from blendsim.sim.deployment import Deployment
from blendsim.sim.engines import get_profile
from blendsim.sim.hardware import get_hardware
from blendsim.sim.models import get_model

BUDGET_S = 5.0  # cost_many must price 1M steps within this on a laptop-class CPU


def make_steps(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """BatchFeatures' fields for ``n`` random steps, as int64 arrays."""
    rng = np.random.default_rng(seed)
    kind = rng.choice(3, size=n, p=[0.4, 0.2, 0.4])  # 0 decode-only, 1 prefill-only, 2 mixed
    has_p = kind >= 1
    has_d = kind != 1
    num_chunks = np.where(has_p, rng.integers(1, 5, size=n), 0)
    slot = np.arange(4)[None, :] < num_chunks[:, None]  # (n, 4) which chunk slots are used
    chunk = np.exp(rng.uniform(np.log(64), np.log(8192), size=(n, 4))).astype(np.int64) * slot
    ctx = rng.integers(0, 16385, size=(n, 4)) * slot
    done = (rng.random((n, 4)) < 0.5) & slot
    num_decode = np.where(has_d, rng.integers(1, 1025, size=n), 0)
    mean_ctx = rng.integers(128, 16385, size=n)
    return {
        "num_tokens": chunk.sum(1) + num_decode,
        "num_prefill_tokens": chunk.sum(1),
        "num_prefill_seqs": num_chunks,
        "attn_pairs": (chunk * ctx + chunk * (chunk + 1) // 2).sum(1),
        "prefill_kv_tokens": (ctx + chunk).sum(1),
        "num_decode": num_decode,
        "decode_ctx_sum": num_decode * mean_ctx,
        "num_logits": num_decode + done.sum(1),
    }


def _timed(fn, repeat: int = 1) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=1_000_000)
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--hardware", default="a100-80gb")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    add_data_option(ap)
    args = ap.parse_args(argv)

    dep = Deployment(get_model(args.model), get_hardware(args.hardware), args.tp)
    steps = make_steps(args.batches, args.seed)
    n = args.batches
    print(f"{n:,} steps of {args.model} on {args.hardware} x{args.tp}: "
          f"{steps['num_tokens'].mean():.0f} tokens and {steps['num_decode'].mean():.0f} decodes per step on average")
    print(f"{'path':<34}{'mode':<12}{'calls':>11}{'total s':>10}{'us/step':>10}")
    rows = []
    ok = True
    for mode in ("sequential", "overlap"):
        cm = CostModel(dep, mode, get_profile("vllm", {}))
        cm.step(int(steps["num_tokens"].max()), 0, 0, 0, 0, 0, 0, 0)  # size the tables once

        # vectorised: all steps in one call
        feats = features_arrays(**steps)
        t_many, many = _timed(lambda cm=cm, feats=feats: cm.cost_many(feats))
        rows.append(("cost_many (vectorised)", mode, n, t_many))
        ok &= t_many < BUDGET_S

        # scalar fast path, the engine's per-step call
        k = min(n, 200_000)
        cols = [steps[f][:k].tolist() for f in ("num_tokens", "num_prefill_tokens", "num_prefill_seqs", "attn_pairs",
                                                "prefill_kv_tokens", "num_decode", "decode_ctx_sum", "num_logits")]
        args_list = list(zip(*cols, strict=True))
        step = cm.step

        def run_step(step=step, args_list=args_list):
            return [step(*a) for a in args_list]

        t_step, scalar = _timed(run_step)
        rows.append(("step (scalar fast path)", mode, k, t_step))
        assert np.allclose(np.array([s[0] for s in scalar]), many["time_s"][:k], rtol=1e-9)

        # exact per-operator path (CLI, reports)
        from blendsim.sim.batch import BatchFeatures

        kk = min(n, 2_000)
        fs = [BatchFeatures(*(int(steps[f][i]) for f in BatchFeatures.__slots__)) for i in range(kk)]
        t_cost, _ = _timed(lambda cm=cm, fs=fs: [cm.cost(f) for f in fs])
        rows.append(("cost (exact, per operator)", mode, kk, t_cost))

        # fast-forward of a pure-decode run: 10,000 steps of 512 sequences
        cd = 512 * (1000 + np.arange(10_000))
        t_dm, _ = _timed(lambda cm=cm, cd=cd: cm.decode_many(512, cd), repeat=3)
        rows.append(("decode_many (10,000 decode steps)", mode, 10_000, t_dm))

    for name, mode, calls, total in rows:
        print(f"{name:<34}{mode:<12}{calls:>11,}{total:>10.3f}{total / calls * 1e6:>10.3f}")
    print(f"cost_many within {BUDGET_S:.0f} s for {n:,} steps: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
