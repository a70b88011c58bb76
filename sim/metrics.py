"""Run metrics (DESIGN.md definitions), shared by the simulator, the replay and the reports.

* throughput = (all input + output tokens) / makespan (BlendServe's definition);
* prefix sharing ratio s = 1 - (prefill tokens computed - recomputed) / prompt tokens (BatchLLM Eq. 2,
  recomputation of preempted requests excluded as BlendServe sec. 6.4 does), shown against the optimal
  s_o of the trace as sharing_frac_of_opt = s / s_o (null, with ``sharing_frac_of_opt_note``, where s_o = 0);
* frac_of_opt = T_o / makespan, T_o a lower bound on the makespan priced by the run's own cost model, engine,
  mode, parallelism and precision (``blendsim.sim.bounds``; docs/DESIGN.md "Bounds that bound"): <= 1 always;
* frac_of_reference = blended reference / makespan: the trace's work as perfectly blended full steps,
  priced by the run's cost model under the overlap mode (:func:`blended_optimum`): an estimate, not a
  bound (a run may pass 1); null, with ``frac_of_reference_note``, where the reference is below T_o;
* latency (JCT), TTFT and TBT when requests have arrival times or SLOs; SLO attainment and goodput
  only when the trace has SLOs (absent from the summary otherwise);
* t_critical_s: the longest request's own chain of steps alone on the engine, a second lower bound
  (:func:`critical_path`; :func:`critical_path_warning` when it dominates the makespan).
"""

from __future__ import annotations

import numpy as np

SUMMARY_SCHEMA = 1
# the throughput metrics engines' benchmarks publish (a fidelity catalogue row's ``metric``), each as tables and
# reports name its unit; every one is of the whole deployment
METRIC_UNITS = {"output_tok_s": "output tok/s", "total_tok_s": "total tok/s", "req_s": "requests/s"}


