"""One calibration run: measure every operator of a model shard on a device, fit, and build a Profile.

Operators are timed inside forwards of the real backend's model and attention backend
(``blendsim.calibrate.forward``), so the profile prices what ``blendsim validate`` replays.

    cal = Calibrator(CalibrationConfig(model="tiny", device="cpu", quick=True))
    profile = cal.run(advance=lambda label: ...)   # cal.total_steps() calls of advance
    profile.save("p.json")

Shapes come from ``blendsim.sim.ops.Shapes`` of the deployment (model, dtype, tp), so the profiled GEMMs are
exactly the per-GPU GEMMs the cost model accounts for. Out-of-memory points are skipped and listed
in ``profile.skipped``; an operator left with fewer than three points is left out (the cost model
falls back to the roofline for it and says so).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from blendsim.calibrate import grids
from blendsim.calibrate.device import identity, measure_peaks, resolve_device, software
from blendsim.calibrate.fit import attach_holdout, fit_op
from blendsim.calibrate.forward import ForwardProbe, backend_info, longest_position, measure_plan, plan_steps
from blendsim.calibrate.kernels import TOKEN_OPS, TORCH_DTYPES, TokenKernels
from blendsim.calibrate.measure import OpData
from blendsim.calibrate.overlap import GEMM_OP, measure_overlap
from blendsim.calibrate.timing import Clock, is_oom, keep_freed_memory, pin_threads
from blendsim.sim.deployment import Deployment
from blendsim.sim.errors import UserError
from blendsim.sim.hardware import HardwareSpec
from blendsim.sim.models import get_model
from blendsim.sim.ops import Shapes
from blendsim.sim.profile import Profile, model_shape

CPU_PASSES = 3  # interleaved sweeps over each grid on CPU (see calibrate.measure)


@dataclass(frozen=True, slots=True)
class CalibrationConfig:
    """What to calibrate and how."""

    model: str  # preset name or HuggingFace config.json
    device: str = "cpu"  # cuda or cpu
    dtype: str | None = None  # fp32, bf16 or fp16; None: the model's own
    tp: int = 1  # tensor-parallel degree whose per-GPU shard is profiled
    quick: bool = False  # a small grid (CI, smoke runs)
    threads: int = 1  # CPU threads (torch.set_num_threads); ignored on CUDA
    seed: int = 0  # inputs are seeded random tensors
    holdout: int = 0  # off-grid points per operator timed in the same sweeps, kept out of the fit
    command: str = ""  # the command line, recorded in produced_by


def shard_deployment(model, tp: int) -> Deployment:
    """A deployment used only for its shapes and tensor-parallel checks (memory is not the question)."""
    # NOTE: Deployment checks that tp divides the heads and MLP; its hardware only sizes the KV cache
    hw = HardwareSpec("calibration", peak_flops=1e15, mem_bandwidth=1e12, memory_bytes=1 << 50)
    return Deployment(model, hw, tp)


class Calibrator:
    """Plans, measures and fits one model shard on one device."""

    def __init__(self, cfg: CalibrationConfig):
        if cfg.dtype is not None and cfg.dtype not in TORCH_DTYPES:
            raise UserError(f"--dtype {cfg.dtype}: calibration supports {', '.join(TORCH_DTYPES)}")
        if cfg.threads < 1:
            raise UserError(f"--threads must be at least 1, got {cfg.threads}")
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.model = get_model(cfg.model, cfg.dtype)
        if self.model.dtype not in TORCH_DTYPES:
            raise UserError(f"model {self.model.name!r} is {self.model.dtype}; calibrate it with --dtype "
                            f"{' or '.join(TORCH_DTYPES)}")
        self.dep = shard_deployment(self.model, cfg.tp)
        self.shapes = Shapes.of(self.dep)
        q = cfg.quick
        self.plan: dict[str, list] = {}
        for op in TOKEN_OPS:
            if op == "rope" and not self.shapes.rope:
                continue
            pts = grids.lm_head_grid(self.device, q) if op == "lm_head" else grids.token_grid(self.device, q)
            self.plan[op] = [(t,) for t in pts]
        self.plan["attn_prefill"] = grids.prefill_grid(self.device, q)
        self.plan["attn_decode"] = grids.decode_grid(self.device, q)
        rng = np.random.default_rng(cfg.seed + 1)
        self.holdout = {op: grids.heldout_points(op, pts, cfg.holdout, rng) if cfg.holdout > 0 else []
                        for op, pts in self.plan.items()}
        self.overlap_grid = grids.overlap_grid(q) if self.device == "cuda" else []
        self.passes = CPU_PASSES if self.device == "cpu" else 1

    def total_steps(self) -> int:
        """How many times :meth:`run` calls ``advance``."""
        return plan_steps(self._points()) * self.passes + len(self.overlap_grid) + 1

    def _points(self) -> dict:
        """Every operator's grid and held-out points (measured in the same sweeps)."""
        return {op: sorted(set(pts) | set(self.holdout[op])) for op, pts in self.plan.items()}

    def run(self, advance=None) -> Profile:
        """Measure, fit and return the profile; ``advance(label)`` is called once per step.

        The process's torch thread count is restored afterwards; on CPU the glibc allocator keeps
        freed memory from then on (see :func:`blendsim.calibrate.timing.keep_freed_memory`).
        """
        tick = (lambda label: advance(label)) if advance else (lambda label: None)
        torch.manual_seed(self.cfg.seed)
        threads_before = torch.get_num_threads()
        try:
            return self._run(tick, threads_before)
        finally:
            torch.set_num_threads(threads_before)

    def _run(self, tick, threads_before: int) -> Profile:
        cfg, dev = self.cfg, self.device
        threads = pin_threads(cfg.threads) if dev == "cpu" else threads_before
        kept = keep_freed_memory() if dev == "cpu" else False
        if dev == "cpu":
            torch.set_flush_denormal(True)
        budget = 0.06 if cfg.quick else 0.2
        clock = Clock(dev, budget_s=budget, min_reps=6 if dev == "cpu" else 10, max_reps=60 if cfg.quick else 200)
        s, m = self.shapes, self.model
        tdtype = TORCH_DTYPES[m.dtype]
        skipped: list = []
        points = self._points()
        with torch.inference_mode():
            probe = ForwardProbe(m, cfg.tp, dev, seed=cfg.seed, max_position=longest_position(points))
            data: dict[str, OpData] = measure_plan(probe, clock, points, self.passes, skipped, tick, probe.release)
            overlap = None
            if dev == "cuda":
                kern = TokenKernels(s, m.head_dim, m.qkv_bias, m.dtype, dev, seed=cfg.seed)

                def release():
                    kern.release()
                    probe.release()

                overlap = measure_overlap(clock, lambda t: kern.make(GEMM_OP, t), probe.decode_kernel, self.overlap_grid,
                                          skipped, on_point=lambda: tick("overlap"), release=release)
                kern.release()
            else:
                skipped.append({"op": "overlap", "point": [],
                                "reason": "no CUDA streams on cpu: interference not measured (hardware default applies)"})
            info = backend_info(probe)
            probe = None  # the model and its KV cache go before the peaks are measured
            if dev == "cuda":
                torch.cuda.empty_cache()
            try:
                hardware = measure_peaks(clock, dev, tdtype, cfg.quick)
            except Exception as e:  # noqa: BLE001 - out-of-memory is recorded, anything else re-raised
                if not is_oom(e):
                    raise
                hardware = None
                skipped.append({"op": "peaks", "point": [], "reason": f"out of memory ({type(e).__name__})"})
            tick("peaks")
        if cfg.tp > 1:
            skipped.append({"op": "allreduce", "point": [],
                            "reason": f"needs {cfg.tp} GPUs and a collective backend: the roofline's link model is used"})
        ops = {}
        for op, d in data.items():
            held = {tuple(p) for p in self.holdout[op]}
            rows = [i for i, p in enumerate(d.grid) if tuple(p) not in held]
            if len(rows) < 3:
                skipped.append({"op": op, "point": [], "reason": f"only {len(rows)} points measured: not fitted"})
                continue
            ops[op] = fit_op(op, *([getattr(d, k)[i] for i in rows] for k in ("grid", "median_s", "p10_s", "p90_s")))
            hrows = [i for i, p in enumerate(d.grid) if tuple(p) in held]
            attach_holdout(ops[op], *([getattr(d, k)[i] for i in hrows] for k in ("grid", "median_s", "p10_s", "p90_s")))
        sw = software(dev)
        sw.update(info)
        if dev == "cuda":
            sw["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
        produced = {"tool": "blendsim calibrate", "version": sw["blendsim"], "command": cfg.command,
                    "quick": cfg.quick, "seed": cfg.seed, "holdout": cfg.holdout, "passes": self.passes,
                    "budget_s_per_point": budget, "timer": clock.name,
                    "cpu_allocator_keeps_freed_memory": kept if dev == "cpu" else None}
        return Profile(model=m.name, model_shape=model_shape(m), dtype=m.dtype, tp=cfg.tp, ops=ops,
                       device=identity(dev, threads), software=sw, produced_by=produced,
                       interference=overlap["fit"]["kappa"] if overlap else None, overlap=overlap,
                       hardware=hardware, skipped=skipped)


__all__ = ["CalibrationConfig", "Calibrator", "shard_deployment"]
