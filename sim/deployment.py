"""A model on a piece of hardware: tensor and expert parallelism and the memory left for the KV cache."""

from __future__ import annotations

import math
from dataclasses import dataclass

from blendsim.sim.errors import UserError
from blendsim.sim.hardware import GiB, HardwareSpec
from blendsim.sim.models import ModelSpec

# Zipf exponent beyond which expert popularities i^-skew underflow float64 for 256 experts (a skew of 100
# already sends every token to the top-k experts: the second expert is 2^-100 as popular as the first)
MAX_EXPERT_SKEW = 100.0


@dataclass(frozen=True, slots=True)
class Deployment:
    """One replica: ``tp`` GPUs of ``hardware`` holding one copy of ``model``.

    Attention (and dense MLPs) are split ``tp`` ways. A mixture-of-experts model's routed experts are
    split over ``ep`` GPUs (``ep`` divides ``tp``; each expert's width over the ``tp / ep`` GPUs of its
    group), tokens reaching them by all-to-all; ``ep`` 1 splits every expert ``tp`` ways like a dense MLP.
    """

    model: ModelSpec
    hardware: HardwareSpec
    tp: int = 1  # tensor-parallel degree (GPUs per replica)
    gpu_memory_utilization: float = 0.90  # fraction of device memory the engine may use (vLLM's default)
    max_batched_tokens: int = 8192  # largest step, sizes the activation reserve
    max_seqs: int = 1024  # most sequences in a step, sizes the logits buffer
    kv_capacity_override: int = 0  # bytes per replica; 0 derives it from memory
    ep: int = 1  # expert-parallel degree (MoE models)
    expert_skew: float = 0.0  # routing skew: 0 uniform, else the Zipf exponent of expert popularity

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise UserError(f"--tp must be at least 1, got {self.tp}")
        m = self.model
        if m.num_heads % self.tp:
            raise UserError(f"--tp {self.tp} does not divide {m.name}'s {m.num_heads} attention heads")
        if not m.is_mla and m.num_kv_heads % self.tp and self.tp % m.num_kv_heads:
            raise UserError(f"--tp {self.tp} and {m.name}'s {m.num_kv_heads} KV heads must divide one another "
                            f"(KV heads are split, or replicated when tp exceeds them)")
        if m.dense_layers and m.intermediate_size % self.tp:
            raise UserError(f"--tp {self.tp} does not divide {m.name}'s MLP width {m.intermediate_size}")
        if self.ep < 1:
            raise UserError(f"--ep must be at least 1, got {self.ep}")
        if self.ep > 1 and not m.is_moe:
            raise UserError(f"--ep {self.ep}: {m.name} has no experts (expert parallelism needs an MoE model)")
        if m.is_moe:
            if self.tp % self.ep:
                raise UserError(f"--ep {self.ep} must divide --tp {self.tp} (experts are split over the GPUs "
                                f"of a replica)")
            if m.num_experts % self.ep:
                raise UserError(f"--ep {self.ep} does not divide {m.name}'s {m.num_experts} experts")
            etp = self.tp // self.ep
            if m.moe_intermediate_size % etp:
                raise UserError(f"--tp {self.tp} / --ep {self.ep} = {etp} does not divide {m.name}'s expert "
                                f"width {m.moe_intermediate_size}")
            if m.shared_intermediate_size % self.tp:
                raise UserError(f"--tp {self.tp} does not divide {m.name}'s shared-expert width "
                                f"{m.shared_intermediate_size}")
        if not (math.isfinite(self.expert_skew) and 0 <= self.expert_skew <= MAX_EXPERT_SKEW):
            raise UserError(f"--expert-skew: the expert skew must be a number in 0..{MAX_EXPERT_SKEW:g} (the limit: "
                            f"beyond it the rarer experts' Zipf weights underflow), got {self.expert_skew}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise UserError("gpu_memory_utilization must be in (0, 1]")
        if self.kv_capacity_bytes <= 0:
            need = (self.weight_bytes_per_gpu + self.activation_reserve_bytes) / GiB
            have = self.hardware.memory_bytes * self.gpu_memory_utilization / GiB
            act = self.activation_reserve_bytes / GiB
            if self.weight_bytes_per_gpu / GiB < have and act > 0.5:  # the weights fit; the largest step does not
                raise UserError(
                    f"--token-budget {self.max_batched_tokens} / --max-seqs {self.max_seqs}: the activations of "
                    f"such a step need {act:,.1f} GiB per GPU beside {self.weight_bytes_per_gpu / GiB:.1f} GiB of "
                    f"{self.model.name} weights, {have:.1f} GiB usable on {self.hardware.name}; lower them"
                )
            raise UserError(
                f"{self.model.name} ({m.weights} weights) does not fit on {self.hardware.name} with tp={self.tp}: "
                f"weights and activations need {need:.1f} GiB per GPU, {have:.1f} GiB usable"
            )

    @property
    def weight_bytes_per_gpu(self) -> float:
        return self.model.weight_bytes / self.tp

    @property
    def activation_reserve_bytes(self) -> float:
        """Peak activations of the largest step plus the logits buffer, per GPU.

        The widest live tensors of a step are the MLP input to the activation (2 x intermediate, fused
        gate/up) and its output, plus the residual stream and QKV; logits are float32 over the vocabulary
        for every sequence that samples. A floor of 512 MiB covers the CUDA context and workspaces.
        MoE layers hold each token's top-k expert rows (and the shared experts') instead of the MLP's.
        """
        m = self.model
        mlp = (m.mlp_in_out + m.intermediate_size) / self.tp if m.dense_layers else 0.0
        if m.is_moe:
            etp = self.tp // self.ep
            moe = (3 * m.moe_intermediate_size * m.experts_per_token / etp
                   + 3 * m.shared_intermediate_size / self.tp + m.experts_per_token * m.hidden_size)
            mlp = max(mlp, moe)
        per_token = mlp + 3 * m.hidden_size + m.qkv_out / self.tp
        act = self.max_batched_tokens * per_token * m.dtype_bytes
        logits = self.max_seqs * m.vocab_size * 4 / self.tp
        return max(act + logits, 512 * 2**20)

    @property
    def kv_capacity_bytes(self) -> float:
        """KV-cache bytes of the whole replica (all its GPUs)."""
        if self.kv_capacity_override:
            return float(self.kv_capacity_override)
        per_gpu = (
            self.hardware.memory_bytes * self.gpu_memory_utilization
            - self.weight_bytes_per_gpu
            - self.activation_reserve_bytes
        )
        return per_gpu * self.tp

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token on the whole replica; heads are replicated when tp > KV heads, and MLA's
        latent (shared by all heads) is held whole by every GPU of the group, as vLLM keeps it."""
        if self.model.is_mla:
            return self.model.kv_bytes_per_token * self.tp
        return self.model.kv_bytes_per_token * max(1, self.tp // self.model.num_kv_heads)

    @property
    def kv_capacity_tokens(self) -> int:
        return int(self.kv_capacity_bytes // self.kv_bytes_per_token)

    def num_blocks(self, block_size: int) -> int:
        return self.kv_capacity_tokens // block_size


def make_deployment(model: str, hardware: str, tp: int = 1, dtype: str | None = None, weights: str | None = None,
                    kv_dtype: str | None = None, **kw) -> Deployment:
    """A deployment from a model preset or config.json path and a hardware preset name."""
    from blendsim.sim.hardware import get_hardware
    from blendsim.sim.models import get_model

    return Deployment(get_model(model, dtype, weights, kv_dtype), get_hardware(hardware), tp, **kw)


__all__ = ["Deployment", "make_deployment"]
