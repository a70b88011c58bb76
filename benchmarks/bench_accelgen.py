"""AccelGen against Sarathi-Serve and vLLM on AccelGen's mixed-prompt, heterogeneous-SLO workload.

Builds the ``accelgen`` recipe (Alpaca + ShareGPT + 35% BookCorpus; TTFT, TBT and JCT SLOs as in the
paper's sec. 3.1/6.1, the TTFT base priced on the simulated model) at each arrival rate and simulates
every policy on one replica. Prints, per rate and policy:

* the project's metrics (``sim/metrics.py``): SLO attainment (a request meets all of its SLOs; TBT
  uses the longest gap between its tokens), goodput (tokens of those requests / makespan), throughput;
* the attainment of each SLO kind alone (TTFT, TBT, JCT);
* ``iter``: the paper's *iteration* SLO attainment (sec. 3.2: share of iterations that meet their
  iteration-level SLO) — every decode step of an online request is one iteration checked against its
  TBT SLO, its prompt processing one iteration checked against its TTFT SLO;
* preemptions, the 95th-percentile step time and the simulation's wall time.

    python benchmarks/bench_accelgen.py [--requests 1000] [--rates 0.25,0.5,1] [--model llama-3-8b]
        [--hardware a100-80gb] [--variants "budget_model=cost"] [--seed 0]

``--variants`` adds AccelGen runs with policy options (``;``-separated key=value, ``,`` between runs).
``--ttft-scale`` multiplies the recipe's TTFT SLOs (a diagnostic: at 1, most are below what any
batched step can deliver, so nearly every request is urgent on arrival).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sim.runner import RunConfig, run_simulation
from workloads.recipes import synthesize


def iteration_attainment(trace, rq: dict, steps: list) -> float:
    """Paper-style attainment: met iterations / iterations, over online requests (TTFT + TBT SLOs)."""
    online = np.isfinite(trace.ttft_slo_s) | np.isfinite(trace.tbt_slo_s)
    good = total = 0
    t_end = [np.asarray(c["t_end_s"]) for c in steps]
    dt = [np.asarray(c["dt_s"]) for c in steps]
    for i in np.flatnonzero(online).tolist():
        if np.isfinite(trace.ttft_slo_s[i]):
            total += 1
            good += bool(rq["ttft_s"][i] <= trace.ttft_slo_s[i])
        slo = trace.tbt_slo_s[i]
        if np.isfinite(slo) and trace.output_len[i] > 1:
            rep = int(rq["replica"][i])
            lo = np.searchsorted(t_end[rep], rq["first_token_s"][i], side="right")
            hi = np.searchsorted(t_end[rep], rq["finish_s"][i], side="right")
            seg = dt[rep][lo:hi]
            total += len(seg)
            good += int((seg <= slo).sum())
    return good / total if total else 1.0


def kind_attainment(trace, rq: dict) -> tuple[float, float, float]:
    """Share of requests meeting their TTFT, their TBT (longest gap) and their JCT SLO."""
    out = []
    for slo, got in ((trace.ttft_slo_s, rq["ttft_s"]), (trace.tbt_slo_s, rq["tbt_max_s"]),
                     (trace.jct_slo_s, rq["jct_s"])):
        has = np.isfinite(slo)
        ok = (got[has] <= slo[has]) | ((trace.output_len[has] <= 1) & np.isnan(got[has]))
        out.append(float(ok.mean()) if has.any() else float("nan"))
    return tuple(out)


def run_one(trace, policy: str, model: str, hardware: str, options: dict) -> dict:
    t0 = time.perf_counter()
    r = run_simulation(trace, RunConfig(policy=policy, model=model, hardware=hardware, options=options))
    wall = time.perf_counter() - t0
    s, rq = r.summary, r.requests
    ttft, tbt, jct = kind_attainment(trace, rq)
    dt = np.concatenate([np.asarray(c["dt_s"]) for c in r.steps])
    return {"slo": s["slo_attainment"], "goodput": s["goodput_tok_s"], "thr": s["throughput_tok_s"],
            "makespan": s["makespan_s"], "ttft": ttft, "tbt": tbt, "jct": jct,
            "iter": iteration_attainment(trace, rq, r.steps), "pre": s["preemptions"],
            "p95dt": float(np.percentile(dt, 95)), "wall": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rates", default="0.25,0.5,1")
    ap.add_argument("--model", default="llama-3-8b")
    ap.add_argument("--hardware", default="a100-80gb")
    ap.add_argument("--policies", default="accelgen,sarathi,vllm")
    ap.add_argument("--variants", default="budget_model=cost", help="extra accelgen option sets")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ttft-scale", type=float, default=1.0, help="multiply the TTFT SLOs (diagnostic)")
    a = ap.parse_args()
    runs = [(p, {}) for p in a.policies.split(",")]
    for v in filter(None, a.variants.split(",")):
        runs.append(("accelgen", dict(kv.split("=", 1) for kv in v.split(";") if kv)))
    head = (f"{'rate':>5} {'policy':<34} {'SLO':>6} {'goodput':>8} {'thr':>7} {'makespan':>8} {'TTFT':>6} "
            f"{'TBT':>6} {'JCT':>6} {'iter':>6} {'preempt':>7} {'p95 dt':>7} {'wall s':>6}")
    print(f"{a.requests} requests of the accelgen recipe, {a.model} on {a.hardware}, one replica, "
          f"seed {a.seed}, TTFT SLOs x{a.ttft_scale:g}")
    print(head)
    for rate in (float(x) for x in a.rates.split(",")):
        trace = synthesize("accelgen", requests=a.requests, rate=rate, model=a.model, hardware=a.hardware,
                           seed=a.seed)
        trace.ttft_slo_s = trace.ttft_slo_s * a.ttft_scale
        for policy, opts in runs:
            m = run_one(trace, policy, a.model, a.hardware, opts)
            name = policy + ("[" + ",".join(f"{k}={v}" for k, v in opts.items()) + "]" if opts else "")
            print(f"{rate:>5.2f} {name:<34} {m['slo']:>6.3f} {m['goodput']:>8.0f} {m['thr']:>7.0f} "
                  f"{m['makespan']:>8.1f} {m['ttft']:>6.3f} {m['tbt']:>6.3f} {m['jct']:>6.3f} "
                  f"{m['iter']:>6.3f} {m['pre']:>7d} {m['p95dt']:>7.3f} {m['wall']:>6.1f}", flush=True)


if __name__ == "__main__":
    main()
