"""The Batch: what one engine iteration runs, and the small features object the cost model prices.

A run's Batches, in order, are its *schedule*: the simulator prices them, the real backend executes
them. Decode sequences are carried in aggregate (count and summed context) because a step may hold
thousands of them and the engine must not touch each one every step; the ids are materialised only
when the schedule is recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


@dataclass(slots=True)
class Batch:
    """Scheduler output for one iteration of one replica."""

    step: int  # iteration index on this replica, from 0
    prefill: list  # [(request, new_tokens, context_before, cached_tokens)] prefill chunks this step
    num_decode: int  # decode sequences, one new token each
    decode_ctx_sum: int  # sum over decode sequences of context_before (tokens already in their KV)
    num_logits: int  # sequences that sample a token (decodes + prefills that finish their prompt)
    decode: list | None = None  # [(request, context_before)] only when the schedule is recorded

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c[1] for c in self.prefill)

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decode

    @property
    def num_seqs(self) -> int:
        return len(self.prefill) + self.num_decode

    def features(self) -> BatchFeatures:
        return BatchFeatures.from_parts(self.prefill, self.num_decode, self.decode_ctx_sum, self.num_logits)


def prefill_sums(prefill) -> tuple[int, int, int]:
    """``(new tokens, causal (query, key) pairs, KV tokens read)`` of a step's prefill chunks
    ``[(request, new_tokens, context_before, cached)]``: the one batch-to-features rule (BatchFeatures,
    the engine's executor and the fidelity recorder use it). A chunk of n new tokens after c of context
    attends causally, so token j sees c + j + 1 keys and the chunk n*c + n*(n+1)/2."""
    tp = pairs = kv = 0
    for _, n, c, _cached in prefill:
        tp += n
        pairs += n * c + n * (n + 1) // 2
        kv += c + n
    return tp, pairs, kv


@dataclass(frozen=True, slots=True)
class BatchFeatures:
    """Everything the cost model needs to price a step; all counts are whole-replica. The one feature
    record of the cost model: fields are numbers for one step or equal-length arrays for many
    (:func:`features_arrays`; the fidelity re-pricer keeps recorded schedules this way).

    ``attn_pairs`` counts (query, key) pairs of the prefill attention (see :func:`prefill_sums`).
    """

    num_tokens: int = 0  # all new tokens (prefill + decode): the GEMMs' M
    num_prefill_tokens: int = 0
    num_prefill_seqs: int = 0
    attn_pairs: int = 0  # prefill (query, key) pairs, causal
    prefill_kv_tokens: int = 0  # sum over prefill chunks of context + new tokens (KV the kernel reads)
    num_decode: int = 0  # decode sequences
    decode_ctx_sum: int = 0  # sum of their context before this token
    num_logits: int = 0  # rows through the LM head

    @staticmethod
    def from_parts(prefill, num_decode: int, decode_ctx_sum: int, num_logits: int) -> BatchFeatures:
        tp, pairs, kv = prefill_sums(prefill)
        return BatchFeatures(tp + num_decode, tp, len(prefill), pairs, kv, num_decode, decode_ctx_sum, num_logits)

    @staticmethod
    def prefill_only(tokens: int, context: int = 0, seqs: int = 1) -> BatchFeatures:
        """``seqs`` equal chunks of ``tokens // seqs`` new tokens after ``context`` each."""
        n = tokens // seqs
        parts = [(i, n, context, 0) for i in range(seqs)]
        return BatchFeatures.from_parts(parts, 0, 0, seqs)

    @staticmethod
    def decode_only(seqs: int, context: int) -> BatchFeatures:
        return BatchFeatures(seqs, 0, 0, 0, 0, seqs, seqs * context, seqs)


FEATURE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(BatchFeatures))


def features_arrays(**arrays) -> BatchFeatures:
    """BatchFeatures of many steps: arrays named like its fields (missing ones are 0)."""
    return BatchFeatures(**{k: np.asarray(v) for k, v in arrays.items()})


__all__ = ["Batch", "BatchFeatures", "FEATURE_FIELDS", "features_arrays", "prefill_sums"]