def format_throughput(v: float) -> str:
    """A throughput as tables print it: whole numbers, but two decimals below 100 (requests per second)."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"


def per_request_table(trace, rec, steps_by_replica: list[dict]) -> dict[str, np.ndarray]:
    """Per-request outcomes: times relative to arrival, mean and max time between tokens.

    The max gap between tokens is the longest step while the request decodes, or the wait between
    its preemption and the next token, whichever is longer.
    """
    arr = trace.arrival_s
    d = trace.output_len
    ttft = rec.first_token_s - arr
    jct = rec.finish_s - arr
    with np.errstate(invalid="ignore", divide="ignore"):
        tbt_mean = np.where(d > 1, (rec.finish_s - rec.first_token_s) / np.maximum(d - 1, 1), np.nan)
    tbt_max = np.full(trace.n, np.nan)
    for rep, cols in enumerate(steps_by_replica):
        mine = np.flatnonzero((rec.replica == rep) & (d > 1) & (rec.finish_step > rec.first_token_step))
        if len(mine) and len(cols["dt_s"]):
            tbt_max[mine] = _range_max(np.asarray(cols["dt_s"]), rec.first_token_step[mine] + 1,
                                       rec.finish_step[mine] + 1)
    tbt_max = np.fmax(tbt_max, np.where(rec.resume_gap_s > 0, rec.resume_gap_s, np.nan))
    ok = np.ones(trace.n, dtype=bool)
    with np.errstate(invalid="ignore"):
        for slo, got in ((trace.ttft_slo_s, ttft), (trace.tbt_slo_s, tbt_max), (trace.jct_slo_s, jct)):
            has = ~np.isnan(slo)
            ok &= ~has | (got <= slo) | ((slo > 0) & np.isnan(got) & (d <= 1))
    return {"ttft_s": ttft, "jct_s": jct, "tbt_mean_s": tbt_mean, "tbt_max_s": tbt_max, "slo_met": ok}


def slo_breakdown(trace, rec, steps_by_replica: list[dict], per_req: dict) -> dict:
    """Attainment per SLO kind, and AccelGen's iteration-level attainment (sec. 3.2): the share of
    iterations that meet their own SLO — a request's first token against its TTFT SLO, and each of
    its decode steps against its TBT SLO (a preemption's wait counts as one more iteration)."""
    out = {}
    met_iter = total_iter = 0
    for name, slo, got in (("ttft", trace.ttft_slo_s, per_req["ttft_s"]), ("tbt", trace.tbt_slo_s, per_req["tbt_max_s"]),
                           ("jct", trace.jct_slo_s, per_req["jct_s"])):
        has = ~np.isnan(slo)
        if has.any():
            ok = (got[has] <= slo[has]) | np.isnan(got[has])  # NaN TBT: a one-token output has no gaps
            out[f"{name}_slo_attainment"] = float(ok.mean())
            if name == "ttft":
                met_iter += int(ok.sum())
                total_iter += int(has.sum())
    tbt = trace.tbt_slo_s
    for rep, cols in enumerate(steps_by_replica):
        dt = np.asarray(cols["dt_s"])
        mine = np.flatnonzero((rec.replica == rep) & ~np.isnan(tbt) & (rec.finish_step > rec.first_token_step))
        for r in mine.tolist():
            seg = dt[rec.first_token_step[r] + 1:rec.finish_step[r] + 1]
            met_iter += int(np.count_nonzero(seg <= tbt[r]))
            total_iter += len(seg)
            if rec.resume_gap_s[r] > 0:
                met_iter += int(rec.resume_gap_s[r] <= tbt[r])
                total_iter += 1
    if total_iter:
        out["iteration_slo_attainment"] = met_iter / total_iter
    return out


def critical_path(trace, cost_model, top: int = 8) -> float:
    """A second lower bound on the makespan: the longest request's own chain of steps, run alone.

    A request's d - 1 decode steps are sequential whatever the schedule; with a few very long outputs
    (OpenVid's 16K-token videos in a small trace) this, not T_o, bounds the makespan.
    """
    from blendsim.sim.batch import BatchFeatures

    d = trace.output_len
    p = trace.input_len
    cand = np.argsort(-(d.astype(np.int64) * 4 + p))[:top]
    best = 0.0
    for i in cand.tolist():
        pi, di = int(p[i]), int(d[i])
        t = cost_model.cost(BatchFeatures.from_parts([(0, pi, 0, 0)], 0, 0, 1)).time_s
        if di > 1:
            t += float(np.sum(cost_model.decode_many(1, np.arange(pi, pi + di - 1, dtype=np.int64))[0]))
        best = max(best, t)
    return best


CRITICAL_SHARE = 0.5  # warn when T_critical is at least this share of the makespan


def critical_path_warning(s: dict) -> str | None:
    """A warning when an offline run's makespan is dominated by its critical path, else None.

    T_critical (``t_critical_s``, :func:`critical_path`) is the longest single request's own chain of
    steps, run alone on the engine: no schedule finishes sooner. When it is at least half the makespan,
    the run's throughput mostly measures that one request's tail (a few long video decodes in a small
    trace), not the scheduling, and its fraction of T_o says little. Online runs are exempt: their
    makespan follows the arrivals.
    """
    try:
        crit, span = float(s["t_critical_s"]), float(s["makespan_s"])
    except (KeyError, TypeError, ValueError):
        return None
    online = isinstance(s.get("offline"), (bool, np.bool_)) and not s["offline"]
    if online or not span > 0 or not crit >= CRITICAL_SHARE * span:
        return None
    return (f"the makespan is dominated by its critical path: the longest request alone takes {crit:,.1f} s "
            f"(T_critical), {100 * crit / span:.0f}% of the {span:,.1f} s makespan, so throughput here measures "
            f"that request's tail more than the schedule; use a larger trace (BlendServe used 40,000 requests)")


def blended_optimum(trace, sharing: float, cost_model, token_budget: int, kv_tokens: float = float("inf"),
                    max_seqs: int = 0) -> float:
    """The practical optimum: the trace's work as a perfectly blended schedule, priced by the run's own
    cost model (timer, engine overhead) under the overlap mode.

    BlendServe sec. 6.1 prices T_o's compute and memory work by *profiling* GEMMs overlapped with
    attention rather than taking max(T_comp, T_mem). Here that profile is the cost model itself: the
    work -- (1 - s_o) of the prompt tokens and every decode step -- is cut into full steps of
    ``token_budget`` new tokens, each carrying the trace's average mix (prefill tokens at their mean
    context, decode tokens at their mean context), and each step is priced like any other. So the
    estimate pays what every schedule on this engine pays (weight reads, elementwise operators, the
    LM head, interference, engine overhead) and nothing a bad order adds (unbalanced steps, short
    steps in the tail, recomputation). A step decodes no more sequences than the KV cache holds at
    their mean context (``kv_tokens``) or the sequence cap allows; when that binds, the decodes need
    more, smaller steps. An estimate, not a bound (T_o is the bound): summaries call it the blended
    reference (``t_reference_s``), and reports draw it as a marker, never as a ceiling.
    """
    from blendsim.sim.batch import BatchFeatures
    from blendsim.sim.cost import CostModel

    p = trace.input_len.astype(np.float64)
    d = trace.output_len.astype(np.float64)
    prefill = (1.0 - sharing) * p.sum()
    k = np.maximum(d - 1.0, 0.0)  # decode steps: the prefill's last position samples the first token
    decode = k.sum()
    total = prefill + decode
    if total <= 0 or token_budget <= 0:
        return 0.0
    steps = total / token_budget
    dec_ctx = float((k * p + k * (k + 1.0) / 2.0).sum() / decode) if decode else 0.0  # token j reads p + j
    fit = min(kv_tokens / max(dec_ctx, 1.0), float(max_seqs) if max_seqs > 0 else float("inf"))
    if decode > steps * fit:  # the decodes need more steps than the budget alone implies
        steps = decode / max(fit, 1.0)
    pf, nd = prefill / steps, decode / steps
    # prefill tokens computed are each prompt's unshared tail: mean position (1 + s) / 2 of the prompt
    pos = (1.0 + sharing) / 2.0 * float((p * p).sum() / p.sum()) if p.sum() else 0.0
    chunk_ctx = max(pos - pf / 2.0, 0.0)
    n_pf, n_d = int(round(pf)), int(round(nd))
    f = BatchFeatures.from_parts([(0, n_pf, int(round(chunk_ctx)), 0)] if n_pf else [], n_d,
                                 int(round(n_d * dec_ctx - n_d)), n_d + (1 if n_pf else 0))
    overlap = cost_model if cost_model.mode == "overlap" else CostModel(
        cost_model.dep, "overlap", cost_model.engine, timer=cost_model.timer, interference=cost_model.kappa)
    return float(steps * overlap.cost(f).time_s)


def _n_rows(cols) -> int:
    """Steps in one replica's columns (a dict of arrays or lists, or a spilled log's mapping: no column read)."""
    n = getattr(cols, "n", None)
    return int(n) if n is not None else len(cols["dt_s"])


def _tree(trace):
    from blendsim.sim.prefix_tree import PrefixTree

    return PrefixTree(trace)


def _range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo:hi]) per query (hi > lo), with a sparse table built one level at a time: level L
    (the maxima of windows of 2**L) answers the queries whose span needs it, then makes level L + 1 and
    is dropped, so memory is two copies of ``values``, not log2(len) of them (a 10M-step run's full
    table would hold ~2 GB)."""
    span = hi - lo
    lvl = np.floor(np.log2(np.maximum(span, 1))).astype(np.int64)
    out = np.empty(len(lo))
    if not len(lo):
        return out
    order = np.argsort(lvl, kind="stable")
    cuts = np.searchsorted(lvl[order], np.arange(int(lvl.max()) + 2))
    t = values
    k = 1
    for L in range(int(lvl.max()) + 1):
        if L:
            t = np.maximum(t[:-k], t[k:])
            k *= 2
        m = order[cuts[L]:cuts[L + 1]]
        if len(m):
            out[m] = np.maximum(t[lo[m]], t[hi[m] - (1 << L)])
    return out


def latency_summary(per_req: dict) -> dict:
    """Latency (JCT: finish - arrival), TTFT and TBT statistics over the requests, in seconds.

    TBT is per request (finish - first token) / (d - 1); requests with one output token have none.
    """
    jct, ttft, tbt = per_req["jct_s"], per_req["ttft_s"], per_req["tbt_mean_s"]
    has_tbt = np.isfinite(tbt).any()
    return {
        "latency_mean_s": float(np.nanmean(jct)),
        "latency_p50_s": float(np.nanpercentile(jct, 50)),
        "latency_p99_s": float(np.nanpercentile(jct, 99)),
        "ttft_mean_s": float(np.nanmean(ttft)),
        "ttft_p50_s": float(np.nanpercentile(ttft, 50)),
        "ttft_p99_s": float(np.nanpercentile(ttft, 99)),
        "tbt_mean_s": float(np.nanmean(tbt)) if has_tbt else 0.0,
        "tbt_p50_s": float(np.nanpercentile(tbt, 50)) if has_tbt else 0.0,
        "tbt_p99_s": float(np.nanpercentile(tbt, 99)) if has_tbt else 0.0,
    }


def summarize(*, trace, rec, steps_by_replica, bounds, cfg, cost_model, engine_cfg, kv_stats, per_req,
              extra=None, tree=None, work=None) -> dict:
    """The summary.json content: no wall-clock fields, so equal runs give equal files. ``work``: the trace's
    :func:`blendsim.sim.bounds.trace_work` when already known (else made from ``tree``, or a tree built here)."""
    n = trace.n
    p_tot = int(trace.input_len.sum())
    d_tot = int(trace.output_len.sum())
    n_steps = [_n_rows(c) for c in steps_by_replica]
    makespan = max((c["t_end_s"][-1] for c, k in zip(steps_by_replica, n_steps) if k), default=0.0)
    computed = int(rec.prefill_computed.sum())
    recomputed = int(rec.recomputed_tokens.sum())
    cached = int(rec.cached_tokens.sum())
    s = 1.0 - (computed - recomputed) / p_tot if p_tot else 0.0
    n_gpu = cfg.replicas * getattr(cfg, "pp", 1)  # TP groups: with pp stages, pp batches run at once per replica
    gpus = int(cost_model.dep.tp * getattr(cost_model.dep, "pp", 1) * cfg.replicas)  # every GPU the run holds
    from blendsim.sim.bounds import lower_bound, trace_work

    max_t = max((int(np.max(c["num_tokens"])) for c, k in zip(steps_by_replica, n_steps) if k), default=0)
    if work is None:
        work = trace_work(trace, tree if tree is not None else _tree(trace))
    lb = lower_bound(work, cost_model,
                     engine_cfg.token_budget, engine_cfg.max_seqs, kv_stats["total"] * engine_cfg.block_size,
                     n_gpu, int(max_t))
    t_opt = lb["t_lb_s"]  # T_o: no schedule on this engine finishes sooner (docs/DESIGN.md)
    # the blended reference: an estimate of a good schedule, not a bound (runs may beat it)
    t_ref = blended_optimum(trace, bounds.sharing, cost_model, engine_cfg.token_budget,
                            kv_stats["total"] * engine_cfg.block_size, engine_cfg.max_seqs) / n_gpu
    # the step columns one at a time, each over all replicas (so the same sums as one concatenated table),
    # dropped before the next: a 10M-request run's steps never sit in memory whole
    steps = sum(n_steps)

    def column(name: str) -> np.ndarray:
        return np.concatenate([np.asarray(c[name]) for c in steps_by_replica])

    comp_s = float(column("compute_s").sum()) if steps else 0.0
    mem_s = float(column("memory_s").sum()) if steps else 0.0
    mean_tokens = float(column("num_tokens").mean()) if steps else 0.0
    used = column("kv_used_blocks") if steps else None
    kv_mean, kv_peak = (float(used.mean() / kv_stats["total"]), int(used.max())) if steps else (0.0, 0)
    del used
    out = {
        "schema_version": SUMMARY_SCHEMA,
        "policy": cfg.policy,
        "model": cost_model.dep.model.name,
        "hardware": cost_model.dep.hardware.name,
        "dtype": cost_model.dep.model.dtype,
        "weights": cost_model.dep.model.weights,
        "kv_dtype": cost_model.dep.model.kv_dtype,
        "tp": cfg.tp,
        "ep": cost_model.dep.ep,
        **({"expert_skew": cost_model.dep.expert_skew} if cost_model.dep.model.is_moe else {}),
        "replicas": cfg.replicas,
        "mode": cost_model.mode,
        "engine": cost_model.engine.label,
        "engine_profile": cost_model.engine.modelled,
        # a calibrated profile file: its content, so a report never takes two versions of one file for one engine
        **({"engine_sha256": _file_digest(cost_model.engine.params_file)} if cost_model.engine.params_file else {}),
        "cost_model": cost_model.timer_name,
        "token_budget": engine_cfg.token_budget,
        "max_seqs": engine_cfg.max_seqs,
        "block_size": engine_cfg.block_size,
        "round_tokens": engine_cfg.round_tokens,
        "mix": engine_cfg.mix,
        "prefix_caching": engine_cfg.prefix_caching,
        "prefix_retain": engine_cfg.prefix_retain,
        # admission and memory: what a policy may set over the engine's (batchllm admits greedily), so a
        # comparison can say where its runs differ there too (reports.tables.SETTINGS)
        "admission": engine_cfg.admission,
        "reserve_ratio": engine_cfg.reserve_ratio,
        "kv_full": engine_cfg.kv_full,
        "gpu_memory_utilization": engine_cfg.gpu_memory_utilization,
        "kv_capacity_blocks": kv_stats["total"],
        "seed": cfg.seed,
        "offline": bool(cfg.offline or not trace.has_arrivals),
        "trace_name": trace.meta.get("name"),  # a loaded trace's file stem (reports label runs by it)
        "n_requests": n,
        "input_tokens": p_tot,
        "output_tokens": d_tot,
        "makespan_s": makespan,
        "throughput_tok_s": (p_tot + d_tot) / makespan if makespan > 0 else 0.0,
        # what engines' benchmarks and the fidelity catalogue report: output tokens, per GPU
        "gpus": gpus,
        "output_tok_s": d_tot / makespan if makespan > 0 else 0.0,
        "throughput_tok_s_per_gpu": (p_tot + d_tot) / makespan / gpus if makespan > 0 else 0.0,
        "output_tok_s_per_gpu": d_tot / makespan / gpus if makespan > 0 else 0.0,
        "prefix_sharing_ratio": s,
        "optimal_sharing_ratio": bounds.sharing,
        # a trace without shared prefixes has no sharing to reach: null (with a note), not 0 / 0 read as 100%
        "sharing_frac_of_opt": s / bounds.sharing if bounds.sharing > 0 else None,
        "cached_tokens": cached,
        "prefill_tokens_computed": computed,
        "recomputed_tokens": recomputed,
        "preemptions": int(rec.preemptions.sum()),
        "evicted_blocks": kv_stats["evicted"],
        "compute_density": bounds.density,
        "t_comp_s": bounds.t_comp_s,
        "t_mem_s": bounds.t_mem_s,
        "t_opt_s": t_opt,
        "t_opt_exact": bool(lb["exact"]),
        "t_reference_s": t_ref,
        "frac_of_opt": t_opt / makespan if makespan > 0 else 0.0,
        # no estimate where the reference is below the bound T_o (reports leave the cell blank): null, with a note
        "frac_of_reference": (t_ref / makespan if makespan > 0 else 0.0) if t_ref >= t_opt else None,
        "t_critical_s": critical_path(trace, cost_model),
        "steps": steps,
        "mean_tokens_per_step": mean_tokens,
        "compute_time_s": comp_s,
        "memory_time_s": mem_s,
        "mean_kv_util": kv_mean,
        "peak_kv_blocks": kv_peak,
    }
    if t_ref < t_opt:
        out["frac_of_reference_note"] = (
            f"the blended reference ({t_ref:.6g} s) is below T_o ({t_opt:.6g} s), a bound no schedule beats: it leaves "
            f"out what T_o counts (the longest request's chain, the tail's small steps), so it estimates nothing here "
            f"and frac_of_reference is null; frac_of_opt is the run's fraction of its bound")
    if not bounds.sharing > 0:
        out["sharing_frac_of_opt_note"] = ("the trace shares no prefix (optimal sharing ratio s_o = 0), so there is no "
                                           "sharing to reach and sharing_frac_of_opt is null")
    if trace.has_arrivals:
        out["last_arrival_s"] = float(trace.arrival_s.max())
    if trace.has_arrivals or trace.has_slos:
        out.update(latency_summary(per_req))
    if trace.has_slos:
        ok = per_req["slo_met"]
        good = float((trace.input_len[ok] + trace.output_len[ok]).sum())
        out.update({
            "slo_attainment": float(ok.mean()),
            **slo_breakdown(trace, rec, steps_by_replica, per_req),
            "goodput_tok_s": good / makespan if makespan > 0 else 0.0,
        })
    if extra:
        out.update(extra)
    return out


def _file_digest(path) -> str | None:
    from blendsim.sim.engines import profile_file_digest

    return profile_file_digest(path)


__all__ = ["CRITICAL_SHARE", "METRIC_UNITS", "SUMMARY_SCHEMA", "critical_path", "critical_path_warning", "format_throughput", "latency_summary",
           "per_request_table", "summarize"]
