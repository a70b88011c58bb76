"""Per-operator FLOP and byte accounting of one step, per GPU.

Every function here works on Python numbers and on numpy arrays alike (one array element per batch),
so the engine's scalar path, the vectorised pricing of many batches and the CLI breakdown share one
source of truth. Counts are per GPU of a tensor-parallel group: heads, MLP width and the LM head's
vocabulary are split ``tp`` ways; an all-reduce after attention and after the MLP joins them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.deployment import Deployment

# operator -> (class, scope). class decides how the execution mode combines times; scope "layer"
# ops run once per decoder layer, "model" ops once per step.
OPS: dict[str, tuple[str, str]] = {
    "qkv_proj": ("compute", "layer"),
    "rope": ("other", "layer"),
    "kv_write": ("memory", "layer"),
    "attn_prefill": ("compute", "layer"),
    "attn_decode": ("memory", "layer"),
    "o_proj": ("compute", "layer"),
    "norm": ("other", "layer"),
    "gate_up_proj": ("compute", "layer"),
    "act": ("other", "layer"),
    "down_proj": ("compute", "layer"),
    "embedding": ("other", "model"),
    "lm_head": ("compute", "model"),
    "allreduce": ("comm", "model"),
}
GEMM_OPS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")
LAYER_OPS = tuple(k for k, v in OPS.items() if v[1] == "layer")
MODEL_OPS = tuple(k for k, v in OPS.items() if v[1] == "model")


@dataclass(frozen=True, slots=True)
class Shapes:
    """Per-GPU widths of one deployment."""

    hidden: int
    q: int  # query width per GPU
    kv: int  # key (or value) width per GPU
    mlp1: int  # first MLP matrix output width per GPU (gate+up fused when gated)
    inter: int  # intermediate width per GPU
    vocab: int  # LM-head columns per GPU
    layers: int
    dtype_bytes: int
    gated: bool
    rope: bool
    learned_pos: bool
    tp: int

    @staticmethod
    def of(dep: Deployment) -> Shapes:
        m, t = dep.model, dep.tp
        kv_heads_per_gpu = max(1, m.num_kv_heads // t)
        return Shapes(
            hidden=m.hidden_size, q=m.q_dim // t, kv=kv_heads_per_gpu * m.head_dim, mlp1=m.mlp_in_out // t,
            inter=m.intermediate_size // t, vocab=-(-m.vocab_size // t), layers=m.num_layers,
            dtype_bytes=m.dtype_bytes, gated=m.gated_mlp, rope=m.rope, learned_pos=not m.rope, tp=t,
        )


def op_counts(s: Shapes, f) -> dict[str, tuple]:
    """``{op: (flops, bytes, kernels)}`` for one layer (layer ops) or the whole model (model ops).

    ``f`` has the fields of :class:`sim.batch.BatchFeatures`, as numbers or arrays.
    """
    b = s.dtype_bytes
    h = s.hidden
    T = f.num_tokens
    Tp = f.num_prefill_tokens
    D = f.num_decode
    N = f.num_logits
    qkv = s.q + 2 * s.kv
    has_p = _pos(f.num_prefill_seqs)
    has_d = _pos(D)
    has_t = _pos(T)
    dec_keys = f.decode_ctx_sum + D  # each decode token attends its context plus itself
    # NOTE: a GEMM with no rows does not run, so its weights are read only when it has rows
    has_n = _pos(N)
    out = {
        "qkv_proj": (2 * T * h * qkv, b * (h * qkv * has_t + T * h + T * qkv), has_t),
        "rope": ((6 * T * (s.q + s.kv), b * 2 * T * (s.q + s.kv), has_t) if s.rope else (0 * T, 0 * T, 0 * T)),
        "kv_write": (0 * T, b * 2 * T * 2 * s.kv, has_t),
        "attn_prefill": (4 * s.q * f.attn_pairs, b * (2 * Tp * s.q + f.prefill_kv_tokens * 2 * s.kv), has_p),
        "attn_decode": (4 * s.q * dec_keys, b * (dec_keys * 2 * s.kv + 2 * D * s.q), has_d),
        "o_proj": (2 * T * s.q * h, b * (s.q * h * has_t + T * s.q + T * h), has_t),
        # two fused residual-add + RMSNorm kernels: read x and residual, write both
        "norm": (2 * 5 * T * h, b * 2 * (4 * T * h + h * has_t), 2 * has_t),
        "gate_up_proj": (2 * T * h * s.mlp1, b * (h * s.mlp1 * has_t + T * h + T * s.mlp1), has_t),
        "act": ((4 * T * s.inter, b * 3 * T * s.inter, has_t) if s.gated else (T * s.inter, b * 2 * T * s.inter, has_t)),
        "down_proj": (2 * T * s.inter * h, b * (s.inter * h * has_t + T * s.inter + T * h), has_t),
        "embedding": (0 * T, b * 2 * T * h * (2 if s.learned_pos else 1), has_t),
        # final norm over the sampled rows, the LM-head GEMM, float32 logits
        "lm_head": (2 * N * h * s.vocab, b * (h * s.vocab * has_n + 3 * N * h) + 4 * N * s.vocab, has_n),
        "allreduce": (0 * T, (b * T * h * 2 * s.layers) if s.tp > 1 else 0 * T, 2 * s.layers * has_t if s.tp > 1 else 0 * T),
    }
    return out


def gemm_m(op: str, f):
    """The GEMM's M dimension (rows): new tokens, or sampled rows for the LM head."""
    return f.num_logits if op == "lm_head" else f.num_tokens


def _pos(x):
    """1 where x > 0 else 0, for numbers and arrays."""
    try:
        return (x > 0).astype(int)
    except AttributeError:
        return 1 if x > 0 else 0


__all__ = ["GEMM_OPS", "LAYER_OPS", "MODEL_OPS", "OPS", "Shapes", "gemm_m", "op_counts"]
