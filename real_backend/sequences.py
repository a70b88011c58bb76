"""Per-request state of a replay and the ragged inputs of one step.

:class:`SequenceBook` applies the simulator's schedule events (``chunk``, ``decode``, ``insert``,
``evict``, ``preempt``, ``finish``; see ``blendsim.sim.scheduler.Scheduler.events``) to a :class:`BlockManager`,
checking each against the state it implies (a chunk continues where the sequence's KV ends, a decode
reads exactly its context), and turns a :class:`blendsim.sim.batch.Batch` into :class:`StepInputs`: token ids,
positions, KV slots and the per-sequence attention layout, prefill chunks first, then decodes.

Token ids are deterministic and need no tokenizer: a prompt of token ids keeps them (modulo the
vocabulary); a synthetic segment ``(segment_id, length)`` becomes a hashed id per (segment, offset), so
requests that share a prefix in the prefix tree have identical tokens there. Output tokens are forced by
the schedule (no EOS); output token k of request r is a hash of (r, k).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from blendsim.real_backend.paged_kv import BlockManager, ScheduleMismatch
from blendsim.workloads.trace import SEGMENT_BASE

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, elementwise on uint64 (wraps modulo 2**64)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def prompt_tokens(trace, req: int, vocab: int) -> np.ndarray:
    """Token ids of request ``req``'s prompt (int64, length ``input_len``)."""
    sym, ln = trace.units(req)
    ids = np.repeat(sym, ln).astype(np.uint64)
    offs = (np.arange(len(ids)) - np.repeat(np.cumsum(ln) - ln, ln)).astype(np.uint64)
    with np.errstate(over="ignore"):
        key = ids * np.uint64(1 << 20) + offs  # one key per (segment, offset); wraps by design
    hashed = _mix(key)
    seg = np.repeat(sym >= SEGMENT_BASE, ln)
    return np.where(seg, hashed % np.uint64(vocab), ids % np.uint64(vocab)).astype(np.int64)


