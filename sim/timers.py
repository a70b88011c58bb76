"""Op timers: the seconds of one operator from its FLOPs, bytes and kernel launches (numbers or arrays).

A timer is anything with the :class:`OpTimer` shape: :class:`RooflineTimer` here (FLOPs and bytes
against the device's peaks times measured efficiencies, GEMM rows padded to the kernel tile, plus a
launch overhead per kernel), ``blendsim.sim.efficiency.EfficiencyTimer`` (the roofline at an engine
regime's fitted efficiencies) and ``blendsim.sim.profile.ProfileTimer`` (polynomials fitted to kernels
profiled on a real device). The cost model (``blendsim.sim.cost``) sums and combines what they return.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from blendsim.sim.deployment import Deployment
from blendsim.sim.ops import (
    ALL_GEMM_OPS,
    LOWP_GEMMS,
    MOE_GEMMS,
    Shapes,
    attn_coefs,
    dp_attention,
    gemm_m,
    window_decode,
    window_prefill,
)


class OpTimer(Protocol):
    """What the cost model asks of a timer."""

    name: str  # "roofline", "roofline+fitted", "profile": recorded as a run's cost model
    shapes: Shapes  # the deployment's per-GPU widths

    def op_time(self, op: str, flops, nbytes, kernels, f):
        """Seconds of ``op`` (one layer for layer operators); ``f`` is the step's BatchFeatures."""

    def attn_scalars(self):
        """``(prefill(Tp, Np, pairs, pkv, chunks), decode(D, Cd))``: one layer's attention from scalars."""

    def notes(self) -> list[str]:
        """Messages for the user about this timer (e.g. operators a profile lacks)."""


# An all-reduce on an NVLink-SHARP switch (NVLS) sends each GPU's buffer once and receives the reduced buffer once,
# but the switch does not reduce at the links' rate. NCCL's maintainer (NVIDIA/nccl-tests issue #212, 2024-05-06):
# on H100 NCCL reaches an effective NVLink bandwidth of about 370 GB/s of the 450 GB/s line rate (what a ring
# moves), and an 8-GPU NVLS all-reduce peaks at about 275 GB/s of algorithm bandwidth (bus bandwidth ~480 GB/s; the
# 480 GB/s of GTC S62129, NVIDIA/nccl issue #1374). At the ring's wire efficiency an NVLS all-reduce of S bytes
# therefore costs the time of 370 / 275 = 1.35 S on the wire, against the ring's 2(t-1)/t S (1.75 S at t = 8: NVLS is
# 1.30x faster, not the 1.75x that moving each buffer once would give). Taken as the same for any t > 2 (the
# switch's reduction rate, not the GPU count, limits it) and for NVLink 5 (no published figure).
NVLS_FACTOR = 370 / 275

# A grouped (MoE expert) GEMM's time grows as its reduction dimension K shrinks: every output tile pays a fixed
# prologue and epilogue (scheduling its expert's problem, loading the first operands, writing the result) that its
# K / tile-K main-loop iterations amortise, and an expert's slice of a thin MoE layer is a short K. Measured on one
# H100 (docs/gpu-days/2026-11-26-h100, benchmarks/gpu_moe_gemm.py: CUTLASS grouped GEMMs through torch, 64
# experts with K 96-4,096, N 256-4,096 and 1-1,024 rows per expert set independently, plus every MoE preset's
# expert GEMMs at 1-16,384 tokens): with this module's GEMM form (rows padded to the tile per expert, compute and
# weight streaming joined by the p-norm, a fixed time), scaling both the compute and the streaming time by
# (1 + K0 / K) took the median error from 10.4% to 6.6% (p90 37% -> 19%) at K0 = 184 for bf16 (324 points), and
# FP8 with row-wise scales from 18.6% to 6.9% (p90 51% -> 24%) at K0 = 653 (180 points; at K <= 256 an FP8 grouped
# GEMM ran slower than the bf16 one). ``python benchmarks/gpu_moe_gemm.py --analyse`` refits them from that file.
# FP4 grouped kernels were not measured and take FP8's constant; weights dequantised to 16-bit in the main loop
# (no low-precision tensor cores on the device, e.g. INT4 or FP8 on Ampere) take the 16-bit one.
GROUPED_K0 = {"16-bit": 184.0, "low-precision": 653.0}


def grouped_k_factors(s: Shapes, low_precision: bool) -> dict[str, float]:
    """``{op: 1 + K0 / K}`` of the routed-expert (grouped) GEMMs: gate/up reduces over the hidden width, down over
    the expert's (per-GPU) intermediate width; K0 by the tensor cores the GEMM runs on (:data:`GROUPED_K0`;
    ``low_precision``: FP8/FP4 cores, at a higher peak than the 16-bit one)."""
    if not s.e_inter:
        return {}
    k0 = GROUPED_K0["low-precision" if low_precision else "16-bit"]
    return {"moe_gate_up": 1.0 + k0 / s.hidden, "moe_down": 1.0 + k0 / s.e_inter}


