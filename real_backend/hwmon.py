"""The device under a validation run: its identity, free memory, measured peaks and NVML samples.

``measure_peaks`` measures what the device actually reaches — a large device-to-device copy (bytes
read + written per second) and a large matmul in the run's dtype — so the backend's achieved bandwidth
and FLOP/s can be reported as fractions of measured, not datasheet, peaks. :class:`NvmlSampler` polls
memory use, clocks, power and utilisation from a background thread while steps run (NVIDIA GPUs,
``pynvml`` from the ``nvidia-ml-py`` package); it records nothing elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

import torch


def device_info(device: torch.device) -> dict:
    """Name, memory and software of the device."""
    info = {"kind": device.type, "torch": torch.__version__}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(name=p.name, memory_bytes=int(p.total_memory), sm_count=int(p.multi_processor_count),
                    cuda=torch.version.cuda, capability=f"{p.major}.{p.minor}")
    else:
        import platform

        from blendsim.calibrate.device import cpu_model

        info.update(name=cpu_model() or platform.processor() or platform.machine(),
                    threads=torch.get_num_threads(), cpus=os.cpu_count())
    return info


def free_memory_bytes(device: torch.device) -> int:
    """Memory the run can still allocate on ``device`` (CUDA: free device memory; CPU: MemAvailable)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _best(clock, fn, reps: int) -> float:
    clock.time(fn)
    return min(clock.time(fn)[1] for _ in range(reps))


def measure_peaks(clock, dtype: torch.dtype) -> dict:
    """Measured copy bandwidth (bytes/s, read + write) and matmul rate (FLOP/s) of ``clock``'s device
    (a :class:`blendsim.real_backend.timing.Clock`, so CPU peaks use the same clock as the steps)."""
    device = clock.device
    cuda = device.type == "cuda"
    nbytes = (2 << 30) if cuda else (256 << 20)
    if cuda:  # far beyond any L2, within what is free
        nbytes = max(64 << 20, min(nbytes, int(torch.cuda.mem_get_info(device)[0] * 0.3)))
    n = 8192 if cuda else 1024
    return {"mem_bandwidth": _copy_rate(clock, nbytes), "matmul_flops": _matmul_rate(clock, n, dtype),
            "copy_bytes": nbytes, "matmul_n": n, "matmul_dtype": str(dtype).replace("torch.", "")}


def _copy_rate(clock, nbytes: int) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=clock.device).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * nbytes / _best(clock, lambda: dst.copy_(src), 10 if clock.cuda else 3)


def _matmul_rate(clock, n: int, dtype) -> float:
    a = torch.randn(n, n, device=clock.device).to(dtype)
    b = torch.randn(n, n, device=clock.device).to(dtype)
    return 2 * n**3 / _best(clock, lambda: a @ b, 10 if clock.cuda else 3)


class NvmlSampler:
    """Polls NVML every ``interval_s`` from a thread: ``start()``, run steps, ``stop() -> samples``."""

    FIELDS = ("t_s", "mem_used_bytes", "sm_clock_mhz", "mem_clock_mhz", "power_w", "gpu_util_pct")

    def __init__(self, device: torch.device, interval_s: float = 0.05):
        import pynvml

        self._nv = pynvml
        pynvml.nvmlInit()
        self._h = _handle(pynvml, device)
        self.interval_s = interval_s
        self.samples: dict = {k: [] for k in self.FIELDS}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._t0 = 0.0

    def start(self) -> NvmlSampler:
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=5)
        with contextlib.suppress(self._nv.NVMLError):
            self._nv.nvmlShutdown()
        return self.samples

    def summary(self) -> dict:
        s = self.samples
        if not s["t_s"]:
            return {"samples": 0}
        med = lambda k: sorted(s[k])[len(s[k]) // 2]  # noqa: E731
        return {"samples": len(s["t_s"]), "mem_used_max_bytes": max(s["mem_used_bytes"]),
                "sm_clock_mhz_median": med("sm_clock_mhz"), "sm_clock_mhz_min": min(s["sm_clock_mhz"]),
                "mem_clock_mhz_median": med("mem_clock_mhz"), "power_w_median": med("power_w"),
                "gpu_util_pct_median": med("gpu_util_pct")}

    def _loop(self) -> None:
        nv, h, s = self._nv, self._h, self.samples
        while not self._stop.is_set():
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h).used
                sm = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
                mc = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)
                pw = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
                ut = nv.nvmlDeviceGetUtilizationRates(h).gpu
            except nv.NVMLError:
                break  # a driver that stops answering ends the sampling, not the run
            for k, v in zip(self.FIELDS, (time.perf_counter() - self._t0, mem, sm, mc, pw, ut)):
                s[k].append(v)
            self._stop.wait(self.interval_s)


def _handle(nv, device: torch.device):
    """The NVML handle of the torch device (by PCI bus id, so CUDA_VISIBLE_DEVICES renumbering is right)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    p = torch.cuda.get_device_properties(idx)
    bus = getattr(p, "pci_bus_id", None)
    if bus is not None:
        dom = getattr(p, "pci_domain_id", 0)
        dev = getattr(p, "pci_device_id", 0)
        # an NVML without this call or format: fall back to the index
        with contextlib.suppress(Exception):
            return nv.nvmlDeviceGetHandleByPciBusId(f"{dom:08x}:{bus:02x}:{dev:02x}.0")
    return nv.nvmlDeviceGetHandleByIndex(idx)


def start_sampler(device: torch.device):
    """An :class:`NvmlSampler` already started, or None (not a CUDA device, or no NVML): the reason."""
    if device.type != "cuda":
        return None, "not a CUDA device"
    try:
        return NvmlSampler(device).start(), ""
    except Exception as e:  # noqa: BLE001 - pynvml absent or NVML unusable: run without sampling
        return None, f"{type(e).__name__}: {e}"


__all__ = ["NvmlSampler", "device_info", "free_memory_bytes", "measure_peaks", "start_sampler"]
