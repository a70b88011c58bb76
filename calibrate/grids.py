"""Where each operator is measured: token, (new tokens, context) and (batch, context) grids.

GEMM and elementwise times are piecewise in the token count: flat while the kernel is bound by
reading its weights or by launch latency, linear once compute-bound, with steps at multiples of the
GEMM's M tile (128 on current GPUs). The GPU grid is therefore dense below 128 tokens and samples both
sides of every multiple of 128 up to 2K, then coarser to 16K. CPUs have no M-tile steps and run 10-100x
slower, so their grid stops earlier. ``quick`` grids keep a handful of points per decade (CI, smoke
runs). Attention grids are capped in total KV tokens so the largest points fit in memory (a point that
still does not fit is skipped and recorded, never fatal).
"""

from __future__ import annotations

import numpy as np

# ---- token counts (GEMMs, elementwise operators) ------------------------------------------
_GPU_SMALL = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112]
_GPU_QUICK = [1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144,
              8192, 12288, 16384]
_CPU_FULL = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024,
             1280, 1536, 2048, 2560, 3072, 4096]
_CPU_QUICK = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024]


def token_grid(device: str, quick: bool) -> list[int]:
    """Token counts for the per-token operators (GEMMs' M, elementwise rows)."""
    if device != "cuda":
        return list(_CPU_QUICK if quick else _CPU_FULL)
    if quick:
        return list(_GPU_QUICK)
    pts = set(_GPU_SMALL)
    for m in range(128, 2048 + 1, 128):
        pts.update((m - 8, m, m + 8))  # both sides of each M-tile boundary
    pts.update(range(2048 + 256, 16384 + 1, 512))
    pts.update((3072, 4096, 6144, 8192, 12288, 16384))
    return sorted(pts)


def lm_head_grid(device: str, quick: bool) -> list[int]:
    """Sampled rows through the LM head: one per sequence that samples, so at most a step's sequences."""
    cap = 4096 if device == "cuda" else (256 if quick else 1024)
    return [t for t in token_grid(device, quick) if t <= cap]


# ---- attention ----------------------------------------------------------------------------
def prefill_grid(device: str, quick: bool) -> list[tuple[int, int]]:
    """(new tokens of one sequence's chunk, context before it)."""
    if device == "cuda":
        ns = [16, 128, 512, 2048, 8192] if quick else [1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
        cs = [0, 256, 2048, 8192, 32768] if quick else [0, 256, 1024, 2048, 4096, 8192, 16384, 32768]
        cap = 32768 + 16384
    else:
        ns = [8, 32, 128, 256, 512] if quick else [1, 8, 32, 64, 128, 256, 512, 1024]
        cs = [0, 64, 256, 768, 1536] if quick else [0, 32, 128, 512, 1024, 2048, 3072]
        cap = 4096
    return [(n, c) for n in ns for c in cs if n + c <= cap]


def decode_grid(device: str, quick: bool) -> list[tuple[int, int]]:
    """(decoding sequences, context of each)."""
    if device == "cuda":
        bs = [1, 8, 32, 128, 512] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
        cs = [64, 512, 2048, 8192, 32768] if quick else [16, 128, 512, 1024, 2048, 4096, 8192, 16384, 32768]
        cap = 1 << 21  # KV tokens in the batch: 8 GB per layer for 1024-wide K and V in 16-bit
    else:
        bs = [1, 4, 12, 32, 48] if quick else [1, 2, 4, 8, 16, 32, 64, 128]
        cs = [16, 64, 256, 768, 2048] if quick else [16, 64, 128, 256, 512, 1024, 2048, 4096]
        cap = 1 << 17
    return [(b, c) for b in bs for c in cs if b * c <= cap]


def overlap_grid(quick: bool) -> list[tuple[int, int, int]]:
    """(GEMM tokens, decode batch, decode context) pairs launched together on two streams."""
    gemm = [512, 4096] if quick else [256, 1024, 4096, 8192]
    dec = [(64, 2048), (256, 4096)] if quick else [(16, 1024), (64, 2048), (256, 4096), (512, 8192)]
    return [(t, b, c) for t in gemm for b, c in dec]


# ---- held-out points (timed with the grid, kept out of the fit; see calibrate.validate) -------------
def heldout_points(op: str, grid, n: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """``n`` points inside the domain of ``grid`` (and within its cap on total KV), none on it."""
    g = np.asarray(grid, dtype=float)
    on_grid = {tuple(int(v) for v in p) for p in g}
    lo, hi = [int(np.ceil(v)) for v in g.min(axis=0)], [int(np.floor(v)) for v in g.max(axis=0)]
    out: list[tuple[int, ...]] = []
    if len(lo) == 1:
        for x in np.geomspace(max(lo[0], 1), hi[0], n + 2)[1:-1]:
            t = int(round(x))
            while (t,) in on_grid or (t,) in out:
                t += 1
            if t < hi[0]:
                out.append((t,))
        return out
    cap = (g[:, 0] * g[:, 1]).max() if op == "attn_decode" else (g[:, 0] + g[:, 1]).max()
    tries = 0
    while len(out) < n and tries < 100 * n:
        tries += 1
        # log-uniform in each variable (a context from 0: log-uniform in 1 + context)
        p = tuple(int(round(np.exp(rng.uniform(np.log(1 + a), np.log(1 + b))))) - 1 if a == 0
                  else int(round(np.exp(rng.uniform(np.log(a), np.log(b))))) for a, b in zip(lo, hi))
        total = p[0] * p[1] if op == "attn_decode" else p[0] + p[1]
        if p in on_grid or p in out or total > cap:
            continue
        out.append(p)
    return out


__all__ = ["decode_grid", "heldout_points", "lm_head_grid", "overlap_grid", "prefill_grid", "token_grid"]
