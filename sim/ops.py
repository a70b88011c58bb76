"""Per-operator FLOP and byte accounting of one step, per GPU.

Every function here works on Python numbers and on numpy arrays alike (one array element per batch),
so the engine's scalar path, the vectorised pricing of many batches and the CLI breakdown share one
source of truth. Counts are per GPU of a tensor-parallel group: heads, MLP width and the LM head's
vocabulary are split ``tp`` ways; an all-reduce after attention and after the MLP joins them.

Mixture-of-experts layers replace the dense MLP by a router, the routed experts (grouped GEMMs over the
tokens each expert receives; only the experts some token picked have their weights read) and shared
experts; with expert parallelism (``ep`` > 1) the experts are split over ``ep`` GPUs and tokens travel
to them and back by all-to-all. Multi-head latent attention (DeepSeek) caches one compressed latent per
token: prefill up-projects it to per-head keys and values (``kv_up_proj``) and runs multi-head
attention; decode folds the up-projections into the query and output (``attn_absorb``) and attends over
the latent directly, as vLLM and SGLang run MLA.

Byte counts use three element sizes: activations (``dtype``), GEMM weights (``weights``: fp8, fp4 and
int4 shrink them) and the KV cache (``kv_dtype``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from blendsim.sim.deployment import Deployment


class Op(NamedTuple):
    """One operator of a step: every fact the cost model, the timers and calibration need about its name."""

    cls: str  # compute | memory | other | comm: how the execution mode combines its time
    scope: str  # layer (once per decoder layer it belongs to, see Shapes.layers_of) | model (once per step)
    kind: str = ""  # gemm (priced with GEMM tiles and the GEMM rate), attention, elementwise or comm
    lowp: bool = False  # a GEMM whose weights are stored in the ``weights`` precision (runs at its peak)
    feature: bool = False  # priced from more than the step's token counts (context, prefill keys, decodes)
    group: str = ""  # dense (dense MLP layers only), moe (MoE layers), moe-experts (routed-expert GEMMs), mla
    vars: tuple = ()  # what a calibration profile's polynomial for it reads (sim.profile); () = not profiled
    base: bool = False  # one of a dense model's GEMMs


T = ("tokens",)
# THE operator table: every other list of operator names is derived from it
OP_TABLE: dict[str, Op] = {
    "qkv_proj": Op("compute", "layer", "gemm", lowp=True, vars=T, base=True),
    "rope": Op("other", "layer", "elementwise", vars=T),
    "kv_write": Op("memory", "layer", "elementwise", vars=T),
    "attn_prefill": Op("compute", "layer", "attention", feature=True, vars=("tokens", "context")),
    "kv_up_proj": Op("compute", "layer", "gemm", lowp=True, feature=True, group="mla"),  # latent -> per-head K, V
    "attn_decode": Op("memory", "layer", "attention", feature=True, vars=("batch", "context")),
    "attn_absorb": Op("compute", "layer", "gemm", feature=True, group="mla"),  # W_UK into q, W_UV out of the latent
    "o_proj": Op("compute", "layer", "gemm", lowp=True, vars=T, base=True),
    "norm": Op("other", "layer", "elementwise", vars=T),
    "gate_up_proj": Op("compute", "layer", "gemm", lowp=True, group="dense", vars=T, base=True),
    "act": Op("other", "layer", "elementwise", group="dense", vars=T),
    "down_proj": Op("compute", "layer", "gemm", lowp=True, group="dense", vars=T, base=True),
    "router": Op("compute", "layer", "gemm", group="moe"),
    "moe_combine": Op("other", "layer", "elementwise", group="moe"),
    "moe_gate_up": Op("compute", "layer", "gemm", lowp=True, group="moe-experts"),
    "moe_act": Op("other", "layer", "elementwise", group="moe"),
    "moe_down": Op("compute", "layer", "gemm", lowp=True, group="moe-experts"),
    "shared_gate_up": Op("compute", "layer", "gemm", lowp=True, group="moe"),
    "shared_down": Op("compute", "layer", "gemm", lowp=True, group="moe"),
    "a2a": Op("comm", "layer", "comm", group="moe"),
    "embedding": Op("other", "model", "elementwise", vars=T),
    "lm_head": Op("compute", "model", "gemm", vars=T, base=True),  # 16-bit: stays in the activation dtype
    "allreduce": Op("comm", "model", "comm", vars=T),
}
del T


def _ops(pred) -> tuple[str, ...]:
    return tuple(k for k, o in OP_TABLE.items() if pred(o))


# operator -> (class, scope)
OPS: dict[str, tuple[str, str]] = {k: (o.cls, o.scope) for k, o in OP_TABLE.items()}
GEMM_OPS = _ops(lambda o: o.base)  # a dense model's GEMMs
ALL_GEMM_OPS = GEMM_OPS + tuple(k for k in _ops(lambda o: o.kind == "gemm") if k not in GEMM_OPS)
LOWP_GEMMS = _ops(lambda o: o.lowp)
FEATURE_OPS = _ops(lambda o: o.feature)
DENSE_MLP_OPS = _ops(lambda o: o.group == "dense")
MOE_GEMMS = _ops(lambda o: o.group == "moe-experts")  # routed-expert (grouped) GEMMs
MOE_OPS = _ops(lambda o: o.group in ("moe", "moe-experts"))
MLA_OPS = _ops(lambda o: o.group == "mla")
PROFILED_OPS: dict[str, tuple] = {k: o.vars for k, o in OP_TABLE.items() if o.vars}  # op -> profile variables
LAYER_OPS = tuple(k for k, v in OPS.items() if v[1] == "layer")
MODEL_OPS = tuple(k for k, v in OPS.items() if v[1] == "model")


@dataclass(frozen=True, slots=True)
class Shapes:
    """Per-GPU widths of one deployment."""

    hidden: int
    q: int  # query width per GPU
    kv: int  # key (or value) width per GPU (MLA: the cached latent, whole on every GPU)
    mlp1: int  # first MLP matrix output width per GPU (gate+up fused when gated)
    inter: int  # intermediate width per GPU
    vocab: int  # LM-head columns per GPU
    layers: int
    dtype_bytes: int  # activation element
    gated: bool
    rope: bool
    learned_pos: bool
    tp: int
    w_bytes: float = 0.0  # GEMM weight element (block scales included); 0: dtype_bytes
    kv_bytes: int = 0  # KV element; 0: dtype_bytes
    o: int = 0  # output-projection input width per GPU; 0: q
    dense_layers: int = -1  # layers with the dense MLP; -1: all
    # mixture of experts (busiest GPU of the expert-parallel group)
    moe_layers: int = 0
    experts: int = 0  # routed experts of the model
    topk: int = 0
    e_mlp1: int = 0  # first expert matrix width per GPU (gate+up)
    e_inter: int = 0
    sh_mlp1: int = 0  # shared experts' first matrix width per GPU
    sh_inter: int = 0
    ep: int = 1
    e_w_bytes: float = 0.0  # routed-expert weight element; 0: w_bytes
    # sliding-window attention: layers (of ``layers``) that attend only the last ``window`` tokens
    swa_layers: int = 0
    window: int = 0
    disp_bytes: float = 0.0  # one dispatched activation element of the all-to-all; 0: dtype_bytes
    expert_q: tuple = ()  # per local expert: the probability a token picks it
    # multi-head latent attention
    mla: bool = False
    heads: int = 0  # query heads per GPU
    nope: int = 0
    rope_dim: int = 0
    v_head: int = 0
    kv_lora: int = 0
    q_lora: int = 0
    # pipeline stage: whether it holds the embedding (first stage) and the LM head (last stage)
    embed: bool = True
    head: bool = True
    # attention data parallelism (Deployment.dp): attention, norms, embedding and LM head run whole on each GPU over
    # its own sequences (ATTN_DP_OPS; the busiest GPU's share, dp_share); the MLP / experts over all of them
    dp: int = 1

    def __post_init__(self) -> None:
        if self.w_bytes == 0:
            object.__setattr__(self, "w_bytes", self.dtype_bytes)
        if self.kv_bytes == 0:
            object.__setattr__(self, "kv_bytes", self.dtype_bytes)
        if self.o == 0:
            object.__setattr__(self, "o", self.q)
        if self.disp_bytes == 0:
            object.__setattr__(self, "disp_bytes", self.dtype_bytes)
        if self.e_w_bytes == 0:
            object.__setattr__(self, "e_w_bytes", self.w_bytes)
        if self.dense_layers < 0:
            object.__setattr__(self, "dense_layers", self.layers - self.moe_layers)

    @staticmethod
    def of(dep: Deployment) -> Shapes:
        m, t = dep.model, dep.tp
        common = dict(
            hidden=m.hidden_size, mlp1=m.mlp_in_out // t, inter=m.intermediate_size // t,
            vocab=-(-m.vocab_size // t), layers=m.num_layers, dtype_bytes=m.dtype_bytes, gated=m.gated_mlp,
            rope=m.rope, learned_pos=not m.rope, tp=t, w_bytes=m.weight_elem_bytes, kv_bytes=m.kv_elem_bytes,
            dense_layers=m.dense_layers, swa_layers=m.sliding_layers, window=m.sliding_window,
        )
        ta = 1 if dep.dp > 1 else t  # attention is whole on every GPU under attention data parallelism
        if dep.dp > 1:
            common.update(vocab=m.vocab_size, dp=dep.dp)
        if m.is_mla:
            heads = m.num_heads // ta
            attn = dict(q=heads * m.qk_head_dim, kv=m.kv_dim, o=heads * m.v_head_dim, mla=True, heads=heads,
                        nope=m.qk_nope_head_dim, rope_dim=m.qk_rope_head_dim, v_head=m.v_head_dim,
                        kv_lora=m.kv_lora_rank, q_lora=m.q_lora_rank)
        else:
            kv_heads_per_gpu = max(1, m.num_kv_heads // ta)
            attn = dict(q=m.q_dim // ta, kv=kv_heads_per_gpu * m.head_dim, heads=m.num_heads // ta)
        moe = {}
        if m.is_moe:
            ep = dep.ep
            etp = t // ep  # each expert's width is split over the GPUs of its expert group
            local = m.num_experts // ep
            q = expert_pick_probabilities(m.num_experts, m.experts_per_token, dep.expert_skew)[:local]
            # Experts whose weights run on the device's FP8/FP4 tensor cores take FP8/FP4 inputs, and engines
            # quantise the tokens before the dispatch, not after it: DeepSeek-V3 (arXiv 2412.19437, sec. 3.3.2)
            # dispatches FP8 activations and combines in BF16, as DeepEP and TensorRT-LLM's FP8/NVFP4 MoE do.
            # Weight-only kernels (FP8 on Ampere, int4) take 16-bit tokens.
            lowp = dep.hardware.gemm_precision(m.expert_precision) in ("fp8", "fp4")
            disp = min(m.expert_elem_bytes, 1.0) if lowp else m.dtype_bytes
            moe = dict(moe_layers=m.moe_layers, experts=m.num_experts, topk=m.experts_per_token,
                       e_mlp1=2 * m.moe_intermediate_size // etp, e_inter=m.moe_intermediate_size // etp,
                       sh_mlp1=2 * m.shared_intermediate_size // t, sh_inter=m.shared_intermediate_size // t,
                       ep=ep, expert_q=tuple(float(x) for x in q), disp_bytes=disp, e_w_bytes=m.expert_elem_bytes)
        if dep.pp > 1 and dep.stage >= 0:  # one pipeline stage: its layers, embedding or LM head
            i = dep.stage
            L = dep.stage_layers()[i]
            ml = dep.stage_moe_layers(i) if m.is_moe else 0
            common.update(layers=L, dense_layers=L - ml, embed=i == 0, head=i == dep.pp - 1,
                          swa_layers=L - dep.stage_full_attention_layers(i))
            if moe:
                moe["moe_layers"] = ml
        return Shapes(**common, **attn, **moe)

    def layers_of(self, op: str) -> int:
        """How many times ``op`` runs in one step (decoder layers it belongs to; 1 for model ops)."""
        if OPS[op][1] == "model":
            return 1
        if op in DENSE_MLP_OPS:
            return self.dense_layers
        if op in MOE_OPS:
            return self.moe_layers
        return self.layers

    def applies(self, op: str) -> bool:
        """Whether the model has ``op`` at all (dense models show exactly their dense operators)."""
        if op in MLA_OPS:
            return self.mla
        if op in ("shared_gate_up", "shared_down"):
            return self.moe_layers > 0 and self.sh_inter > 0
        if op == "a2a":
            return self.moe_layers > 0 and self.ep > 1
        if op == "rope":
            return True
        return self.layers_of(op) > 0

    # ---- mixture of experts --------------------------------------------------------------------
    def expert_assignments(self, T):
        """Token-to-expert assignments the busiest GPU computes for ``T`` tokens (T x its experts' share)."""
        return T * float(sum(self.expert_q))

    def experts_touched(self, T):
        """Expected distinct local experts that ``T`` tokens pick: sum over experts of 1 - (1 - q_i)^T.

        Each token picks its top-k independently; under uniform routing q_i = k / E, so 1 token touches
        exactly k experts and many tokens touch all of them.
        """
        T = np.asarray(T, dtype=float)
        vals, counts = np.unique(np.asarray(self.expert_q, dtype=float), return_counts=True)
        out = 0.0 * T
        for v, c in zip(vals.tolist(), counts.tolist()):
            out = out + c * (1.0 - (1.0 - v) ** T)
        return out if out.ndim else float(out)


def expert_pick_probabilities(E: int, k: int, skew: float = 0.0) -> np.ndarray:
    """Probability that a token picks each expert, most popular first, summing to ``k``.

    ``skew`` 0 is uniform routing (k / E each). Otherwise popularity follows a Zipf law p_i ~ (i+1)^-skew,
    and a token's k picks give expert i the probability min(1, k p_i), the excess spread over the others.
    """
    p = np.arange(1, E + 1, dtype=float) ** -float(skew)
    p = p / p.sum()
    q = k * p
    for _ in range(E):  # water-filling: no expert is picked with probability above 1
        over = q > 1.0
        if not over.any():
            break
        excess = float((q[over] - 1.0).sum())
        q[over] = 1.0
        rest = ~over & (q < 1.0)
        if not rest.any():
            break
        mass = float(q[rest].sum())
        # the excess goes to the others by popularity (evenly where their popularity underflowed to 0)
        q[rest] += excess * q[rest] / mass if mass > 0 else excess / int(rest.sum())
    return q


# ---- attention coefficients ---------------------------------------------------------------------------
def attn_coefs(s: Shapes) -> tuple:
    """Linear coefficients of one layer's attention, shared by op_counts and the engine's fast path.

    ``(flops per prefill (query, key) pair, prefill bytes per new token, prefill bytes per key,
    decode flops per key, decode bytes per key, decode bytes per sequence)``.
    """
    ba, bk = s.dtype_bytes, s.kv_bytes
    if s.mla:
        h = s.heads
        qk = s.nope + s.rope_dim
        return (2 * h * (qk + s.v_head), ba * h * (qk + s.v_head), ba * h * (s.nope + s.v_head) + bk * s.kv,
                2 * h * (s.kv + s.kv_lora), bk * s.kv, ba * h * (s.kv + s.kv_lora))
    return (4 * s.q, ba * 2 * s.q, bk * 2 * s.kv, 4 * s.q, bk * 2 * s.kv, ba * 2 * s.q)


def _window_mix(s: Shapes, full, capped):
    """The mean over the layers of ``full`` (full-attention layers) and min(full, capped) (sliding-window ones)."""
    return full - s.swa_layers / s.layers * (full - np.minimum(full, capped))


def window_prefill(s: Shapes, Tp, Np, pairs, pkv):
    """A step's prefill ``(pairs, pkv)`` as one layer's attention sees them on average over the layers: a
    sliding-window layer computes at most min(pairs, Tp x window) and reads min(pkv, Tp + Np x window) keys."""
    if not s.swa_layers:
        return pairs, pkv
    return _window_mix(s, pairs, Tp * s.window), _window_mix(s, pkv, Tp + Np * s.window)


def window_decode(s: Shapes, D, Cd):
    """A step's decode context sum ``Cd`` as one layer's attention sees it on average over the layers: a
    sliding-window layer reads at most min(Cd, D x (window - 1)) keys besides each token's own."""
    return _window_mix(s, Cd, D * (s.window - 1)) if s.swa_layers else Cd


def window_features(s: Shapes, Tp, Np, pairs, pkv, D, Cd):
    """``(pairs, pkv, Cd)`` averaged over the layers (:func:`window_prefill`, :func:`window_decode`). Attention is
    linear in these (the roofline's max of two proportional bounds), so the mean layer prices the sum of both
    kinds; numbers or arrays. Unchanged for a model without sliding-window layers."""
    return (*window_prefill(s, Tp, Np, pairs, pkv), window_decode(s, D, Cd))


def op_counts(s: Shapes, f) -> dict[str, tuple]:
    """``{op: (flops, bytes, kernels)}`` for one layer (layer ops) or the whole model (model ops).

    ``f`` has the fields of :class:`blendsim.sim.batch.BatchFeatures`, as numbers or arrays. Only the operators
    the model has are listed.
    """
    b = s.dtype_bytes
    bw = s.w_bytes
    bk = s.kv_bytes
    h = s.hidden
    T = f.num_tokens
    Tp = f.num_prefill_tokens
    D = f.num_decode
    N = f.num_logits
    has_p = _pos(f.num_prefill_seqs)
    has_d = _pos(D)
    has_t = _pos(T)
    Tall = T  # the rows the MLP / experts (and the collectives around them) see: every GPU's
    pkv_all = f.prefill_kv_tokens
    Np, apairs, ctx = f.num_prefill_seqs, f.attn_pairs, f.decode_ctx_sum
    if s.dp > 1:  # attention data parallelism: the attention-side operators run on the busiest GPU's share:
        # 1/dp of the rows for the GEMMs and elementwise kernels (gemm_m rounds them up) and of the prompt tokens
        # (each GPU chunks its own prompts under its own token budget), and its whole decodes: ceil(D / dp) of
        # the step's D (dp_share)
        r, rd = 1.0 / s.dp, dp_share(D, s.dp)
        T, N, Tp, Np, apairs, pkv_all = T * r, N * r, Tp * r, Np * r, apairs * r, pkv_all * r
        D, ctx = D * rd, ctx * rd
    pairs, pkv, cd = window_features(s, Tp, Np, apairs, pkv_all, D, ctx)
    dec_keys = cd + D  # each decode token attends its context plus itself
    # NOTE: a GEMM with no rows does not run, so its weights are read only when it has rows
    has_n = _pos(N)
    zero = (0 * T, 0 * T, 0 * T)
    fp, bq, bkey, fd, bdk, bds = attn_coefs(s)
    out = {}
    if s.mla:
        # q: (h -> q_lora -> heads x qk) or h -> heads x qk; kv_a: h -> latent + rotary key (replicated)
        qw = h * s.q_lora + s.q_lora * s.q if s.q_lora else h * s.q
        w = qw + h * s.kv
        io = T * (h + s.q + s.kv + (2 * s.q_lora if s.q_lora else 0))
        nq = 3 if s.q_lora else 2
        out["qkv_proj"] = (2 * T * w, bw * w * has_t + b * io, nq * has_t)
        rot = s.heads * s.rope_dim + s.rope_dim
        out["rope"] = (6 * T * rot, b * 2 * T * rot, has_t)
        out["kv_write"] = (0 * T, b * T * s.kv + bk * T * s.kv, has_t)
    else:
        qkv = s.q + 2 * s.kv
        out["qkv_proj"] = (2 * T * h * qkv, bw * h * qkv * has_t + b * (T * h + T * qkv), has_t)
        out["rope"] = (6 * T * (s.q + s.kv), b * 2 * T * (s.q + s.kv), has_t) if s.rope else zero
        out["kv_write"] = (0 * T, b * 2 * T * s.kv + bk * 2 * T * s.kv, has_t)
    out["attn_prefill"] = (fp * pairs, bq * Tp + bkey * pkv, has_p)
    if s.mla:
        out["kv_up_proj"] = mla_up_counts(s, pkv_all, has_p)
    out["attn_decode"] = (fd * dec_keys, bdk * dec_keys + bds * D, has_d)
    if s.mla:
        out["attn_absorb"] = mla_absorb_counts(s, D, has_d)
    out["o_proj"] = (2 * T * s.o * h, bw * s.o * h * has_t + b * (T * s.o + T * h), has_t)
    # two fused residual-add + RMSNorm kernels: read x and residual, write both (MLA: two more, on the
    # compressed query and latent)
    if s.mla:
        lat = s.q_lora + s.kv_lora
        out["norm"] = (2 * 5 * T * h + 5 * T * lat, b * 2 * (4 * T * h + h * has_t) + b * 2 * T * lat, 4 * has_t)
    else:
        out["norm"] = (2 * 5 * T * h, b * 2 * (4 * T * h + h * has_t), 2 * has_t)
    Ta, T = T, Tall  # the MLP and the experts run over every GPU's tokens
    if s.dense_layers > 0:
        out["gate_up_proj"] = (2 * T * h * s.mlp1, bw * h * s.mlp1 * has_t + b * (T * h + T * s.mlp1), has_t)
        out["act"] = ((4 * T * s.inter, b * 3 * T * s.inter, has_t) if s.gated
                      else (T * s.inter, b * 2 * T * s.inter, has_t))
        out["down_proj"] = (2 * T * s.inter * h, bw * s.inter * h * has_t + b * (T * s.inter + T * h), has_t)
    if s.moe_layers > 0:
        A = s.expert_assignments(T)
        touched = s.experts_touched(T)
        E = s.experts
        # router logits in float32. The grouped expert GEMMs gather their rows themselves (vLLM's fused_moe
        # reads tokens through sorted ids), so what is left is top-k + sorting by expert (small) and the
        # weighted combine: read each assignment's output row, write the token's sum
        out["router"] = (2 * T * h * E, b * (h * E * has_t + T * h) + 4 * T * E, has_t)
        out["moe_combine"] = (2 * A * h, b * (A * h + T * h), 3 * has_t)
        ew = s.e_w_bytes
        out["moe_gate_up"] = (2 * A * h * s.e_mlp1, ew * h * s.e_mlp1 * touched + b * (A * h + A * s.e_mlp1), has_t)
        sh = s.sh_inter > 0
        out["moe_act"] = (4 * (A * s.e_inter + T * s.sh_inter), b * 3 * (A * s.e_inter + T * s.sh_inter),
                          (2 if sh else 1) * has_t)
        out["moe_down"] = (2 * A * s.e_inter * h, ew * s.e_inter * h * touched + b * (A * s.e_inter + A * h), has_t)
        if sh:
            out["shared_gate_up"] = (2 * T * h * s.sh_mlp1, bw * h * s.sh_mlp1 * has_t + b * (T * h + T * s.sh_mlp1),
                                     has_t)
            out["shared_down"] = (2 * T * s.sh_inter * h, bw * s.sh_inter * h * has_t + b * (T * s.sh_inter + T * h),
                                  has_t)
        if s.ep > 1 and s.dp > 1:
            # attention data parallelism: every GPU's tokens are all-gathered to every GPU (at the dispatch
            # precision) and the experts' outputs reduce-scattered back (16-bit), each GPU receiving the other GPUs'
            # share (TensorRT-LLM's and SGLang's MoE under attention DP without an all-to-all backend)
            out["a2a"] = (0 * T, (s.disp_bytes + b) * T * h * (s.dp - 1) / s.dp, 2 * has_t)
        elif s.ep > 1:
            # dispatch and combine: each assignment's hidden vector to its expert's GPU (at the dispatch
            # precision) and back (16-bit); the share (ep-1)/ep of them lives on another GPU
            out["a2a"] = (0 * T, (s.disp_bytes + b) * A * h * (s.ep - 1) / s.ep, 2 * has_t)
    out["embedding"] = (0 * T, b * 2 * Ta * h * (2 if s.learned_pos else 1), has_t) if s.embed else zero
    # final norm over the sampled rows, the LM-head GEMM, float32 logits
    out["lm_head"] = ((2 * N * h * s.vocab, b * (h * s.vocab * has_n + 3 * N * h) + 4 * N * s.vocab, has_n)
                      if s.head else zero)
    # two all-reduces a layer (after attention and after the MLP); with expert parallelism a MoE layer's
    # MLP all-reduce is replaced by the all-to-all, and its attention all-reduce is done as a
    # reduce-scatter + all-gather around it (the same bytes)
    n_ar = 2 * s.layers - (s.moe_layers if s.ep > 1 else 0)
    if s.dp > 1:
        # attention data parallelism: no all-reduce after attention (each GPU's is whole); around a layer's MLP the
        # tokens are all-gathered and the outputs reduce-scattered (one all-reduce's bytes), or, for experts split
        # over GPUs (ep > 1), carried by the all-to-all alone
        n_ar = s.dense_layers + (s.moe_layers if s.ep == 1 else 0)
    out["allreduce"] = ((0 * T, b * T * h * n_ar, n_ar * has_t) if s.tp > 1 else zero)
    return out


def mla_up_counts(s: Shapes, pkv, has_p):
    """MLA prefill: every key's latent (context and new) up-projected to per-head K (no rotary part) and V."""
    up = s.kv_lora * s.heads * (s.nope + s.v_head)
    return (2 * pkv * up, s.w_bytes * up * has_p + s.dtype_bytes * pkv * (s.kv_lora + s.heads * (s.nope + s.v_head)),
            has_p)


def mla_absorb_counts(s: Shapes, D, has_d):
    """MLA decode: W_UK folded into each query head, W_UV applied to the latent output (two batched GEMMs;
    vLLM keeps these absorbed weights in the activation dtype)."""
    b = s.dtype_bytes
    absorb = s.heads * (s.nope * s.kv_lora + s.kv_lora * s.v_head)
    return (2 * D * absorb, b * absorb * has_d + b * D * s.heads * (s.nope + 2 * s.kv_lora + s.v_head), 2 * has_d)


def dp_share(n, dp: int):
    """The busiest GPU's share of a step's ``n`` decodes under attention data parallelism over ``dp`` GPUs: a
    sequence decodes on the GPU that holds its KV, so one GPU has ceil(n / dp) of them, taken at the step's mean
    context (1/dp with none; numbers or arrays). Prompts are not shared out this way: each GPU chunks its own
    waiting prompts under its own token budget, so a step's prompt tokens are taken as spread evenly (1/dp)."""
    if np.ndim(n) == 0:
        return -(-n // dp) / n if n > 0 else 1.0 / dp
    n = np.asarray(n, dtype=float)
    return np.where(n > 0, np.ceil(n / dp) / np.maximum(n, 1.0), 1.0 / dp)


def dp_attention(prefill, decode, dp: int):
    """Attention closures ``(prefill(Tp, Np, pairs, pkv, chunks), decode(D, Cd))`` of a whole step turned into the
    busiest GPU's under attention data parallelism over ``dp`` GPUs: 1/dp of the prompt work, ceil(D / dp) of the
    decodes (:func:`dp_share`); unchanged for ``dp`` 1."""
    if dp <= 1:
        return prefill, decode
    r = 1.0 / dp

    def prefill_dp(Tp, Np, pairs, pkv, chunks=None):
        return prefill(Tp * r, Np * r, pairs * r, pkv * r)

    def decode_dp(D, Cd):
        rd = dp_share(D, dp)
        return decode(D * rd, Cd * rd)

    return prefill_dp, decode_dp


# operators that run on one GPU's own sequences under attention data parallelism (Shapes.dp)
ATTN_DP_OPS = ("qkv_proj", "rope", "kv_write", "attn_prefill", "kv_up_proj", "attn_decode", "attn_absorb", "o_proj",
               "norm", "embedding", "lm_head")


def gemm_m(op: str, f, s: Shapes | None = None):
    """The GEMM's M dimension (rows): new tokens, sampled rows for the LM head, prefill keys for MLA's
    up-projection, decodes for its absorbed form, and the rows each touched expert receives; under attention data
    parallelism an attention-side GEMM's rows are the busiest GPU's share."""
    if s is not None and s.dp > 1 and op in ATTN_DP_OPS:
        return np.ceil(np.asarray(_gemm_m(op, f, s), dtype=float) / s.dp)  # the busiest GPU's rows
    return _gemm_m(op, f, s)


def _gemm_m(op: str, f, s: Shapes | None = None):
    if op == "lm_head":
        return f.num_logits
    if op == "kv_up_proj":
        return f.prefill_kv_tokens
    if op == "attn_absorb":
        return f.num_decode
    if op in MOE_GEMMS and s is not None:
        T = np.asarray(f.num_tokens, dtype=float)
        touched = np.asarray(s.experts_touched(T), dtype=float)
        return np.where(touched > 0, s.expert_assignments(T) / np.maximum(touched, 1e-300), 0.0)
    return f.num_tokens


def _pos(x):
    """1 where x > 0 else 0, for numbers and arrays."""
    try:
        return (x > 0).astype(int)
    except AttributeError:
        return 1 if x > 0 else 0


__all__ = ["ALL_GEMM_OPS", "ATTN_DP_OPS", "DENSE_MLP_OPS", "FEATURE_OPS", "GEMM_OPS", "LAYER_OPS", "LOWP_GEMMS", "MLA_OPS", "MODEL_OPS",
           "MOE_GEMMS", "MOE_OPS", "OPS", "OP_TABLE", "Op", "PROFILED_OPS",
           "Shapes", "attn_coefs", "dp_attention", "dp_share", "expert_pick_probabilities", "gemm_m", "mla_absorb_counts", "mla_up_counts",
           "op_counts", "window_decode", "window_features",
           "window_prefill"]
