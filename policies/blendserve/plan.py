"""BlendServe's offline preprocessing: sample -> estimate -> sort/split -> merge -> DP partition.

The result, a :class:`Plan`, is what the router and the per-replica dual scanners read. Everything is
vectorised (numpy over requests and tree nodes), so a 400,000-request trace takes seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from blendsim.policies._tiercost import split_load_s_per_block
from blendsim.policies.blendserve.estimate import estimate_output
from blendsim.policies.blendserve.merge import scan_units, unit_stats
from blendsim.policies.blendserve.partition import dp_partition, occupancy_time
from blendsim.policies.blendserve.restree import ResourceTree
from blendsim.policies.blendserve.split import sort_and_split
from blendsim.sim.density import Rates, comp_time
from blendsim.sim.kv_tiers import StageLinks


@dataclass
class Plan:
    """Per-request lists (fast scalar reads in the scheduler) and per-unit / per-replica figures."""

    seq: list  # requests of the scan, left (compute-intensive) to right (memory-intensive)
    pos: list  # per request: index in ``seq`` (-1 for warm-up requests)
    unit: list  # per request: merged scan unit (-1 for warm-up requests)
    est: list  # per request: estimated output length (exact if sampled or hinted)
    warm: list  # per request: served in the warm-up
    warm_pos: list  # per request: order inside the warm-up (DFS)
    unit_rho: list  # per unit: occupancy density (partition.occupancy_time)
    unit_p: list
    unit_d: list
    replica: np.ndarray  # per request: data-parallel replica
    rho_rt: list  # per replica: occupancy density of its share of the scan
    rank: np.ndarray  # per request: warm-up first (DFS), then the scan order
    report: dict = field(default_factory=dict)  # deterministic figures for summary.json
    timings: dict = field(default_factory=dict)  # wall seconds per stage (not deterministic)


def build_plan(ctx, opt: dict) -> Plan:
    """The plan of ``ctx.trace`` under the policy options ``opt`` (see ``BlendServe.options``)."""
    tic = time.perf_counter()
    timings = {}

    def lap(name):
        nonlocal tic
        now = time.perf_counter()
        timings[name] = now - tic
        tic = now

    trace, tree = ctx.trace, ctx.tree
    n = trace.n
    rates = Rates.of(ctx.deployment, ctx.cost_model.kappa)
    est = estimate_output(tree, trace.output_len, trace.output_len_hint, opt["sample"], ctx.seed,
                          opt["default_output"])
    warm = est.sampled if opt["warmup"] == "barrier" else np.zeros(n, dtype=bool)
    lap("sample")
    rt = ResourceTree(tree, est.d, rates, active=~warm)
    keep, thr, tier_scale = opt["keep_sharing"], opt["split_threshold"], 1.0
    tiers = getattr(ctx, "tiers", None)
    if opt.get("tiers", "gpu") == "load" and tiers is not None:
        # ours: a split unit's prefix, written to the host tier when the GPU evicts it (and on to disk as host
        # memory fills), comes back as a load, priced as the tiers charge it (_tiercost); the budget (shared
        # tokens x (1 - keep_sharing) of recomputation) buys prefill/load times the tokens
        load_tok_s = split_load_s_per_block(tiers, StageLinks(tiers)) / ctx.engine.block_size
        prefill_tok_s = 2.0 * rates.gemm_params / rates.flops
        tier_scale = min(1.0, load_tok_s / prefill_tok_s)
        keep = max(0.0, 1.0 - (1.0 - keep) / tier_scale)
        thr = thr / tier_scale if thr >= 0 else thr
    rep = sort_and_split(rt, keep, thr, opt["split_divide"], opt["max_rounds"], opt["split"])
    lap("sort_split")
    p = trace.input_len.astype(np.float64)
    d = est.d
    seq = rt.seq
    kv_tokens = ctx.num_blocks * ctx.engine.block_size
    unit_seq = scan_units(rt, p + d / 2.0, max(opt["merge_cap"], 1e-9) * kv_tokens)
    comp_eff = comp_time(p[seq], d[seq], rates) - comp_time(rt.lcp(), 0.0, rates)  # shared prefix computed once
    occ = occupancy_time(p[seq], d[seq], rates)
    urho, up, ud = unit_stats(unit_seq, comp_eff, occ, p[seq], d[seq])
    lap("merge")
    k = ctx.replicas
    part = dp_partition(comp_eff, rt.mem[seq], k)
    replica = np.zeros(n, dtype=np.int64)
    replica[seq] = part
    csum = np.bincount(part, weights=comp_eff, minlength=k)
    osum = np.bincount(part, weights=occ, minlength=k)
    rho_rt = [float(c / o) if o > 0 else float("inf") for c, o in zip(csum, osum)]
    # warm-up: DFS order (sharing among the sampled requests), split into k contiguous chunks
    dfs_rank = np.empty(n, dtype=np.int64)
    dfs_rank[tree.dfs_order()] = np.arange(n)
    wreq = np.flatnonzero(warm)
    wreq = wreq[np.argsort(dfs_rank[wreq], kind="stable")]
    warm_pos = np.full(n, -1, dtype=np.int64)
    warm_pos[wreq] = np.arange(len(wreq))
    replica[wreq] = np.arange(len(wreq)) * k // max(len(wreq), 1)
    pos = np.full(n, -1, dtype=np.int64)
    pos[seq] = np.arange(len(seq))
    unit = np.full(n, -1, dtype=np.int64)
    unit[seq] = unit_seq
    rank = np.empty(n, dtype=np.int64)
    rank[wreq] = np.arange(len(wreq))
    rank[seq] = len(wreq) + np.arange(len(seq))
    lap("partition")
    occ_all, comp_all = occ.sum(), comp_eff.sum()
    report = {
        "sampled": int(est.sampled.sum()), "hinted": int(est.hinted.sum()), "warmup_requests": int(len(wreq)),
        "splits": rep.splits, "split_rounds": rep.rounds, "split_stop": rep.stop, "split_mode": rep.mode,
        "split_moved_requests": rep.moved_requests,
        "split_threshold_tokens": rep.threshold, "split_budget_tokens": rep.budget_tokens,
        "split_recompute_tokens": rep.recompute_tokens,
        **({"split_tier_scale": tier_scale} if tier_scale != 1.0 else {}), "inversions_left": rep.inversions_left,
        "tree_sharing_before": rep.sharing_before, "tree_sharing_after": rep.sharing_after,
        "units": int(len(urho)),
        # densities that do not exist (no KV read: every output one token; a replica with no request)
        # are None (null in summary.json), never inf
        "rho_root": _finite(rt.rho_node[0]) if len(seq) else 0.0,
        "rho_root_occupancy": float(comp_all / occ_all) if occ_all > 0 else 0.0,
        "rho_rt_replicas": [_finite(x) for x in rho_rt],
        "est_mean_abs_rel_err": float(np.mean(np.abs(d - trace.output_len) / np.maximum(trace.output_len, 1))),
    }
    return Plan(seq.tolist(), pos.tolist(), unit.tolist(), d.tolist(), warm.tolist(),
                warm_pos.tolist(), urho.tolist(), up.tolist(), ud.tolist(), replica, rho_rt, rank, report, timings)


def _finite(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


__all__ = ["Plan", "build_plan"]
