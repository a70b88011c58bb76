"""Accelerator specs (HardwareSpec): sourced peak numbers and measured efficiencies.

Peaks come from the vendors' datasheets (dense, no sparsity). Efficiencies are the fractions of those
peaks that real kernels reach; their defaults come from public kernel measurements, cited per field.
A calibration profile (``calibrate``) replaces them with the user's own measurements.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from blendsim.sim.errors import UserError

GiB = 1 << 30

# Where the efficiency defaults come from (A100, applied to GPUs of the same generation and later):
# * compute_efficiency 0.70 — Vidur's A100 profile of Llama-2-7B (../shared/data
#   vidur_profile_a100_Llama-2-7b-hf_mlp.csv): the QKV, O, up and down GEMMs run at 205-235 TFLOP/s
#   for 1K-4K tokens, 0.66-0.75 of 312 TFLOP/s; BlendServe Table 1 implies 0.69-0.71.
# * memory_efficiency 0.80 — the same profile's weight-bound GEMMs at 1-8 tokens read the weights at
#   1.60-1.64 TB/s, 0.78-0.80 of 2,039 GB/s; BlendServe Table 1's decode attention implies 0.80-0.85.
# * elementwise_efficiency 0.45 — the same profile's RMSNorm, SiLU-and-mul and rotary kernels at 4K
#   tokens move 0.64-1.0 TB/s, 0.31-0.50 of peak.
# * attention_compute_efficiency 0.55 — FlashAttention-2 forward reaches 50-73% of A100 peak on causal
#   head-dim-128 attention (Dao, 2023, Fig. 4); short chunks sit at the low end.
# * kernel_launch_s 4 us — the smallest kernels in the Vidur profile (norm, add at 1-4 tokens) take 4-5 us.
# * gemm_tile_m 128 — the Vidur GEMM times step at multiples of 128 tokens (e.g. 144 tokens cost as
#   much as 256), the M tile of cuBLAS's large kernels; at 64 tokens or fewer a 64-row tile is used.
# * gemm_roofline_blend 3 — a GEMM's time is (t_compute^3 + t_memory^3)^(1/3) rather than the max of the
#   two: near the ridge (65-128 tokens on A100) cuBLAS reaches neither bound, and Vidur's Llama-2-7B
#   GEMMs there sit 15-30% above max(); the blend takes that region's median error from -23% to -11%
#   and, held out, Vidur's Meta-Llama-3-8B A100 profile from 9.7% to 6.4% median error, while large
#   GEMMs (and BlendServe Table 1) move by under 1%. 0 restores the plain max.
# * overlap_interference 0.2 — the slowdown of the shorter of two co-running compute- and memory-bound
#   kernel groups; NanoFlow reports overlapped nano-batches lose 10-25% against ideal overlap. Replaced by
#   the calibrated value (``calibrate``'s overlap profile) when a profile is given.
# * The same fractions apply to the FP8 and FP4 peaks: no per-precision kernel measurement is in the shared
#   data, so an FP8 GEMM is priced at 0.70 of the FP8 peak until a profile says otherwise.


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One accelerator (per GPU; tensor parallelism multiplies GPUs, not this spec)."""

    name: str
    peak_flops: float  # dense FP16/BF16 tensor-core FLOP/s
    mem_bandwidth: float  # HBM bytes/s
    memory_bytes: int  # device memory
    peak_flops_fp32: float = 0.0  # FP32 FLOP/s (non-tensor); 0 means peak_flops / 16
    link_bandwidth: float = 0.0  # GPU-to-GPU bytes/s per direction (NVLink or PCIe); 0 = no link
    link_latency_s: float = 8e-6  # per all-reduce step
    num_sms: int = 0
    compute_efficiency: float = 0.70
    memory_efficiency: float = 0.80
    elementwise_efficiency: float = 0.45
    attention_compute_efficiency: float = 0.55
    kernel_launch_s: float = 4e-6
    gemm_tile_m: int = 128
    gemm_roofline_blend: float = 3.0
    overlap_interference: float = 0.2
    source: str = ""
    peak_flops_fp8: float = 0.0  # dense FP8 tensor-core FLOP/s; 0: no FP8 tensor cores
    peak_flops_fp4: float = 0.0  # dense FP4 tensor-core FLOP/s; 0: no FP4 tensor cores
    # lower-case pieces of the device names (torch.cuda.get_device_name) this preset describes; the longest
    # piece found wins, then the preset whose memory is closest to the device's (preset_for_device)
    device_names: tuple = ()

    def __post_init__(self) -> None:
        for f in ("peak_flops", "mem_bandwidth", "memory_bytes"):
            if not getattr(self, f) > 0:
                raise UserError(f"hardware {self.name!r}: {f} must be positive")
        for f in ("peak_flops_fp8", "peak_flops_fp4", "link_bandwidth", "link_latency_s"):
            if not getattr(self, f) >= 0:
                raise UserError(f"hardware {self.name!r}: {f} must be >= 0")
        for f in ("compute_efficiency", "memory_efficiency", "elementwise_efficiency",
                  "attention_compute_efficiency"):
            v = getattr(self, f)
            if not 0 < v <= 1:
                raise UserError(f"hardware {self.name!r}: {f} must be in (0, 1], got {v}")
        if not 0 <= self.overlap_interference <= 1:
            raise UserError(f"hardware {self.name!r}: overlap_interference must be in [0, 1]")
        if self.peak_flops_fp32 == 0:
            object.__setattr__(self, "peak_flops_fp32", self.peak_flops / 16)

    def gemm_precision(self, precision: str) -> str:
        """The precision a GEMM with operands in ``precision`` runs at on this device.

        FP8 and FP4 run on their own tensor cores where the device has them; otherwise the weights are
        dequantised to 16-bit (weight-only kernels: Marlin for FP8 on Ampere, the MXFP4/NVFP4 kernels on
        Hopper), as is weight-only int4 everywhere.
        """
        if precision == "fp4" and self.peak_flops_fp4 > 0:
            return "fp4"
        if precision == "fp8" and self.peak_flops_fp8 > 0:
            return "fp8"
        return "fp32" if precision == "fp32" else "bf16"

    def flops_for(self, precision: str) -> float:
        """Peak matmul FLOP/s of a GEMM whose operands are in ``precision`` (see :meth:`gemm_precision`)."""
        p = self.gemm_precision(precision)
        return {"fp4": self.peak_flops_fp4, "fp8": self.peak_flops_fp8, "fp32": self.peak_flops_fp32}.get(
            p, self.peak_flops)

    def with_(self, **changes) -> HardwareSpec:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)


