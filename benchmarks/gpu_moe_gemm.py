"""Grouped (MoE expert) GEMMs and FP8 GEMMs by shape on one GPU: the kernel data behind ``moe_eff``'s shape.

For each MoE preset (and tensor-parallel shard of its experts) and each step size T (tokens), T x top-k
assignments are routed to the experts uniformly at random (seeded), and three things are timed:

* ``grouped``: the experts' gate/up GEMM (A x h -> A x 2i) and down GEMM (A x i -> A x h) as one grouped
  launch each (``torch._grouped_mm``: CUTLASS grouped GEMM on Hopper, the kernel family TensorRT-LLM's MoE
  plugin uses; on the CPU a loop of per-expert matmuls stands in, for the test of this script only);
* ``dense``: one plain GEMM of the same rows (A) against one expert-sized weight (the rate a grouped GEMM would
  reach if grouping cost nothing: same flops, one weight);
* the bytes of the touched experts' weights, so weight streaming can be judged as well as compute.

A synthetic sweep then sets the grouped GEMM's K, N and rows per expert independently (64 experts, equal
rows), in bf16 and in FP8 (``torch._scaled_grouped_mm``, row-wise scales). Then FP8 (e4m3, per-tensor scales,
``torch._scaled_mm``) against bf16 plain GEMMs over rows 1-16,384 for the layer shapes of llama-3-8b and
llama-3.1-70b's TP shards: FP8's share of its own (2x) peak by shape.

Each time is a median of CUDA-event timings with the L2 cache flushed and a GPU sleep queued ahead (the host
is ahead of the GPU), so it is the kernel's device time. Writes one JSON file:

    python benchmarks/gpu_moe_gemm.py -o moe_gemm.json            # on a GPU (12 s on an H100)
    python benchmarks/gpu_moe_gemm.py --device cpu --small -o x.json  # the CPU path its test runs
    python benchmarks/gpu_moe_gemm.py --analyse docs/gpu-days/2026-11-26-h100/moe_gemm.json  # fit the K law

``--analyse`` fits the cost model's GEMM form with and without the grouped-GEMM K law (``blendsim.sim.timers``'s
``GROUPED_K0``) to a results file and prints the constants and errors.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

# (preset, expert TP shards): each model's experts, whole and split as its TP 4/8 deployments split them
MOE = (("qwen3-30b-a3b", (1, 4)), ("qwen3-235b-a22b", (1, 4, 8)), ("mixtral-8x7b", (1, 4)),
       ("deepseek-v3", (8,)), ("llama-4-maverick", (8,)))
TOKENS = (1, 8, 32, 128, 512, 2048, 8192, 16384)
# (name, N, K) of plain GEMMs: llama-3-8b TP1 and llama-3.1-70b TP1/TP8 layer shapes
DENSE = (("8b.qkv", 6144, 4096), ("8b.gate_up", 28672, 4096), ("8b.down", 4096, 14336),
         ("70b.qkv", 10240, 8192), ("70b.gate_up", 57344, 8192), ("70b-tp8.gate_up", 7168, 8192),
         ("70b-tp8.down", 8192, 3584), ("70b-tp8.o", 8192, 1024))
ROWS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
SWEEP_N = (256, 1024, 4096)
SWEEP_K = (96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096)
SWEEP_ROWS = (1, 4, 16, 64, 256, 1024)


def make_timer(device: str, reps: int):
    """``timer(fn)``: median seconds of one call of ``fn``, by calibration's clock (``blendsim.calibrate.timing``:
    on CUDA each repetition behind an L2 flush and a GPU sleep, so the host is ahead and the time is the kernel's;
    on the CPU wall or thread time), ``reps`` repetitions after a warm-up call."""
    from blendsim.calibrate.timing import Clock

    clock = Clock(device, min_reps=reps, max_reps=reps)
    return lambda fn: clock.time(fn).median_s


def grouped_mm(torch, x, w, offs, cuda: bool):
    """x [A, K] rows sorted by expert, w [E, K, N], offs [E] cumulative row ends -> [A, N]."""
    if cuda:
        return torch._grouped_mm(x, w, offs=offs)
    out, a = [], 0
    for e, b in enumerate(offs.tolist()):
        out.append(x[a:b] @ w[e])
        a = b
    return torch.cat(out)


def moe_rows(torch, device: str, small: bool, timer, rng) -> list[dict]:
    from blendsim.sim.models import PRESETS

    dt = torch.bfloat16 if device.startswith("cuda") else torch.float32
    cuda = device.startswith("cuda")
    rows = []
    for name, tps in (MOE[:1] if small else MOE):
        m = PRESETS[name]
        E, k, h = m.num_experts, m.experts_per_token, m.hidden_size
        for tp in (tps[:1] if small else tps):
            i = m.moe_intermediate_size // tp
            if small:
                E, h, i = 8, 64, 32
            # [E, K, N] views of [E, N, K] weights (column-major B, as the grouped kernel wants them)
            w1 = (torch.randn(E, 2 * i, h, device=device, dtype=dt) * 0.02).transpose(1, 2)
            w2 = (torch.randn(E, h, i, device=device, dtype=dt) * 0.02).transpose(1, 2)
            for T in (TOKENS[:3] if small else TOKENS):
                A = T * k
                counts = np.bincount(np.concatenate([rng.choice(E, k, replace=False) for _ in range(T)]), minlength=E)
                offs = torch.tensor(np.cumsum(counts), dtype=torch.int32, device=device)
                x1 = torch.randn(A, h, device=device, dtype=dt)
                x2 = torch.randn(A, i, device=device, dtype=dt)
                touched = int((counts > 0).sum())
                rec = {"model": name, "tp": tp, "tokens": T, "assignments": A, "experts": E, "touched": touched,
                       "max_rows": int(counts.max()), "hidden": h, "inter": i}
                # each expert's rows padded to 16 (the alignment some grouped kernels require): the fallback
                pad = -(-counts // 16) * 16
                offs16 = torch.tensor(np.cumsum(pad), dtype=torch.int32, device=device)
                for op, x, w, n, kk in (("gate_up", x1, w1, 2 * i, h), ("down", x2, w2, h, i)):
                    try:
                        g = timer(lambda x=x, w=w, o=offs: grouped_mm(torch, x, w, o, cuda))
                    except Exception as ex:  # noqa: BLE001 - an unsupported layout is recorded, then padded
                        rec[f"{op}_error"] = f"{type(ex).__name__}: {str(ex)[:160]}"
                        xp = torch.zeros(int(pad.sum()), kk, device=device, dtype=dt)
                        try:
                            g = timer(lambda xp=xp, w=w, o=offs16: grouped_mm(torch, xp, w, o, cuda))
                            rec[f"{op}_padded16"] = True
                        except Exception as ex2:  # noqa: BLE001
                            g = None
                            rec[f"{op}_error16"] = f"{type(ex2).__name__}: {str(ex2)[:160]}"
                    d = timer(lambda x=x, w=w: x @ w[0])
                    rec |= {f"{op}_grouped_s": g, f"{op}_dense_s": d, f"{op}_flops": 2.0 * A * n * kk,
                            f"{op}_weight_bytes": float(touched * n * kk * x.element_size())}
                rows.append(rec)
                print(f"{name} tp{tp} T={T:6d} touched {touched:3d} gate_up {rec['gate_up_grouped_s']} "
                      f"dense {rec['gate_up_dense_s']:.3e}", flush=True)
            w1 = w2 = None  # free before the next shard
            if cuda:
                torch.cuda.empty_cache()
    return rows


def sweep_rows(torch, device: str, small: bool, timer) -> list[dict]:
    """Grouped GEMMs with K (the reduction), N and rows per expert set independently: 64 experts, each
    getting the same number of rows, so the expert's shape and its rows are the only variables."""
    cuda = device.startswith("cuda")
    dt = torch.bfloat16 if cuda else torch.float32
    E = 8 if small else 64
    rows = []
    for N in ((64,) if small else SWEEP_N):
        for K in ((32, 64) if small else SWEEP_K):
            w = (torch.randn(E, N, K, device=device, dtype=dt) * 0.02).transpose(1, 2)
            w8 = w.transpose(1, 2).contiguous().to(torch.float8_e4m3fn).transpose(1, 2) if cuda else None
            sb = torch.ones(E, N, device=device, dtype=torch.float32)
            for r in ((1, 4) if small else SWEEP_ROWS):
                x = torch.randn(E * r, K, device=device, dtype=dt)
                offs = torch.arange(1, E + 1, device=device, dtype=torch.int32) * r
                rec = {"experts": E, "N": N, "K": K, "rows_per_expert": r, "flops": 2.0 * E * r * N * K,
                       "weight_bytes": float(E * N * K * w.element_size())}
                try:
                    rec["grouped_s"] = timer(lambda x=x, w=w, o=offs: grouped_mm(torch, x, w, o, cuda))
                except Exception as ex:  # noqa: BLE001
                    rec["grouped_s"], rec["error"] = None, f"{type(ex).__name__}: {str(ex)[:160]}"
                if cuda:  # FP8 (e4m3, row-wise scales, fast accumulation as the engines run it)
                    x8, sa = x.to(torch.float8_e4m3fn), torch.ones(E * r, device=device, dtype=torch.float32)
                    try:
                        rec["fp8_grouped_s"] = timer(lambda x8=x8, w8=w8, sa=sa, sb=sb, o=offs: torch._scaled_grouped_mm(
                            x8, w8, sa, sb, offs=o, out_dtype=torch.bfloat16, use_fast_accum=True))
                    except Exception as ex:  # noqa: BLE001
                        rec["fp8_grouped_s"], rec["fp8_error"] = None, f"{type(ex).__name__}: {str(ex)[:160]}"
                rows.append(rec)
            w = w8 = None
        print(f"sweep N={N}: done", flush=True)
    return rows


