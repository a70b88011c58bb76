"""The per-token operators of one decoder layer (and the model's ends), as standalone timeable callables.

A profile's operator times come from forwards of the real backend's model (``blendsim.calibrate.forward``):
a kernel looped alone runs with its data and code hot in the caches, which a forward pass never
does. These standalone callables serve where one kernel must run on its own: the two-stream overlap
measurement (``blendsim.calibrate.overlap``) co-runs a GEMM from here with decode attention.

Shapes are exactly those the cost model accounts for (``blendsim.sim.ops.Shapes``: the per-GPU shard under
tensor parallelism), so a profile's times and the roofline's FLOP/byte counts describe the same work:

* GEMMs ``x @ W.T`` (``F.linear``, the layout real engines use): ``qkv_proj`` (hidden -> q + 2 kv, with
  bias for Qwen2), ``o_proj`` (q -> hidden), ``gate_up_proj`` (hidden -> gate+up fused), ``down_proj``
  (intermediate -> hidden), ``lm_head`` (final RMSNorm, hidden -> vocabulary shard, float32 logits);
* ``norm``: the layer's two residual-add + RMSNorm pairs; ``rope``: neox-style rotary on q and k with
  a position gather; ``act``: SiLU-and-mul (gated) or ReLU (OPT); ``kv_write``: K and V scattered into
  a slot-addressed cache (paged layout); ``embedding``: token (and learned position) lookup.

Inputs are seeded random tensors; a builder allocates per grid point and returns a zero-argument
callable that runs the operator once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from blendsim.sim.ops import OP_TABLE, Shapes

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# the per-token operators a kernel here measures (sim.ops.OP_TABLE: profiled on the token count alone)
TOKEN_OPS = tuple(k for k, o in OP_TABLE.items() if o.vars == ("tokens",) and o.kind != "comm")
_EPS = 1e-6


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, _EPS)
    v = x.float().pow(2).mean(-1, keepdim=True)  # torch < 2.4
    return (x.float() * torch.rsqrt(v + _EPS)).to(x.dtype) * w


class TokenKernels:
    """Builds the per-token operators of one model shard on one device."""

    def __init__(self, shapes: Shapes, head_dim: int, qkv_bias: bool, dtype: str, device: str, seed: int = 0):
        self.s = shapes
        self.head_dim = head_dim
        self.qkv_bias = qkv_bias
        self.dtype = TORCH_DTYPES[dtype]
        self.device = device
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)
        self._weights: dict[str, tuple] = {}

    def make(self, op: str, tokens: int):
        """A callable that runs ``op`` once over ``tokens`` rows."""
        if op not in TOKEN_OPS:
            raise ValueError(f"not a per-token operator: {op}")
        return getattr(self, "_" + op)(int(tokens))

    def release(self) -> None:
        """Drop cached weights (between operators, so only one operator's weights are resident)."""
        self._weights.clear()
        if self.device == "cuda":
            torch.cuda.empty_cache()

    # ---- helpers --------------------------------------------------------------------------
    def _rand(self, *shape, dtype=None) -> torch.Tensor:
        t = torch.randn(*shape, generator=self.gen, device=self.device, dtype=torch.float32)
        return t.mul_(0.05).to(dtype or self.dtype)

    def _weight(self, key: str, *shape) -> torch.Tensor:
        if key not in self._weights:
            self._weights[key] = self._rand(*shape)
        return self._weights[key]

    def _table(self, key: str, rows: int, *shape) -> torch.Tensor:
        """A cached ``[rows or more, *shape]`` table (position tables, KV slots), grown when too short."""
        t = self._weights.get(key)
        if t is None or t.shape[0] < rows:
            self._weights.pop(key, None)
            t = self._weights[key] = self._rand(rows, *shape)
        return t

    def _linear(self, key: str, tokens: int, n_in: int, n_out: int, bias: bool = False):
        w = self._weight(key, n_out, n_in)
        b = self._weight(key + ".bias", n_out) if bias else None
        x = self._rand(tokens, n_in)
        return lambda: F.linear(x, w, b)

    # ---- GEMMs ----------------------------------------------------------------------------
    def _qkv_proj(self, t):
        s = self.s
        return self._linear("qkv", t, s.hidden, s.q + 2 * s.kv, self.qkv_bias)

    def _o_proj(self, t):
        return self._linear("o", t, self.s.q, self.s.hidden)

    def _gate_up_proj(self, t):
        return self._linear("gate_up", t, self.s.hidden, self.s.mlp1)

    def _down_proj(self, t):
        return self._linear("down", t, self.s.inter, self.s.hidden)

    def _lm_head(self, t):
        s = self.s
        w = self._weight("lm_head", s.vocab, s.hidden)
        g = self._weight("final_norm", s.hidden)
        x = self._rand(t, s.hidden)
        return lambda: F.linear(rms_norm(x, g), w).float()

    # ---- elementwise ----------------------------------------------------------------------
    def _norm(self, t):
        h = self.s.hidden
        w1, w2 = self._weight("ln1", h), self._weight("ln2", h)
        x, r = self._rand(t, h), self._rand(t, h)

        def run():
            s1 = x + r  # residual add, then RMSNorm (before attention)
            y1 = rms_norm(s1, w1)
            s2 = y1 + s1  # and again before the MLP
            return rms_norm(s2, w2)

        return run

    def _rope(self, t):
        d = self.head_dim
        hq, hk = self.s.q // d, self.s.kv // d
        q, k = self._rand(t, hq, d), self._rand(t, hk, d)
        cos, sin = self._table("rope.cos", max(4096, t), d // 2), self._table("rope.sin", max(4096, t), d // 2)
        pos = torch.randint(0, min(cos.shape[0], sin.shape[0]), (t,), generator=self.gen, device=self.device)

        def rotate(x, c, s_):
            x1, x2 = x[..., : d // 2], x[..., d // 2:]
            return torch.cat((x1 * c - x2 * s_, x2 * c + x1 * s_), dim=-1)

        def run():
            c, s_ = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)
            return rotate(q, c, s_), rotate(k, c, s_)

        return run

    def _act(self, t):
        s = self.s
        if s.gated:
            x = self._rand(t, 2 * s.inter)
            return lambda: F.silu(x[:, : s.inter]) * x[:, s.inter:]
        x = self._rand(t, s.inter)
        return lambda: F.relu(x)

    def _kv_write(self, t):
        d = self.head_dim
        hk = self.s.kv // d
        kc = self._table("k_cache", max(16384, 2 * t), hk, d)
        vc = self._table("v_cache", max(16384, 2 * t), hk, d)
        k, v = self._rand(t, hk, d), self._rand(t, hk, d)
        slots = torch.randperm(min(kc.shape[0], vc.shape[0]), generator=self.gen, device=self.device)[:t]

        def run():
            kc.index_copy_(0, slots, k)
            vc.index_copy_(0, slots, v)

        return run

    def _embedding(self, t):
        s = self.s
        w = self._weight("embed", s.vocab, s.hidden)
        ids = torch.randint(0, s.vocab, (t,), generator=self.gen, device=self.device)
        if not s.learned_pos:
            return lambda: F.embedding(ids, w)
        p = self._table("pos_embed", max(4096, t), s.hidden)
        pos = torch.arange(t, device=self.device)
        return lambda: F.embedding(ids, w) + F.embedding(pos, p)


__all__ = ["TORCH_DTYPES", "TOKEN_OPS", "TokenKernels", "rms_norm"]