TB = 1e12
MiB = 1 << 20
PRESETS: dict[str, HardwareSpec] = {
    h.name: h
    for h in [
        # Ampere has no FP8 tensor cores: FP8 weights run weight-only at the 16-bit peak.
        HardwareSpec("a100-80gb", 312 * TB, 2.039 * TB, 80 * GiB, peak_flops_fp32=19.5 * TB,
                     device_names=('a100',),
                     link_bandwidth=300e9, num_sms=108,
                     source="NVIDIA A100 datasheet (SXM4 80GB): 312 TFLOPS BF16 dense, no FP8, 2,039 GB/s, "
                            "NVLink 600 GB/s bidirectional"),
        HardwareSpec("a100-40gb", 312 * TB, 1.555 * TB, 40 * GiB, peak_flops_fp32=19.5 * TB,
                     device_names=('a100',),
                     link_bandwidth=300e9, num_sms=108,
                     source="NVIDIA A100 datasheet (SXM4 40GB): 312 TFLOPS BF16 dense, no FP8, 1,555 GB/s"),
        HardwareSpec("h100-80gb", 989.4 * TB, 3.35 * TB, 80 * GiB, peak_flops_fp32=66.9 * TB,
                     device_names=('h100',),
                     peak_flops_fp8=1978.9 * TB, link_bandwidth=450e9, num_sms=132,
                     source="NVIDIA H100 datasheet (SXM5): 989 TFLOPS BF16 and 1,979 TFLOPS FP8 dense (half "
                            "the with-sparsity figures), 3.35 TB/s, NVLink 900 GB/s bidirectional"),
        HardwareSpec("h100-pcie", 756 * TB, 2.0 * TB, 80 * GiB, peak_flops_fp32=51.2 * TB,
                     device_names=('h100 pcie',),
                     peak_flops_fp8=1513 * TB, link_bandwidth=64e9, num_sms=114,
                     source="NVIDIA H100 datasheet (PCIe 80GB): 756 TFLOPS BF16 and 1,513 TFLOPS FP8 dense, "
                            "51 TFLOPS FP32, 2.0 TB/s, PCIe Gen5 x16 128 GB/s bidirectional (no NVLink bridge)"),
        # NOTE: "141 GB" is the marketing figure; the board exposes 143,771 MiB (140.4 GiB, nvidia-smi),
        # as the "80GB" boards expose about 80 GiB, so the presets count memory alike.
        HardwareSpec("h200", 989.4 * TB, 4.8 * TB, 143_771 * MiB, peak_flops_fp32=66.9 * TB,
                     device_names=('h200',),
                     peak_flops_fp8=1978.9 * TB, link_bandwidth=450e9, num_sms=132,
                     source="NVIDIA H200 datasheet (SXM): 989 TFLOPS BF16 and 1,979 TFLOPS FP8 dense, 4.8 TB/s, "
                            "141 GB (143,771 MiB as nvidia-smi reports it), NVLink 900 GB/s bidirectional"),
        # The export-market Hopper: full HBM and NVLink, a fraction of the tensor cores.
        HardwareSpec("h20", 148 * TB, 4.0 * TB, 96 * GiB, peak_flops_fp32=44 * TB, peak_flops_fp8=296 * TB,
                     device_names=('h20',),
                     link_bandwidth=450e9, num_sms=78,
                     source="NVIDIA HGX H20 product brief (as reported by SemiAnalysis, 2023-11-09): 148 "
                            "TFLOPS BF16 and 296 TFLOPS FP8 dense, 44 TFLOPS FP32, 96 GB HBM3 at 4.0 TB/s, "
                            "NVLink 900 GB/s bidirectional"),
        # Blackwell: the datasheets give FP4/FP8/BF16 "with sparsity"; dense is half of each.
        HardwareSpec("b200", 2250 * TB, 8.0 * TB, 183_359 * MiB, peak_flops_fp32=75 * TB,
                     device_names=('b200',),
                     peak_flops_fp8=4500 * TB, peak_flops_fp4=9000 * TB, link_bandwidth=900e9, num_sms=148,
                     source="NVIDIA DGX B200 datasheet (8 GPUs: 72 PFLOPS FP8 and 144 PFLOPS FP4 with "
                            "sparsity, 1,440 GB at 64 TB/s, NVLink 5 14.4 TB/s): per GPU 2.25/4.5/9 PFLOPS "
                            "BF16/FP8/FP4 dense, 8 TB/s, 1.8 TB/s NVLink bidirectional; 183,359 MiB as "
                            "nvidia-smi reports it; 75 TFLOPS FP32 (HGX B200 datasheet)"),
        HardwareSpec("gb200", 2500 * TB, 8.0 * TB, 186 * GiB, peak_flops_fp32=80 * TB,
                     device_names=('gb200',),
                     peak_flops_fp8=5000 * TB, peak_flops_fp4=10000 * TB, link_bandwidth=900e9, num_sms=148,
                     source="NVIDIA GB200 NVL72 datasheet, per GPU (1/72): 360/720/1,440 PFLOPS FP16/FP8/FP4 "
                            "with sparsity -> 2.5/5/10 PFLOPS dense, 13.4 TB HBM3e -> 186 GB at 576 TB/s -> "
                            "8 TB/s, NVLink 130 TB/s -> 1.8 TB/s bidirectional; 5,760 TFLOPS FP32 -> 80"),
        HardwareSpec("a6000", 154.8 * TB, 0.768 * TB, 48 * GiB, peak_flops_fp32=38.7 * TB,
                     device_names=('a6000',),
                     link_bandwidth=56.25e9, num_sms=84,
                     source="NVIDIA RTX A6000 datasheet: 154.8 TFLOPS FP16 tensor dense, no FP8, 768 GB/s, "
                            "NVLink bridge 112.5 GB/s bidirectional"),
        HardwareSpec("l40s", 362.05 * TB, 0.864 * TB, 48 * GiB, peak_flops_fp32=91.6 * TB,
                     device_names=('l40s',),
                     peak_flops_fp8=733 * TB, link_bandwidth=32e9, num_sms=142,
                     source="NVIDIA L40S datasheet: 362 TFLOPS BF16 and 733 TFLOPS FP8 dense (half the "
                            "with-sparsity figures), 864 GB/s, PCIe 4.0 x16 64 GB/s bidirectional"),
        # AMD: fully connected by 7 Infinity Fabric links per GPU in an 8-GPU platform.
        HardwareSpec("mi300x", 1307.4 * TB, 5.3 * TB, 192 * GiB, peak_flops_fp32=163.4 * TB,
                     device_names=('mi300x',),
                     peak_flops_fp8=2614.9 * TB, link_bandwidth=448e9, num_sms=304,
                     source="AMD Instinct MI300X datasheet: 1,307.4 TFLOPS FP16/BF16 and 2,614.9 TFLOPS FP8 "
                            "dense, 163.4 TFLOPS FP32 matrix, 192 GB HBM3 at 5.3 TB/s, no FP4; Infinity Fabric "
                            "896 GB/s aggregate peer bandwidth (7 x 128 GB/s links) -> 448 GB/s per direction; "
                            "304 CUs"),
        # A placeholder to be calibrated (``blendsim calibrate --device cpu``): two AVX2 cores.
        HardwareSpec("cpu", 100e9, 20e9, 16 * GiB, peak_flops_fp32=100e9, link_bandwidth=10e9,
                     compute_efficiency=0.5, memory_efficiency=0.5, elementwise_efficiency=0.3,
                     attention_compute_efficiency=0.3, kernel_launch_s=20e-6, gemm_tile_m=1,
                     source="rough 2-core AVX2 figures; calibrate before trusting"),
    ]
}


def preset_for_device(device_name: str, memory_bytes: int = 0) -> str | None:
    """The preset describing a device by its reported name (and memory, between presets of one name), or
    None: the longest matching entry of the presets' ``device_names`` wins."""
    name = device_name.lower()
    hits = [(len(d), -abs(h.memory_bytes - memory_bytes), h.name) for h in PRESETS.values()
            for d in h.device_names if d in name]
    return max(hits)[2] if hits else None


def hardware_names() -> list[str]:
    return list(PRESETS)


def get_hardware(name: str) -> HardwareSpec:
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"unknown hardware {name!r}; presets: {', '.join(PRESETS)}") from None


__all__ = ["GiB", "HardwareSpec", "PRESETS", "get_hardware", "hardware_names", "preset_for_device"]
