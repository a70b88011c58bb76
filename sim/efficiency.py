"""Kernel-efficiency refinements fitted to published end-to-end measurements (``blendsim fidelity``).

The roofline timer prices operators at the hardware preset's efficiencies. An engine profile
(``blendsim.sim.engines``) selects a *regime* whose efficiencies were fitted by least squares on the fidelity
catalogue; this module holds those named, bounded parameters and a timer that applies them:

* ``gemm_eff``     fraction of the precision's dense peak a large GEMM reaches (also MoE expert GEMMs);
* ``mem_eff``      fraction of HBM bandwidth a weight-streaming (small-M) GEMM reaches;
* ``attn_mem_eff`` fraction of HBM bandwidth decode attention reaches reading the paged KV cache;
* ``attn_eff``     fraction of peak prefill attention reaches;
* ``link_eff``     fraction of the NVLink bandwidth an all-reduce or all-to-all reaches (bus bandwidth);
* ``a2a_eff``      fraction of the link bandwidth the MoE all-to-all (expert parallelism) reaches; the bytes it
                   moves are counted at the precision the engine dispatches (``blendsim.sim.ops``);
* ``moe_eff``      the share of the plain GEMM's compute rate (``gemm_eff`` or ``lowp_eff`` of its precision's
                   peak) a grouped (MoE expert) GEMM keeps: many small per-expert GEMMs in one launch tile
                   worse than one large GEMM (1: as fast as the dense GEMM, a ceiling). The cost of a short
                   reduction dimension is not in it: ``blendsim.sim.timers.GROUPED_K0`` prices that from
                   measurement, on the compute and the streaming time alike;
* ``moe_mem_eff``  fraction of HBM bandwidth a grouped GEMM reaches streaming its experts' weights, in place of
                   ``mem_eff``: each expert's slice is a small matrix behind a routing gather, read by few
                   thread blocks, so few tokens per expert leave the kernel latency-bound (DeepGEMM's README,
                   H800: masked-layout grouped GEMMs for decode read 0.92-2.06 TB/s of 3.35, dense GEMMs at
                   64-128 rows 1.5-2.3);
* ``lowp_eff``     fraction of its precision's peak a large GEMM with quantised weights reaches, in place of
                   ``gemm_eff``: FP8/FP4 on their own tensor cores (twice the math per byte of operand, with
                   per-block scales applied in the main loop), or the 16-bit peak for a weight-only kernel that
                   dequantises in its main loop where the device has no such cores (Marlin on Ampere); a
                   weight-only format on a device that has them (INT4, MXFP4 on Hopper) keeps ``gemm_eff``
                   (:func:`runs_at_lowp_eff`);
* ``ew_eff``       fraction of HBM bandwidth the small elementwise kernels reach (norms, rotary, activation,
                   MoE combine, embedding), in place of the preset's ``elementwise_efficiency``: engines fuse
                   them (residual add + RMSNorm, SiLU-and-mul, rotary into attention), so fewer passes run;
* ``launch_s``     seconds each kernel adds beyond its roofline time (launch gap and the ramp a kernel needs
                   to fill the GPU), in place of the preset's ``kernel_launch_s``: CUDA graphs remove the CPU
                   launch, the ramp stays;
* ``kappa``        overlap interference (overlap mode only): the share of the shorter operator groups'
                   time that is not hidden when compute- and memory-bound kernels co-run.

Parameters are looked up, later entries winning: ``params["global"]``, ``params["arch"][arch]`` (the GPU
architecture's: one die and one kernel library share compute efficiencies, e.g. H100 and H200; see
``blendsim.sim.hardware.ARCH``), ``params["hardware"][hardware]`` (kernel efficiencies are mostly the GPU's
and its kernel libraries'), ``params["regime"][regime]["*"]``
(an engine's own behaviour, e.g. its overlap interference) and ``params["regime"][regime][hardware]``;
what is missing keeps the preset's value. Nothing here is per row or per model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from blendsim.sim.ops import MOE_GEMMS
from blendsim.sim.timers import RooflineTimer

# name -> (lower, upper) bound of every fittable efficiency
BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_eff": (0.25, 0.95),
    "mem_eff": (0.40, 0.95),
    "attn_mem_eff": (0.20, 0.95),
    "attn_eff": (0.15, 0.90),
    "link_eff": (0.20, 1.00),
    "moe_eff": (0.10, 1.00),
    "moe_mem_eff": (0.10, 0.95),
    "lowp_eff": (0.25, 0.95),
    "ew_eff": (0.15, 0.95),
    "launch_s": (0.5e-6, 8e-6),
    "a2a_eff": (0.20, 1.00),
    "kappa": (0.0, 1.0),
}


# Upper bounds that are physical ceilings, with why (``fidelity --params`` names them): a parameter sitting there
# says the rows want the hardware faster than it can be, i.e. the cost model over-prices something else.
# Lower bounds are floors against absurd fits, none physical.
_HBM = ("HBM streaming ceiling: the largest transfers reach 0.90 of an A100's 2,048 GB/s (calculon-ai/calculon "
        "systems/a100_80g.json); no kernel streams faster than ~0.95 of the datasheet bandwidth")
_TC = "tensor-core ceiling: no GEMM kernel runs faster than ~0.95 of the datasheet peak"
_LINK = "link ceiling: a collective moves no more than the link's datasheet bandwidth per direction"
CEILINGS: dict[str, str] = {
    "mem_eff": _HBM, "attn_mem_eff": _HBM, "moe_mem_eff": _HBM,
    "gemm_eff": _TC, "lowp_eff": _TC, "attn_eff": _TC,
    "moe_eff": "a grouped GEMM is never faster than the dense GEMM of the same rows and weights",
    "link_eff": _LINK, "a2a_eff": _LINK,
    "ew_eff": _HBM,
}


# Bounds and prior centres measured on a lent GPU, per architecture: (lower, upper, prior), in place of BOUNDS and the
# preset's value for that architecture's fit (``blendsim.fidelity.fit.free_params``). Where no GPU of an architecture
# has been measured it keeps BOUNDS and the preset (whose 0.70 / 0.80 come from Vidur's A100 profile); no ratio is
# carried from one architecture to another.
# NOTE: Hopper, from one H200 (docs/gpu-days/2026-11-26-h200, profile.json of run1-cudnn and run2-no-cudnn: each
# operator timed inside forwards of llama-3-8b's layers, cuBLAS through torch's F.linear, as vLLM and SGLang run
# their 16-bit GEMMs; raw medians over the token grid, against the preset's 989.4 TFLOP/s and 4.8 TB/s):
# * gemm_eff: qkv_proj / o_proj / gate_up_proj / down_proj at 2,048-16,384 tokens reached 0.61-0.80 / 0.75-0.83 /
#   0.80-0.83 / 0.78-0.84 of peak (medians 0.75-0.76 / 0.79 / 0.82 / 0.81-0.82); the roofline's GEMM price
#   (128-row tiles, cubic blend) matches those points within 5% at 0.78 except qkv_proj's (7-18% slower than its shape); an
#   8192^3 matmul alone 0.72-0.735; the LM head (float32 logits, final norm included) 0.62-0.64. Range 0.60
#   (below the slowest large GEMM) to 0.85 (above the fastest); prior 0.78. H100 SXM has the same die, SM count
#   and clocks, so the range is taken as the architecture's.
# * mem_eff: at 1-128 tokens the weight-streaming GEMMs read their weights at (median over the grid) 0.45-0.46
#   (down_proj, 117 MB), 0.58-0.59 (gate_up_proj, 235 MB) and 0.61-0.63 (lm_head, 1.05 GB) of 4.8 TB/s, eager
#   launches included (qkv_proj and o_proj, 50 and 34 MB, are host-bound there at 40-55 us and say nothing of
#   bandwidth); a device-to-device copy reached 3.80-3.84 TB/s (0.79-0.80), the fastest streaming measured.
#   Range 0.40 (BOUNDS' own floor) to 0.80 (the copy); prior 0.60 (the largest layer GEMM at decode sizes).
#   What the day did not measure keeps BOUNDS: decode attention there ran through torch SDPA over gathered
#   pages, not a paged kernel, so it says nothing of attn_mem_eff.
MEASURED: dict[str, dict[str, tuple[float, float, float]]] = {
    "hopper": {"gemm_eff": (0.60, 0.85, 0.78), "mem_eff": (0.40, 0.80, 0.60)},
}
MEASURED_SOURCE = "docs/gpu-days/2026-11-26-h200"

# Ranges from published kernel measurements, for what no lent GPU has measured yet; same use as MEASURED.
# * Hopper lowp_eff (FP8 GEMMs, of the 1,979 TFLOP/s dense FP8 peak): tile-ai/tilelang
#   benchmark/matmul_fp8/README.md (H800 SXM, the H100 die; autotuned FP8 GEMMs, M = N = 8192; its latency column
#   read as ms) ran 927 / 1,174 / 1,378 / 1,461 / 1,523 TFLOP/s at K = 1,024 / 2,048 / 4,096 / 8,192 / 16,384
#   (0.47-0.77 of peak; 0.19-0.31 at K = 256-512, below any layer GEMM here); DeepGEMM's README (H800) had its
#   block-scaled FP8 GEMMs at 4,096 rows at 0.30-0.69 by shape (see MOE_PRIOR in blendsim.fidelity.fit). The
#   dense layer GEMMs of the catalogue's FP8 rows have K >= 1,024 (the smallest: a 70B's o_proj at TP8; the MoE
#   experts' thin shards carry their own moe_eff), so the floor is 0.45; the ceiling is the bf16 one the H200 measured (no FP8 GEMM above 0.78 in either source);
#   prior 0.72, tilelang's K = 4,096-8,192. Without it, a fit with no TensorRT-LLM FP8 Hopper row (the
#   performance overview left out) put it at the generic floor 0.25: the vLLM and SGLang FP8 rows' own costs
#   went into it.
# * CDNA3 (MI300X), from an Azure ND MI300X v5 VM's microbenchmarks (Azure/AI-benchmarking-guide
#   Azure_Results/ND_MI300X_v5_results.md, as of fork commit bf209ab of 2025-03-27; ROCm 6.2 HIP) and stas00's MAMF
#   table (see the mi300x preset in blendsim.sim.hardware):
#   * lowp_eff (FP8 GEMMs, of the 2,614.9 TFLOP/s dense FP8 peak): hipBLASLt at M = N = K = 2,048 / 4,096 / 8,192 /
#     16,384 ran 726.9 / 1,085.4 / 1,222.9 / 1,081.4 TFLOP/s (0.28 / 0.42 / 0.47 / 0.41) and 1,148.7 at a layer-like
#     6,144 x 12,288 x 12,288 (0.44); range 0.25 (BOUNDS' floor, below the 2,048 cube) to 0.50 (above the fastest), prior 0.44 (the
#     layer-like shape). About 0.6 of Hopper's prior fraction of its own FP8 peak (0.72 above): no ratio is carried across.
#   * mem_eff: the STREAM kernels ran 4.0 (Dot, read-only) to 4.28 TB/s (Mul) of 5.3; range 0.40 (BOUNDS' floor) to
#     0.81 (Mul), prior 0.755 (Dot: weight streaming only reads).
#   * gemm_eff (BF16): the mamf-finder's best BF16 matmul on ROCm 6.2, 781.9 of 1,300 TFLOP/s (0.60); 450 on ROCm
#     6.1 (0.35). Range 0.34-0.65, prior 0.60. No catalogue row runs 16-bit weights on MI300X yet.
#   Without them (29 Nov 2026) the two MI300X sources' leave-one-source-out errors were +70% and +31%: each held-out
#   source's efficiencies came from the other's rows alone, one source of dense and one of MLA/MoE models.
PUBLISHED: dict[str, dict[str, tuple[float, float, float]]] = {
    "hopper": {"lowp_eff": (0.45, 0.85, 0.72)},
    "cdna3": {"gemm_eff": (0.34, 0.65, 0.60), "lowp_eff": (0.25, 0.50, 0.44), "mem_eff": (0.40, 0.81, 0.755)},
}
PUBLISHED_SOURCE = ("tile-ai/tilelang benchmark/matmul_fp8/README.md (H800); DeepGEMM README (H800); "
                    "Azure/AI-benchmarking-guide Azure_Results/ND_MI300X_v5_results.md (MI300X); "
                    "stas00/ml-engineering compute/accelerator/README.md MAMF table (MI300X)")


def runs_at_lowp_eff(hw, precision: str, quantised: bool) -> bool:
    """Whether a GEMM whose weights are stored in ``precision`` runs at ``lowp_eff`` rather than ``gemm_eff``.

    ``lowp_eff`` is fitted on the quantised GEMMs a device's rows run: FP8/FP4 on its own low-precision tensor
    cores, or, on a device with none (Ampere), the weight-only kernel that dequantises in its main loop onto the
    16-bit cores (Marlin), the only quantised GEMM such a device runs. A weight-only format on a device that has
    low-precision cores (INT4 anywhere, MXFP4 on Hopper or MI300X) runs the second kind of kernel, which the fitted
    figure does not describe: it keeps the 16-bit GEMM's ``gemm_eff`` at the 16-bit peak. Weight-only kernels
    reach the 16-bit GEMM's rate where a GEMM is compute-bound (Neural Magic's Machete on Hopper, October 2024:
    W4A16 matches FP16's compute-bound throughput; Frantar et al., MARLIN, arXiv 2408.11743, on Ampere: the
    speed-up over FP16 falls towards 1x as the batch grows past 64-128) and read fewer bytes where it streams
    weights. Before 1 Dec 2026 such GEMMs took ``lowp_eff`` fitted on FP8 tensor cores, which priced INT4 on
    MI300X at half BF16's rate (a 70B TP8 step with 2,048 prompt tokens 45% slower than BF16)."""
    if not quantised:
        return False
    return hw.gemm_precision(precision) in ("fp8", "fp4") or (hw.peak_flops_fp8 <= 0 and hw.peak_flops_fp4 <= 0)


