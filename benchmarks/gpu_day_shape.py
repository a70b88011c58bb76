"""The cost model's operator prices against the H200 GPU day's measured operators (llama-3-8b, bf16, TP 1).

docs/gpu-days/2026-11-26-h200/run*/profile.json hold, per operator, the raw median time at every grid point
(1-16,384 tokens; the LM head to 4,096 rows), timed inside eager PyTorch forwards of the model's layers
(cuBLAS through F.linear; see that folder's README). This script prices the same points with the cost
model's timer (``blendsim.sim.efficiency.EfficiencyTimer``, the roofline of ``blendsim.sim.timers``: a GEMM's
compute time over rows padded to the tile and its weight-streaming time joined by a cubic p-norm, plus a
launch per kernel; an elementwise operator's bytes over its bandwidth plus launches) and prints, per operator
and token band, the median and range of model / measured:

* ``shipped``: at the efficiencies ``sim/engine_params.json`` gives the cuda-graph regime (vLLM, SGLang) on h200;
* ``form``: the same functional form at the compute and streaming efficiencies fitted (least squares on
  log time) to gate_up_proj and down_proj, the two layer GEMMs whose small-token points are not host-bound,
  so the ratios say whether the form's *shape* follows the measured curve, apart from its level.

    python benchmarks/gpu_day_shape.py [--json]

Judge small-token ratios with care: the harness is eager, so operators of a few tens of microseconds include
host launch time that serving engines (CUDA graphs, fused kernels) do not pay (qkv_proj and o_proj sit at a
40-60 us host floor below ~512 tokens), and its elementwise operators run unfused (rotary as ~10 kernels).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from blendsim.sim.batch import BatchFeatures
from blendsim.sim.deployment import make_deployment
from blendsim.sim.efficiency import Efficiency, EfficiencyTimer
from blendsim.sim.engines import load_params
from blendsim.sim.ops import op_counts

DAY = Path(__file__).resolve().parents[1] / "docs" / "gpu-days" / "2026-11-26-h200"
RUNS = ("run1-cudnn", "run2-no-cudnn")
OPS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head", "norm", "rope", "act", "kv_write", "embedding")
FIT_OPS = ("gate_up_proj", "down_proj")
BANDS = ((1, 16), (17, 64), (65, 256), (257, 1024), (1025, 4096), (4097, 16384))


def measured(run: str, op: str) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, seconds) of one token operator in one run's profile: the raw medians at its grid points."""
    o = json.loads((DAY / run / "profile.json").read_text())["ops"][op]
    return np.array([g[0] for g in o["grid"]], dtype=float), np.array(o["median_s"], dtype=float)


def deployment():
    return make_deployment("llama-3-8b", "h200", tp=1)


def shipped_timer() -> EfficiencyTimer:
    """The timer the shipped parameters give vLLM's and SGLang's regime on h200."""
    return EfficiencyTimer(deployment(), Efficiency.lookup(load_params(), "cuda-graph", "h200"))


def form_timer(gemm_eff: float, mem_eff: float) -> EfficiencyTimer:
    """The cost model's form at these GEMM efficiencies, everything else as shipped."""
    eff = replace(Efficiency.lookup(load_params(), "cuda-graph", "h200"), gemm_eff=gemm_eff, mem_eff=mem_eff)
    return EfficiencyTimer(deployment(), eff)


def model_s(timer, op: str, tokens: np.ndarray) -> np.ndarray:
    """Seconds the timer gives ``op`` (one layer; the LM head over ``tokens`` sampled rows) at each token count."""
    t = np.asarray(tokens).astype(np.int64)
    f = BatchFeatures(num_tokens=t, num_logits=t)
    flops, nbytes, kernels = op_counts(timer.shapes, f)[op]
    return np.asarray(timer.op_time(op, flops, nbytes, kernels, f), dtype=float)


