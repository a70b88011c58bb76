"""Model architecture specs (ModelSpec): presets and HuggingFace ``config.json`` loading.

Dense decoders (Llama, Mistral, Qwen2/3, OPT), mixture-of-experts decoders (Qwen3-MoE, Mixtral, Llama 4's
text model, DeepSeek-V2/V3) and multi-head latent attention (DeepSeek). Parameter counts, active
parameters and KV bytes per token are derived from the architecture, never typed in.

Precisions: ``dtype`` is the activation (compute) dtype; ``weights`` the storage of the GEMM weights
(``bf16|fp16|fp8|fp4|int4``; embeddings, LM head, norms and routers stay in ``dtype``, as published FP8
and FP4 checkpoints keep them); ``kv_dtype`` the KV cache's (``bf16|fp16|fp8``).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from blendsim.sim.errors import UserError

# activation / compute dtypes (fp8 kept for the older ``--dtype fp8``: everything in one byte)
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
# Bytes per stored weight, block scales included:
# * fp8: one byte (per-tensor, per-channel or DeepSeek's 128x128-block fp32 scales add < 0.01%);
# * fp4: NVFP4, 4-bit E2M1 values with one FP8 E4M3 scale per 16 values = 4.5 bits (NVIDIA technical
#   blog "Introducing NVFP4 for efficient and accurate low-precision inference", 2025-06-24);
# * int4: AWQ/GPTQ layout, 4-bit values with an fp16 scale and a 4-bit zero point per group of 128
#   = 4 + 20/128 bits (Lin et al., AWQ, MLSys'24; the AutoAWQ/GPTQ checkpoint format).
WEIGHT_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 4.5 / 8, "int4": (4 + 20 / 128) / 8,
                # OCP microscaling FP4: 4-bit E2M1 values, one 8-bit E8M0 scale per 32 (gpt-oss's expert weights)
                "mxfp4": (4 + 8 / 32) / 8}
WEIGHT_PRECISIONS = ("bf16", "fp16", "fp8", "fp4", "int4")
KV_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
KV_DTYPES = ("bf16", "fp16", "fp8")
_HF_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "fp8"}
# decoder layouts whose shapes this module reads (llama4: the text model of the config's text_config)
SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "opt", "qwen3_moe", "mixtral", "llama4", "deepseek_v2",
                   "deepseek_v3", "gpt_oss")
_SUPPORTED = set(SUPPORTED_TYPES) | {"llama4_text"}


# Upper bounds on a config's integers (a typo of 2**40 layers must be refused, not priced or allocated):
# the largest public models have ~10**5 widths, 126 layers, 384 experts and 10**7 positions.
MAX_DIM = 2**24
_SIZE_CAPS = {"num_layers": 2**14, "moe_layers": 2**14, "num_experts": 2**16, "experts_per_token": 2**16,
              "num_shared_experts": 2**16, "max_position_embeddings": 2**31}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer, described by the shapes that drive its cost."""

    name: str
    hidden_size: int  # H: model width
    num_layers: int  # L: decoder layers
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (== num_heads for MHA, fewer for GQA)
    intermediate_size: int  # MLP inner width of the dense (non-MoE) layers
    vocab_size: int
    head_dim: int = 0  # 0 means hidden_size // num_heads
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix
    gated_mlp: bool = True  # SwiGLU (gate, up, down) vs a plain two-matrix MLP (OPT)
    rope: bool = True  # rotary position embedding (False: learned positions, OPT)
    qkv_bias: bool = False  # Qwen2 adds biases to q/k/v (negligible cost, kept for shapes)
    dtype: str = "bf16"  # activation dtype (and weight/KV dtype unless given below)
    max_position_embeddings: int = 8192
    source: str = ""  # where the numbers come from
    weights: str = ""  # GEMM weight precision; "" = dtype
    kv_dtype: str = ""  # KV-cache dtype; "" = dtype
    qk_norm: bool = False  # per-head RMSNorm on q and k (Qwen3): 2 x head_dim weights a layer
    model_type: str = "llama"
    # ---- mixture of experts (num_experts 0: dense) ----
    num_experts: int = 0  # routed experts per MoE layer
    experts_per_token: int = 0  # top-k
    moe_intermediate_size: int = 0  # width of one routed expert
    num_shared_experts: int = 0  # always-on experts per MoE layer
    shared_intermediate_size: int = 0  # width of all shared experts together
    moe_layers: int = 0  # decoder layers with an MoE block; the others have the dense MLP
    # ---- multi-head latent attention (kv_lora_rank 0: none) ----
    kv_lora_rank: int = 0  # compressed KV width (the cached latent)
    q_lora_rank: int = 0  # compressed query width; 0: a direct query projection
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0  # decoupled rotary key width, cached with the latent
    v_head_dim: int = 0
    # sliding-window attention: ``sliding_layers`` of the decoder layers attend only the last ``sliding_window``
    # tokens (gpt-oss: every other layer, 128); their KV beyond the window is freed (vLLM's hybrid KV manager,
    # SGLang's SWA pool), so the per-token KV counts the full-attention layers and each running sequence holds at
    # most a window in the others
    sliding_window: int = 0
    sliding_layers: int = 0
    # the routed experts' weight precision where it differs from ``weights`` (gpt-oss: MXFP4 experts, BF16
    # attention, router and LM head); "" = ``weights``
    expert_weights: str = ""

    def __post_init__(self) -> None:
        where = f"model {self.name!r}"
        for f in fields(self):
            v = getattr(self, f.name)
            if f.type in ("int", int) and (isinstance(v, bool) or not isinstance(v, int)):
                raise UserError(f"{where}: {f.name} must be an integer, got {v!r}")
        for f in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size",
                  "max_position_embeddings"):
            if getattr(self, f) <= 0:
                raise UserError(f"{where}: {f} must be positive, got {getattr(self, f)}")
        for f in ("head_dim", "num_experts", "experts_per_token", "moe_intermediate_size", "num_shared_experts",
                  "shared_intermediate_size", "moe_layers", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
                  "qk_rope_head_dim", "v_head_dim"):
            if getattr(self, f) < 0:
                raise UserError(f"{where}: {f} must be positive, got {getattr(self, f)}")
        for f in fields(self):  # far beyond any real model, and small enough to price and to allocate for
            v = getattr(self, f.name)
            cap = _SIZE_CAPS.get(f.name, MAX_DIM)
            if f.type in ("int", int) and v > cap:
                raise UserError(f"{where}: {f.name} {v:,} is beyond any model (at most {cap:,})")
        if self.num_heads % self.num_kv_heads:
            raise UserError(
                f"{where}: num_heads ({self.num_heads}) is not a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if self.dtype not in DTYPE_BYTES:
            raise UserError(f"{where}: unknown dtype {self.dtype!r}; use one of {', '.join(sorted(DTYPE_BYTES))}")
        if not self.weights:
            object.__setattr__(self, "weights", self.dtype)
        if not self.kv_dtype:
            object.__setattr__(self, "kv_dtype", self.dtype)
        if self.weights not in WEIGHT_BYTES:
            raise UserError(f"{where}: unknown weight precision {self.weights!r}; use one of "
                            f"{', '.join(WEIGHT_PRECISIONS)}")
        if self.kv_dtype not in KV_BYTES:
            raise UserError(f"{where}: unknown KV dtype {self.kv_dtype!r}; use one of {', '.join(KV_DTYPES)}")
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise UserError(f"{where}: hidden_size is not a multiple of num_heads; give head_dim")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_experts:
            if not 1 <= self.experts_per_token <= self.num_experts:
                raise UserError(f"{where}: experts_per_token must be in 1..num_experts ({self.num_experts}), "
                                f"got {self.experts_per_token}")
            if self.moe_intermediate_size <= 0:
                raise UserError(f"{where}: moe_intermediate_size must be positive for an MoE model")
            if not 1 <= self.moe_layers <= self.num_layers:
                raise UserError(f"{where}: moe_layers must be in 1..num_layers ({self.num_layers}), "
                                f"got {self.moe_layers}")
            if not self.gated_mlp:
                raise UserError(f"{where}: MoE experts are gated (SwiGLU) MLPs")
        elif self.moe_layers or self.experts_per_token or self.num_shared_experts:
            raise UserError(f"{where}: moe_layers, experts_per_token and shared experts need num_experts > 0")
        if self.num_shared_experts and self.shared_intermediate_size <= 0:
            raise UserError(f"{where}: shared experts need a positive shared_intermediate_size")
        if self.kv_lora_rank:
            for f in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                if getattr(self, f) <= 0:
                    raise UserError(f"{where}: {f} must be positive for multi-head latent attention")
        if self.sliding_window < 0 or not 0 <= self.sliding_layers < self.num_layers:
            raise UserError(f"{where}: sliding_window must be >= 0 and sliding_layers in 0..num_layers - 1 "
                            f"({self.num_layers - 1}), got {self.sliding_window} / {self.sliding_layers}")
        if bool(self.sliding_window) != bool(self.sliding_layers):
            raise UserError(f"{where}: sliding_window and sliding_layers come together (got "
                            f"{self.sliding_window} / {self.sliding_layers})")
        if self.sliding_layers and self.is_mla:
            raise UserError(f"{where}: sliding-window layers with multi-head latent attention are not modelled")
        if self.expert_weights:
            if not isinstance(self.expert_weights, str) or self.expert_weights not in WEIGHT_BYTES:
                raise UserError(f"{where}: unknown expert weight precision {self.expert_weights!r}; use one of "
                                f"{', '.join(WEIGHT_BYTES)}")
            if not self.num_experts:
                raise UserError(f"{where}: expert_weights needs routed experts (num_experts > 0)")

    # ---- kinds and precisions ----------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def dtype_bytes(self) -> int:
        """Bytes of one activation element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def weight_elem_bytes(self) -> float:
        """Bytes of one GEMM weight, block scales included."""
        return WEIGHT_BYTES[self.weights]

    @property
    def expert_precision(self) -> str:
        """The routed experts' weight precision (``expert_weights``, else ``weights``)."""
        return self.expert_weights or self.weights

    @property
    def expert_elem_bytes(self) -> float:
        """Bytes of one routed-expert weight, block scales included."""
        return WEIGHT_BYTES[self.expert_precision]

    @property
    def kv_elem_bytes(self) -> int:
        return KV_BYTES[self.kv_dtype]

    @property
    def full_attention_layers(self) -> int:
        """Decoder layers whose attention reads the whole context (all but the sliding-window ones)."""
        return self.num_layers - self.sliding_layers

    # ---- derived shapes -------------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        """Query/key width of one head (MLA: the non-rotary plus the rotary part)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of all query heads together."""
        return self.num_heads * self.qk_head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all key (or value) heads together: BlendServe's H_kv (MLA: the cached latent)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self.num_kv_heads * self.head_dim

    @property
    def o_in(self) -> int:
        """Input width of the output projection (all heads' values)."""
        return self.num_heads * (self.v_head_dim if self.is_mla else self.head_dim)

    @property
    def qkv_out(self) -> int:
        return self.q_dim + 2 * self.kv_dim

    @property
    def mlp_in_out(self) -> int:
        """Output width of the first dense MLP matrix (gate and up fused when gated)."""
        return (2 if self.gated_mlp else 1) * self.intermediate_size

    @property
    def attn_flops_per_pair(self) -> int:
        """Attention FLOPs of one (query, key) pair in one layer: QK^T and PV over all heads (MLA prefill:
        per-head keys of qk_head_dim, values of v_head_dim)."""
        if self.is_mla:
            return 2 * self.num_heads * (self.qk_head_dim + self.v_head_dim)
        return 4 * self.q_dim

    @property
    def dense_layers(self) -> int:
        """Decoder layers with the dense MLP."""
        return self.num_layers - self.moe_layers

    # ---- parameter counts -----------------------------------------------------------------
    @property
    def attn_linear_params(self) -> int:
        """Weights of one layer's attention projections (QKV or MLA's, and O), biases excluded."""
        h = self.hidden_size
        if not self.is_mla:
            return h * self.qkv_out + self.q_dim * h
        q = (h * self.q_lora_rank + self.q_lora_rank * self.q_dim) if self.q_lora_rank else h * self.q_dim
        kv_a = h * self.kv_dim
        kv_b = self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv_a + kv_b + self.o_in * h

    @property
    def mlp_params(self) -> int:
        """Weights of one dense MLP."""
        return self.hidden_size * self.mlp_in_out + self.intermediate_size * self.hidden_size

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert (gate, up, down)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def shared_params(self) -> int:
        """Weights of a MoE layer's shared experts together."""
        return 3 * self.hidden_size * self.shared_intermediate_size

    @property
    def router_params(self) -> int:
        return self.hidden_size * self.num_experts

    @property
    def layer_linear_params(self) -> int:
        """Weights of one dense layer's GEMMs (attention and MLP), biases excluded."""
        return self.attn_linear_params + self.mlp_params

    @property
    def _attn_extra_params(self) -> int:
        """Biases and norms inside attention, plus the layer's two RMSNorms."""
        bias = self.qkv_out if self.qkv_bias else 0
        qkn = 2 * self.head_dim if self.qk_norm else 0
        mla = self.q_lora_rank + self.kv_lora_rank if self.is_mla else 0
        return bias + qkn + mla + 2 * self.hidden_size

    @property
    def layer_params(self) -> int:
        """All weights of one dense layer."""
        return self.layer_linear_params + self._attn_extra_params

    @property
    def moe_layer_params(self) -> int:
        """MoE block weights of one layer: router, every routed expert, shared experts."""
        return self.router_params + self.num_experts * self.expert_params + self.shared_params

    @property
    def moe_layer_active_params(self) -> int:
        """MoE block weights one token uses: router, its top-k experts, shared experts."""
        return self.router_params + self.experts_per_token * self.expert_params + self.shared_params

    @property
    def embedding_params(self) -> int:
        pos = 0 if self.rope else self.max_position_embeddings * self.hidden_size
        return self.vocab_size * self.hidden_size + pos

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def _total(self, moe_block: int) -> int:
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        per_layer = self.attn_linear_params + self._attn_extra_params
        return (self.embedding_params + self.num_layers * per_layer + self.dense_layers * self.mlp_params
                + self.moe_layers * moe_block + self.hidden_size + head)

    @property
    def num_params(self) -> int:
        """All parameters: embedding, layers (every expert), final norm, and an untied LM head."""
        return self._total(self.moe_layer_params)

    @property
    def params_total(self) -> int:
        return self.num_params

    @property
    def params_active(self) -> int:
        """Parameters one token uses (MoE: the router, top-k routed and the shared experts)."""
        return self._total(self.moe_layer_active_params)

    @property
    def gemm_weight_params(self) -> int:
        """Weights stored in the ``weights`` precision (the routed experts' in ``expert_precision``): every
        decoder GEMM but the routers."""
        return (self.num_layers * self.attn_linear_params + self.dense_layers * self.mlp_params
                + self.moe_layers * (self.num_experts * self.expert_params + self.shared_params))

    @property
    def routed_expert_params(self) -> int:
        """Weights of every routed expert of every MoE layer."""
        return self.moe_layers * self.num_experts * self.expert_params

    @property
    def gemm_params_active(self) -> int:
        """Decoder GEMM weights one token multiplies with (routers included)."""
        return (self.num_layers * self.attn_linear_params + self.dense_layers * self.mlp_params
                + self.moe_layers * self.moe_layer_active_params)

    @property
    def weight_bytes(self) -> int:
        """GEMM weights in their precision; embeddings, LM head, norms and routers in ``dtype``."""
        g, e = self.gemm_weight_params, self.routed_expert_params
        return round((g - e) * self.weight_elem_bytes + e * self.expert_elem_bytes
                     + (self.num_params - g) * self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV of one token over the full-attention layers (all layers but sliding-window ones): K and V of the
        KV heads (MLA: the latent and rotary key)."""
        return self.kv_layer_bytes * self.full_attention_layers

    @property
    def kv_layer_bytes(self) -> int:
        """KV of one token in one layer."""
        return (self.kv_dim if self.is_mla else 2 * self.kv_dim) * self.kv_elem_bytes

    @property
    def window_kv_bytes(self) -> int:
        """KV one running sequence holds at most in the sliding-window layers (their whole window)."""
        return self.kv_layer_bytes * self.sliding_layers * self.sliding_window

    # ---- variants and identity ---------------------------------------------------------------
    def with_dtype(self, dtype: str) -> ModelSpec:
        """The model with activations in ``dtype``; weights and KV follow unless set apart from it."""
        d = asdict(self)
        d["dtype"] = dtype
        if self.weights == self.dtype:
            d["weights"] = dtype
        if self.kv_dtype == self.dtype and dtype in KV_BYTES:
            d["kv_dtype"] = dtype
        return ModelSpec(**d)

    def with_precision(self, weights: str | None = None, kv_dtype: str | None = None) -> ModelSpec:
        """The model with its GEMM weights and/or KV cache in another precision."""
        if weights is not None and weights not in WEIGHT_PRECISIONS:
            raise UserError(f"--weights {weights}: use one of {', '.join(WEIGHT_PRECISIONS)}")
        if kv_dtype is not None and kv_dtype not in KV_DTYPES:
            raise UserError(f"--kv-dtype {kv_dtype}: use one of {', '.join(KV_DTYPES)}")
        d = asdict(self)
        d["weights"] = weights or self.weights
        d["kv_dtype"] = kv_dtype or self.kv_dtype
        return ModelSpec(**d)

    def fingerprint(self) -> str:
        """A short hash of everything but the name and source: equal shapes and precisions, equal hash."""
        d = {k: v for k, v in asdict(self).items() if k not in ("name", "source")}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:8]

    def to_dict(self) -> dict:
        return asdict(self)

    def derived(self) -> dict:
        """Every derived figure, for ``blendsim models`` and summaries."""
        out = {"name": self.name, "model_type": self.model_type, "params_total": self.params_total,
               "params_active": self.params_active, "layers": self.num_layers, "hidden": self.hidden_size,
               "heads": self.num_heads, "kv_heads": self.num_kv_heads, "head_dim": self.head_dim,
               "dtype": self.dtype, "weights": self.weights, "kv_dtype": self.kv_dtype,
               "weight_bytes": self.weight_bytes, "kv_bytes_per_token": self.kv_bytes_per_token,
               "max_context": self.max_position_embeddings, "vocab": self.vocab_size,
               "dense_layers": self.dense_layers, "mlp_width": self.intermediate_size}
        if self.is_moe:
            out.update({"moe_layers": self.moe_layers, "experts": self.num_experts,
                        "experts_per_token": self.experts_per_token, "expert_width": self.moe_intermediate_size,
                        "shared_experts": self.num_shared_experts, "shared_width": self.shared_intermediate_size,
                        "expert_weights": self.expert_precision})
        if self.sliding_layers:
            out.update({"sliding_window": self.sliding_window, "sliding_layers": self.sliding_layers,
                        "window_kv_bytes": self.window_kv_bytes})
        if self.is_mla:
            out.update({"kv_lora_rank": self.kv_lora_rank, "q_lora_rank": self.q_lora_rank,
                        "qk_nope_head_dim": self.qk_nope_head_dim, "qk_rope_head_dim": self.qk_rope_head_dim,
                        "v_head_dim": self.v_head_dim})
        out["source"] = self.source
        return out


_HF = "HuggingFace config.json of "

PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        # NOTE: Llama-3.1 has Llama-3's shapes with a 128K context (BlendServe evaluates Llama-3.1)
        ModelSpec("llama-3-8b", 4096, 32, 32, 8, 14336, 128256, max_position_embeddings=131072,
                  source=_HF + "meta-llama/Llama-3.1-8B (shapes of Meta-Llama-3-8B)"),
        ModelSpec("llama-3-70b", 8192, 80, 64, 8, 28672, 128256, max_position_embeddings=131072,
                  source=_HF + "meta-llama/Llama-3.1-70B (shapes of Meta-Llama-3-70B)"),
        ModelSpec("llama-3.1-8b", 4096, 32, 32, 8, 14336, 128256, max_position_embeddings=131072,
                  source=_HF + "meta-llama/Llama-3.1-8B"),
        ModelSpec("llama-3.1-70b", 8192, 80, 64, 8, 28672, 128256, max_position_embeddings=131072,
                  source=_HF + "meta-llama/Llama-3.1-70B"),
        ModelSpec("llama-3.3-70b", 8192, 80, 64, 8, 28672, 128256, max_position_embeddings=131072,
                  source=_HF + "meta-llama/Llama-3.3-70B-Instruct"),
        ModelSpec("llama-3.1-405b", 16384, 126, 128, 8, 53248, 128256, max_position_embeddings=131072,
                  source=_HF + "meta-llama/Llama-3.1-405B"),
        ModelSpec("llama-2-7b", 4096, 32, 32, 32, 11008, 32000, max_position_embeddings=4096,
                  source=_HF + "meta-llama/Llama-2-7b-hf"),
        ModelSpec("llama-2-70b", 8192, 80, 64, 8, 28672, 32000, max_position_embeddings=4096,
                  source=_HF + "meta-llama/Llama-2-70b-hf"),
        ModelSpec("qwen2.5-7b", 3584, 28, 28, 4, 18944, 152064, qkv_bias=True, max_position_embeddings=32768,
                  model_type="qwen2", source=_HF + "Qwen/Qwen2.5-7B"),
        ModelSpec("qwen2.5-72b", 8192, 80, 64, 8, 29568, 152064, qkv_bias=True, max_position_embeddings=32768,
                  model_type="qwen2", source=_HF + "Qwen/Qwen2.5-72B"),
        ModelSpec("qwen3-8b", 4096, 36, 32, 8, 12288, 151936, head_dim=128, qk_norm=True,
                  max_position_embeddings=40960, model_type="qwen3", source=_HF + "Qwen/Qwen3-8B"),
        ModelSpec("qwen3-14b", 5120, 40, 40, 8, 17408, 151936, head_dim=128, qk_norm=True,
                  max_position_embeddings=40960, model_type="qwen3", source=_HF + "Qwen/Qwen3-14B"),
        ModelSpec("qwen3-32b", 5120, 64, 64, 8, 25600, 151936, head_dim=128, qk_norm=True,
                  max_position_embeddings=40960, model_type="qwen3", source=_HF + "Qwen/Qwen3-32B"),
        ModelSpec("mistral-7b", 4096, 32, 32, 8, 14336, 32000, max_position_embeddings=32768,
                  model_type="mistral", source=_HF + "mistralai/Mistral-7B-v0.1"),
        ModelSpec("opt-13b", 5120, 40, 40, 40, 20480, 50272, tie_word_embeddings=True, gated_mlp=False,
                  rope=False, dtype="fp16", max_position_embeddings=2048, model_type="opt",
                  source=_HF + "facebook/opt-13b"),
        # ---- mixture of experts ----
        ModelSpec("mixtral-8x7b", 4096, 32, 32, 8, 14336, 32000, max_position_embeddings=32768, model_type="mixtral",
                  num_experts=8, experts_per_token=2, moe_intermediate_size=14336, moe_layers=32,
                  source=_HF + "mistralai/Mixtral-8x7B-v0.1"),
        ModelSpec("qwen3-30b-a3b", 2048, 48, 32, 4, 6144, 151936, head_dim=128, qk_norm=True,
                  max_position_embeddings=40960, model_type="qwen3_moe", num_experts=128, experts_per_token=8,
                  moe_intermediate_size=768, moe_layers=48, source=_HF + "Qwen/Qwen3-30B-A3B"),
        ModelSpec("qwen3-235b-a22b", 4096, 94, 64, 4, 12288, 151936, head_dim=128, qk_norm=True,
                  max_position_embeddings=40960, model_type="qwen3_moe", num_experts=128, experts_per_token=8,
                  moe_intermediate_size=1536, moe_layers=94, source=_HF + "Qwen/Qwen3-235B-A22B"),
        # Llama 4: text_config; every layer MoE (Scout) or every other one (Maverick, interleave step 2; the
        # others have a 16,384-wide dense MLP); one routed and one shared expert per token
        ModelSpec("llama-4-scout", 5120, 48, 40, 8, 16384, 202048, head_dim=128, max_position_embeddings=10485760,
                  model_type="llama4", num_experts=16, experts_per_token=1, moe_intermediate_size=8192,
                  num_shared_experts=1, shared_intermediate_size=8192, moe_layers=48,
                  source=_HF + "meta-llama/Llama-4-Scout-17B-16E (text_config)"),
        ModelSpec("llama-4-maverick", 5120, 48, 40, 8, 16384, 202048, head_dim=128, max_position_embeddings=1048576,
                  model_type="llama4", num_experts=128, experts_per_token=1, moe_intermediate_size=8192,
                  num_shared_experts=1, shared_intermediate_size=8192, moe_layers=24,
                  source=_HF + "meta-llama/Llama-4-Maverick-17B-128E (text_config)"),
        # gpt-oss (OpenAI, Aug 2025): every layer MoE (top-4 of 32 / 128 experts 2,880 wide), 64 query and 8 KV
        # heads of 64 (queries 4,096 wide against a 2,880-wide residual), q/k/v biases, alternating sliding-window
        # (128 tokens, the even layers) and full attention; the checkpoint keeps the routed experts in MXFP4 and
        # attention, router, embedding and LM head in BF16 (quantization_config.modules_to_not_convert). The
        # per-head attention sinks (one learned logit a head) cost nothing here.
        ModelSpec("gpt-oss-20b", 2880, 24, 64, 8, 2880, 201088, head_dim=64, qkv_bias=True,
                  max_position_embeddings=131072, model_type="gpt_oss", num_experts=32, experts_per_token=4,
                  moe_intermediate_size=2880, moe_layers=24, sliding_window=128, sliding_layers=12,
                  expert_weights="mxfp4", source=_HF + "openai/gpt-oss-20b (config.json: layer_types, "
                                                      "quantization_config mxfp4)"),
        ModelSpec("gpt-oss-120b", 2880, 36, 64, 8, 2880, 201088, head_dim=64, qkv_bias=True,
                  max_position_embeddings=131072, model_type="gpt_oss", num_experts=128, experts_per_token=4,
                  moe_intermediate_size=2880, moe_layers=36, sliding_window=128, sliding_layers=18,
                  expert_weights="mxfp4", source=_HF + "openai/gpt-oss-120b (config.json: layer_types, "
                                                       "quantization_config mxfp4)"),
        # ---- multi-head latent attention + MoE (first 3 layers dense); published with FP8 weights ----
        ModelSpec("deepseek-v3", 7168, 61, 128, 128, 18432, 129280, head_dim=192, max_position_embeddings=163840,
                  model_type="deepseek_v3", weights="fp8", num_experts=256, experts_per_token=8,
                  moe_intermediate_size=2048, num_shared_experts=1, shared_intermediate_size=2048, moe_layers=58,
                  kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                  source=_HF + "deepseek-ai/DeepSeek-V3 (quantization_config: fp8; the multi-token-prediction "
                                "layer is not counted)"),
        # Small enough for CPU calibration and CPU replay in CI, GQA like llama-3.
        ModelSpec("tiny", 512, 4, 8, 2, 1536, 8192, max_position_embeddings=4096, dtype="fp32",
                  source="blendsim test model"),
    ]
}


def model_names() -> list[str]:
    return list(PRESETS)


def get_model(name_or_path: str, dtype: str | None = None, weights: str | None = None,
              kv_dtype: str | None = None) -> ModelSpec:
    """A preset by name, or a HuggingFace ``config.json`` (file or folder holding one), in the given
    activation dtype, weight precision and KV dtype (each None: the model's own)."""
    if name_or_path in PRESETS:
        spec = PRESETS[name_or_path]
    else:
        p = Path(name_or_path)
        if p.is_dir():
            p = p / "config.json"
        if not p.exists():
            raise UserError(
                f"unknown model {name_or_path!r}: not a preset ({', '.join(PRESETS)}) and no config.json there"
            )
        spec = load_hf_config(p, weights_given=weights is not None)
    if dtype is not None and dtype != spec.dtype:
        if dtype not in DTYPE_BYTES:
            raise UserError(f"unknown dtype {dtype!r}; use one of {', '.join(sorted(DTYPE_BYTES))}")
        spec = spec.with_dtype(dtype)
    if weights is not None or kv_dtype is not None:
        spec = spec.with_precision(weights, kv_dtype)
    return spec


# ---- HuggingFace config.json ----------------------------------------------------------------------


class _Cfg:
    """Typed reads of one config.json, every error naming the file and field."""

    def __init__(self, path: Path, cfg: dict):
        self.path, self.cfg = path, cfg
        self.read: dict[str, str] = {}  # the config key each spec field was read from (errors name it)

    def err(self, msg: str) -> UserError:
        return UserError(f"{self.path}: {msg}")

    def raw(self, *keys: str):
        for k in keys:
            if k in self.cfg and self.cfg[k] is not None:
                return k, self.cfg[k]
        return keys[0], None

    def int(self, *keys: str, default: int | None = None, minimum: int = 1, maximum: int = 2**31,
            field: str = "", why: str = "") -> int:
        """The integer under the first of ``keys`` present; ``field``: the spec field it fills (an error the spec
        raises about it names ``key`` instead); ``why``: said when a required one is missing."""
        key, v = self.raw(*keys)
        if field:
            self.read[field] = key
        if v is None:
            if default is None:
                raise self.err(f"missing field {keys[0]!r}" + (f" ({why})" if why else ""))
            return default
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.err(f"field {key!r} must be an integer, got {v!r}")
        if v < minimum:
            raise self.err(f"field {key!r} must be >= {minimum}, got {v}")
        if v > maximum:
            raise self.err(f"field {key!r} is {v:,}, beyond any model (at most {maximum:,})")
        return v

    def bool(self, key: str, default: bool) -> bool:
        v = self.cfg.get(key, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.err(f"field {key!r} must be true or false, got {v!r}")
        return v

    def int_list(self, key: str) -> list[int]:
        v = self.cfg.get(key) or []
        if not isinstance(v, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in v):
            raise self.err(f"field {key!r} must be a list of layer indices, got {v!r}")
        return v


def load_hf_config(path: str | Path, weights_given: bool = False) -> ModelSpec:
    """Read a HuggingFace ``config.json`` (the layouts of :data:`SUPPORTED_TYPES`). ``weights_given``: the caller
    sets the weight precision itself (``--weights``), so a ``quantization_config`` blendsim does not read is no
    error."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read config: {e}") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: expected a JSON object")
    top = cfg
    if "model_type" not in cfg:  # which layout the file has cannot be guessed (a MoE read as a dense llama)
        arch = cfg.get("architectures")
        raise UserError(f"{path}: field 'model_type' is missing" + (f" (architectures: {arch!r})" if arch else "")
                        + f"; add the model_type of its transformers config (supported: {', '.join(SUPPORTED_TYPES)})")
    model_type = str(cfg.get("model_type"))
    if model_type not in _SUPPORTED:
        raise UserError(f"{path}: model_type {model_type!r} is not supported (supported: "
                        f"{', '.join(SUPPORTED_TYPES)})")
    if model_type == "llama4":  # a multimodal config: the text model lives in text_config
        if not isinstance(cfg.get("text_config"), dict):
            raise UserError(f"{path}: a llama4 config needs a 'text_config' object")
        cfg = {**cfg["text_config"], **{k: top[k] for k in ("torch_dtype", "quantization_config")
                                        if k in top and k not in cfg["text_config"]}}
    if model_type == "llama4_text":
        model_type = "llama4"
    c = _Cfg(path, cfg)
    is_opt = model_type == "opt"
    hidden = c.int("hidden_size", "n_embd", "d_model", field="hidden_size")
    heads = c.int("num_attention_heads", "n_head", field="num_heads")
    kv_heads = c.int("num_key_value_heads", default=heads, field="num_kv_heads")
    layers = c.int("num_hidden_layers", "n_layer", maximum=_SIZE_CAPS["num_layers"], field="num_layers")
    vocab = c.int("vocab_size", field="vocab_size")
    head_dim = c.int("head_dim", default=0, minimum=1, field="head_dim") if c.raw("head_dim")[1] is not None else 0
    dtype = _dtype_of(c, top)
    kw = dict(
        hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, vocab_size=vocab,
        head_dim=head_dim, tie_word_embeddings=c.bool("tie_word_embeddings", is_opt), gated_mlp=not is_opt,
        rope=not is_opt, qkv_bias=model_type == "qwen2" or (model_type == "qwen3" and c.bool("attention_bias", False)),
        qk_norm=model_type in ("qwen3", "qwen3_moe"), dtype=dtype, model_type=model_type,
        # absent: what transformers' config class (and so an engine loading the file) takes for that model_type
        max_position_embeddings=c.int("max_position_embeddings", default=_HF_CONTEXT[model_type],
                                      field="max_position_embeddings"),
        weights=_weights_of(c, top, weights_given),
    )
    if model_type == "opt":
        kw["intermediate_size"] = c.int("ffn_dim", "intermediate_size", field="intermediate_size",
                                        why="the MLP's inner width")
    elif model_type == "mixtral":
        kw.update(_moe(c, layers, experts=("num_local_experts",), width=("intermediate_size",),
                       moe_ids=range(layers)))
        kw["intermediate_size"] = kw["moe_intermediate_size"]  # no dense layer; kept for shapes
    elif model_type == "qwen3_moe":
        step = c.int("decoder_sparse_step", default=1)
        dense = set(c.int_list("mlp_only_layers"))
        if any(not 0 <= i < layers for i in dense):
            raise c.err(f"field 'mlp_only_layers': layer indices must be in 0..{layers - 1}, got {sorted(dense)}")
        kw.update(_moe(c, layers, experts=("num_experts",), width=("moe_intermediate_size",),
                       moe_ids=[i for i in range(layers) if i not in dense and (i + 1) % step == 0],
                       placed_by="fields 'mlp_only_layers' and 'decoder_sparse_step'"))
        kw["intermediate_size"] = c.int("intermediate_size", field="intermediate_size")
    elif model_type == "llama4":
        step = c.int("interleave_moe_layer_step", default=1)
        ids = c.int_list("moe_layers") or list(range(step - 1, layers, step))
        kw.update(_moe(c, layers, experts=("num_local_experts",), width=("intermediate_size",), moe_ids=ids,
                       placed_by="fields 'moe_layers' and 'interleave_moe_layer_step'"))
        kw.update(num_shared_experts=1, shared_intermediate_size=kw["moe_intermediate_size"],
                  intermediate_size=c.int("intermediate_size_mlp", "intermediate_size", field="intermediate_size"))
    elif model_type == "gpt_oss":  # every layer MoE; layer_types marks the sliding-window layers
        kw.update(_moe(c, layers, experts=("num_local_experts", "num_experts"), width=("intermediate_size",),
                       moe_ids=range(layers)))
        kw["intermediate_size"] = kw["moe_intermediate_size"]  # no dense layer; kept for shapes
        kw["qkv_bias"] = c.bool("attention_bias", True)
        types = c.cfg.get("layer_types")
        if types is None:  # transformers' GptOssConfig default: the even layers slide, the odd ones attend fully
            types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        if not isinstance(types, list) or len(types) != layers or any(not isinstance(t, str) for t in types):
            raise c.err(f"field 'layer_types' must list one attention type per layer ({layers}), got {types!r}")
        odd = next((t for t in types if t not in ("sliding_attention", "full_attention")), None)
        if odd is not None:
            raise c.err(f"field 'layer_types': unknown attention type {odd!r} (known: sliding_attention, "
                        f"full_attention)")
        sliding = sum(t == "sliding_attention" for t in types)
        if sliding:
            kw.update(sliding_layers=sliding, sliding_window=c.int("sliding_window"))
        if kw["weights"] == "fp4" and str((c.cfg.get("quantization_config") or {}).get("quant_method")) == "mxfp4":
            # the checkpoint's MXFP4 covers the experts only (modules_to_not_convert: attention, router, embedding,
            # LM head stay in the dtype)
            kw.update(weights="", expert_weights="mxfp4")
    elif model_type in ("deepseek_v2", "deepseek_v3"):
        first = c.int("first_k_dense_replace", default=0, minimum=0)
        freq = c.int("moe_layer_freq", default=1)
        kw.update(_moe(c, layers, experts=("n_routed_experts",), width=("moe_intermediate_size",),
                       moe_ids=[i for i in range(layers) if i >= first and i % freq == 0],
                       placed_by="fields 'first_k_dense_replace' and 'moe_layer_freq'"))
        shared = c.int("n_shared_experts", default=0, minimum=0)
        kw.update(num_shared_experts=shared, shared_intermediate_size=shared * kw["moe_intermediate_size"],
                  intermediate_size=c.int("intermediate_size", field="intermediate_size"),
                  kv_lora_rank=c.int("kv_lora_rank", field="kv_lora_rank"),
                  # null: a direct query projection (DeepSeek-V2-Lite); absent is refused, since transformers'
                  # DeepseekV2/V3Config would take 1536, not none
                  q_lora_rank=_q_lora_rank(c),
                  qk_nope_head_dim=c.int("qk_nope_head_dim"), qk_rope_head_dim=c.int("qk_rope_head_dim"),
                  v_head_dim=c.int("v_head_dim"))
        kw["head_dim"] = kw["qk_nope_head_dim"] + kw["qk_rope_head_dim"]
    else:
        kw["intermediate_size"] = c.int("intermediate_size", field="intermediate_size", why="the MLP's inner width")
    try:
        spec = ModelSpec(name=_config_name(path, top, kw), source=str(path), **kw)
    except UserError as e:
        raise UserError(f"{path}: {_config_words(str(e), c.read)}") from None
    return spec


# max_position_embeddings where a config leaves it out: the default of transformers' config class for that
# model_type (huggingface/transformers src/transformers/models/<type>/configuration_<type>.py: LlamaConfig 2048,
# MistralConfig and MixtralConfig 4096 * 32, Qwen2/Qwen3/Qwen3MoeConfig 32768, OPTConfig 2048, DeepseekV2Config
# 2048, DeepseekV3Config 4096, Llama4TextConfig 4096 * 32, GptOssConfig 131072), which is what an engine that
# loads the file through transformers takes. The fields that size the model (intermediate_size, q_lora_rank)
# have no such fallback here: a class default is one model's width, not this one's, so they are refused.
_HF_CONTEXT = {"llama": 2048, "mistral": 131072, "mixtral": 131072, "qwen2": 32768, "qwen3": 32768,
               "qwen3_moe": 32768, "opt": 2048, "deepseek_v2": 2048, "deepseek_v3": 4096, "llama4": 131072,
               "gpt_oss": 131072}


def _moe(c: _Cfg, layers: int, experts: tuple, width: tuple, moe_ids, placed_by: str = "") -> dict:
    """The routed-expert fields; ``placed_by``: the config fields that chose ``moe_ids`` (named if they chose none)."""
    ids = sorted(set(moe_ids))
    if any(not 0 <= i < layers for i in ids):
        raise c.err(f"MoE layer indices must be in 0..{layers - 1}, got {ids}")
    if not ids:
        raise c.err(f"{placed_by} leave none of the {layers} layers with routed experts (an MoE model_type needs at "
                    f"least one)")
    n = c.int(*experts, field="num_experts")
    return {"num_experts": n,
            "experts_per_token": c.int("num_experts_per_tok", "num_experts_per_token", field="experts_per_token"),
            "moe_intermediate_size": c.int(*width, field="moe_intermediate_size"), "moe_layers": len(ids)}


def _q_lora_rank(c: _Cfg) -> int:
    """A DeepSeek config's compressed query width: 0 where the field is null (a direct query projection)."""
    if "q_lora_rank" not in c.cfg:
        raise c.err("missing field 'q_lora_rank' (null for a direct query projection; transformers' DeepSeek "
                    "configs would take 1536)")
    return c.int("q_lora_rank", default=0, minimum=0, field="q_lora_rank")


def _config_words(message: str, read: dict[str, str]) -> str:
    """A spec error about a config in the config's own words: each spec field named by the key it was read from
    (``num_heads`` -> ``num_attention_heads``)."""
    names = {f: k for f, k in read.items() if f != k}
    if not names:
        return message
    # one pass: a config key may itself be another spec field's name (llama4: the experts' width is read from
    # intermediate_size, the dense width from intermediate_size_mlp), so names are never replaced twice
    pattern = r"\b(" + "|".join(map(re.escape, sorted(names, key=len, reverse=True))) + r")\b"
    return re.sub(pattern, lambda m: names[m.group(1)], message)


def _dtype_of(c: _Cfg, top: dict) -> str:
    key, v = c.raw("torch_dtype", "dtype")
    if v is None:
        key, v = ("torch_dtype", top.get("torch_dtype") or "bfloat16")  # null is absent, as for every field
    if str(v) not in _HF_DTYPES:
        raise c.err(f"field {key!r}: unknown dtype {v!r} (known: {', '.join(_HF_DTYPES)})")
    d = _HF_DTYPES[str(v)]
    return "bf16" if d == "fp8" else d  # an fp8 torch_dtype describes the stored weights


def _weights_of(c: _Cfg, top: dict, given: bool = False) -> str:
    """The GEMM weights' precision from ``quantization_config`` ("" = the dtype's; also when the scheme is not
    understood but the caller gives the precision, ``given``)."""
    q = c.cfg.get("quantization_config")
    if q is None:
        return "fp8" if str(c.cfg.get("torch_dtype", "")) == "float8_e4m3fn" else ""
    if not isinstance(q, dict):
        raise c.err("field 'quantization_config' must be an object")
    method = str(q.get("quant_method", "")).lower()
    algo = str(q.get("quant_algo", "")).upper()
    if method == "fp8" or algo == "FP8":
        return "fp8"
    if method == "mxfp4" or algo in ("NVFP4", "MXFP4"):
        return "fp4"
    if method in ("awq", "gptq") and q.get("bits", 4) == 4:
        return "int4"
    if method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        if not isinstance(groups, dict):
            raise c.err(f"field 'quantization_config.config_groups' must be an object of groups, got "
                        f"{type(groups).__name__}")
        w = next((g.get("weights") for g in groups.values() if isinstance(g, dict) and g.get("weights")), None)
        if isinstance(w, dict):
            bits, typ = w.get("num_bits"), w.get("type")
            if bits == 8 and typ == "float":
                return "fp8"
            if bits == 4:
                return "fp4" if typ == "float" else "int4"
    if given:
        return ""
    raise c.err(f"field 'quantization_config': quantization {method or algo or q!r} is not understood; "
                f"give the weight precision with --weights ({', '.join(WEIGHT_PRECISIONS)})")


def _config_name(path: Path, top: dict, kw: dict) -> str:
    """``_name_or_path``; else the file's name (unless it is plain config.json); else architecture + size."""
    n = top.get("_name_or_path")
    if isinstance(n, str) and n.strip():
        return n.strip()
    if path.stem != "config":
        return path.stem
    arch = top.get("architectures")
    arch = str(arch[0]) if isinstance(arch, list) and arch else str(kw.get("model_type", "custom"))
    probe = ModelSpec(name=arch, **kw)
    return f"{arch}-{probe.params_total / 1e9:.1f}B"


__all__ = ["DTYPE_BYTES", "KV_DTYPES", "ModelSpec", "PRESETS", "SUPPORTED_TYPES", "WEIGHT_BYTES",
           "WEIGHT_PRECISIONS", "get_model", "load_hf_config", "model_names"]