def nccl_curve(curves: tuple, tp: int) -> tuple:
    """The measured curve that prices ``tp`` GPUs (``HardwareSpec.nccl_allreduce``: ``((gpus, ((bytes, seconds),
    ...)), ...)``), prepared once for :func:`nccl_time`: ``(log bytes, log seconds, bytes scale, time scale, first
    bytes, last bytes, floor seconds)``. At a measured GPU count its curve; at another, the next larger measured
    count's (else the largest), scaled as a ring: t GPUs take 2(t - 1) steps of 1/t chunks, so T_t(S) = (t - 1)/(m - 1)
    T_m(m S / t), but never below m GPUs' smallest measured time (the latency floor does not shrink with fewer GPUs:
    four H100s measured 24 us where eight measured 19 us)."""
    counts = sorted(m for m, _ in curves)
    m = tp if tp in counts else next((c for c in counts if c > tp), counts[-1])
    curve = dict(curves)[m]
    return (np.log([b for b, _ in curve]), np.log([s for _, s in curve]), m / tp, (tp - 1) / (m - 1),
            curve[0][0], curve[-1][0], curve[0][1])


def nccl_time(prepared: tuple, nbytes):
    """Seconds of one NCCL all-reduce of ``nbytes`` per GPU (a number or an array) on a :func:`nccl_curve`: log-log
    between measured points; below the first, its time; above the last, at the last point's bandwidth."""
    xs, ys, byte_scale, time_scale, first, last, floor = prepared
    x = np.maximum(np.asarray(nbytes, dtype=float) * byte_scale, first)
    tm = np.exp(np.interp(np.log(x), xs, ys)) * np.maximum(x / last, 1.0)
    return np.maximum(time_scale * tm, floor)


def nccl_allreduce_s(curves: tuple, tp: int, nbytes):
    """Seconds of one NCCL all-reduce of ``nbytes`` per GPU among ``tp`` GPUs of one node, from the hardware's
    measured ``curves`` (:func:`nccl_curve`, :func:`nccl_time`)."""
    return nccl_time(nccl_curve(curves, tp), nbytes)


# rows within this fraction of a tile above a multiple of it pad to the multiple (float round-off, not a row)
TILE_ROUNDOFF = 1e-9