def measured(arch: str | None, name: str) -> tuple[float, float, float] | None:
    """``(lower, upper, prior)`` of ``name`` on ``arch`` where a lent GPU (:data:`MEASURED`) or a published kernel
    benchmark (:data:`PUBLISHED`) measured it, else None."""
    a = arch or ""
    return MEASURED.get(a, {}).get(name) or PUBLISHED.get(a, {}).get(name)


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Efficiencies of one regime on one hardware; ``None`` keeps the preset's value."""

    gemm_eff: float | None = None
    mem_eff: float | None = None
    attn_mem_eff: float | None = None
    attn_eff: float | None = None
    link_eff: float | None = None
    moe_eff: float | None = None
    moe_mem_eff: float | None = None
    lowp_eff: float | None = None
    ew_eff: float | None = None
    launch_s: float | None = None
    a2a_eff: float | None = None
    kappa: float | None = None

    @staticmethod
    def lookup(params: dict, regime: str, hardware: str, arch: str | None = None) -> Efficiency:
        """``arch``: the hardware's architecture (None: the preset's, "" for hardware that is not a preset)."""
        if arch is None:
            from blendsim.sim.hardware import PRESETS

            arch = PRESETS[hardware].arch if hardware in PRESETS else ""
        reg = params.get("regime", {}).get(regime, {})
        vals = dict(params.get("global", {}))
        for part in (params.get("arch", {}).get(arch, {}) if arch else {}, params.get("hardware", {}).get(hardware, {}),
                     reg.get("*", {}), reg.get(arch, {}) if arch else {}, reg.get(hardware, {})):
            vals.update(part)
        return Efficiency(**{k: float(v) for k, v in vals.items() if k in BOUNDS})

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