def fp8_rows(torch, device: str, small: bool, timer) -> list[dict]:
    if not device.startswith("cuda"):
        return []
    rows = []
    one = torch.ones((), device=device, dtype=torch.float32)
    for name, N, K in (DENSE[:2] if small else DENSE):
        w = torch.randn(N, K, device=device, dtype=torch.bfloat16) * 0.02
        w8 = w.to(torch.float8_e4m3fn)
        for M in (ROWS[:3] if small else ROWS):
            x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
            x8 = x.to(torch.float8_e4m3fn)
            b16 = timer(lambda x=x, w=w: x @ w.t())
            try:
                f8 = timer(lambda x8=x8, w8=w8: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one,
                                                                  out_dtype=torch.bfloat16))
                err = None
            except Exception as ex:  # noqa: BLE001
                f8, err = None, f"{type(ex).__name__}: {str(ex)[:160]}"
            rows.append({"shape": name, "M": M, "N": N, "K": K, "bf16_s": b16, "fp8_s": f8, "flops": 2.0 * M * N * K,
                         **({"fp8_error": err} if err else {})})
        print(f"fp8 {name}: done", flush=True)
        w = w8 = None
    return rows


def law_points(data: dict, precision: str = "bf16") -> dict:
    """The measured grouped GEMMs as arrays: flops, weight bytes, K, rows per expert and seconds. bf16: the synthetic
    sweep and every preset's expert GEMMs; fp8: the sweep's FP8 timings (weights at one byte)."""
    pts = []
    for r in data["sweep"]:
        t = r.get("grouped_s" if precision == "bf16" else "fp8_grouped_s")
        if t:
            pts.append((r["flops"], r["weight_bytes"] / (1 if precision == "bf16" else 2), r["K"],
                        r["rows_per_expert"], t))
    if precision == "bf16":
        for r in data["moe"]:
            for op, K in (("gate_up", r["hidden"]), ("down", r["inter"])):
                if r.get(f"{op}_grouped_s"):
                    pts.append((r[f"{op}_flops"], r[f"{op}_weight_bytes"], K, r["assignments"] / r["touched"],
                                r[f"{op}_grouped_s"]))
    a = np.array(pts, dtype=float).reshape(-1, 5)
    return {"flops": a[:, 0], "bytes": a[:, 1], "K": a[:, 2], "rows": a[:, 3], "seconds": a[:, 4]}


