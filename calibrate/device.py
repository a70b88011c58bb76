"""The device a profile was measured on: identity (pynvml / platform), software, and measured peaks.

The peaks (a large device-to-device copy for memory bandwidth, a large square matmul in the run's
dtype for matmul throughput) go in ``profile.hardware`` under HardwareSpec's field names, so a user
with an unlisted GPU can fill a :class:`blendsim.sim.hardware.HardwareSpec` from them
(:func:`blendsim.calibrate.report.hardware_fields`, printed by ``blendsim calibrate show``).
"""

from __future__ import annotations

import os
import platform

import torch

from blendsim.sim.errors import UserError


def resolve_device(device: str) -> str:
    """``cuda`` or ``cpu``; a clear error when CUDA is asked for and torch sees no GPU."""
    if device not in ("cuda", "cpu"):
        raise UserError(f"--device {device!r}: use cuda or cpu")
    if device == "cuda" and not torch.cuda.is_available():
        why = ("this torch is a CPU-only build" if torch.version.cuda is None
               else "torch sees no CUDA device (check CUDA_VISIBLE_DEVICES and the driver)")
        raise UserError(f"--device cuda: no GPU available: {why} (torch {torch.__version__}); use --device cpu")
    return device


def identity(device: str, threads: int) -> dict:
    """Who measured: GPU identity through NVML (name, memory, clocks, driver, power), or the CPU."""
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        d = {"kind": "cuda", "name": props.name, "memory_bytes": int(props.total_memory),
             "num_sms": int(props.multi_processor_count), "capability": f"{props.major}.{props.minor}"}
        d.update(_nvml())
        return d
    return {"kind": "cpu", "name": cpu_model() or platform.processor() or platform.machine(),
            "processor": platform.processor(), "machine": platform.machine(), "platform": platform.platform(),
            "logical_cpus": os.cpu_count(), "threads": threads, "memory_bytes": _ram_bytes()}


def software(device: str) -> dict:
    import numpy
    import scipy

    from blendsim.sim import __version__

    d = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
         "numpy": numpy.__version__, "scipy": scipy.__version__, "blendsim": __version__}
    if device == "cuda":
        d["cudnn"] = torch.backends.cudnn.version()
    return d


def _nvml() -> dict:
    try:
        import pynvml
    except ImportError:
        return {"nvml": "pynvml not installed (pip install nvidia-ml-py)"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return {"nvml": f"unavailable: {e}"}
    try:
        h = _nvml_handle(pynvml)
        out = {}
        for key, fn in (("nvml_name", lambda: pynvml.nvmlDeviceGetName(h)),
                        ("memory_total_bytes", lambda: pynvml.nvmlDeviceGetMemoryInfo(h).total),
                        ("sm_clock_max_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
                        ("mem_clock_max_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)),
                        ("sm_clock_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
                        ("power_limit_w", lambda: pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000.0),
                        ("driver", lambda: pynvml.nvmlSystemGetDriverVersion()),
                        ("uuid", lambda: pynvml.nvmlDeviceGetUUID(h))):
            try:
                v = fn()
                out[key] = v.decode() if isinstance(v, bytes) else v
            except pynvml.NVMLError as e:
                out[key] = f"unavailable: {e}"
        return out
    finally:
        pynvml.nvmlShutdown()


def _nvml_handle(pynvml):
    """NVML's handle of torch's current GPU: by UUID (NVML ignores CUDA_VISIBLE_DEVICES), else by index."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except pynvml.NVMLError:
            pass
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return pynvml.nvmlDeviceGetHandleByIndex(int(visible) if visible.isdigit() else torch.cuda.current_device())


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _ram_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def measure_peaks(clock, device: str, dtype: torch.dtype, quick: bool) -> dict:
    """Memory bandwidth (bytes read + written per second of a large copy) and matmul FLOP/s."""
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        copy_bytes = int(min(2 * 2**30, free // 8))
        n = 4096 if quick else 8192
    else:
        copy_bytes = 64 * 2**20 if quick else 256 * 2**20
        n = 1024 if quick else 2048
    src = torch.empty(copy_bytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    t_copy = clock.time(lambda: dst.copy_(src))
    src = dst = None  # free before the matmul
    g = torch.Generator(device=device)
    g.manual_seed(0)
    a = torch.randn(n, n, generator=g, device=device, dtype=torch.float32).to(dtype)
    b = torch.randn(n, n, generator=g, device=device, dtype=torch.float32).to(dtype)
    t_mm = clock.time(lambda: a @ b)
    return {"mem_bandwidth": 2 * copy_bytes / t_copy.median_s, "peak_flops": 2 * n**3 / t_mm.median_s,
            "peak_flops_dtype": str(dtype).replace("torch.", ""), "copy_bytes": copy_bytes, "matmul_n": n,
            "method": "median of a device-to-device copy (bytes read + written) and an n x n matmul"}


__all__ = ["identity", "measure_peaks", "resolve_device", "software"]