class EfficiencyTimer(RooflineTimer):
    """The roofline timer at fitted efficiencies (decode attention at its own bandwidth)."""

    name = "roofline+fitted"

    def __init__(self, dep, eff: Efficiency, custom_allreduce_max: float = float("inf")):
        super().__init__(dep, custom_allreduce_max)
        hw = dep.hardware
        self.eff = eff
        if eff.gemm_eff is not None:
            self.gemm_rate *= eff.gemm_eff / hw.compute_efficiency  # lowp_ratio scales the weights' GEMMs
        if eff.mem_eff is not None:
            self.bw *= eff.mem_eff / hw.memory_efficiency
        if eff.lowp_eff is not None:
            # GEMMs with quantised weights at lowp_eff of their precision's peak instead of gemm_eff of it (the
            # routed experts by their own precision), where the kernels lowp_eff describes run them
            m, adj = dep.model, eff.lowp_eff / (eff.gemm_eff or hw.compute_efficiency)
            if runs_at_lowp_eff(hw, m.weights, m.weight_elem_bytes != m.dtype_bytes):
                self.lowp_ratio *= adj
            if runs_at_lowp_eff(hw, m.expert_precision, m.expert_elem_bytes != m.dtype_bytes):
                self.expert_ratio *= adj
        if eff.ew_eff is not None:
            self.ew_bw = hw.mem_bandwidth * eff.ew_eff
        if eff.launch_s is not None:
            self.launch = eff.launch_s
        if eff.attn_eff is not None:
            self.attn_rate *= eff.attn_eff / hw.attention_compute_efficiency
        if eff.link_eff is not None:
            self.link_bw *= eff.link_eff
        a = eff.attn_mem_eff
        self.attn_bw = self.bw if a is None else self.bw * a / (eff.mem_eff or hw.memory_efficiency)

    def op_time(self, op, flops, nbytes, kernels, f):
        if op in MOE_GEMMS:
            # the grouped GEMM's compute at moe_eff and its weight streaming at moe_mem_eff instead of the
            # plain GEMM's efficiencies
            hw = self.dep.hardware
            if self.eff.moe_eff is not None:
                flops = flops / self.eff.moe_eff
            if self.eff.moe_mem_eff is not None:
                nbytes = nbytes * ((self.eff.mem_eff or hw.memory_efficiency) / self.eff.moe_mem_eff)
            return super().op_time(op, flops, nbytes, kernels, f)
        if op == "a2a" and self.eff.a2a_eff is not None:
            return super().op_time(op, flops, nbytes / self.eff.a2a_eff, kernels, f)
        return super().op_time(op, flops, nbytes, kernels, f)


__all__ = ["BOUNDS", "CEILINGS", "MEASURED", "MEASURED_SOURCE", "PUBLISHED", "PUBLISHED_SOURCE", "Efficiency", "EfficiencyTimer", "measured"]