class RooflineTimer:
    """Operator time = max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth) + launches.

    ``custom_allreduce_max``: the largest all-reduce message (bytes per GPU) the engine runs in its own all-reduce
    kernel (``EngineProfile.custom_allreduce_max``); larger ones go through NCCL, priced by the hardware's measured
    curve where it has one (:func:`nccl_allreduce_s`). Infinite (the default): every all-reduce at the link."""

    name = "roofline"

    def __init__(self, dep: Deployment, custom_allreduce_max: float = float("inf")):
        self.dep = dep
        hw, m = dep.hardware, dep.model
        self.shapes = Shapes.of(dep)
        peak = hw.flops_for(m.dtype)
        self.gemm_rate = peak * hw.compute_efficiency  # 16-bit GEMMs (LM head, routers) and decode attention
        # GEMMs with weights in the ``weights`` precision run at its tensor-core peak where the device has one:
        # this ratio to the 16-bit rate (1 for 16-bit weights), so timers that rescale gemm_rate keep it
        self.lowp_ratio = hw.flops_for(m.weights) / peak
        # the routed experts' GEMMs at their own precision's peak (gpt-oss: MXFP4 experts beside BF16 attention)
        self.expert_ratio = hw.flops_for(m.expert_precision) / peak
        self.attn_rate = peak * hw.attention_compute_efficiency
        self.bw = hw.mem_bandwidth * hw.memory_efficiency
        self.attn_bw = self.bw  # decode attention reading the paged KV cache (EfficiencyTimer fits its own)
        self.ew_bw = hw.mem_bandwidth * hw.elementwise_efficiency
        self.launch = hw.kernel_launch_s
        self.tile = max(1, hw.gemm_tile_m)
        self.blend = hw.gemm_roofline_blend
        self.link_bw, self.link_lat = dep.tp_link()  # the scale-up link, or the network when TP spans nodes
        # bytes each GPU moves per byte all-reduced: the ring's (or reduce-scatter + all-gather's) 2(t-1)/t, or
        # NVLS_FACTOR where the switch reduces in the network (NVLS, HardwareSpec.nvls) within a node
        t = self.shapes.tp
        self.ar_factor = NVLS_FACTOR if (hw.nvls and not dep.tp_spans_nodes and t > 2) else 2 * (t - 1) / max(t, 1)
        # messages above the engine's own kernel's limit go through NCCL: its measured curve within a node
        self.custom_ar_max = custom_allreduce_max
        self.nccl = (nccl_curve(hw.nccl_allreduce, t) if hw.nccl_allreduce and t > 1 and not dep.tp_spans_nodes
                     and custom_allreduce_max != float("inf") else ())
        # the tensor cores the expert GEMMs run on (the same rule as the all-to-all's dispatch precision, ops.Shapes)
        self.grouped_k = grouped_k_factors(self.shapes, hw.gemm_precision(m.expert_precision) in ("fp8", "fp4"))

    def op_time(self, op: str, flops, nbytes, kernels, f):
        """Seconds of ``op`` (one layer for layer ops), numbers or arrays."""
        launch = kernels * self.launch
        if op in ALL_GEMM_OPS:
            k = self.grouped_k.get(op)
            if k is not None:  # a grouped expert GEMM: its short-K tiles' fixed cost (GROUPED_K0)
                flops, nbytes = flops * k, nbytes * k
            m = np.asarray(gemm_m(op, f, self.shapes))
            # a mean row count a round-off from a whole number is that number (an MoE expert's 64.00000000000001)
            near = np.round(m)
            m = np.where(np.abs(m - near) <= TILE_ROUNDOFF * np.maximum(near, 1), near, m)
            tile = np.where(m <= 64, min(64, self.tile), self.tile)  # small-M kernels use 64-row tiles
            # whole tiles; a mean row count a round-off above a tile multiple (an MoE expert's expected rows,
            # T x k / E with picks summing to k +- 1 ulp: 256.00000000000003) is that multiple, not one tile more
            pad = np.where(m > 0, np.maximum(np.ceil(m / tile - TILE_ROUNDOFF), 1) * tile / np.maximum(m, 1), 0.0)
            ratio = (self.expert_ratio if op in MOE_GEMMS else self.lowp_ratio) if op in LOWP_GEMMS else 1.0
            tc = flops * pad / (self.gemm_rate * ratio)
            tm = nbytes / self.bw
            if self.blend:
                # NOTE: a p-norm instead of max(): near the ridge neither bound is reached (see hardware.py)
                return (tc ** self.blend + tm ** self.blend) ** (1.0 / self.blend) + launch
            return np.maximum(tc, tm) + launch
        if op == "attn_prefill":
            return np.maximum(flops / self.attn_rate, nbytes / self.bw) + launch
        if op == "attn_decode":
            return np.maximum(flops / self.gemm_rate, nbytes / self.attn_bw) + launch
        if op == "allreduce":
            if self.shapes.tp == 1 or self.link_bw <= 0:
                return 0.0 * nbytes
            t = kernels * self.link_lat + self.ar_factor * nbytes / self.link_bw
            if not self.nccl:
                return t
            # kernels: the layer's all-reduces (each of nbytes / kernels); those above the engine's own kernel's
            # limit run in NCCL
            per = nbytes / np.maximum(kernels, 1)
            big = per > self.custom_ar_max
            if not np.any(big):
                return t
            return np.where(big, kernels * nccl_time(self.nccl, per), t)
        if op == "a2a":
            # dispatch and combine: every GPU sends and receives its share at once over its links
            if self.link_bw <= 0:
                return 0.0 * nbytes
            return kernels * self.link_lat + nbytes / self.link_bw
        return nbytes / self.ew_bw + launch

    def attn_scalars(self):
        """Closures pricing one layer's prefill and decode attention from scalars (engine hot path); under
        attention data parallelism, one GPU's share of the step's sequences (ops.dp_attention)."""
        return dp_attention(*self._attn_scalars(), self.shapes.dp)

    def _attn_scalars(self):
        fp, bq, bkey, fd, bdk, bds = attn_coefs(self.shapes)
        ar, gr, bw, abw, la = self.attn_rate, self.gemm_rate, self.bw, self.attn_bw, self.launch
        s = self.shapes

        def prefill(Tp, Np, pairs, pkv, chunks=None):
            a = fp * pairs / ar
            m = (bq * Tp + bkey * pkv) / bw
            return (a if a > m else m) + la

        def decode(D, Cd):
            keys = Cd + D
            a = fd * keys / gr
            m = (bdk * keys + bds * D) / abw
            return (a if a > m else m) + la

        if not s.swa_layers:
            return prefill, decode

        def windowed_prefill(Tp, Np, pairs, pkv, chunks=None):  # the mean layer's keys (ops.window_prefill)
            return prefill(Tp, Np, *window_prefill(s, Tp, Np, pairs, pkv))

        def windowed_decode(D, Cd):
            return decode(D, window_decode(s, D, Cd))

        return windowed_prefill, windowed_decode

    def notes(self) -> list[str]:
        return []


__all__ = ["GROUPED_K0", "NVLS_FACTOR", "OpTimer", "RooflineTimer", "grouped_k_factors", "nccl_allreduce_s", "nccl_curve",
           "nccl_time"]
