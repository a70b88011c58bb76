"""Calibration: profile a model's kernels on a device, fit them, and save a ``blendsim.sim.profile.Profile``.

* ``run``       — one calibration run (:class:`~calibrate.run.Calibrator`): plan, measure, fit, assemble.
* ``grids``     — where each operator is measured (token, prefill and decode grids; quick variants).
* ``forward``   — every operator timed inside forwards of the real backend's model and attention
  backend (FlashAttention, FlashInfer or PyTorch SDPA over a paged KV cache) on synthetic steps.
* ``kernels``   — standalone per-token operators (the overlap measurement's GEMM).
* ``timing``    — CUDA-event / CPU clocks, medians and spread; ``measure`` — interleaved sweeps, OOM skips.
* ``overlap``   — GEMM and decode attention on two CUDA streams; the interference term kappa.
* ``device``    — device identity (NVML / platform), software versions, measured peaks.
* ``fit``       — relative-error polynomial fits, form chosen held out; ``refit`` from stored medians.
* ``validate``  — held-out checks against the cost model; ``vidur`` — import Vidur's CSVs.
* ``report``    — rich tables. The command, ``blendsim calibrate`` (``show``, ``import-vidur``), is
  ``blendsim.cli.calibrate``.
"""
