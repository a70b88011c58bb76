"""AccelGen's token budget (sec. 4.2): the pivot forward size, Eq. 6 and its Eq. 4 form.

The *pivot forward size* S_pf is the smallest forward size at which throughput (tokens per second of
one step) has nearly saturated; T_pf is the time of a step of that size. The paper profiles both on the
GPU; here the iteration-time model is the project's cost model (``ctx.cost_model``), probed with
prefill-only steps of one sequence and no prior context, as a forward-size sweep on a GPU would be.

Eq. 6 scales the pivot linearly to the tightest iteration-level SLO of the batch:
``S_b = S_pf * SLO_min / T_pf`` (``budget_model=eq6``). It prices every token alike: Eq. 4 without its
attention term S/(6H), which the paper drops only "for short sequence lengths (S << 6H)". A chunk
deep into a long prompt attends to everything before it, so at 6H of context an Eq. 6 chunk does
about twice the operations of S_b tokens at the pivot and runs far over SLO_min.

``budget_model=eq4`` (the default) keeps the attention term. Derivation, per transformer layer, in
the paper's own operation counts:

* Eq. 1: a fully connected layer over S_f tokens does 2 S_f H^2 operations; QKV + attention-out +
  FC1 + FC2 = 12 of them: 24 S_f H^2.
* Eq. 3: attention of S_f queries against S_f keys does 4 S_f^2 H (QK^T and the product with V,
  2 S_f^2 H each; the paper counts every query-key pair, no causal halving). A chunk of c tokens at
  offset o (o tokens of the prompt already in the KV cache) has c queries against o + c keys:
  4 c (o + c) H. A decode step of a sequence with L tokens in the KV cache is c = 1, o = L.
* Sum (Eq. 4 with the chunk's context): ``24 c H^2 + 4 c (o + c) H = 4H * c (6H + o + c)``; at o = 0
  this is Eq. 4, 24 c H^2 (1 + c / 6H).

So, in units of 4H operations per layer, a batch does ``W = sum over its sequences of
c_i (6H + o_i + c_i)`` (decodes: 6H + L_i + 1). The paper gets the time of a step from its operations
and the GPU's saturated throughput ("we can also calculate [T_pf] by dividing the number of operations
for S_pf by the GPU saturated throughput"), which T_pf measures at the pivot: X = S_pf (6H + S_pf) /
T_pf. Eq. 6's S_b tokens priced at that rate are ``W_b = X * SLO_min = S_b (6H + S_pf)``, and
``budget_model=eq4`` fills a step until W = W_b instead of until it holds S_b tokens. The chunk that
fits a remaining budget R at offset o is the largest integer c with c (6H + o + c) <= R:
``c = (isqrt((6H + o)^2 + 4R) - (6H + o)) // 2``. Hand checks: a single chunk at o = 0 with
S_b = S_pf is exactly S_pf; with c << 6H it is S_b (1 + S_pf/6H) / (1 + c/6H), within a few percent
of S_b; at o = 6H it is about S_b / 2, at o = 18H (3 x 6H) about S_b / 4. The only approximation
left is the paper's (operations, not time: memory-bound decode attention is still priced as FLOPs).

Option ``budget_model=cost`` (an extension, not the paper's rule) sizes every chunk so the cost-model
time of the whole step — its decodes, its chunks and their contexts — fits SLO_min.
"""

from __future__ import annotations

import math

from blendsim.sim.cost import largest_fit  # re-exported: the chunk that fits a step time

PIVOT_GRID = 16  # forward sizes probed: multiples of this
PIVOT_MAX = 16384  # largest forward size probed


def prefill_step_time(cm, tokens: int, decodes: int = 0, decode_ctx_sum: int = 0) -> float:
    """Cost-model seconds of one step: a ``tokens``-long prefill chunk (no prior context) plus
    ``decodes`` decode sequences with ``decode_ctx_sum`` tokens of context in all."""
    n = tokens
    logits = decodes + (1 if n else 0)
    return cm.step(n + decodes, n, 1 if n else 0, n * (n + 1) // 2, n, decodes, decode_ctx_sum, logits)[0]


def pivot_forward_size(cm, tol: float, grid: int = PIVOT_GRID, limit: int = PIVOT_MAX) -> tuple[int, float]:
    """``(S_pf, T_pf)``: the smallest forward size on the grid whose throughput is within ``tol`` of the
    best throughput of the sweep, and the time of a step of that size."""
    sizes = range(grid, limit + 1, grid)
    times = [prefill_step_time(cm, s) for s in sizes]
    thr = [s / t for s, t in zip(sizes, times, strict=True)]
    peak = max(thr)
    for s, t, x in zip(sizes, times, thr, strict=True):
        if x >= (1.0 - tol) * peak:
            return s, t
    raise AssertionError("unreachable: the peak itself qualifies")


def eq6_budget(s_pf: int, t_pf: float, slo_min: float) -> int:
    """Eq. 6: ``S_b = S_pf * SLO_min / T_pf`` (floored; S_pf itself when no SLO binds)."""
    if math.isinf(slo_min):
        return s_pf
    return int(s_pf * slo_min / t_pf)


def eq4_work(tokens: int, offset: int, six_h: int) -> int:
    """Eq. 4 operations (per layer, in units of 4H) of ``tokens`` new tokens of one sequence that has
    ``offset`` tokens in the KV cache: ``tokens (6H + offset + tokens)``."""
    return tokens * (six_h + offset + tokens)


def eq4_budget(s_b: int, s_pf: int, six_h: int) -> int:
    """W_b: Eq. 6's S_b tokens priced at the pivot's operations per token, ``S_b (6H + S_pf)``."""
    return s_b * (six_h + s_pf)


def eq4_chunk(room: int, offset: int, six_h: int) -> int:
    """Largest chunk c >= 0 at ``offset`` with ``eq4_work(c, offset, six_h) <= room`` (exact)."""
    if room <= 0:
        return 0
    a = six_h + offset
    return (math.isqrt(a * a + 4 * room) - a) // 2


def clamp_budget(sb: int, cap: int, round_tokens: int) -> int:
    """At least one token, at most the engine's cap, trimmed to a multiple of ``round_tokens``."""
    sb = max(1, min(sb, cap))
    if round_tokens and sb >= round_tokens:
        sb = sb // round_tokens * round_tokens
    return sb


__all__ = ["clamp_budget", "eq4_budget", "eq4_chunk", "eq4_work", "eq6_budget", "largest_fit",
           "pivot_forward_size", "prefill_step_time"]
