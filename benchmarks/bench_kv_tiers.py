"""KV tiers (issue 26): every policy with the GPU's KV only, + a host-memory tier, + host and disk.

    python benchmarks/bench_kv_tiers.py [--mooncake-limit N] [--grid-requests N] [--deployments 8b 70b]
                                        [--policies ...] [--host-gb 256] [--disk-gb 2000] [--full] [--json FILE]
    python benchmarks/bench_kv_tiers.py --speed [--speed-requests 400000] [--repeat 3]

Tables (one per trace x deployment; deployments as bench_real_traces.py: llama-3-8b on one H100 and
llama-3-70b on four, roofline cost model, every policy on the one default engine, ``ideal``, whose loads stall):

* **Mooncake** conversation trace (../shared/data, real 512-token block sharing, s_o 0.374): an *online*
  run on the trace's own timestamps (mean latency and TTFT, sharing kept) and an *offline* run (all at
  t = 0: throughput, sharing kept). Default: the first 3,000 requests (``--mooncake-limit 0`` or ``--full``:
  all 12,031).
* a **synthetic grid**: ``workloads synth blendserve`` traces (App. A.3: BurstGPT + OpenVid + MMLU) at
  rho 1.1 and s 0.15 / 0.35, offline. Default 10,000 requests per cell (``--full``: 100,000).

Tier columns: ``gpu`` (no tier), ``+host`` (``--host-gb``, default 256 GB per replica) and ``+host+disk``
(plus ``--disk-gb``, default 2 TB). Each cell: ``s/s_o`` (prefix sharing over the optimum), throughput in
k tok/s, online mean latency in s; ``host``/``disk`` columns give the prompt tokens served from each tier
(% of prompt tokens), the bytes loaded and the seconds steps waited on loads, and ``link`` the host link's
busy time over the makespan (near 1: the link is the bottleneck).

``--speed``: the engine's cost of a tier. ``workloads synth blendserve --requests N`` (default 400,000) run
as whole ``blendsim simulate`` processes (median of ``--repeat``) with and without ``--host-kv-gb 256`` for
dfs (bench_engine.py's job) and fcfs (arrival order: the most evictions and reloads); target: the tier run
within 1.5x the GPU-only wall time.

Not run by CI.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from blendsim.policies.registry import policy_names
from blendsim.runner import RunConfig, run_simulation
from blendsim.sim.errors import UserError
from blendsim.workloads.loaders import load

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import bench  # noqa: E402  (whole-process timing, median of runs)
from bench_real_traces import deployments  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MOONCAKE = DATA / "mooncake_conversation_trace.jsonl"


def tier_configs(host_gb: float, disk_gb: float) -> dict:
    return {"gpu": {}, "+host": {"host_kv_gb": host_gb}, "+host+disk": {"host_kv_gb": host_gb, "disk_kv_gb": disk_gb}}


def run(trace, policy: str, dep: tuple, offline: bool, tiers: dict) -> dict | None:
    model, hw, tp = dep
    print(f"  {policy} {'offline' if offline else 'online'} {tiers or 'gpu'}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        s = run_simulation(trace, RunConfig(policy=policy, model=model, hardware=hw, tp=tp, offline=offline,
                                            **tiers)).summary
    except UserError as e:
        print(f"({policy} {tiers}: {e})")
        return None
    s["_wall_s"] = time.perf_counter() - t0
    return s


def cell(s: dict | None, s_o: float, online: bool) -> list[str]:
    if s is None:
        return ["-"] * 3
    share = f"{s['prefix_sharing_ratio'] / s_o:.3f}" if s_o > 0 else "-"
    out = [share, f"{s['throughput_tok_s'] / 1e3:.1f}"]
    out.append(f"{s['latency_mean_s']:,.0f}" if online and "latency_mean_s" in s else "")
    return out


def tier_detail(s: dict | None) -> str:
    if s is None or not s.get("kv_load_bytes"):
        return "-"
    h = s["prefix_hit_tokens"]
    p = s["input_tokens"]
    link = s["host_link_busy_s"] / s["makespan_s"] if s["makespan_s"] > 0 else 0.0
    disk = f", disk {h['disk'] / p:.1%}" if h["disk"] else ""
    return (f"host {h['host'] / p:.1%}{disk}, {s['kv_load_bytes'] / 1e12:.2f} TB loaded, "
            f"stall {s['kv_load_stall_s']:,.0f} s, link {link:.2f}")


def bench_trace(name: str, trace, dep_key: str, dep: tuple, policies: list, configs: dict, online: bool,
                out: dict) -> None:
    res: dict = {}
    wall = 0.0
    for pol in policies:
        for tk, tiers in configs.items():
            if online:
                res[(pol, tk, "online")] = s = run(trace, pol, dep, False, tiers)
                wall += s["_wall_s"] if s else 0.0
            res[(pol, tk, "offline")] = s = run(trace, pol, dep, True, tiers)
            wall += s["_wall_s"] if s else 0.0
    ref = next(s for s in res.values() if s is not None)
    s_o = ref["optimal_sharing_ratio"]
    print(f"\n### {name} · {dep[0]} on {dep[2]}x {dep[1]} — {trace.n:,} requests, s_o {s_o:.3f}, GPU KV "
          f"{ref['kv_capacity_blocks'] * ref['block_size'] / 1e3:,.0f}K tokens; {wall:.0f} s of simulation")
    cols = ["policy"]
    for tk in configs:
        cols += [f"{tk} s/s_o", "k tok/s", "lat s" if online else ""]
    cols = [c for c in cols if c]
    print("| " + " | ".join(cols) + " | +host tier (run " + ("online" if online else "offline") + ") |")
    print("|" + "---|" * (len(cols) + 1))
    kind = "online" if online else "offline"
    for pol in policies:
        row = [pol]
        for tk in configs:
            off, on = res.get((pol, tk, "offline")), res.get((pol, tk, "online"))
            share, thr, _ = cell(on if online else off, s_o, False)
            row += [share, cell(off, s_o, False)[1]]
            if online:
                row.append(cell(on, s_o, True)[2])
        row.append(tier_detail(res.get((pol, "+host", kind))))
        print("| " + " | ".join(row) + " |", flush=True)
    out[f"{name}/{dep_key}"] = {f"{p}|{t}|{k}": {kk: v for kk, v in s.items() if not kk.startswith("_")}
                                for (p, t, k), s in res.items() if s is not None}


def speed(args) -> None:
    exe = shutil.which("blendsim") or sys.exit("blendsim is not installed (pip install -e .)")
    import subprocess

    tmp = Path(tempfile.mkdtemp(prefix="bench-kv-tiers-"))
    try:
        trace = tmp / "bs.parquet"
        subprocess.run([exe, "workloads", "synth", "blendserve", "--requests", str(args.speed_requests), "-o",
                        str(trace)], check=True, stdout=subprocess.DEVNULL)
        print(f"{'job':40s} {'median s':>9s} {'min':>7s} {'max':>7s} {'peak MB':>8s}")
        for pol in ("dfs", "fcfs"):
            meds = {}
            for label, extra in (("GPU only", []), (f"+{args.host_gb:g} GB host", ["--host-kv-gb", str(args.host_gb)])):
                cmd = [exe, "simulate", str(trace), "--policy", pol, "--model", "llama-3-8b", "--hardware",
                       "a100-80gb", "-o", str(tmp / f"run-{pol}-{len(extra)}"), "--force", *extra]
                med, lo, hi, mem = bench(cmd, args.repeat)
                meds[label] = med
                print(f"{pol + ', ' + label:40s} {med:9.2f} {lo:7.2f} {hi:7.2f} {mem:8.0f}", flush=True)
            a, b = meds.values()
            print(f"{pol}: tier / GPU only = {b / a:.2f} (target <= 1.5: {'met' if b / a <= 1.5 else 'MISSED'})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def grid_trace(density: float, sharing: float, n: int):
    from blendsim.workloads.recipes.blendserve import BlendServeOptions, build

    return build(BlendServeOptions(density=density, sharing=sharing, requests=n))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mooncake", type=Path, default=MOONCAKE, help="the Mooncake conversation trace (JSONL)")
    ap.add_argument("--mooncake-limit", type=int, default=3000, help="first N Mooncake requests (0: all)")
    ap.add_argument("--grid-requests", type=int, default=10_000)
    ap.add_argument("--densities", default="1.1")
    ap.add_argument("--sharings", default="0.15,0.35")
    ap.add_argument("--deployments", nargs="+", default=["8b", "70b"])
    ap.add_argument("--tp70", type=int, default=4)
    ap.add_argument("--policies", nargs="+", default=None)
    ap.add_argument("--host-gb", type=float, default=256.0)
    ap.add_argument("--disk-gb", type=float, default=2000.0)
    ap.add_argument("--skip-grid", action="store_true")
    ap.add_argument("--skip-mooncake", action="store_true")
    ap.add_argument("--full", action="store_true", help="all of Mooncake and 100,000 requests per grid cell")
    ap.add_argument("--speed", action="store_true", help="only the engine-speed comparison")
    ap.add_argument("--speed-requests", type=int, default=400_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.speed:
        speed(args)
        return
    if args.full:
        args.mooncake_limit, args.grid_requests = 0, 100_000
    policies = args.policies or policy_names()
    configs = tier_configs(args.host_gb, args.disk_gb)
    deps = deployments(args.tp70)
    out: dict = {}
    t0 = time.perf_counter()
    if not args.skip_mooncake:
        if args.mooncake.is_file():
            mc = load(args.mooncake, "mooncake")
            if args.mooncake_limit:
                mc = mc.take(np.arange(min(args.mooncake_limit, mc.n)))
            for dk in args.deployments:
                bench_trace("mooncake", mc, dk, deps[dk], policies, configs, True, out)
        else:
            print(f"Mooncake skipped: {args.mooncake} not found (--mooncake PATH)")
    if not args.skip_grid:
        for rho in (float(x) for x in args.densities.split(",")):
            for s in (float(x) for x in args.sharings.split(",")):
                tr = grid_trace(rho, s, args.grid_requests)
                for dk in args.deployments:
                    bench_trace(f"synth rho {rho:g} s {s:g}", tr, dk, deps[dk], policies, configs, False, out)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=float))


if __name__ == "__main__":
    main()