def fit_law(pts: dict, peak: float, bandwidth: float, tile: int, blend: float, k_law: bool = True):
    """Fit the cost model's GEMM form (rows padded per expert to 64-row tiles up to 64 rows, else ``tile``; compute
    and streaming joined by a ``blend``-norm; plus a fixed time) to the points, with both terms scaled by
    (1 + K0 / K) when ``k_law``. Returns the fitted constants and the median / p90 relative error."""
    from scipy.optimize import least_squares

    m = pts["rows"]
    t_m = np.where(m <= 64, 64, tile)
    pad = np.ceil(m / t_m) * t_m / m

    def model(p):
        k = 1.0 + np.exp(p[3]) / pts["K"] if k_law else 1.0
        tc = pts["flops"] * pad * k / (peak * p[0])
        tm = pts["bytes"] * k / (bandwidth * p[1])
        return (tc ** blend + tm ** blend) ** (1.0 / blend) + np.exp(p[2])

    res = least_squares(lambda p: np.log(model(p) / pts["seconds"]), [0.7, 0.8, np.log(5e-6), np.log(200.0)],
                        bounds=([0.05, 0.05, np.log(1e-7), 0.0], [1.5, 1.5, np.log(1e-3), np.log(1e5)]),
                        loss="soft_l1", f_scale=0.1)
    err = np.abs(model(res.x) / pts["seconds"] - 1.0)
    return {"compute_eff": float(res.x[0]), "stream_eff": float(res.x[1]), "fixed_s": float(np.exp(res.x[2])),
            "K0": float(np.exp(res.x[3])) if k_law else 0.0, "median_err": float(np.median(err)),
            "p90_err": float(np.percentile(err, 90)), "points": int(err.size)}


