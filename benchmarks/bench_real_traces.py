"""Every policy on real traces: Mooncake's conversation trace (real prefix sharing) and Azure's (none).

    python benchmarks/bench_real_traces.py [--traces mooncake azure-conv azure-code] [--deployments 8b 70b]
                                           [--tp70 4] [--policies ...] [--limit N] [--json FILE]

Traces from ``../shared/data`` (SOURCES.md): ``mooncake_conversation_trace.jsonl`` (Kimi, FAST'25: 12,031
requests in an hour, 512-token block hashes, s_o 0.374) and the Azure LLM inference 2023 conv / code
traces (no prompt content, so s_o = 0). Deployments: llama-3.1-8b on one H100 and llama-3.1-70b with
``--tp70`` GPUs (the llama-3-* presets of the same shapes where the 3.1 names do not exist), roofline
cost model. Three runs per policy:

* ``seq``: offline (every request at t = 0), sequential mode, every policy priced on one engine
  (``--engine``, default ``vllm``) with the scheduler settings it declares, plus ``vllm@2k`` (vLLM with a
  2,048-token chunk, BatchLLM's baseline, sec. 6.1);
* ``ovl``: offline, overlap mode (NanoFlow-like), every policy on BlendServe's engine settings (NanoFlow
  overheads, 1,024-token budget in multiples of 128, token-granular cache) so only the order differs --
  the comparison BlendServe makes (``bench_blendserve.py`` does the same);
* ``online``: the trace's own arrival times, sequential mode, on the same engine as ``seq``: mean latency,
  TTFT and TBT.

Columns: throughput (k tok/s); ``s/s_o``: prefix sharing achieved over the optimum; ``fpo``: fraction of
the blended reference (``frac_of_reference``, not a bound); ``tok/st`` and ``kv``: mean tokens per step and KV
utilisation of the ovl run. Each trace's header gives its shape, compute density rho on the deployment,
the offered load of its own timestamps against dfs's offline throughput, and -- for hashed traces --
the sharing an LRU prefix cache of the deployment's KV capacity could catch in arrival order (what a
vLLM-like FCFS server can get at best) and the distance between reuses of a shared block.

Not run by CI. The full run (3 traces x 2 deployments, 28 runs each) takes about 10 minutes on 2 cores;
``--limit N`` keeps the first N requests of each trace.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
from _data import add_data_option, data_file  # noqa: E402 (benchmarks/_data.py, beside this script)

from blendsim.policies.registry import policy_names
from blendsim.runner import RunConfig, run_simulation
from blendsim.sim.density import Rates, comp_time, mem_time
from blendsim.sim.deployment import make_deployment
from blendsim.sim.errors import UserError
from blendsim.sim.models import PRESETS
from blendsim.workloads.loaders import load

TRACES = {
    "mooncake": ("mooncake_conversation_trace.jsonl", "mooncake"),
    "azure-conv": ("azure_llm_inference_2023_conv.csv", "azure"),
    "azure-code": ("azure_llm_inference_2023_code.csv", "azure"),
}
# ablations: (row label, policy, run kind, RunConfig overrides); "-oracle" runs know every output length
VARIANTS = (("vllm@2k", "vllm", "seq", {"token_budget": 2048}),
            ("batchllm-sched", "batchllm", "seq", {"options": {"shared_attention": False}}),
            ("blendserve-oracle", "blendserve", "ovl", {}))
BLENDSERVE_ENGINE = {"mode": "overlap", "engine": "nanoflow", "token_budget": 1024, "round_tokens": 128,
                     "block_size": 1}


def model_name(*names: str) -> str:
    return next(n for n in names if n in PRESETS)


def deployments(tp70: int) -> dict:
    return {"8b": (model_name("llama-3.1-8b", "llama-3-8b"), "h100-80gb", 1),
            "70b": (model_name("llama-3.1-70b", "llama-3-70b"), "h100-80gb", tp70)}


def simulate(trace, policy: str, dep: tuple, offline: bool, **kw) -> tuple[dict, float]:
    model, hw, tp = dep
    t0 = time.perf_counter()
    cfg = RunConfig(policy=policy, model=model, hardware=hw, tp=tp, offline=offline, **kw)
    return run_simulation(trace, cfg).summary, time.perf_counter() - t0


def lru_reach(trace, capacity_tokens: int) -> tuple[float, float, float]:
    """Prefix sharing an LRU cache of ``capacity_tokens`` prompt tokens catches in arrival order (prefix
    hits stop at the first miss; a request's blocks are inserted as it arrives; running requests' other
    KV is ignored, so this is an upper bound for an FCFS server with an LRU prefix cache), and the
    median gap between two uses of one tree position in seconds and in prompt tokens arrived between."""
    order = np.lexsort((np.arange(trace.n), trace.arrival_s))
    arrived = np.cumsum(trace.input_len[order])
    cache: OrderedDict = OrderedDict()
    keys: dict = {}
    last: dict = {}
    gaps_s, gaps_tok = [], []
    used = hit = 0
    for j, i in enumerate(order):
        sym, ln = trace.units(i)
        parent, missed = 0, False
        for s, n in zip(sym.tolist(), ln.tolist()):
            k = keys.setdefault((parent, s), len(keys) + 1)
            if k in cache:
                cache.move_to_end(k)
                if not missed:
                    hit += n
            else:
                missed = True
                cache[k] = n
                used += n
            if k in last:
                t_prev, j_prev = last[k]
                gaps_s.append(trace.arrival_s[i] - t_prev)
                gaps_tok.append(arrived[j - 1] - arrived[j_prev] if j else 0)
            last[k] = (trace.arrival_s[i], j)
            parent = k
        while used > capacity_tokens:
            used -= cache.popitem(last=False)[1]
    p = int(trace.input_len.sum())
    med = (lambda g: float(np.median(g)) if g else float("nan"))  # noqa: E731
    return hit / p, med(gaps_s), med(gaps_tok)


def bench_one(name: str, trace, dep_key: str, dep: tuple, policies: list[str], out: dict,
              engine: str = "vllm") -> dict:
    seq, ovl, onl, wall = {}, {}, {}, 0.0
    oracle = trace.take(np.arange(trace.n))
    oracle.output_len_hint = trace.output_len.copy()  # every output length known in advance
    seq_engine = {"engine": engine}  # one engine for every policy of the seq and online comparisons
    runs = [("seq", p, True, seq_engine) for p in policies]
    runs += [("ovl", p, True, BLENDSERVE_ENGINE) for p in policies]
    if trace.has_arrivals:
        runs += [("online", p, False, seq_engine) for p in policies]
    for label, base, kind, kw in VARIANTS:
        if base in policies:
            runs.append((kind, label, True, kw | (BLENDSERVE_ENGINE if kind == "ovl" else seq_engine)))
    for kind, label, offline, kw in runs:
        pol = label.split("@")[0].split("-")[0]
        try:
            s, w = simulate(oracle if label.endswith("oracle") else trace, pol, dep, offline, **kw)
        except UserError as e:  # a policy that cannot take these engine settings: its cell stays empty
            print(f"({label} {kind}: {e})")
            continue
        wall += w
        {"seq": seq, "ovl": ovl, "online": onl}[kind][label] = s
    ref = seq.get("dfs") or next(iter(seq.values()))
    s_o, cap = ref["optimal_sharing_ratio"], ref["kv_capacity_blocks"] * ref["block_size"]
    span = float(trace.arrival_s.max() - trace.arrival_s.min())
    offered = (ref["input_tokens"] + ref["output_tokens"]) / span if span > 0 else float("nan")
    head = {"trace": name, "deployment": dep_key, "model": dep[0], "tp": dep[2], "requests": trace.n,
            "mean_input": float(trace.input_len.mean()), "mean_output": float(trace.output_len.mean()),
            "s_o": s_o, "rho": ref["compute_density"], "kv_tokens": int(cap), "offered_tok_s": offered,
            "offered_over_dfs": offered / ref["throughput_tok_s"], "wall_s": wall}
    rates = Rates.of(make_deployment(*dep))  # per-request density rho(r) = Comp(r) / Mem(r), no sharing
    p, d = trace.input_len.astype(float), trace.output_len.astype(float)
    mem = mem_time(p, d, rates)
    comp = comp_time(p, d, rates)
    low = comp < mem
    head["rho_p10"] = float(np.percentile(comp / np.maximum(mem, 1e-30), 10))
    head["mem_intensive_requests"] = float(np.mean(low))
    head["mem_time_in_mem_intensive"] = float(mem[low].sum() / mem.sum())
    if s_o > 0:
        head["lru_sharing"], head["reuse_gap_s"], head["reuse_gap_tokens"] = lru_reach(trace, cap)
    print(f"\n### {name} · {dep[0]} on {dep[2]}x h100-80gb — {trace.n:,} requests, mean prompt "
          f"{head['mean_input']:,.0f} / output {head['mean_output']:,.0f}, s_o {s_o:.3f}, rho {head['rho']:.2f}, "
          f"KV {cap / 1e3:,.0f}K tokens")
    print(f"own timestamps offer {offered / 1e3:.1f}K tok/s = {head['offered_over_dfs']:.2f}x dfs's offline "
          f"throughput; requests with rho < 1: {head['mem_intensive_requests']:.1%} holding "
          f"{head['mem_time_in_mem_intensive']:.1%} of the memory time, 10th percentile rho {head['rho_p10']:.2f}"
          + (f"; LRU prefix cache of the KV size in arrival order catches s = {head['lru_sharing']:.3f}, "
                          f"median reuse gap {head['reuse_gap_s']:.0f} s / {head['reuse_gap_tokens'] / 1e6:.1f}M "
                          "prompt tokens" if s_o > 0 else "") + f"; {wall:.0f} s of simulation")
    cols = ["policy", "seq k tok/s", "s/s_o", "fpo", "ovl k tok/s", "s/s_o", "fpo", "tok/st", "kv"]
    if onl:
        cols += ["online k tok/s", "lat s", "TTFT s", "TBT ms"]
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for label in [*policies, *(v[0] for v in VARIANTS)]:
        if label not in seq and label not in ovl:
            continue
        a, b, c = seq.get(label), ovl.get(label), onl.get(label)
        row = [label, f"{a['throughput_tok_s'] / 1e3:.1f}", _frac(a, s_o), _ref(a)] \
            if a else [label, "-", "-", "-"]
        row += [f"{b['throughput_tok_s'] / 1e3:.1f}", _frac(b, s_o), _ref(b),
                f"{b['mean_tokens_per_step']:.0f}", f"{b['mean_kv_util']:.2f}"] if b else ["-"] * 5
        if onl:
            row += [f"{c['throughput_tok_s'] / 1e3:.1f}", f"{c['latency_mean_s']:.1f}", f"{c['ttft_mean_s']:.1f}",
                    f"{c['tbt_mean_s'] * 1e3:.0f}"] if c else ["-"] * 4
        print("| " + " | ".join(row) + " |", flush=True)
    ratios = _ratios(seq, ovl, onl)
    if "blendserve" in ovl:  # its output-length estimates (1% sample + the prefix tree) against the truth
        ratios["blendserve est. mean abs rel err"] = ovl["blendserve"]["blendserve"]["est_mean_abs_rel_err"]
    print("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    out[f"{name}/{dep_key}"] = {"header": head, "ratios": ratios, "seq": seq, "ovl": ovl, "online": onl}
    return head | ratios


def _ref(s: dict) -> str:
    """The fraction of the blended reference, or "-" where a summary holds null (the reference below T_o)."""
    v = s.get("frac_of_reference")
    return "-" if v is None else f"{v:.3f}"


def _frac(s: dict, s_o: float) -> str:
    return f"{s['prefix_sharing_ratio'] / s_o:.3f}" if s_o > 0 else "-"


def _ratios(seq: dict, ovl: dict, onl: dict) -> dict:
    """The papers' comparisons: BlendServe over dfs / random on its engine (overlap), BatchLLM over
    vLLM with a 2,048-token chunk and as registered (sequential), online latency of the two over vllm."""
    tp = (lambda d, a, b: d[a]["throughput_tok_s"] / d[b]["throughput_tok_s"])  # noqa: E731
    r = {}
    for a, b, d, key in (("blendserve", "dfs", ovl, "blendserve/dfs ovl"), ("blendserve", "random", ovl,
                         "blendserve/random ovl"), ("batchllm", "vllm@2k", seq, "batchllm/vllm@2k seq"),
                         ("batchllm", "vllm", seq, "batchllm/vllm seq"), ("batchllm", "dfs", seq, "batchllm/dfs seq"),
                         ("batchllm-sched", "vllm@2k", seq, "batchllm-sched/vllm@2k seq"),
                         ("blendserve-oracle", "dfs", ovl, "blendserve-oracle/dfs ovl")):
        if a in d and b in d:
            r[key] = tp(d, a, b)
    for a in ("blendserve", "batchllm", "dfs", "e2"):
        if a in onl and "vllm" in onl:
            r[f"{a}/vllm latency"] = onl[a]["latency_mean_s"] / onl["vllm"]["latency_mean_s"]
    return r


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", nargs="+", default=list(TRACES), choices=list(TRACES))
    ap.add_argument("--deployments", nargs="+", default=["8b", "70b"], choices=["8b", "70b"])
    ap.add_argument("--tp70", type=int, default=4, help="GPUs of the 70B model (tensor parallel)")
    ap.add_argument("--policies", nargs="+", default=policy_names())
    ap.add_argument("--limit", type=int, default=None, help="keep the first N requests of each trace")
    ap.add_argument("--json", type=Path, default=None, help="also write every summary here")
    ap.add_argument("--engine", default="vllm", help="the one engine the seq and online runs are priced on")
    add_data_option(ap)
    a = ap.parse_args(argv)
    deps = deployments(a.tp70)
    out, rows = {}, []
    t0 = time.perf_counter()
    for name in a.traces:
        fname, fmt = TRACES[name]
        t1 = time.perf_counter()
        trace = load(data_file(a.data, fname), fmt, a.limit)
        print(f"\nloaded {name}: {trace.n:,} requests in {time.perf_counter() - t1:.2f} s")
        for d in a.deployments:
            rows.append(bench_one(name, trace, d, deps[d], a.policies, out, a.engine))
    cols = {"bs/dfs ovl": "blendserve/dfs ovl", "bs-oracle/dfs ovl": "blendserve-oracle/dfs ovl",
            "bs/random ovl": "blendserve/random ovl", "bllm/vllm@2k": "batchllm/vllm@2k seq",
            "bllm-sched/vllm@2k": "batchllm-sched/vllm@2k seq", "bllm/dfs": "batchllm/dfs seq"}
    print("\n## summary\n| trace | model | s_o | rho | rho<1 reqs | load/dfs | LRU s | " + " | ".join(cols)
          + " |\n|" + "---|" * (7 + len(cols)))
    for r in rows:
        cells = [f"{r[k]:.2f}" if k in r else "-" for k in cols.values()]
        lru = f"{r['lru_sharing']:.3f}" if "lru_sharing" in r else "-"
        print(f"| {r['trace']} | {r['model']} x{r['tp']} | {r['s_o']:.3f} | {r['rho']:.2f} | "
              f"{r['mem_intensive_requests']:.0%} | {r['offered_over_dfs']:.2f} | {lru} | " + " | ".join(cells) + " |")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1, sort_keys=True, default=str))


if __name__ == "__main__":
    main()
