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
#   GEMMs there sit 15-30% above max(); the blend takes that region's median error from -23% to -11%,
#   while large GEMMs (and BlendServe Table 1) move by under 1%. 0 restores the plain max.
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
    # host/disk KV tiers (sim.kv_tiers; cited per preset in HOST_IO below)
    host_link_bandwidth: float = 0.0  # GPU <-> host bytes/s per direction per GPU (achieved copy rate); 0: none
    host_memory_bytes: float = 0.0  # host DRAM of a typical node (bounds --host-kv-gb); 0: not known
    disk_read_bandwidth: float = 6.4e9  # local NVMe bytes/s per GPU (one drive's share); see DISK_DEFAULT
    disk_write_bandwidth: float = 3.8e9
    disk_bytes: float = 0.0  # local NVMe of a typical node (bounds --disk-kv-gb); 0: not known
    host_source: str = ""
    # node topology (see TOPOLOGY below): GPUs per node, GPUs joined by the scale-up link (``link_bandwidth``;
    # 0: the node's GPUs; GB200 NVL72: 72), and the inter-node network per GPU (its NIC), per direction
    gpus_per_node: int = 8
    nvlink_domain: int = 0
    net_bandwidth: float = 0.0  # bytes/s per GPU per direction; 0: unknown (multi-node deployments refused)
    net_latency_s: float = 12e-6  # per collective step across nodes
    topology_source: str = ""
    # the GPU architecture whose kernels it runs (fitted compute efficiencies are shared per architecture: one
    # die and one kernel library, e.g. H100 and H200), and whether its switch reduces in the network (NVLink
    # SHARP): see ARCH below
    arch: str = ""
    nvls: bool = False
    # NCCL's all-reduce among a node's GPUs as measured (nccl-tests all_reduce_perf within one node): ((GPUs,
    # ((message bytes, seconds), ...)), ...), sizes ascending; () where none is cited (see NCCL_ALLREDUCE below).
    # Priced for the messages an engine hands to NCCL rather than to its own all-reduce kernel
    # (blendsim.sim.engines CUSTOM_ALLREDUCE); without a curve every all-reduce is priced at the link.
    nccl_allreduce: tuple = ()

    def __post_init__(self) -> None:
        for f in ("peak_flops", "mem_bandwidth", "memory_bytes"):
            if not getattr(self, f) > 0:
                raise UserError(f"hardware {self.name!r}: {f} must be positive")
        for f in ("peak_flops_fp8", "peak_flops_fp4", "link_bandwidth", "link_latency_s", "net_bandwidth",
                  "net_latency_s", "nvlink_domain"):
            if not getattr(self, f) >= 0:
                raise UserError(f"hardware {self.name!r}: {f} must be >= 0")
        for f in ("compute_efficiency", "memory_efficiency", "elementwise_efficiency",
                  "attention_compute_efficiency"):
            v = getattr(self, f)
            if not 0 < v <= 1:
                raise UserError(f"hardware {self.name!r}: {f} must be in (0, 1], got {v}")
        for f in ("host_link_bandwidth", "host_memory_bytes", "disk_read_bandwidth", "disk_write_bandwidth",
                  "disk_bytes"):
            v = getattr(self, f)
            if not (v >= 0 and v != float("inf")):
                raise UserError(f"hardware {self.name!r}: {f} must be a finite number >= 0, got {v}")
        if not 0 <= self.overlap_interference <= 1:
            raise UserError(f"hardware {self.name!r}: overlap_interference must be in [0, 1]")
        if self.peak_flops_fp32 == 0:
            object.__setattr__(self, "peak_flops_fp32", self.peak_flops / 16)
        if not self.gpus_per_node >= 1:
            raise UserError(f"hardware {self.name!r}: gpus_per_node must be >= 1")

    @property
    def scaleup_domain(self) -> int:
        """GPUs joined by the scale-up link (NVLink/NVSwitch, Infinity Fabric, PCIe): the node's, or a rack's."""
        return self.nvlink_domain or self.gpus_per_node

    def gemm_precision(self, precision: str) -> str:
        """The precision a GEMM with operands in ``precision`` runs at on this device.

        FP8 and FP4 run on their own tensor cores where the device has them; otherwise the weights are
        dequantised to 16-bit (weight-only kernels: Marlin for FP8 on Ampere, the MXFP4/NVFP4 kernels on
        Hopper), as is weight-only int4 everywhere.
        """
        if precision in ("fp4", "mxfp4") and self.peak_flops_fp4 > 0:
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
        # AMD: fully connected by 7 Infinity Fabric links per GPU in an 8-GPU platform. Its own efficiencies, from
        # published measurements (the 0.70 / 0.80 above are an A100's): compute 0.60, the largest BF16 matmul
        # stas00/ml-engineering's mamf-finder found on ROCm 6.2, 781.9 of 1,300 TFLOP/s (compute/accelerator/README.md,
        # "Maximum Achievable Matmul FLOPS comparison table"; 450 on ROCm 6.1); memory 0.755, the read-only STREAM
        # kernel (Dot, 4.0 TB/s; Copy 4.15, Mul 4.28) on an Azure ND MI300X v5 (Azure/AI-benchmarking-guide
        # Azure_Results/ND_MI300X_v5_results.md, "HBM Bandwidth", as of fork commit bf209ab): a decode step's weight
        # and KV reads are reads. The fitted architecture values (blendsim.sim.efficiency PUBLISHED["cdna3"]) replace
        # them where a catalogue row measured them.
        HardwareSpec("mi300x", 1307.4 * TB, 5.3 * TB, 192 * GiB, peak_flops_fp32=163.4 * TB,
                     device_names=('mi300x',), compute_efficiency=0.60, memory_efficiency=0.755,
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


# Host link, host memory and local NVMe per preset (each with its source below; "U" marks a
# figure no primary copy was found for). The link is the achieved host<->device copy rate per GPU, not the
# PCIe line rate. DISK_DEFAULT: a datacentre Gen4 U.2 drive (Samsung PM1733 class: 6.4 GB/s sequential read,
# 3.8 GB/s write, hardwareluxx.de quoting Samsung) per GPU, as DGX H100/H200/B200 nodes carry 8 such drives
# for 8 GPUs; override with HardwareSpec.with_(disk_read_bandwidth=...) or RunConfig's disk bandwidths.
TiB = 1 << 40
DISK_DEFAULT = "Samsung PM1733-class U.2 Gen4 drive per GPU: 6.4 GB/s read, 3.8 GB/s write (hardwareluxx.de)"
_A100_LINK = ("PCIe Gen4 x16: 25.1 GB/s H2D measured on A100-SXM4 (NVIDIA/nvbandwidth issue #42); 25 GB/s "
              "(ZaidQureshi/bam issue #54)")
_H100_LINK = ("PCIe Gen5 x16: copy-engine H2D 55.6-57.1 GB/s per H100 (NVIDIA/nvbandwidth issue #6; "
              "nvbandwidth tutorial 55.63 GB/s)")
HOST_IO: dict[str, dict] = {
    "a100-80gb": dict(host_link_bandwidth=25e9, host_memory_bytes=1152 * GiB, disk_bytes=8e12,
                      host_source=_A100_LINK + "; AWS p4de 1152 GiB DRAM, 8 x 1 TB NVMe (EC2 Capacity Blocks "
                                               "page); " + DISK_DEFAULT + " (U for these drives)"),
    "a100-40gb": dict(host_link_bandwidth=25e9, host_memory_bytes=1152 * GiB, disk_bytes=8e12,
                      host_source=_A100_LINK + "; AWS p4d 1152 GiB DRAM, 8 x 1 TB NVMe (EC2 Capacity Blocks "
                                               "page); " + DISK_DEFAULT + " (U for these drives)"),
    "h100-80gb": dict(host_link_bandwidth=55.6e9, host_memory_bytes=2 * TiB, disk_bytes=8 * 3.84e12,
                      host_source=_H100_LINK + "; DGX H100: 2 TB DDR5, 8 x 3.84 TB U.2 NVMe (NVIDIA DGX "
                                               "BasePOD RA); " + DISK_DEFAULT),
    "h100-pcie": dict(host_link_bandwidth=55.6e9, host_memory_bytes=640e9,
                      host_source="PCIe Gen5 x16 card; achieved rate as h100-80gb (U); Azure NC80adis H100 v5 "
                                  "640 GB for 2 GPUs (aspire.dev VM sizes); NVMe not found; " + DISK_DEFAULT),
    "h200": dict(host_link_bandwidth=55.6e9, host_memory_bytes=2 * TiB, disk_bytes=8 * 3.84e12,
                 host_source="PCIe Gen5 x16 (NVIDIA H200 Tensor Core GPU datasheet: PCIe Gen5 128 GB/s); achieved rate as "
                             "H100 (U); DGX H200: "
                             "2 TB DDR5, 8 x 3.84 TB U.2 NVMe (NVIDIA DGX BasePOD RA); " + DISK_DEFAULT),
    "h20": dict(host_link_bandwidth=55.6e9,
                host_source="PCIe Gen5 x16 (U); achieved rate as H100 (U); host memory and NVMe not found; "
                            + DISK_DEFAULT),
    "b200": dict(host_link_bandwidth=55.6e9, host_memory_bytes=2 * TiB, disk_bytes=8 * 3.84e12,
                 host_source="PCIe Gen5 x16 (U: the HGX B200 host interface); achieved rate as H100 (U); "
                             "DGX B200: 2 TB, 8 x 3.84 TB U.2 NVMe (DGX B200 User Guide); " + DISK_DEFAULT),
    "gb200": dict(host_link_bandwidth=225e9, host_memory_bytes=960e9, disk_read_bandwidth=14e9,
                  host_source="NVLink-C2C 900 GB/s bidirectional per Grace shared by its 2 GPUs -> 225 GB/s per "
                              "GPU per direction when both stream (U derivation; GH200 measures 346 GB/s H2D for "
                              "one GPU, NVIDIA/nvbandwidth issue #23); 2 x 480 GB LPDDR5X per 4-GPU tray "
                              "(yobitel.com GB200); Gen5 E1.S drives ~14 GB/s read (Samsung PM1743 class, "
                              "hardwaretimes.com), write as " + DISK_DEFAULT),
    "a6000": dict(host_link_bandwidth=25e9, host_memory_bytes=400 * GiB,
                  host_source="PCIe Gen4 x16 (U), achieved rate as A100's Gen4 (U); Lambda 4x A6000 instance "
                              "400 GiB (skypilot-catalog v8 lambda vms.csv); " + DISK_DEFAULT),
    "l40s": dict(host_link_bandwidth=25e9,
                 host_source="PCIe Gen4 x16 (datasheet), achieved rate as A100's Gen4 (U); host memory and "
                             "NVMe not found; " + DISK_DEFAULT),
    "mi300x": dict(host_link_bandwidth=55.6e9,
                   host_source="PCIe Gen5 x16 (AMD Instinct MI300X product page: 'PCIe Gen 5 x16'), achieved rate "
                               "as H100's Gen5 (U); host memory and NVMe of a typical node not found; " + DISK_DEFAULT),
}
PRESETS = {k: replace(h, **HOST_IO.get(k, {})) for k, h in PRESETS.items()}

# RTX PRO 6000 Blackwell Server Edition: a PCIe card (no NVLink), the GPU of TensorRT-LLM's pipeline-parallel tables.
PRESETS["rtx-pro-6000"] = HardwareSpec(
    "rtx-pro-6000", 500 * TB, 1.597 * TB, 96 * GiB, peak_flops_fp32=125 * TB, peak_flops_fp8=1000 * TB,
    peak_flops_fp4=2000 * TB, link_bandwidth=64e9, num_sms=188,
    source="NVIDIA RTX PRO 6000 Blackwell Server Edition (GTC 2025 announcement as reported by the trade press: "
           "188 SMs, 125 TFLOPS FP32, 4,000 AI TOPS FP4 with sparsity; datasheet: 96 GB GDDR7 at 1,597 GB/s, "
           "PCIe Gen5 x16 128 GB/s bidirectional, no NVLink): dense FP4 2,000 TFLOPS = half the sparse figure, "
           "FP8 1,000 and BF16 500 at half rate per precision step as on the other Blackwell parts (derived, "
           "not a datasheet line)")

# Node topology per preset (sim.deployment prices TP, EP and PP traffic on the link it crosses). Sources: [S12] NVIDIA DGX BasePOD reference
# architecture (DGX H100/H200: 8 GPUs, 4 NVSwitch, 8 x ConnectX-7 400 Gb/s, one per GPU), [S18] DGX B200 user
# guide (8 x ConnectX-7 400 Gb/s), [S33]/[S34] DGX GB200 user guide and NVL multi-node tuning guide (4 GPUs per
# compute tray, one NVLink domain of 72, 4 x ConnectX-7 400 Gb/s per tray), [S30] DGX A100 (8 x 200 Gb/s HDR
# ConnectX-6), [S26] Azure ND MI300X v5 (8 x 400 Gb/s NDR). 400 Gb/s = 50e9 bytes/s per direction.
# net_latency_s 12 us: the scale-up link's 8 us per collective step (uncited, the model's) plus the 3-4 us
# end-to-end latency of an offloaded InfiniBand transfer (Mellanox "In-Network Computing" slides [S39]).
# PCIe cards (h100-pcie, a6000, l40s, rtx-pro-6000) and h20 have no published network per GPU: net_bandwidth
# 0, so a deployment spanning two of their nodes is refused rather than priced on a guess.
TOPOLOGY: dict[str, dict] = {
    "a100-80gb": dict(gpus_per_node=8, net_bandwidth=25e9, topology_source="DGX A100: 8 GPUs, NVSwitch, 8 x HDR 200 Gb/s"),
    "a100-40gb": dict(gpus_per_node=8, net_bandwidth=25e9, topology_source="DGX A100: 8 GPUs, NVSwitch, 8 x HDR 200 Gb/s"),
    "h100-80gb": dict(gpus_per_node=8, net_bandwidth=50e9, topology_source="DGX H100: 8 GPUs, 4 NVSwitch, 8 x CX-7 400 Gb/s"),
    "h200": dict(gpus_per_node=8, net_bandwidth=50e9, topology_source="DGX H200: 8 GPUs, 4 NVSwitch, 8 x CX-7 400 Gb/s"),
    "h20": dict(gpus_per_node=8, topology_source="HGX H20: 8 GPUs, NVLink; network per GPU not published"),
    "b200": dict(gpus_per_node=8, net_bandwidth=50e9, topology_source="DGX B200: 8 GPUs, 2 NVSwitch, 8 x CX-7 400 Gb/s"),
    "gb200": dict(gpus_per_node=4, nvlink_domain=72, net_bandwidth=50e9,
                  topology_source="GB200 NVL72: 4 GPUs per tray, 72 in one NVLink domain, 4 x CX-7 400 Gb/s per tray"),
    "mi300x": dict(gpus_per_node=8, net_bandwidth=50e9,
                   topology_source="8 x MI300X fully connected by Infinity Fabric; Azure ND MI300X v5: 8 x 400 Gb/s NDR"),
    "h100-pcie": dict(gpus_per_node=8, nvlink_domain=8, topology_source="8 PCIe cards per server, PCIe Gen5 between them"),
    "a6000": dict(gpus_per_node=4, topology_source="up to 4 PCIe cards per server (Lambda's 4x A6000 instances)"),
    "l40s": dict(gpus_per_node=8, topology_source="8 PCIe cards per server (CoreWeave's L40S nodes)"),
    "rtx-pro-6000": dict(gpus_per_node=8, topology_source="8 PCIe cards per server (TensorRT-LLM's PP tables use up to 8)"),
    "cpu": dict(gpus_per_node=1),
}
for _name, _topo in TOPOLOGY.items():
    if _name in PRESETS:
        PRESETS[_name] = replace(PRESETS[_name], **_topo)


# Architecture and in-switch reduction per preset. H100/H200/H20 are one die (GH100) and B200/GB200 one (GB100
# family): their GEMM and grouped-GEMM kernels, and so the fraction of peak those reach, are the same; memory
# efficiencies stay per preset (HBM3 vs HBM3e, different stacks). The RTX PRO 6000 is a different Blackwell die
# (GB202, consumer-class tensor cores). NVLink SHARP (NVLS): third-generation NVSwitch (HGX H100/H200) and the
# NVLink 5 switches (HGX B200, GB200 NVL72) reduce in the switch, so an all-reduce sends each GPU's data into the
# switch once and receives the sum once -- the bytes a GPU moves are its buffer, not the ring's 2(t-1)/t of it
# (NVIDIA H100 Tensor Core GPU Architecture whitepaper, 2022, "NVLink Switch System": SHARP in-network
# reductions; NCCL 2.17 release notes: NVLS all-reduce on NVSwitch systems). A100's NVSwitch has no SHARP.
ARCH: dict[str, dict] = {
    "a100-80gb": dict(arch="ampere"), "a100-40gb": dict(arch="ampere"), "a6000": dict(arch="ampere"),
    "l40s": dict(arch="ada"),
    "h100-80gb": dict(arch="hopper", nvls=True), "h200": dict(arch="hopper", nvls=True),
    "h100-pcie": dict(arch="hopper"), "h20": dict(arch="hopper", nvls=True),
    "b200": dict(arch="blackwell", nvls=True), "gb200": dict(arch="blackwell", nvls=True),
    "rtx-pro-6000": dict(arch="blackwell-rtx"),
    "mi300x": dict(arch="cdna3"),
    "cpu": dict(arch="cpu"),
}
for _name, _a in ARCH.items():
    if _name in PRESETS:
        PRESETS[_name] = replace(PRESETS[_name], **_a)


# NCCL all-reduce inside one node, measured: eight A100-SXM4-40GBs over NVSwitch on an OCI BM.GPU4.8
# (oracle-japan/ocitutorials tutorials/_intermediates/spinup-gpu-cluster.md, the Horovod-container version's section
# 4-2: `all_reduce_perf -b 64 -e 10G -f 2 -t 1 -g 8`, one process driving the eight GPUs of host inst-ks8ls-comp,
# float32 sum, out-of-place times below; nccl-tests built against CUDA 11.3). 32 us up to 32 KB (the rows below it
# are 31.8-32.5 us), 77 us at 1 MiB and 186 us at 8 MiB -- 2-4x what the same bytes take at the link's bandwidth: a
# ring takes 2(t - 1) steps of fixed cost and splits a message into chunks per channel -- and bus bandwidth 120 GB/s
# at 16 MiB, 199 GB/s at 64 MiB, 235 GB/s at 8 GiB (bus bandwidth = bytes x 2(t - 1)/t / time). The 80 GB part has
# the same switch generation and links (NVLink 3, 12 links, 300 GB/s per direction). Hopper's and MI300X's below; B200,
# GB200 and the PCIe cards have no cited intra-node sweep and price every all-reduce at the link.
_A100_NCCL = tuple((2 ** k, us * 1e-6) for k, us in zip(range(15, 34), (
    32.02, 35.40, 38.50, 45.21, 58.96, 76.71, 112.4, 134.5, 185.8, 245.1, 398.2, 589.5, 1191.2, 2121.9, 4208.2,
    8166.8, 16232.0, 32097.0, 63929.0)))
# Eight H100 80GB HBM3s of one DGX H100 (NVIDIA/dgxc-benchmarking nccl/README.md at 46e420155bec, its AllReduce
# sample: eight ranks on host pool0-01806, float32 sum, out-of-place): NCCL takes the switch's in-network reduction
# (NVLS) at this count, 480 GB/s of bus bandwidth at 8 GiB; 13-24 us up to 512 KB (one outlier: 68 us at 32 B).
# Four H100 SXMs of one Lambda instance, NV18 between every pair (dudeperf3ct/dudeperf3ct.github.io
# content/posts/distributed_communication_part1.md at 30f9cbde8e24, NCCL 2.26.2, `all_reduce_perf -b 8 -e 1G -f 2
# -g 4`): 24-27 us up to 512 KB, 356 GB/s at 1 GiB. H200 has the same switches and links.
_H100_NCCL_8 = tuple((2 ** k, us * 1e-6) for k, us in zip(range(15, 35), (
    19.33, 19.54, 19.89, 20.43, 20.66, 27.37, 42.21, 54.19, 83.04, 123.8, 199.3, 324.7, 586.4, 1112.5, 2151.0,
    4029.4, 7939.1, 15749.0, 31307.0, 62648.0)))
_H100_NCCL_4 = tuple((2 ** k, us * 1e-6) for k, us in zip(range(15, 31), (
    24.40, 24.56, 24.62, 26.80, 26.67, 28.06, 32.05, 45.05, 65.19, 104.4, 174.9, 326.6, 614.7, 1184.9, 2314.9,
    4525.6)))
_HOPPER_NCCL = ((4, _H100_NCCL_4), (8, _H100_NCCL_8))
# Eight MI300X of one Azure ND MI300X v5 VM, RCCL 2.22.3 (Azure/AI-benchmarking-guide Azure_Results/ND_MI300X_v5_results.md,
# "RCCL Bandwidth", as of fork commit bf209ab): all_reduce_perf's in-place bus bandwidth in GB/s, 32 KiB to 8 GiB
# (the table's "32K".."8G" rows, powers of two), turned into times as bytes x 2(t - 1)/t / bus bandwidth: 51 us at
# 32 KiB, 82 us at 1 MiB, 112 us at 8 MiB, 317 GB/s at 8 GiB.
_MI300X_RCCL_BUSBW = (1.13, 2.22, 4.18, 7.50, 13.01, 22.41, 43.41, 82.53, 131.57, 171.46, 230.35, 266.34, 290.81,
                      302.80, 308.89, 313.92, 315.06, 314.85, 316.82)
_MI300X_RCCL_8 = tuple((2 ** k, 2 ** k * (2 * 7 / 8) / (gbs * 1e9)) for k, gbs in zip(range(15, 34), _MI300X_RCCL_BUSBW))
NCCL_ALLREDUCE: dict[str, tuple] = {"a100-80gb": ((8, _A100_NCCL),), "a100-40gb": ((8, _A100_NCCL),),
                                    "h100-80gb": _HOPPER_NCCL, "h200": _HOPPER_NCCL, "mi300x": ((8, _MI300X_RCCL_8),)}
for _name, _curve in NCCL_ALLREDUCE.items():
    PRESETS[_name] = replace(PRESETS[_name], nccl_allreduce=_curve)


def hardware_names() -> list[str]:
    return list(PRESETS)


def get_hardware(name: str) -> HardwareSpec:
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        import difflib

        low = str(name).strip().lower()
        near = ([low] if low in PRESETS else [p for p in PRESETS if low and p.startswith(low)]
                or difflib.get_close_matches(low, PRESETS, n=1, cutoff=0.75))
        hint = f" (did you mean {' or '.join(near)}?)" if near else ""
        raise UserError(f"unknown hardware {name!r}{hint}; presets: {', '.join(PRESETS)}") from None


__all__ = ["GiB", "HOST_IO", "HardwareSpec", "NCCL_ALLREDUCE", "PRESETS", "TOPOLOGY", "get_hardware", "hardware_names",
           "preset_for_device"]