def analyse(path: Path, hardware: str = "h100-80gb") -> dict:
    """K0 of the grouped GEMMs in a results file, with and without the K law, for bf16 and FP8, at the peaks, GEMM
    tile and p-norm of the hardware preset the cost model prices that GPU with."""
    from blendsim.sim.hardware import get_hardware

    hw = get_hardware(hardware)
    data = json.loads(path.read_text())
    out = {}
    for prec in ("bf16", "fp8"):
        pts = law_points(data, prec)
        if len(pts["seconds"]):
            kw = dict(peak=hw.flops_for(prec), bandwidth=hw.mem_bandwidth, tile=hw.gemm_tile_m,
                      blend=hw.gemm_roofline_blend)
            out[prec] = {"k_law": fit_law(pts, **kw), "no_k_law": fit_law(pts, k_law=False, **kw)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny shapes (the CPU test)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("-o", "--out", type=Path, help="results file to write (must not exist)")
    ap.add_argument("--analyse", type=Path, metavar="RESULTS", help="fit the K law to a results file and print it")
    a = ap.parse_args(argv)
    if a.analyse:
        if not a.analyse.exists():
            raise SystemExit(f"gpu_moe_gemm: {a.analyse} does not exist")
        print(json.dumps(analyse(a.analyse), indent=1))
        return 0
    if a.out is None:
        raise SystemExit("gpu_moe_gemm: give -o RESULTS (or --analyse RESULTS)")
    if a.out.exists():
        raise SystemExit(f"gpu_moe_gemm: {a.out} exists (earlier results are kept)")
    import torch

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_moe_gemm: no CUDA device (use --device cpu --small for the CPU path)")
    torch.manual_seed(0)
    timer = make_timer(a.device, a.reps)
    info = {"torch": torch.__version__, "device": a.device}
    if a.device.startswith("cuda"):
        p = torch.cuda.get_device_properties(0)
        info |= {"name": p.name, "sms": p.multi_processor_count, "memory_bytes": p.total_memory}
    t0 = time.perf_counter()
    out = {"info": info, "moe": moe_rows(torch, a.device, a.small, timer, np.random.default_rng(0)),
           "fp8": fp8_rows(torch, a.device, a.small, timer), "sweep": sweep_rows(torch, a.device, a.small, timer)}
    out["info"]["seconds"] = round(time.perf_counter() - t0, 1)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out} ({out['info']['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
