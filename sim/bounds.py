"""T_o: a lower bound on a run's makespan, priced by the run's own cost model (docs/DESIGN.md, "Bounds that bound").

The bound is built from the same step pricer as the run (op timer: roofline, engine-profile efficiencies or a
calibration profile; execution mode; engine overhead; CUDA-graph padding; tensor and expert parallelism;
weight and KV precision; for MoE the experts a step of T tokens touches), so it can be compared with the run's
makespan. It rests on two facts:

1. **Work every schedule does** (:func:`trace_work`): every node of the trace's prefix tree is computed at least
   once (W_p prefill tokens, at least Pi causal (query, key) pairs), each duplicate prompt recomputes its last
   token, every request decodes d - 1 tokens reading at least K keys, and samples d logit rows. Recomputation,
   cache misses and padding only add to these.
2. **A step's price is bounded below by sums** (:func:`lower_bound`): each of the step's compute, memory,
   other and comm seconds is a token-count table (``g(T)``, priced by the cost model itself) plus attention.
   Any line ``alpha + beta T`` under ``g`` on the step sizes the engine can run (the lower convex hull of the
   table) gives sum_s g(T_s) >= alpha S + beta sum_s T_s (alpha, beta >= 0, S >= S_min steps); roofline
   attention is a maximum of linear forms plus a launch, so its sum is at least its value at the summed
   arguments. The step time combines the four parts by a function that is monotone, convex and positively
   homogeneous (the sum; or max + kappa x rest with 0 <= kappa <= 1), hence subadditive: the sum of step
   times is at least the function of the summed parts. Engine overhead is linear in steps, sequences and
   tokens. Replicas share the work: the busiest replica's time is at least 1/R of the total.

Where a piece cannot be bounded exactly (a calibration profile's fitted attention: no known form) it
contributes 0, which keeps the bound true but looser; ``exact`` is False only when a table goes negative (a
bad fit), and then callers call the figure a reference, never a bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Work:
    """The work every schedule of a trace does (lower bounds on sums over its steps)."""

    n: int
    prefill_tokens: float  # W_p: prefix-tree tokens + one per duplicate prompt
    prefill_pairs: float  # Pi: causal (query, key) pairs of those tokens
    decode_tokens: float  # sum (d - 1)
    decode_keys: float  # K: sum over decode steps of (context + itself) = sum_j (p + j)
    logits: float  # sum d: every output token is sampled from a logit row
    longest_decode: int  # max (d - 1): one request's decode steps are sequential
    private_kv: float  # sum over decode steps of the request's own generated tokens held in KV (j - 1)

    @property
    def tokens(self) -> float:
        return self.prefill_tokens + self.decode_tokens


def trace_work(trace, tree, shared_decode: bool = False) -> Work:
    """The work every schedule does. ``shared_decode``: the run's decodes may read a shared prefix's KV once per
    step for a whole group (BatchLLM's prefix-shared attention, ``Policy.reads_shared_prefix_once``), so the keys
    every decode step must read leave out each request's shared prompt prefix (``PrefixTree.shared_prompt_tokens``)."""
    p = trace.input_len.astype(np.float64)
    d = trace.output_len.astype(np.float64)
    tok = tree.tokens.astype(np.float64)
    start = tree.start.astype(np.float64)
    dup = np.maximum(np.diff(tree.term_offsets) - 1, 0).astype(np.float64)
    node_end = start + tok  # a duplicate recomputes the last token of the prompt ending at this node
    k = np.maximum(d - 1.0, 0.0)
    read = tree.own_prompt_tokens() if shared_decode else p  # the prompt keys each decode must read
    return Work(
        n=int(trace.n),
        prefill_tokens=float(tok.sum() + dup.sum()),
        prefill_pairs=float((tok * start + tok * (tok + 1.0) / 2.0).sum() + (dup * node_end).sum()),
        decode_tokens=float(k.sum()),
        decode_keys=float((k * read + k * (k + 1.0) / 2.0).sum()),
        logits=float(d.sum()),
        longest_decode=int(k.max(initial=0)),
        private_kv=float((k * (k - 1.0) / 2.0).sum()),
    )


def hull_bound(g: np.ndarray, steps: float, total: float) -> float:
    """A lower bound on sum_s g(T_s) over ``steps`` (or more) steps of T_s in [1, len(g) - 1] summing to
    ``total`` (or more tokens).

    Every line ``alpha + beta T`` under g with alpha, beta >= 0 gives sum_s g(T_s) >= alpha x steps +
    beta x total. For a slope beta the highest such line has alpha(beta) = min_T (g(T) - beta T), which is
    >= 0 exactly for beta in [0, rho], rho = min_T g(T) / T; the bound alpha(beta) steps + beta total is
    concave in beta, so a golden-section search finds its best slope (any slope it tries is a valid bound:
    only tightness depends on the search). 0 when g goes negative (no such line exists)."""
    y = np.asarray(g, dtype=np.float64)[1:]
    if y.size == 0 or (total <= 0 and steps <= 0) or float(y.min()) < 0:
        return 0.0
    x = np.arange(1, y.size + 1, dtype=np.float64)
    rho = float(np.min(y / x))

    def bound(beta: float) -> float:
        return max(float(np.min(y - beta * x)), 0.0) * steps + beta * total

    lo, hi = 0.0, rho
    best = max(bound(lo), bound(hi))
    r = (np.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - r * (hi - lo), lo + r * (hi - lo)
    fa, fb = bound(a), bound(b)
    for _ in range(60):
        if fa < fb:
            lo, a, fa = a, b, fb
            b = lo + r * (hi - lo)
            fb = bound(b)
        else:
            hi, b, fb = b, a, fa
            a = hi - r * (hi - lo)
            fa = bound(a)
        best = max(best, fa, fb)
    return best


def _linear_attention(timer) -> tuple[bool, bool]:
    """Whether the timer's prefill and decode attention are roofline-shaped (max of linear forms + launch)."""
    from blendsim.sim.cost import RooflineTimer

    if isinstance(timer, RooflineTimer):
        return True, True
    prof = getattr(timer, "profile", None)
    if prof is not None and hasattr(timer, "roofline"):
        return "attn_prefill" not in prof.ops, "attn_decode" not in prof.ops
    return False, False


_TABLE_CHUNK = 1 << 18  # step sizes priced at once by lower_bound


def lower_bound(work: Work, cm, token_budget: int, max_seqs: int, kv_tokens: float, replicas: int = 1,
                max_step_tokens: int = 0) -> dict:
    """T_o of a run (see the module docstring): ``{"t_lb_s", "exact", parts...}`` in seconds, per replica.

    ``max_step_tokens``: the largest step the run actually formed, if larger than its configuration allows
    (a user policy's own scheduler); the tables then cover it too.
    """
    from blendsim.sim.cost import combine_times, features_arrays, net_share

    n = max(work.n, 1)
    dcap = min(max_seqs, n) if max_seqs > 0 else n
    tcap = int(max(token_budget, dcap, getattr(cm, "graph_cap", 0) or 0, max_step_tokens, 1))
    # steps: enough to hold the tokens; one per decode of the longest request; the decodes' own
    # generated KV (never shared) must fit the cache of the replica that runs them
    s_dec = max(float(work.longest_decode), np.ceil(work.decode_tokens / max(dcap, 1)),
                np.ceil(work.private_kv / kv_tokens) if kv_tokens > 0 and np.isfinite(kv_tokens) else 0.0)
    s_all = max(np.ceil(work.tokens / tcap), s_dec, 1.0 if work.tokens > 0 else 0.0)
    s_pf = np.ceil(work.prefill_tokens / tcap) if work.prefill_tokens > 0 else 0.0

    plain = cm.unpadded()  # the tables at the step's own size; padding only raises T, inside [1, tcap]
    # the tables priced a chunk of step sizes at a time: with no sequence cap tcap is the number of requests, and
    # pricing 10M sizes at once held ~4 GB of temporaries (each size is priced on its own: same values)
    tables = {k: np.empty(tcap + 1) for k in ("compute", "memory", "other", "comm")}
    lm = np.empty(tcap + 1)
    for a in range(0, tcap + 1, _TABLE_CHUNK):
        T = np.arange(a, min(a + _TABLE_CHUNK, tcap + 1))
        zero = 0 * T
        tok = plain.cost_many(features_arrays(num_tokens=T, num_prefill_tokens=zero, num_prefill_seqs=zero,
                                              attn_pairs=zero, prefill_kv_tokens=zero, num_decode=zero,
                                              decode_ctx_sum=zero, num_logits=zero))
        lm[a:a + len(T)] = plain.cost_many(features_arrays(
            num_tokens=T, num_prefill_tokens=zero, num_prefill_seqs=zero, attn_pairs=zero, prefill_kv_tokens=zero,
            num_decode=zero, decode_ctx_sum=zero, num_logits=T))["compute_s"] - tok["compute_s"]
        for k, t in tables.items():
            t[a:a + len(T)] = tok[f"{k}_s"]
        del tok
    exact = all(bool((t[1:] >= -1e-15).all()) for t in tables.values()) and bool((lm[1:] >= -1e-15).all())
    c = hull_bound(tables["compute"], s_all, work.tokens) + hull_bound(lm, s_dec, work.logits)
    m = hull_bound(tables["memory"], s_all, work.tokens)
    o = hull_bound(tables["other"], s_all, work.tokens)
    comm = hull_bound(tables["comm"], s_all, work.tokens)

    lin_pf, lin_dec = _linear_attention(cm.timer)
    if cm.timer.shapes.swa_layers:  # a sliding window caps each step's keys: a min() over the run's totals would
        lin_pf = lin_dec = False    # overstate them, so attention adds nothing here (true, looser)
    prefill_fn, decode_fn = cm.timer.attn_scalars()
    L = cm.layers
    attn_pf = attn_dec = 0.0
    if lin_pf and work.prefill_tokens > 0:
        launch = prefill_fn(0, 1, 0, 0)  # the launch alone: max(0, 0) + launch
        attn_pf = L * (prefill_fn(work.prefill_tokens, 1, work.prefill_pairs, work.prefill_tokens) - launch
                       + launch * s_pf)
    if lin_dec and work.decode_tokens > 0:
        launch = decode_fn(0, 0)
        attn_dec = L * (decode_fn(work.decode_tokens, work.decode_keys - work.decode_tokens) - launch
                        + launch * s_dec)
    c += attn_pf
    m += attn_dec
    e = cm.engine
    ovh = (e.fixed_s * s_all + e.per_seq_s * (work.decode_tokens + work.n) + e.per_token_s * work.tokens) * e.overhead_scale
    kappa = min(max(float(cm.kappa), 0.0), 1.0)
    kernels = combine_times(cm.mode, kappa, float(c), float(m), float(o), float(comm),
                            net_share(cm.dep.hardware, kappa))
    total = kernels + ovh
    return {"t_lb_s": float(total) / max(replicas, 1), "exact": exact, "compute_s": float(c), "memory_s": float(m),
            "other_s": float(o), "comm_s": float(comm), "overhead_s": float(ovh), "steps_min": float(s_all), "max_step_tokens": tcap,
            "attention_bounded": (lin_pf, lin_dec)}


__all__ = ["Work", "hull_bound", "lower_bound", "trace_work"]
