"""Time `blendsim plan` and check its answer (issue 27's "Done when").

    python benchmarks/bench_plan.py                              # 20,000 requests, 2h deadline (target <= 10 min)
    python benchmarks/bench_plan.py --requests 1000000 --deadline 8h --target-min 15 --out /tmp/plan-1m

Synthesises a BlendServe-recipe trace (seed 0; its long OpenVid outputs make it tail-heavy), plans it on A100
and H100 up to 8 GPUs with the vllm and sglang engines and the dfs and random policies (--jobs 2), then
re-simulates the recommended deployment with its settings and checks: it meets the deadline, the re-run's
makespan is within 2% of the planned one, its cost is GPUs x price x makespan within 1%, and the wall time is
under the target. Prints the timings, the load of the machine and the sampled-vs-full check. Not run by CI.
With --out the plan directory (report.html, pareto.png) is kept, and a rerun there resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--deadline", default="2h")
    ap.add_argument("--hardware", default="a100-80gb,h100-80gb")
    ap.add_argument("--max-gpus", type=int, default=8)
    ap.add_argument("--engines", default="vllm,sglang")
    ap.add_argument("--policies", default="dfs,random")
    ap.add_argument("--prices", default=None, help="price CSV (default: the shipped table)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--target-min", type=float, default=10.0)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()

    import blendsim
    from blendsim.plan.prices import read_prices

    tmp = Path(tempfile.mkdtemp(prefix="bench-plan-"))
    try:
        trace = tmp / "trace.parquet"
        blendsim.write_trace(blendsim.synthesize("blendserve", requests=a.requests, seed=0), trace)
        t0 = time.perf_counter()
        ans = blendsim.plan(trace, "llama-3-8b", a.deadline, hardware=a.hardware, max_gpus=a.max_gpus,
                            engines=a.engines, policies=a.policies, prices=a.prices, jobs=a.jobs,
                            out=a.out or tmp / "plan")
        wall = time.perf_counter() - t0
        rec = ans["recommended"]
        t1 = time.perf_counter()
        res = blendsim.simulate(trace, policy=rec["policy"], model="llama-3-8b", hardware=rec["hardware"],
                                tp=rec["tp"], replicas=rec["replicas"], engine=rec["engine"], weights=rec["weights"],
                                kv_dtype=rec["kv_dtype"], ep=rec["ep"], offline=True)
        resim = time.perf_counter() - t1
        ms = res.summary["makespan_s"]
        price = read_prices(a.prices).price_of(rec["hardware"]).usd_per_gpu_hour
        cost = rec["gpus"] * price * ms / 3600
        checks = {k: bool(v) for k, v in {  # plain booleans for JSON (the comparisons of numpy floats are numpy's)
            "meets deadline": rec["meets_deadline"],
            "re-simulated makespan within 2%": abs(ms / rec["makespan_s"] - 1) <= 0.02,
            "cost = GPUs x price x makespan within 1%": abs(cost / rec["cost_usd"] - 1) <= 0.01,
            f"wall <= {a.target_min:g} min": wall <= 60 * a.target_min,
        }.items()}
        print(json.dumps({"requests": a.requests, "deadline": a.deadline, "jobs": a.jobs, "wall_s": round(wall, 1),
                          "load_avg": os.getloadavg(), "cpus": os.cpu_count(), "simulated": ans["simulated"],
                          "candidates": ans["candidates"], "pruned": ans["pruned"],
                          "recommendation": ans["recommendation"], "planned_makespan_s": rec["makespan_s"],
                          "resimulated_makespan_s": ms, "resimulate_wall_s": round(resim, 1),
                          "cost_usd": rec["cost_usd"], "sampling": ans["sampling"], "checks": checks}, indent=2))
        raise SystemExit(0 if all(checks.values()) else 1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
