"""How long a calibration takes and how well its profile predicts kernels it never fitted.

Runs ``blendsim calibrate`` for a model on a device (by default the CI path: the tiny model, CPU,
``--quick``), then reports the wall time, the fit table, the error at the held-out points timed in the
run's own sweeps, and the error at fresh points timed afterwards (which also includes how much the
machine's speed drifted in between). Plain Python:

    python benchmarks/bench_calibrate.py [--device cpu] [--model tiny] [--full] [--holdout 8] [-o p.json]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from _data import add_data_option  # noqa: E402 (benchmarks/_data.py, beside this script)

from blendsim.calibrate.report import fit_table
from blendsim.calibrate.run import CalibrationConfig, Calibrator
from blendsim.calibrate.validate import holdout_errors, summary, validate
from blendsim.sim.models import get_model

BUDGET_S = 120.0  # the quick CPU calibration of the tiny model must finish within this on 2 cores


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--full", action="store_true", help="the full grid instead of --quick")
    ap.add_argument("--holdout", type=int, default=8)
    ap.add_argument("--fresh", type=int, default=6, help="fresh points per operator timed after the run")
    ap.add_argument("-o", "--out", default=None)
    add_data_option(ap)
    a = ap.parse_args(argv)
    from rich.console import Console

    c = Console()
    cfg = CalibrationConfig(model=a.model, device=a.device, dtype=a.dtype, quick=not a.full, holdout=a.holdout,
                            command="benchmarks/bench_calibrate.py " + " ".join(argv or sys.argv[1:]))
    t0, c0 = time.perf_counter(), time.process_time()
    profile = Calibrator(cfg).run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if a.out:
        profile.save(a.out)
    c.print(fit_table(profile, title=f"{profile.model} {profile.dtype} on {profile.device.get('name')}"))
    c.print(f"calibration: {wall:.1f} s wall, {cpu:.1f} s CPU ({'quick' if not a.full else 'full'} grid)")
    model = get_model(a.model, a.dtype)
    if a.holdout:
        s = summary(holdout_errors(profile, model))
        c.print(f"held-out points timed in the run's sweeps: median relative error {100 * s['all']:.1f}% over "
                f"{s['n_points']} points; per operator: " + _per_op(s))
    if a.fresh:
        t1 = time.perf_counter()
        s = summary(validate(profile, model, a.device, n_points=a.fresh, seed=11))
        c.print(f"fresh points timed after the run ({time.perf_counter() - t1:.0f} s): median relative error "
                f"{100 * s['all']:.1f}% over {s['n_points']} points; per operator: " + _per_op(s))
    if a.device == "cpu" and a.model == "tiny" and not a.full and wall > BUDGET_S:
        c.print(f"[red]over budget: {wall:.0f} s > {BUDGET_S:.0f} s[/]")
        return 1
    return 0


def _per_op(s: dict) -> str:
    return ", ".join(f"{op} {100 * v:.1f}%" for op, v in sorted(s["per_op"].items(), key=lambda kv: -kv[1]))


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
