"""Model architecture specs (ModelSpec): presets and HuggingFace ``config.json`` loading.

Parameter counts and KV bytes per token are derived from the architecture, never typed in.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from sim.errors import UserError

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
_HF_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "fp8"}
# decoder layouts whose shapes this module reads correctly (Llama-style, and OPT)
SUPPORTED_TYPES = {"llama", "mistral", "qwen2", "opt"}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer, described by the shapes that drive its cost."""

    name: str
    hidden_size: int  # H: model width
    num_layers: int  # L: decoder layers
    num_heads: int  # query heads
    num_kv_heads: int  # key/value heads (== num_heads for MHA, fewer for GQA)
    intermediate_size: int  # MLP inner width
    vocab_size: int
    head_dim: int = 0  # 0 means hidden_size // num_heads
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix
    gated_mlp: bool = True  # SwiGLU (gate, up, down) vs a plain two-matrix MLP (OPT)
    rope: bool = True  # rotary position embedding (False: learned positions, OPT)
    qkv_bias: bool = False  # Qwen2 adds biases to q/k/v (negligible cost, kept for shapes)
    dtype: str = "bf16"  # weight and KV-cache dtype
    max_position_embeddings: int = 8192
    source: str = ""  # where the numbers come from

    def __post_init__(self) -> None:
        for f in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size"):
            if getattr(self, f) <= 0:
                raise UserError(f"model {self.name!r}: {f} must be positive, got {getattr(self, f)}")
        if self.num_heads % self.num_kv_heads:
            raise UserError(
                f"model {self.name!r}: num_heads ({self.num_heads}) is not a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.dtype not in DTYPE_BYTES:
            raise UserError(f"model {self.name!r}: unknown dtype {self.dtype!r}; use one of {sorted(DTYPE_BYTES)}")
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise UserError(f"model {self.name!r}: hidden_size is not a multiple of num_heads; give head_dim")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)

    # ---- derived shapes -------------------------------------------------------------------
    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def q_dim(self) -> int:
        """Width of all query heads together."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all key (or value) heads together: BlendServe's H_kv."""
        return self.num_kv_heads * self.head_dim

    @property
    def qkv_out(self) -> int:
        return self.q_dim + 2 * self.kv_dim

    @property
    def mlp_in_out(self) -> int:
        """Output width of the first MLP matrix (gate and up fused when gated)."""
        return (2 if self.gated_mlp else 1) * self.intermediate_size

    # ---- parameter counts -----------------------------------------------------------------
    @property
    def layer_linear_params(self) -> int:
        """Weights of one layer's GEMMs (QKV, O, MLP), biases excluded."""
        h = self.hidden_size
        return h * self.qkv_out + self.q_dim * h + h * self.mlp_in_out + self.intermediate_size * h

    @property
    def layer_params(self) -> int:
        bias = self.qkv_out if self.qkv_bias else 0
        norms = 2 * self.hidden_size
        return self.layer_linear_params + bias + norms

    @property
    def embedding_params(self) -> int:
        pos = 0 if self.rope else self.max_position_embeddings * self.hidden_size
        return self.vocab_size * self.hidden_size + pos

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """All parameters: embedding, layers, final norm, and an untied LM head."""
        head = 0 if self.tie_word_embeddings else self.lm_head_params
        return self.embedding_params + self.num_layers * self.layer_params + self.hidden_size + head

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers."""
        return 2 * self.kv_dim * self.num_layers * self.dtype_bytes

    def with_dtype(self, dtype: str) -> ModelSpec:
        d = asdict(self)
        d["dtype"] = dtype
        return ModelSpec(**d)

    def to_dict(self) -> dict:
        return asdict(self)


_HF = "HuggingFace config.json of "

PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        # NOTE: Llama-3.1 has Llama-3's shapes with a 128K context (BlendServe evaluates Llama-3.1)
        ModelSpec("llama-3-8b", 4096, 32, 32, 8, 14336, 128256, max_position_embeddings=131072,
                  source=_HF + "meta-llama/Llama-3.1-8B (shapes of Meta-Llama-3-8B)"),
        ModelSpec("llama-3-70b", 8192, 80, 64, 8, 28672, 128256, max_position_embeddings=131072,
                  source=_HF + "meta-llama/Llama-3.1-70B (shapes of Meta-Llama-3-70B)"),
        ModelSpec("llama-2-7b", 4096, 32, 32, 32, 11008, 32000, max_position_embeddings=4096,
                  source=_HF + "meta-llama/Llama-2-7b-hf"),
        ModelSpec("qwen2.5-7b", 3584, 28, 28, 4, 18944, 152064, qkv_bias=True, max_position_embeddings=32768,
                  source=_HF + "Qwen/Qwen2.5-7B"),
        ModelSpec("qwen2.5-72b", 8192, 80, 64, 8, 29568, 152064, qkv_bias=True, max_position_embeddings=32768,
                  source=_HF + "Qwen/Qwen2.5-72B"),
        ModelSpec("mistral-7b", 4096, 32, 32, 8, 14336, 32000, max_position_embeddings=32768,
                  source=_HF + "mistralai/Mistral-7B-v0.1"),
        ModelSpec("opt-13b", 5120, 40, 40, 40, 20480, 50272, tie_word_embeddings=True, gated_mlp=False,
                  rope=False, dtype="fp16", max_position_embeddings=2048, source=_HF + "facebook/opt-13b"),
        # Small enough for CPU calibration and CPU replay in CI, GQA like llama-3.
        ModelSpec("tiny", 512, 4, 8, 2, 1536, 8192, max_position_embeddings=4096, dtype="fp32",
                  source="blendsim test model"),
    ]
}


def model_names() -> list[str]:
    return list(PRESETS)


def get_model(name_or_path: str, dtype: str | None = None) -> ModelSpec:
    """A preset by name, or a HuggingFace ``config.json`` (file or folder holding one)."""
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
        spec = load_hf_config(p)
    if dtype is not None and dtype != spec.dtype:
        if dtype not in DTYPE_BYTES:
            raise UserError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPE_BYTES)}")
        spec = spec.with_dtype(dtype)
    return spec


def load_hf_config(path: str | Path) -> ModelSpec:
    """Read a HuggingFace ``config.json`` (Llama, Mistral, Qwen2 and OPT layouts)."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read config: {e}") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: expected a JSON object")

    def get(*keys: str, default=None, required: bool = True):
        for k in keys:
            if k in cfg and cfg[k] is not None:
                return cfg[k]
        if required and default is None:
            raise UserError(f"{path}: missing field {keys[0]!r}")
        return default

    def as_int(value, key: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{path}: field {key!r} must be an integer, got {value!r}")
        return value

    model_type = str(cfg.get("model_type", "llama"))
    if model_type not in SUPPORTED_TYPES:
        raise UserError(f"{path}: model_type {model_type!r} is not supported (supported: "
                        f"{', '.join(sorted(SUPPORTED_TYPES))})")
    is_opt = model_type == "opt"
    hidden = as_int(get("hidden_size", "n_embd", "d_model"), "hidden_size")
    heads = as_int(get("num_attention_heads", "n_head"), "num_attention_heads")
    kv_heads = as_int(get("num_key_value_heads", default=heads), "num_key_value_heads")
    inter = as_int(get("intermediate_size", "ffn_dim", "n_inner", default=4 * hidden), "intermediate_size")
    layers = as_int(get("num_hidden_layers", "n_layer"), "num_hidden_layers")
    vocab = as_int(get("vocab_size"), "vocab_size")
    head_dim = cfg.get("head_dim") or 0
    torch_dtype = str(cfg.get("torch_dtype", cfg.get("dtype", "bfloat16")))
    if torch_dtype not in _HF_DTYPES:
        raise UserError(f"{path}: field 'torch_dtype': unknown dtype {torch_dtype!r} "
                        f"(known: {', '.join(_HF_DTYPES)})")
    dtype = _HF_DTYPES[torch_dtype]
    name = str(cfg.get("_name_or_path") or path.parent.name or "custom")
    return ModelSpec(
        name=name,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=inter,
        vocab_size=vocab,
        head_dim=as_int(head_dim, "head_dim"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", is_opt)),
        gated_mlp=not is_opt,
        rope=not is_opt,
        qkv_bias=model_type == "qwen2",
        dtype=dtype,
        max_position_embeddings=as_int(get("max_position_embeddings", default=8192), "max_position_embeddings"),
        source=str(path),
    )


__all__ = ["DTYPE_BYTES", "ModelSpec", "PRESETS", "get_model", "load_hf_config", "model_names"]
