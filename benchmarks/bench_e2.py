"""E2 (Preble) against round-robin on Preble's ToolBench workload, and E2's routing speed.

Setting: llama-3-8b on a100-80gb, roofline cost model in ``sequential`` mode (vLLM/SGLang-like: a step
costs compute + memory), SGLang's engine overhead, 4 replicas (data parallel, TP 1), 512-token
chunked-prefill budget and a token-granular prefix cache for every policy. Workload: the ``preble``
recipe's toolbench, Preble's size scaled to 4 GPUs (POLICY_NOTES: 300 prefixes / 3,600 requests /
12 req/s per 2 GPUs -> 600 prefixes, 24 req/s), runs of ``--seconds`` of arrivals (300 s as Preble's
3,600 requests at 12 req/s), at Preble's rate and at higher loads; plus the Zipf-1.1 variant of
Preble's ablation (320 / 5,400 / 18 per 2 GPUs -> 640 prefixes, 36 req/s).

Policies: ``e2`` (the paper's algorithm, defaults), ``e2 no-P/D`` (the same without prefill/decode
balancing: an ablation that explains a difference from the paper, see the report), ``e2-code`` (the options that follow Preble's
public code: cost L + M, the code's load model, TTFT overload signal, group quota 10, exploit rule, route map
and autoscaling), and
``round-robin`` (the ``fcfs`` policy: round-robin routing, FCFS local queue — Preble's baseline).

Routing speed: time spent inside ``E2Router.route`` only (``perf_counter`` around each call; on a
shared machine calls over 2 ms — descheduled by another process — are left out of the mean and
counted; ``thread_time`` is not used: its system call, ~1 us here, also slows the code after it), as
decisions/s, split into ``sync`` (applying replica feedback and expiring the window H — work Preble's global scheduler
does in background threads) and ``decide`` (matching, exploit/explore, load costs, recording,
rebalancing and autoscaling — Preble's request-scheduling path).

    python benchmarks/bench_e2.py [--seconds 300] [--rates 24,48,72] [--zipf-rate 36] [--quick]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _data import add_data_option  # noqa: E402 (benchmarks/_data.py, beside this script)

from blendsim.policies.e2.router import E2Router
from blendsim.runner import RunConfig, run_simulation
from blendsim.workloads.recipes import synthesize

# engine="sglang" prices steps with the fitted SGLang profile (sim.engines); its scheduler knobs are pinned
# here to the setting above (decode-first 512-token chunks, no sequence cap), the same for every policy
ENGINE = dict(model="llama-3-8b", hardware="a100-80gb", mode="sequential", replicas=4, engine="sglang",
              token_budget=512, block_size=1, mix="decode-first", max_seqs=0, gpu_memory_utilization=0.90)
CODE_OPTS = {"cost": "lm", "load": "code", "overload_signal": "ttft", "quota_unit": 10, "exploit": "code",
             "route_map": "window", "autoscale": "code"}
POLICIES = (("e2", "e2", {}), ("e2 no-P/D", "e2", {"pd_balance": False}), ("e2-code", "e2", CODE_OPTS),
            ("round-robin", "fcfs", {}))
TARGET_DECISIONS_S = 20_000


PREEMPTED_S = 2e-3  # a call this long was descheduled by another process (a decision takes ~50 us)


class RouteClock:
    """Per-call wall time (``perf_counter``, no system call) of E2Router.route and of its ``sync``
    part (feedback and window bookkeeping); ``decide`` is the rest."""

    def __init__(self):
        self.route: list[float] = []
        self.sync: list[float] = []
        self._orig = E2Router.route, E2Router.sync

    def __enter__(self):
        (orig, orig_sync), clock, T = self._orig, self, time.perf_counter

        def route(router, req, now):
            t = T()
            i = orig(router, req, now)
            clock.route.append(T() - t)
            return i

        def sync(router, now):
            t = T()
            orig_sync(router, now)
            clock.sync.append(T() - t)

        E2Router.route, E2Router.sync = route, sync
        return self

    def __exit__(self, *exc):
        E2Router.route, E2Router.sync = self._orig

    def stats(self) -> dict:
        r, s = np.asarray(self.route), np.asarray(self.sync)
        ok = r < PREEMPTED_S  # calls that ran undisturbed
        return {"decisions": len(r), "route_mean_s": float(r[ok].mean()), "route_median_s": float(np.median(r)),
                "route_raw_mean_s": float(r.mean()), "sync_mean_s": float(s[ok].mean()),
                "preempted": float(1 - ok.mean())}


def run(trace, policy: str, opts: dict) -> dict:
    with RouteClock() as clock:
        t0 = time.perf_counter()
        res = run_simulation(trace, RunConfig(policy=policy, options=dict(opts), **ENGINE))
        wall = time.perf_counter() - t0
    s = res.summary
    out = {k: s[k] for k in ("latency_mean_s", "latency_p99_s", "ttft_mean_s", "ttft_p99_s",
                              "prefix_sharing_ratio", "makespan_s")}
    out["sim_wall_s"] = wall
    out["replica_share"] = np.bincount(res.requests["replica"], minlength=4) / trace.n
    if clock.route:
        out.update(clock.stats())
        out.update({k: s[k] for k in s if k.startswith("e2_")})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0, help="arrival span of each run (s)")
    ap.add_argument("--rates", default="24,48,72", help="uniform-toolbench arrival rates (req/s, 4 GPUs)")
    ap.add_argument("--zipf-rate", type=float, default=36.0, help="Zipf-1.1 toolbench rate (0: skip)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="60 s runs at 24 and 48 req/s only")
    add_data_option(ap)
    a = ap.parse_args()
    if a.quick:
        a.seconds, a.rates, a.zipf_rate = 60.0, "24,48", 0.0
    rates = [float(r) for r in a.rates.split(",") if r]
    cases = [(f"toolbench {r:g} req/s", dict(kind="toolbench", rate=r, prefixes=600)) for r in rates]
    if a.zipf_rate > 0:
        cases.append((f"toolbench zipf-1.1 {a.zipf_rate:g} req/s",
                      dict(kind="toolbench", rate=a.zipf_rate, prefixes=640, zipf=1.1)))
    print(f"llama-3-8b / a100-80gb, sequential mode, sglang overhead, 4 replicas, budget 512, "
          f"{a.seconds:g} s of Poisson arrivals per run")
    head = (f"{'workload':<30} {'policy':<12} {'lat mean':>9} {'lat p99':>9} {'ttft mean':>9} {'ttft p99':>9} "
            f"{'sharing':>8} {'sim s':>6}  replica share")
    print(head)
    print("-" * len(head))
    speed = []
    for name, spec in cases:
        trace = synthesize("preble", requests=int(spec["rate"] * a.seconds), seed=a.seed, **spec)
        for label, policy, opts in POLICIES:
            o = run(trace, policy, opts)
            share = " ".join(f"{x:.2f}" for x in o["replica_share"])
            print(f"{name:<30} {label:<12} {o['latency_mean_s']:9.2f} {o['latency_p99_s']:9.2f} "
                  f"{o['ttft_mean_s']:9.2f} {o['ttft_p99_s']:9.2f} {o['prefix_sharing_ratio']:8.3f} "
                  f"{o['sim_wall_s']:6.1f}  {share}")
            if "decisions" in o:
                speed.append((name, label, o))
    print(f"\nrouting time per decision (wall, perf_counter per call; calls over {PREEMPTED_S * 1e3:g} ms were "
          f"descheduled by other processes and are left out of the means): route = sync + decide")
    print(f"{'workload':<30} {'policy':<12} {'decisions':>9} {'route us':>8} {'median':>7} {'sync us':>8} "
          f"{'decide us':>9} {'route/s':>8} {'decide/s':>8} {'left out':>8}  exploit/explore/pd/moves/scaled")
    tot: dict = {}
    for name, label, o in speed:
        n, r, sy = o["decisions"], o["route_mean_s"], o["sync_mean_s"]
        t = tot.setdefault(label, [0, 0.0, 0.0])
        t[0], t[1], t[2] = t[0] + n, t[1] + n * r, t[2] + n * (r - sy)
        print(f"{name:<30} {label:<12} {n:9d} {1e6 * r:8.1f} {1e6 * o['route_median_s']:7.1f} {1e6 * sy:8.1f} "
              f"{1e6 * (r - sy):9.1f} {1 / r:8.0f} {1 / (r - sy):8.0f} {100 * o['preempted']:7.2f}%  "
              f"{o['e2_exploit']}/{o['e2_explore']}/{o['e2_pd_balanced']}/{o['e2_rebalance_moves']}/"
              f"{o['e2_autoscaled']}")
    for label, (n, r, d) in tot.items():
        print(f"all {label} runs: {n / r:,.0f} routing decisions per second, route() whole; "
              f"{n / d:,.0f} counting decide() only (target >= {TARGET_DECISIONS_S:,})")
    t0, s0 = time.process_time(), 0
    for k in range(2_000_000):
        s0 += k
    print(f"machine speed: a 2,000,000-step Python add loop takes {time.process_time() - t0:.3f} s of CPU")


if __name__ == "__main__":
    main()
