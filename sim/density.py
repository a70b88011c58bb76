"""Compute density and optimal-time bounds (BlendServe sec. 3.3 and 4.1), shared by every consumer.

For a request with prompt p and output d on a deployment:

* Comp(r) = [2 (p + d) P_gemm + 2 d V H + A(p)] / F — GEMM work of every token through the decoder
  layers, the LM head for each of the d sampled positions, and (optionally) the prefill attention
  A(p) = 2 q_dim L p (p + 1) (causal: token j attends j keys). F is the achievable FLOP/s
  (peak x compute efficiency) of the replica.
* Mem(r) = kv_bytes_per_token x sum_{j=1}^{d-1} (p + j) / B — the KV cache each of the d - 1 decode
  steps reads; B is the achievable bandwidth (peak x memory efficiency).
* rho(R) = (1 - s) sum Comp / sum Mem for a request set R with sharing ratio s.
* T_o = max((1 - s_o) T_comp, T_mem); ``t_opt_overlap_s`` adds the overlap model's interference share
  of the shorter side. These are the paper's figures at roofline rates, for workload statistics and the
  recipes' density targets; a run's summary reports its own T_o, priced by its cost model, engine and mode
  (``blendsim.sim.bounds``), and a blended reference (``blendsim.sim.metrics.blended_optimum``).

Differences from the paper, deliberately: P_gemm counts the weights a token really multiplies (layer
GEMMs, plus the LM head per sampled row) instead of all parameters (the embedding lookup is no GEMM);
A(p) is the causal count (the paper's 4 p^2 H L counts the full square); Mem sums the d - 1 decode
steps that exist rather than d; and rates are achievable rather than datasheet peaks, so rho = 1 means
balanced *in this cost model*. Each keeps T_o a true lower bound of the simulator's time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blendsim.sim.deployment import Deployment


@dataclass(frozen=True, slots=True)
class Rates:
    flops: float  # achievable FLOP/s of the replica
    bandwidth: float  # achievable bytes/s of the replica
    gemm_params: int  # decoder-layer GEMM weights (all layers)
    head_params: int  # LM-head weights
    attn_coef: float  # A(p) = attn_coef * p * (p + 1)
    kv_bytes: int  # KV bytes per token (whole replica)
    interference: float

    @staticmethod
    def of(dep: Deployment, interference: float | None = None) -> Rates:
        m, hw = dep.model, dep.hardware
        return Rates(
            # NOTE: the fastest GEMM rate of the deployment (FP8/FP4 weights: their tensor-core peak), so
            # T_o stays a lower bound; MoE models multiply by their active GEMM weights only
            flops=max(hw.flops_for(m.dtype), hw.flops_for(m.weights), hw.flops_for(m.expert_precision))
            * hw.compute_efficiency * dep.tp,
            bandwidth=hw.mem_bandwidth * hw.memory_efficiency * dep.tp,
            gemm_params=m.gemm_params_active,
            head_params=m.lm_head_params,
            # the full-attention layers only: a sliding-window layer's pairs are capped per step (a lower bound)
            attn_coef=m.full_attention_layers * m.attn_flops_per_pair / 2.0,
            kv_bytes=dep.kv_bytes_per_token,
            interference=hw.overlap_interference if interference is None else interference,
        )


def comp_time(p, d, rates: Rates, quadratic: bool = True):
    """Comp(r) in seconds (arrays welcome)."""
    p = np.asarray(p, dtype=np.float64)
    d = np.asarray(d, dtype=np.float64)
    flops = 2.0 * (p + d) * rates.gemm_params + 2.0 * d * rates.head_params
    if quadratic:
        flops = flops + rates.attn_coef * p * (p + 1.0)
    return flops / rates.flops


def mem_time(p, d, rates: Rates):
    """Mem(r) in seconds: KV reads of the d - 1 decode steps."""
    p = np.asarray(p, dtype=np.float64)
    d = np.asarray(d, dtype=np.float64)
    steps = np.maximum(d - 1.0, 0.0)
    tokens_read = steps * p + steps * (steps + 1.0) / 2.0
    return tokens_read * rates.kv_bytes / rates.bandwidth


def density(comp, mem, sharing: float | np.ndarray = 0.0):
    """rho = (1 - s) Comp / Mem (inf where Mem is 0)."""
    comp = np.asarray(comp, dtype=np.float64)
    mem = np.asarray(mem, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(mem > 0, (1.0 - np.asarray(sharing)) * comp / np.where(mem > 0, mem, 1.0), np.inf)


@dataclass(frozen=True, slots=True)
class Bounds:
    """Trace-level totals and the optimal-time bounds."""

    t_comp_s: float
    t_mem_s: float
    sharing: float  # s_o
    density: float  # rho of the whole trace, with s_o
    t_opt_s: float  # max((1 - s_o) T_comp, T_mem)
    t_opt_overlap_s: float  # plus interference on the shorter side

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


def bounds(input_len, output_len, sharing: float, rates: Rates, quadratic: bool = True, read_len=None) -> Bounds:
    """``read_len``: the prompt tokens each decode step must read, where fewer than the prompt (a policy whose decodes
    read a shared prefix once for its whole group: the prompt less its shared prefix); the prompt by default."""
    tc = float(np.sum(comp_time(input_len, output_len, rates, quadratic)))
    tm = float(np.sum(mem_time(input_len if read_len is None else read_len, output_len, rates)))
    c = (1.0 - sharing) * tc
    hi, lo = max(c, tm), min(c, tm)
    rho = float("inf") if tm == 0 else c / tm
    return Bounds(tc, tm, sharing, rho, hi, hi + rates.interference * lo)


def trace_bounds(trace, dep: Deployment, tree=None, quadratic: bool = True) -> Bounds:
    """Bounds of a whole trace (builds its prefix tree unless given)."""
    from blendsim.sim.prefix_tree import PrefixTree

    tree = tree or PrefixTree(trace)
    return bounds(trace.input_len, trace.output_len, tree.optimal_sharing_ratio(), Rates.of(dep), quadratic)


__all__ = ["Bounds", "Rates", "bounds", "comp_time", "density", "mem_time", "trace_bounds"]
