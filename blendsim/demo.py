"""``blendsim demo``: a small BlendServe-style workload, several policies side by side, a report."""

from __future__ import annotations

import time
from pathlib import Path

DEMO_POLICIES = ("fcfs", "dfs", "random", "blendserve")


def run_demo(out: Path, requests: int = 40_000, density: float = 1.1, sharing: float = 0.35,
             model: str = "llama-3-8b", hardware: str = "a100-80gb", mode: str = "overlap",
             policies: tuple = DEMO_POLICIES, seed: int = 0, echo=print) -> dict:
    """Synthesise the workload, simulate each policy, write run dirs (and a report); return summaries."""
    from blendsim.sim.deployment import make_deployment
    from blendsim.sim.io import MANIFEST, add_to_manifest, check_output_dir, json_value, write_manifest
    from blendsim.workloads.recipes import get_recipe

    # the options first: a typo is refused before the folder exists
    get_recipe("blendserve").check(density=density, sharing=sharing, requests=requests, model=model,
                                   hardware=hardware, seed=seed)
    make_deployment(model, hardware)
    # a new or empty folder, or an earlier demo's: never the current folder or one of the user's own. A folder
    # whose record is a demo's is one (an interrupted or failed demo's, maybe holding nothing but the record);
    # check_output_dir still refuses it when it holds anything the record does not list
    out = check_output_dir(out, "blendsim demo folder (trace.parquet, runs/)",
                           lambda d: ((d / "trace.parquet").exists() and (d / "runs").exists())
                           or json_value(d / MANIFEST, "kind") == "blendsim demo folder")
    out.mkdir(parents=True, exist_ok=True)
    write_manifest(out, "blendsim demo folder")  # recorded as written: an interrupted demo's folder is still ours

    def record(path: Path) -> None:
        files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file())
        add_to_manifest(out, [f.relative_to(out).as_posix() for f in files])

    try:
        return _demo(out, record, requests, density, sharing, model, hardware, mode, policies, seed, echo)
    except KeyboardInterrupt:
        import sys

        wrote = bool(json_value(out / MANIFEST, "files"))
        print(f"demo: interrupted; run it again to start over in {out}"
              + (" (what it wrote there is replaced)" if wrote else ""), file=sys.stderr)
        raise


def _demo(out, record, requests, density, sharing, model, hardware, mode, policies, seed, echo) -> dict:
    from blendsim.policies.registry import policy_names
    from blendsim.runner import RunConfig, run_simulation, write_run
    from blendsim.sim.io import write_manifest
    from blendsim.workloads.recipes import synthesize
    from blendsim.workloads.trace import write_trace

    t0 = time.perf_counter()
    trace = synthesize("blendserve", density=density, sharing=sharing, requests=requests, model=model,
                       hardware=hardware, seed=seed)
    record(write_trace(trace, out / "trace.parquet"))
    m = trace.meta.get("measured", {})
    echo(f"workload: {trace.n:,} requests from the blendserve recipe (burstgpt + openvid + mmlu),\n"
         f"          compute density {m.get('density', float('nan')):.3f}, optimal prefix sharing "
         f"{100 * m.get('sharing', float('nan')):.1f}%  [{time.perf_counter() - t0:.1f} s]")
    from blendsim.policies.registry import get_policy
    from blendsim.runner import ENGINE_FIELDS

    engine = {k: v for k, v in get_policy("blendserve").engine_defaults.items() if k in ENGINE_FIELDS}
    known = set(policy_names())
    summaries = {}
    run_dirs = []
    for p in policies:
        if p not in known:
            continue
        t1 = time.perf_counter()
        # NOTE: every policy on BlendServe's engine settings (as the paper's NanoFlow-DFS and -Balance
        # baselines), so only the scheduling differs
        cfg = RunConfig(policy=p, model=model, hardware=hardware, mode=mode, engine="ideal", seed=seed, **engine)
        res = run_simulation(trace, cfg)
        d = write_run(res, out / "runs" / p)
        record(Path(d))
        run_dirs.append(d)
        summaries[p] = res.summary
        echo(f"  simulated {p:<11s} [{time.perf_counter() - t1:.1f} s]")
    from blendsim.reports.render import write_report

    report = write_report(run_dirs, out / "report")  # dfs is the default baseline when it ran
    write_manifest(out, "blendsim demo folder")  # what a later demo into ``out`` may replace
    return {"summaries": summaries, "report": report, "out": out}


def print_table(summaries: dict, baseline: str = "dfs") -> None:
    from blendsim.reports.terminal import print_demo_table

    print_demo_table(summaries, baseline, setting="simulated: llama-3-8b on a100-80gb, roofline cost model, "
                                                  "overlap mode, BlendServe's engine settings for all")


__all__ = ["DEMO_POLICIES", "print_table", "run_demo"]
