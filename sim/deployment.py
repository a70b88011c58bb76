"""A model on a piece of hardware: tensor, expert and pipeline parallelism, the links they cross, and the memory
left for the KV cache.

Pipeline parallelism (``pp`` > 1) splits the decoder layers into ``pp`` contiguous stages of ``tp`` GPUs each,
as vLLM's ``get_pp_indices`` does (``vllm/distributed/utils.py``: ``layers // pp`` each, the remainder one more
to the stages before the last, which carries the LM head); the first stage also holds the embedding. Every stage
sizes its own memory: its weights, its activations (the logits buffer on the last stage only) and the KV of its
own layers; the replica holds as many KV tokens as its tightest stage (vLLM takes the minimum over workers).

GPUs are placed in order: TP group of stage 0 first, then stage 1, ... A group of GPUs talks over the scale-up
link (``HardwareSpec.link_bandwidth``: NVLink/NVSwitch, Infinity Fabric or PCIe) when it sits inside one
scale-up domain (a node, or a GB200 NVL72 rack), else over the inter-node network (``net_bandwidth``, one NIC
per GPU). ``stage`` >= 0 makes the deployment a view of one stage, which the cost model prices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from blendsim.sim.errors import UserError
from blendsim.sim.hardware import GiB, HardwareSpec
from blendsim.sim.models import ModelSpec

# Zipf exponent beyond which expert popularities i^-skew underflow float64 for 256 experts (a skew of 100
# already sends every token to the top-k experts: the second expert is 2^-100 as popular as the first)
MAX_EXPERT_SKEW = 100.0


def split_label(tp: int, pp: int | None = 1, ep: int | None = 1) -> str:
    """How one replica is split, spelt the one way every report uses: ``TP8``, ``TP4 x PP2`` (GPUs multiply),
    ``TP8, EP8`` (experts split inside the TP group, no more GPUs); a missing ``pp`` or ``ep`` is 1."""
    return f"TP{tp}" + (f" x PP{pp}" if (pp or 1) > 1 else "") + (f", EP{ep}" if (ep or 1) > 1 else "")


def deployment_name(hardware: str, tp: int, pp: int | None = 1, ep: int | None = 1) -> str:
    """A GPU and one replica's split, the key ``fidelity`` groups runs by: ``h200 TP8, EP8`` (replicas not named:
    a data-parallel run's replicas are alike)."""
    return f"{hardware} {split_label(tp, pp, ep)}"


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
    # False: that fraction of the device holds weights, activations and KV (vLLM's gpu_memory_utilization,
    # SGLang's mem_fraction_static); True: it is the fraction of what the weights and activations leave that the
    # KV takes (TensorRT-LLM's KvCacheConfig.free_gpu_memory_fraction)
    kv_of_free: bool = False
    # True: that fraction of the device holds the weights and the KV pool only, the rest is left to activations,
    # CUDA graphs and workspaces, so no activation reserve comes out of it (SGLang's mem_fraction_static: the pool is
    # the fraction of the memory free at start less the weights, srt/model_executor/model_runner.py
    # profile_max_num_token); False: the engine's profiling run measures the activations inside it (vLLM)
    static_fraction: bool = False
    max_batched_tokens: int = 8192  # largest step, sizes the activation reserve
    max_seqs: int = 1024  # most sequences in a step, sizes the logits buffer
    kv_capacity_override: int = 0  # bytes per replica; 0 derives it from memory
    ep: int = 1  # expert-parallel degree (MoE models)
    expert_skew: float = 0.0  # routing skew: 0 uniform, else the Zipf exponent of expert popularity
    pp: int = 1  # pipeline-parallel degree (stages per replica, ``tp`` GPUs each)
    stage: int = -1  # -1: the whole replica; i >= 0: a view of stage i (what the cost model prices)
    # attention data parallelism (SGLang's --enable-dp-attention, TensorRT-LLM's enable_attention_dp): each GPU of the
    # TP group runs whole attention over its own share of the sequences and keeps their KV whole; the MoE layers run
    # over every GPU's tokens (all-to-all with ``ep`` > 1, else all-gather + reduce-scatter around the TP-split
    # experts), within each pipeline stage. Only a MoE model takes it (``dp``); a dense one keeps attention split
    attn_dp: bool = False

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise UserError(f"--tp must be at least 1, got {self.tp}")
        if self.pp < 1:
            raise UserError(f"--pp must be at least 1, got {self.pp}")
        m = self.model
        if self.pp > m.num_layers:
            raise UserError(f"--pp {self.pp}: {m.name} has only {m.num_layers} layers to split into stages")
        if not -1 <= self.stage < self.pp:
            raise UserError(f"stage {self.stage} of a {self.pp}-stage pipeline does not exist")
        if m.num_heads % self.tp and self.dp == 1:
            raise UserError(f"--tp {self.tp} does not divide {m.name}'s {m.num_heads} attention heads")
        if not m.is_mla and m.num_kv_heads % self.tp and self.tp % m.num_kv_heads and self.dp == 1:
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
        self._check_links()
        if self.pp > 1:
            self._check_stages()
            return
        if self.kv_capacity_bytes <= 0:
            act = self._beside_weights(last=True) / GiB
            need = self.weight_bytes_per_gpu / GiB + act
            have = self._usable_bytes / GiB
            what = " (and the sliding-window KV of that many sequences)" if self._window_reserve else ""
            if self.weight_bytes_per_gpu / GiB < have and act > 0.5:  # the weights fit; the largest step does not
                raise UserError(
                    f"--token-budget {self.max_batched_tokens} / --max-seqs {self.max_seqs}: the activations of "
                    f"such a step{what} need {act:,.1f} GiB per GPU beside {self.weight_bytes_per_gpu / GiB:.1f} GiB "
                    f"of {self.model.name} weights, {have:.1f} GiB usable on {self.hardware.name}; lower them"
                )
            parts = ["weights"] + ([] if self.static_fraction else ["activations"]) + (
                ["sliding-window KV"] if self._window_reserve else [])
            held = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
            raise UserError(
                f"{self.model.name} ({m.weights} weights) does not fit on {self.hardware.name} with tp={self.tp}: "
                f"{held} need {need:.1f} GiB per GPU, {have:.1f} GiB usable"
            )

    @property
    def dp(self) -> int:
        """GPUs attention is data-parallel over (``attn_dp``): :func:`attn_dp_gpus`."""
        return attn_dp_gpus(self.model, self.tp, self.attn_dp)

    @property
    def replicated_weight_bytes(self) -> float:
        """Weights every GPU of a TP group holds whole under attention data parallelism (``dp`` > 1), over all its
        stages: attention, its norms, the embedding and the LM head (each GPU runs them over its own sequences); 0
        otherwise."""
        return float(sum(self._stage_replicated(i) for i in range(self.pp)))

    def _stage_replicated(self, i: int) -> float:
        """Of stage ``i``'s weights, those each of its GPUs holds whole under attention data parallelism."""
        if self.dp == 1:
            return 0.0
        m = self.model
        L = self.stage_layers()[i] if self.pp > 1 else m.num_layers
        out = L * (m.attn_linear_params * m.weight_elem_bytes + m._attn_extra_params * m.dtype_bytes)
        if i == 0:
            out += m.embedding_params * m.dtype_bytes
        if i == self.pp - 1:  # a pipeline's last stage holds its own LM head (stage_weight_bytes)
            head = m.lm_head_params if (self.pp > 1 or not m.tie_word_embeddings) else 0
            out += (head + m.hidden_size) * m.dtype_bytes
        return float(out)

    def _stage_weights_per_gpu(self, i: int) -> float:
        """Weights each GPU of stage ``i`` holds: its 1/tp share, or, under attention data parallelism, its share of
        the rest and the attention side whole."""
        rep = self._stage_replicated(i)
        return (self.stage_weight_bytes(i) - rep) / self.tp + rep

    # ---- pipeline stages -------------------------------------------------------------------
    @property
    def gpus(self) -> int:
        """GPUs of one replica."""
        return self.tp * self.pp

    def stage_layers(self) -> list[int]:
        """Decoder layers of each stage (vLLM's split: the remainder to the stages before the last)."""
        L, p = self.model.num_layers, self.pp
        parts = [L // p] * p
        for i in range(2, L % p + 2):
            parts[-i] += 1
        return parts

    def stage_range(self, i: int) -> tuple[int, int]:
        """First and one-past-last decoder layer of stage ``i``."""
        parts = self.stage_layers()
        a = sum(parts[:i])
        return a, a + parts[i]

    def stage_full_attention_layers(self, i: int) -> int:
        """Full-attention layers of stage ``i`` (its layers but the sliding-window ones, taken as spread evenly over
        the depth, rounded up: gpt-oss alternates them)."""
        m = self.model
        return -(-self.stage_layers()[i] * m.full_attention_layers // m.num_layers)

    def stage_moe_layers(self, i: int) -> int:
        """MoE layers of stage ``i``, taken as spread evenly over the depth (exact for all-MoE models and
        Llama-4-Maverick's every-other-layer interleave; DeepSeek's 3 leading dense layers of 61 land up to
        two layers off)."""
        a, b = self.stage_range(i)
        L, M = self.model.num_layers, self.model.moe_layers
        return (b * M + L // 2) // L - (a * M + L // 2) // L

    def at_stage(self, i: int) -> Deployment:
        """The view of stage ``i`` (what one stage's cost model prices)."""
        return replace(self, stage=i) if self.pp > 1 else self

    def stage_weight_bytes(self, i: int) -> float:
        """Weights stage ``i`` holds (all its GPUs): its layers, the embedding on the first stage, the final
        norm and LM head on the last (with tied embeddings the last stage holds its own copy, as vLLM does)."""
        m = self.model
        if self.pp == 1:
            return float(m.weight_bytes)
        L = self.stage_layers()[i]
        moe = self.stage_moe_layers(i)
        w, d = m.weight_elem_bytes, m.dtype_bytes
        attn = m.attn_linear_params * w + m._attn_extra_params * d
        dense = attn + m.mlp_params * w
        moe_b = (attn + m.num_experts * m.expert_params * m.expert_elem_bytes + m.shared_params * w
                 + m.router_params * d)
        out = (L - moe) * dense + moe * moe_b
        if i == 0:
            out += m.embedding_params * d
        if i == self.pp - 1:
            out += (m.lm_head_params + m.hidden_size) * d
        return float(out)

    def _stage_index(self) -> int:
        return 0 if self.stage < 0 else self.stage

    def _check_stages(self) -> None:
        """Every stage's weights, activations and some KV fit; else one line naming the stage."""
        have = self._usable_bytes
        for i in range(self.pp):
            w = self._stage_weights_per_gpu(i)
            act = self._beside_weights(last=i == self.pp - 1)
            if w + act >= have or self._stage_kv_tokens(i) < 1:
                a, b = self.stage_range(i)
                what = (" + embedding" if i == 0 else "") + (" + LM head" if i == self.pp - 1 else "")
                wkv = " and sliding-window KV" if self._window_reserve else ""
                raise UserError(
                    f"{self.model.name} ({self.model.weights} weights) does not fit on {self.hardware.name} with "
                    f"tp={self.tp} pp={self.pp}: stage {i} (layers {a}-{b - 1}{what}) needs {w / GiB:.1f} GiB of "
                    f"weights and {act / GiB:.1f} GiB of activations{wkv} per GPU, {have / GiB:.1f} GiB usable, "
                    + (f"short by {(w + act - have) / GiB:.1f} GiB before any KV cache" if w + act >= have else
                       "no room for a KV block of its layers")
                )

    def _stage_kv_tokens(self, i: int) -> int:
        """KV tokens stage ``i`` can hold for its own layers."""
        per_gpu = self._kv_bytes_per_gpu(self._stage_weights_per_gpu(i), last=i == self.pp - 1)
        per_token = self.kv_bytes_per_token // self.model.full_attention_layers * self.stage_full_attention_layers(i)
        return int(per_gpu * self.tp // per_token) if per_gpu > 0 else 0

    def stage_kv_tokens(self) -> list[int]:
        """KV tokens each stage can hold (the replica holds the smallest)."""
        return [self._stage_kv_tokens(i) for i in range(self.pp)]

    # ---- links by topology ----------------------------------------------------------------
    def _spans(self, first: int, n: int) -> bool:
        """Whether GPUs ``first .. first + n - 1`` of the replica leave one scale-up domain."""
        dom = self.hardware.scaleup_domain
        return first // dom != (first + n - 1) // dom

    @property
    def nodes(self) -> int:
        """Nodes one replica spans."""
        return -(-self.gpus // self.hardware.gpus_per_node)

    @property
    def tp_spans_nodes(self) -> bool:
        """Whether a TP (and EP) group leaves its scale-up domain (its collectives cross the network)."""
        return any(self._spans(i * self.tp, self.tp) for i in range(self.pp))

    def pp_crosses(self, i: int) -> bool:
        """Whether the hand-off from stage ``i`` to stage ``i + 1`` crosses the network."""
        return self._spans(i * self.tp + self.tp - 1, 2)

    def _net(self, what: str) -> tuple[float, float]:
        hw = self.hardware
        if hw.net_bandwidth <= 0:
            raise UserError(f"{what} spans nodes of {hw.gpus_per_node} {hw.name} GPUs, and no inter-node network "
                            f"is known for {hw.name}; use fewer GPUs per replica (--tp x --pp <= "
                            f"{hw.scaleup_domain})")
        return hw.net_bandwidth, hw.net_latency_s

    def tp_link(self) -> tuple[float, float]:
        """Bandwidth (bytes/s per direction) and per-step latency of the link TP/EP collectives cross."""
        if self.tp_spans_nodes:
            return self._net(f"--tp {self.tp}")
        return self.hardware.link_bandwidth, self.hardware.link_latency_s

    def pp_link(self, i: int) -> tuple[float, float]:
        """Bandwidth and latency of the hand-off from stage ``i`` to stage ``i + 1``."""
        if self.pp_crosses(i):
            return self._net(f"--tp {self.tp} --pp {self.pp}")
        return self.hardware.link_bandwidth, self.hardware.link_latency_s

    def pp_bytes(self, tokens):
        """Bytes each GPU sends to the next stage for ``tokens`` tokens: the hidden states and the residual
        (vLLM's IntermediateTensors), each TP rank its 1/tp slice (``send_tensor_dict`` with the TP group as
        all-gather group)."""
        return 2 * tokens * self.model.hidden_size * self.model.dtype_bytes / self.tp

    def _check_links(self) -> None:
        self.tp_link()
        for i in range(self.pp - 1):
            self.pp_link(i)

    def topology_notes(self) -> list[str]:
        """Warnings about the placement (a TP/EP group on the network), for the run's notes."""
        out = []
        if self.tp_spans_nodes:
            hw = self.hardware
            out.append(f"--tp {self.tp} spans nodes ({hw.scaleup_domain} {hw.name} GPUs per scale-up domain): its "
                       f"all-reduces{' and all-to-alls' if self.ep > 1 else ''} are priced on the "
                       f"{hw.net_bandwidth / 1e9:.0f} GB/s network, not the {hw.link_bandwidth / 1e9:.0f} GB/s "
                       f"scale-up link; engines place TP within a node (use --pp across nodes)")
        return out

    # ---- memory -----------------------------------------------------------------------------
    @property
    def weight_bytes_per_gpu(self) -> float:
        return self._stage_weights_per_gpu(self._stage_index())

    @property
    def activation_reserve_bytes(self) -> float:
        return self._activation_bytes(last=self.pp == 1 or self.stage in (-1, self.pp - 1))

    def _activation_bytes(self, last: bool = True) -> float:
        """Peak activations of the largest step plus the logits buffer, per GPU.

        The widest live tensors of a step are the MLP input to the activation (2 x intermediate, fused
        gate/up) and its output, plus the residual stream and QKV; logits are float32 over the vocabulary
        for every sequence that samples. A floor of 512 MiB covers the CUDA context and workspaces.
        MoE layers hold each token's top-k expert rows (and the shared experts') instead of the MLP's; with expert
        parallelism a GPU receives only the rows routed to its own experts, 1/ep of them with the routing spread
        evenly (as the engines' own profiling runs measure it), each split over the etp = tp / ep GPUs of its expert.
        """
        m = self.model
        mlp = (m.mlp_in_out + m.intermediate_size) / self.tp if m.dense_layers else 0.0
        if m.is_moe:
            etp = self.tp // self.ep
            rows = m.experts_per_token / self.ep  # routed (token, expert) rows a GPU holds per token of the step
            moe = (3 * m.moe_intermediate_size * rows / etp
                   + 3 * m.shared_intermediate_size / self.tp + rows * m.hidden_size)
            mlp = max(mlp, moe)
        per_token = mlp + 3 * m.hidden_size + m.qkv_out / self.tp
        act = self.max_batched_tokens * per_token * m.dtype_bytes
        logits = self.max_seqs * m.vocab_size * 4 / self.tp if last else 0.0
        return max(act + logits, 512 * 2**20)

    @property
    def kv_capacity_bytes(self) -> float:
        """KV-cache bytes of the whole replica (all its GPUs)."""
        if self.kv_capacity_override:
            return float(self.kv_capacity_override)
        if self.pp > 1:
            return float(min(self.stage_kv_tokens()) * self.kv_bytes_per_token)
        return self._kv_bytes_per_gpu(self.weight_bytes_per_gpu, last=True) * self.tp

    @property
    def _usable_bytes(self) -> float:
        """Device bytes per GPU the engine may fill with weights, activations and KV."""
        return self.hardware.memory_bytes * (1.0 if self.kv_of_free else self.gpu_memory_utilization)

    def _beside_weights(self, last: bool) -> float:
        """Bytes per GPU that come out of the engine's memory beside the weights and the KV pool: the activation
        reserve of a stage (``last``: the one with the LM head; none where the fraction holds weights and KV only,
        ``static_fraction``) and the sliding-window layers' KV, a whole window for each of ``max_seqs`` sequences
        (the per-token KV counts only the full-attention layers)."""
        return (0.0 if self.static_fraction else self._activation_bytes(last)) + self._window_reserve

    def _kv_bytes_per_gpu(self, weights: float, last: bool) -> float:
        """KV bytes per GPU of a stage beside ``weights`` and what else it holds (``_beside_weights``; see
        ``kv_of_free``)."""
        act = self._beside_weights(last)
        if self.kv_of_free:
            free = self.hardware.memory_bytes - weights - act
            return self.gpu_memory_utilization * free if free > 0 else free
        return self.hardware.memory_bytes * self.gpu_memory_utilization - weights - act

    @property
    def _window_reserve(self) -> float:
        """Bytes per GPU the sliding-window layers' KV takes: a whole window for every sequence in flight on the
        stage (``max_seqs`` per virtual engine, ``pp`` of them on a pipeline, each stage holding its 1/pp of the
        layers); 0 for a model without sliding-window layers."""
        m = self.model
        if not m.sliding_layers:
            return 0.0
        return self.max_seqs * m.window_kv_bytes * (1 if self.dp > 1 else max(1, self.tp // m.num_kv_heads)) / self.tp

    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token on the whole replica; heads are replicated when tp > KV heads, and MLA's
        latent (shared by all heads) is held whole by every GPU of the group, as vLLM keeps it. Under attention data
        parallelism (``dp`` > 1) a token's KV is whole on the one GPU that runs its sequence."""
        if self.dp > 1:
            return self.model.kv_bytes_per_token
        if self.model.is_mla:
            return self.model.kv_bytes_per_token * self.tp
        return self.model.kv_bytes_per_token * max(1, self.tp // self.model.num_kv_heads)

    @property
    def kv_capacity_tokens(self) -> int:
        return int(self.kv_capacity_bytes // self.kv_bytes_per_token)

    def num_blocks(self, block_size: int) -> int:
        return self.kv_capacity_tokens // block_size


def attn_dp_gpus(model, tp: int, attn_dp: bool) -> int:
    """GPUs attention runs data-parallel over: the TP group (each pipeline stage's) for a MoE model with attention
    data parallelism on, else 1 (attention split ``tp`` ways)."""
    return tp if (attn_dp and tp > 1 and model.is_moe) else 1


def make_deployment(model: str, hardware: str, tp: int = 1, dtype: str | None = None, weights: str | None = None,
                    kv_dtype: str | None = None, **kw) -> Deployment:
    """A deployment from a model preset or config.json path and a hardware preset name."""
    from blendsim.sim.hardware import get_hardware
    from blendsim.sim.models import get_model

    return Deployment(get_model(model, dtype, weights, kv_dtype), get_hardware(hardware), tp, **kw)


__all__ = ["Deployment", "attn_dp_gpus", "deployment_name", "make_deployment", "split_label"]
