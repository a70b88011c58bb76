"""A Llama-architecture decoder in PyTorch, built from a ``blendsim.sim.models.ModelSpec`` with seeded random weights.

Its operators are exactly those ``blendsim.sim.ops`` prices, with the same shapes; calibration times them inside
this model's own forward (``blendsim.calibrate.forward``), so a profile describes this model:

* ``embedding`` token lookup (plus learned positions when the spec has no rotary);
* per layer: ``norm`` (residual add + RMSNorm, twice), ``qkv_proj`` (fused, bias for Qwen2), ``rope``
  (neox-style on q and k), ``kv_write`` (scatter into the paged cache), ``attn_prefill`` /
  ``attn_decode`` (see ``blendsim.real_backend.attention``), ``o_proj``, ``gate_up_proj`` (fused gate and up;
  one matrix when the MLP is not gated), ``act`` (SiLU-and-mul, or ReLU), ``down_proj``;
* ``lm_head``: the last residual add and the final RMSNorm for the rows that sample only, the LM-head
  GEMM and float32 logits.

``forward`` takes one ragged step (prefill chunks and decode tokens of many sequences together) and an
``ops`` timer: ``ops(name)`` is a context manager around each operator (a no-op unless per-operator
timing is on). Tensor parallelism is not executed: the model is the whole (tp=1) model on one device.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
EPS = 1e-6
ROPE_THETA = 500000.0


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


class Layer(nn.Module):
    """One decoder layer's weights (the forward is :meth:`LlamaModel.forward`, operator by operator)."""

    def __init__(self, spec, dtype, device):
        super().__init__()
        h, kw = spec.hidden_size, {"dtype": dtype, "device": device}
        self.in_norm = nn.Parameter(torch.ones(h, **kw))
        self.qkv_proj = nn.Linear(h, spec.qkv_out, bias=spec.qkv_bias, **kw)
        self.o_proj = nn.Linear(spec.q_dim, h, bias=False, **kw)
        self.post_norm = nn.Parameter(torch.ones(h, **kw))
        self.gate_up_proj = nn.Linear(h, spec.mlp_in_out, bias=False, **kw)
        self.down_proj = nn.Linear(spec.intermediate_size, h, bias=False, **kw)


class LlamaModel(nn.Module):
    """The decoder; ``forward(inputs, attn, kv, ops) -> float32 logits of the sampling rows``."""

    def __init__(self, spec, device="cpu", seed: int = 0):
        super().__init__()
        if spec.dtype not in TORCH_DTYPES:
            raise ValueError(f"the real backend runs {', '.join(TORCH_DTYPES)}, not {spec.dtype}")
        dtype = TORCH_DTYPES[spec.dtype]
        kw = {"dtype": dtype, "device": device}
        self.spec = spec
        self.dtype = dtype
        self.hq, self.hk, self.d = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size, **kw)
        self.pos_embed = None if spec.rope else nn.Embedding(spec.max_position_embeddings, spec.hidden_size, **kw)
        self.layers = nn.ModuleList(Layer(spec, dtype, device) for _ in range(spec.num_layers))
        self.final_norm = nn.Parameter(torch.ones(spec.hidden_size, **kw))
        self.lm_head = None if spec.tie_word_embeddings else nn.Linear(spec.hidden_size, spec.vocab_size, bias=False, **kw)
        self.requires_grad_(False)
        self._init_weights(seed, device)
        inv = 1.0 / ROPE_THETA ** (torch.arange(0, self.d, 2, dtype=torch.float64) / self.d)
        ang = torch.arange(spec.max_position_embeddings, dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos().to(dtype).to(device), persistent=False)  # [positions, d/2]
        self.register_buffer("sin", ang.sin().to(dtype).to(device), persistent=False)

    @torch.no_grad()
    def _init_weights(self, seed: int, device) -> None:
        """N(0, 0.02) matrices, drawn in a fixed order from one seeded generator on the device."""
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        for name, p in self.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.02, generator=g)

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    @torch.inference_mode()
    def forward(self, ids, positions, slots, logits_rows, attn, kv, ops) -> torch.Tensor:
        """Run one step: ``ids``/``positions``/``slots`` are [T] device tensors, ``logits_rows`` [N]."""
        s = self.spec
        T = ids.shape[0]
        qd, kd = s.q_dim, s.kv_dim
        with ops("embedding"):
            h = F.embedding(ids, self.embed.weight)
            if self.pos_embed is not None:
                h = h + F.embedding(positions, self.pos_embed.weight)
        residual = h
        first = True
        for i, layer in enumerate(self.layers):
            with ops("norm"):
                if not first:
                    residual = h + residual
                x = rms_norm(residual, layer.in_norm)
            first = False
            with ops("qkv_proj"):
                qkv = F.linear(x, layer.qkv_proj.weight, layer.qkv_proj.bias)
            q = qkv[:, :qd].view(T, self.hq, self.d)
            k = qkv[:, qd:qd + kd].view(T, self.hk, self.d)
            v = qkv[:, qd + kd:].view(T, self.hk, self.d)
            if s.rope:
                with ops("rope"):
                    cos, sin = self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)
                    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            with ops("kv_write"):
                kv.write(i, slots, k, v)
            o = attn.forward(i, q, kv, ops)
            with ops("o_proj"):
                h = F.linear(o.view(T, qd), layer.o_proj.weight)
            with ops("norm"):
                residual = h + residual
                x = rms_norm(residual, layer.post_norm)
            with ops("gate_up_proj"):
                gu = F.linear(x, layer.gate_up_proj.weight)
            with ops("act"):
                inter = s.intermediate_size
                a = F.silu(gu[:, :inter]) * gu[:, inter:] if s.gated_mlp else F.relu(gu)
            with ops("down_proj"):
                h = F.linear(a, layer.down_proj.weight)
        if logits_rows.shape[0] == 0:
            return torch.empty(0, s.vocab_size, dtype=torch.float32, device=ids.device)
        with ops("lm_head"):
            x = h.index_select(0, logits_rows) + residual.index_select(0, logits_rows)
            return F.linear(rms_norm(x, self.final_norm), self.lm_head_weight).float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotary: the two halves of each head rotate as (x1, x2) -> (x1 c - x2 s, x2 c + x1 s)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


__all__ = ["LlamaModel", "TORCH_DTYPES", "rms_norm"]