def fit_form(runs=RUNS, ops=FIT_OPS) -> dict:
    """The form's (gemm_eff, mem_eff) fitted to ``ops`` at every grid point of ``runs``, with its errors."""
    pts = [(op, *measured(r, op)) for r in runs for op in ops]

    def res(x):
        tm = form_timer(*x)
        return np.concatenate([np.log(model_s(tm, op, t) / s) for op, t, s in pts])

    fit = least_squares(res, [0.8, 0.6], bounds=([0.3, 0.3], [1.0, 1.0]))
    err = np.abs(np.exp(res(fit.x)) - 1)
    return {"gemm_eff": float(fit.x[0]), "mem_eff": float(fit.x[1]), "points": int(err.size),
            "median_abs_err": float(np.median(err)), "p90_abs_err": float(np.quantile(err, 0.9))}


# llama-3-8b's layer GEMMs: (N, K) of the weight; the H200's SM count (the profile's device.num_sms)
GEMM_NK = {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096), "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336)}
SMS = 132
TILES = ((128, 128), (128, 256), (256, 128), (64, 256))


def wave_scatter(tile: tuple[int, int] | None, min_tokens: int = 1024, runs=RUNS) -> float:
    """Spread (standard deviation of the log) of the layer GEMMs' measured fraction of peak at ``min_tokens``
    or more, divided by the fraction tile and wave quantization would leave (``tile`` = (rows, columns) of an
    output tile; None: nothing divided). Quantization explains the spread only where dividing shrinks it."""
    logs = []
    for op, (n, k) in GEMM_NK.items():
        for r in runs:
            m, s = measured(r, op)
            sel = m >= min_tokens
            m, s = m[sel], s[sel]
            eff = 2 * m * n * k / s
            if tile is not None:
                bm, bn = tile
                tiles = np.ceil(m / bm) * np.ceil(n / bn)
                eff = eff / (m * n / (tiles * bm * bn) * tiles / (np.ceil(tiles / SMS) * SMS))
            logs.append(np.log(eff))
    return float(np.std(np.concatenate(logs)))


def ratios(timer, op: str, runs=RUNS) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, model / measured) at every grid point of ``runs`` (pooled)."""
    t = [measured(r, op) for r in runs]
    return (np.concatenate([x for x, _ in t]), np.concatenate([model_s(timer, op, x) / s for x, s in t]))


def table(timers: dict) -> list[dict]:
    rows = []
    for op in OPS:
        for lo, hi in BANDS:
            row = {"op": op, "tokens": f"{lo}-{hi}"}
            for name, tm in timers.items():
                t, r = ratios(tm, op)
                sel = (t >= lo) & (t <= hi)
                if not sel.any():
                    break
                row[name] = {"median": float(np.median(r[sel])), "min": float(r[sel].min()),
                             "max": float(r[sel].max())}
            else:
                rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON instead of a Markdown table")
    a = ap.parse_args(argv)
    fit = fit_form()
    timers = {"shipped": shipped_timer(), "form": form_timer(fit["gemm_eff"], fit["mem_eff"])}
    rows = table(timers)
    waves = {"none" if t is None else f"{t[0]}x{t[1]}": wave_scatter(t) for t in (None, *TILES)}
    if a.json:
        json.dump({"form_fit": fit, "shipped": timers["shipped"].eff.to_dict(), "wave_scatter": waves, "rows": rows},
                  sys.stdout, indent=1)
        print()
        return 0
    e = timers["shipped"].eff
    print(f"shipped: gemm_eff {e.gemm_eff:.3f}, mem_eff {e.mem_eff:.3f}, ew_eff {e.ew_eff:.3f}; form fitted to "
          f"{' + '.join(FIT_OPS)} ({fit['points']} points): gemm_eff {fit['gemm_eff']:.3f}, mem_eff "
          f"{fit['mem_eff']:.3f}, |error| median {fit['median_abs_err']:.1%}, p90 {fit['p90_abs_err']:.1%}\n")
    print("spread (sd of log) of the layer GEMMs' fraction of peak at >= 1,024 tokens, divided by tile x wave "
          "quantization: " + ", ".join(f"{k} {v:.3f}" for k, v in waves.items()) + "\n")
    print("| operator | tokens | model / measured, shipped: median (range) | form at fitted efficiencies |")
    print("|---|---|---:|---:|")
    for r in rows:
        cells = [f"{r[k]['median']:.2f} ({r[k]['min']:.2f}-{r[k]['max']:.2f})" for k in timers]
        print(f"| {r['op']} | {r['tokens']} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