def output_tokens(req, k, vocab: int) -> np.ndarray:
    """Output token ids: the ``k``-th output of request ``req`` (arrays or numbers, broadcast)."""
    r = np.asarray(req, dtype=np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        key = r * np.uint64(0x9E3779B97F4A7C15) + np.asarray(k, dtype=np.uint64)
    x = _mix(key)
    return (x % np.uint64(vocab)).astype(np.int64)


@dataclass(slots=True)
class StepInputs:
    """One step's ragged batch, host side (numpy); prefill chunks first, then decodes."""

    input_ids: np.ndarray  # [T] token ids
    positions: np.ndarray  # [T] position of each token in its sequence
    slots: np.ndarray  # [T] KV slot each token's K/V is written to
    logits_rows: np.ndarray  # [N] rows of the tokens that sample (last of a finished prefill, every decode)
    q_start: np.ndarray  # [S+1] row offsets of each sequence's new tokens (prefills, then decodes)
    kv_len: np.ndarray  # [S] tokens each sequence attends to (context + its new tokens)
    block_tables: list  # [S] physical blocks of each sequence (np.int64 arrays)
    num_prefill_seqs: int  # the first this many sequences are prefill chunks

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def attn_pairs(self) -> int:
        """Causal (query, key) pairs of the prefill chunks: n*c + n(n+1)/2 each."""
        p = self.num_prefill_seqs
        n = np.diff(self.q_start[:p + 1])
        c = self.kv_len[:p] - n
        return int((n * c + n * (n + 1) // 2).sum())

    @property
    def decode_keys(self) -> int:
        """Keys the decode tokens read: their context plus themselves."""
        return int(self.kv_len[self.num_prefill_seqs:].sum())


class SequenceBook:
    """Requests' KV and token state on one replica, driven by schedule events."""

    def __init__(self, trace, blocks: BlockManager, vocab: int):
        self.trace = trace
        self.blocks = blocks
        self.vocab = int(vocab)
        self.P = trace.input_len
        self.resume: dict[int, int] = {}  # preempted request -> tokens it had generated
        self._prompt: dict[int, np.ndarray] = {}

    # ---- events ---------------------------------------------------------------------------
    def apply(self, kind: str, req: int, a: int, b: int, c: int) -> None:
        """Apply one schedule event (``blendsim.sim.scheduler.Scheduler.events`` without the step column)."""
        bm = self.blocks
        if kind == "chunk":
            n, ctx, cached = a, b, c
            if req not in bm.tables:
                if cached != ctx:
                    raise ScheduleMismatch(f"request {req} starts a chunk at {ctx} with {cached} cached tokens")
                bm.admit(req, cached)
            elif bm.lengths[req] != ctx:
                raise ScheduleMismatch(f"request {req}: chunk after {ctx} tokens, but its KV holds {bm.lengths[req]}")
            if ctx + n > self.target(req):
                raise ScheduleMismatch(f"request {req}: chunk to {ctx + n} passes its target {self.target(req)}")
            bm.extend(req, ctx + n)
        elif kind == "decode":
            if bm.lengths.get(req) != a:
                raise ScheduleMismatch(f"request {req}: decode after {a} tokens, but its KV holds {bm.lengths.get(req)}")
            if a < self.target(req):
                raise ScheduleMismatch(f"request {req} decodes after {a} tokens, before its prompt and the "
                                       f"{self.resume.get(req, 0)} tokens it generated before preemption are in KV")
            bm.extend(req, a + 1)
        elif kind == "insert":
            bm.insert(req, a, b, c)
        elif kind == "evict":
            bm.evict(a, b, c)
        elif kind == "preempt":
            bm.release(req)
            self.resume[req] = a
        elif kind == "finish":
            bm.release(req)
            self.resume.pop(req, None)
            self._prompt.pop(req, None)
        else:
            raise ScheduleMismatch(f"unknown schedule event kind {kind!r}")

    def target(self, req: int) -> int:
        """Tokens that must be in KV before the request samples: its prompt plus recomputed output."""
        return int(self.P[req]) + self.resume.get(req, 0)

    # ---- inputs ---------------------------------------------------------------------------
    def tokens(self, req: int, start: int, end: int) -> np.ndarray:
        """Token ids at positions ``start .. end-1`` of ``req`` (prompt, then forced output)."""
        p = int(self.P[req])
        parts = []
        if start < p:
            pr = self._prompt.get(req)
            if pr is None:
                pr = self._prompt[req] = prompt_tokens(self.trace, req, self.vocab)
            parts.append(pr[start:min(end, p)])
        if end > p:
            lo = max(start, p)
            parts.append(output_tokens(req, np.arange(lo - p, end - p), self.vocab))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def inputs(self, batch) -> StepInputs:
        """The ragged inputs of ``batch``; its sequences' KV must already be allocated (events applied)."""
        bm = self.blocks
        ids, pos, slots, rows, tables = [], [], [], [], []
        q_start, kv_len = [0], []
        row = 0
        for req, n, ctx, _cached in batch.prefill:
            if bm.lengths.get(req) != ctx + n:
                raise ScheduleMismatch(f"request {req}: batch chunk {ctx}+{n} does not match its KV")
            ids.append(self.tokens(req, ctx, ctx + n))
            pos.append(np.arange(ctx, ctx + n, dtype=np.int64))
            slots.append(bm.slots(req, ctx, ctx + n))
            row += n
            if ctx + n == self.target(req):
                rows.append(row - 1)
            q_start.append(row)
            kv_len.append(ctx + n)
            tables.append(bm.table(req))
        decode = batch.decode if batch.decode is not None else []
        if len(decode) != batch.num_decode:
            raise ScheduleMismatch(f"step {batch.step}: {batch.num_decode} decodes but {len(decode)} listed "
                                   f"(record the schedule)")
        if decode:
            dreq = np.fromiter((r for r, _ in decode), dtype=np.int64, count=len(decode))
            dctx = np.fromiter((c for _, c in decode), dtype=np.int64, count=len(decode))
            # a decode's input is the output token sampled last (its context is past the prompt)
            ids.append(output_tokens(dreq, dctx - self.P[dreq], self.vocab))
            pos.append(dctx)
            for r, c in zip(dreq.tolist(), dctx.tolist()):
                if bm.lengths.get(r) != c + 1:
                    raise ScheduleMismatch(f"request {r}: batch decode after {c} does not match its KV")
                t = bm.tables[r]
                slots.append(np.array([t[c // bm.B] * bm.B + c % bm.B], dtype=np.int64))
                tables.append(np.asarray(t, dtype=np.int64))
            rows.extend(range(row, row + len(decode)))
            q_start.extend(range(row + 1, row + len(decode) + 1))
            kv_len.extend((dctx + 1).tolist())
        cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64)  # noqa: E731
        out = StepInputs(cat(ids), cat(pos), cat(slots), np.asarray(rows, dtype=np.int64),
                         np.asarray(q_start, dtype=np.int64), np.asarray(kv_len, dtype=np.int64), tables,
                         len(batch.prefill))
        if len(out.logits_rows) != batch.num_logits:
            raise ScheduleMismatch(f"step {batch.step}: {len(out.logits_rows)} sequences sample, the batch says "
                                   f"{batch.num_logits}")
        return out


__all__ = ["SequenceBook", "StepInputs", "output_tokens", "prompt_tokens"]
