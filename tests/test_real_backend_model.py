"""The model's executed work is the cost model's accounting, and prefix reuse skips exactly the cached work.

FLOPs are counted on the executed forward: each operator runs inside ``ops(name)``, which here opens a
``torch.utils.flop_counter.FlopCounterMode`` (GEMMs) and a dispatch mode that counts the (query, key)
pairs every ``scaled_dot_product_attention`` call leaves unmasked (attention).

Convention: ``blendsim.sim.ops`` prices attention by the pairs a token must see (prefill: n*c + n(n+1)/2 per
chunk; decode: context + 1), 4 * head_dim FLOPs per pair and query head. The CPU kernels are handed more
than that — the whole n x (c + n) rectangle under a mask for a chunk after context, and decodes padded
to their length group's longest (``blendsim.real_backend.attention.DECODE_PAD``) — but the extra pairs are
masked out; the unmasked pairs counted here are the cost model's pairs exactly. FlashAttention and
FlashInfer skip masked tiles, so on GPU the work is those pairs up to tile rounding.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from blendsim.real_backend.executor import DeviceRuntime, TorchExecutor
from blendsim.sim.batch import Batch
from blendsim.sim.deployment import Deployment
from blendsim.sim.hardware import get_hardware
from blendsim.sim.models import get_model
from blendsim.sim.ops import GEMM_OPS, OPS, Shapes, op_counts
from blendsim.sim.prefix_tree import PrefixTree
from blendsim.workloads.trace import from_columns


class _PairCount(TorchDispatchMode):
    """Counts unmasked (query, key) pairs per query head of every SDPA call: the pairs over all of a call's
    heads and query rows, divided by the model's query heads (a decode call that folds the query heads
    sharing a KV head into its query rows has ``kv_heads`` heads of ``q_heads / kv_heads`` rows)."""

    def __init__(self, q_heads: int):
        super().__init__()
        self.pairs, self.q_heads = 0, q_heads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "scaled_dot_product" in str(func):
            q, k = args[0], args[1]
            mask = kwargs.get("attn_mask", args[3] if len(args) > 3 else None)
            causal = kwargs.get("is_causal", args[5] if len(args) > 5 else False)
            L, S = q.shape[-2], k.shape[-2]
            if mask is not None:
                n = int(mask.expand(*q.shape[:-1], S).sum())
            elif causal:
                n = q.shape[0] * q.shape[1] * L * (L + 1) // 2
            else:
                n = q.shape[0] * q.shape[1] * L * S
            assert n % self.q_heads == 0
            self.pairs += n // self.q_heads
        return func(*args, **kwargs)


class _Counter:
    """``ops(name)``: FLOPs per operator (GEMMs by FlopCounterMode) and attention pairs."""

    def __init__(self):
        self.flops = defaultdict(int)
        self.pairs = defaultdict(int)

    @contextlib.contextmanager
    def __call__(self, name):
        fc, pc = FlopCounterMode(display=False), _PairCount(SPEC.num_heads)
        with fc, pc:
            yield
        self.flops[name] += fc.get_total_flops()
        self.pairs[name] += pc.pairs

    def result(self):
        return {}


SPEC = get_model("tiny")


@pytest.fixture(scope="module")
def runtime():
    return DeviceRuntime(SPEC)


def _trace():
    """Requests 0-3 share 40 tokens; 4-7 are unrelated prompts of 30-60 tokens."""
    prompts = [[(1, 40), (10 + i, 8 + 3 * i)] for i in range(4)] + [None] * 4
    return from_columns(input_len=[48, 51, 54, 57, 30, 40, 50, 60], output_len=[8] * 8, prompts=prompts)


def _executor(runtime, trace, block_size=8, blocks=200):
    return TorchExecutor(runtime, trace, PrefixTree(trace), block_size, blocks)


def _count(ex, batch):
    """Run ``batch`` with counting ops; returns (counter, logits)."""
    c = _Counter()
    inp = ex.book.inputs(batch)
    args = ex._to_device(inp)
    ex.attn.plan(inp)
    logits = ex.rt.model(*args, ex.attn, ex.kv, c)
    return c, logits


def _expected(spec, batch):
    """Per operator FLOPs from the cost model (layer operators times the layer count)."""
    shapes = Shapes.of(Deployment(spec, get_hardware("cpu")))
    out = {}
    for op, (f, _b, _k) in op_counts(shapes, batch.features()).items():
        out[op] = int(f) * (spec.num_layers if OPS[op][1] == "layer" else 1)
    return out


def _check(c, batch, spec=SPEC):
    want = _expected(spec, batch)
    for op in GEMM_OPS:
        assert c.flops[op] == want[op], op  # GEMMs exactly
    f = batch.features()
    assert c.pairs["attn_prefill"] == f.attn_pairs * spec.num_layers
    assert 4 * spec.q_dim * c.pairs["attn_prefill"] == want["attn_prefill"]
    assert c.pairs["attn_decode"] == (f.decode_ctx_sum + f.num_decode) * spec.num_layers
    assert 4 * spec.q_dim * c.pairs["attn_decode"] == want["attn_decode"]


def test_flops_of_prefill_decode_and_mixed_steps_match_the_cost_model(runtime):
    trace = _trace()
    ex = _executor(runtime, trace)
    # step 0: request 4 whole, request 5 in a first chunk of 25 tokens
    ex.apply("chunk", 4, 30, 0, 0)
    ex.apply("chunk", 5, 25, 0, 0)
    b0 = Batch(0, [(4, 30, 0, 0), (5, 25, 0, 0)], 0, 0, 1)
    c, logits = _count(ex, b0)
    _check(c, b0)
    assert logits.shape == (1, SPEC.vocab_size) and logits.dtype == torch.float32
    # step 1: the rest of request 5 after 25 tokens of context (causal over context + chunk), decode 4
    ex.apply("chunk", 5, 15, 25, 0)
    ex.apply("decode", 4, 30, 0, 0)
    b1 = Batch(1, [(5, 15, 25, 0)], 1, 30, 2, [(4, 30)])
    c, _ = _count(ex, b1)
    _check(c, b1)
    # step 2: decodes of different lengths (two length groups) and a new prefill
    ex.apply("chunk", 6, 50, 0, 0)
    ex.apply("decode", 4, 31, 0, 0)
    ex.apply("decode", 5, 40, 0, 0)
    b2 = Batch(2, [(6, 50, 0, 0)], 2, 71, 3, [(4, 31), (5, 40)])
    c, _ = _count(ex, b2)
    _check(c, b2)
    # step 3: decode only
    for r, ctx in ((4, 32), (5, 41), (6, 50)):
        ex.apply("decode", r, ctx, 0, 0)
    b3 = Batch(3, [], 3, 123, 3, [(4, 32), (5, 41), (6, 50)])
    c, _ = _count(ex, b3)
    _check(c, b3)
    assert c.flops["lm_head"] == 2 * 3 * SPEC.hidden_size * SPEC.vocab_size  # only the sampled rows


def _logits(ex, batch):
    inp = ex.book.inputs(batch)
    args = ex._to_device(inp)
    ex.attn.plan(inp)
    return ex.rt.model(*args, ex.attn, ex.kv, lambda name: contextlib.nullcontext())


@pytest.mark.parametrize("block_size", [1, 8, 16])
def test_prefix_reuse_computes_only_new_tokens_and_equals_a_full_recompute(runtime, block_size):
    trace = _trace()
    tree = PrefixTree(trace)
    shared = int(tree.parent[tree.req_node[0]])
    hit = 40 // block_size * block_size
    ex = _executor(runtime, trace, block_size)
    ex.apply("chunk", 0, 48, 0, 0)
    ex.apply("insert", 0, shared, 0, 40 // block_size)
    _logits(ex, Batch(0, [(0, 48, 0, 0)], 0, 0, 1))
    ex.apply("finish", 0, 0, 0, 0)  # its private tail is freed; the shared blocks stay cached
    ex.apply("chunk", 1, 51 - hit, hit, hit)
    b = Batch(1, [(1, 51 - hit, hit, hit)], 0, 0, 1)
    assert ex.blocks.tables[1][:hit // block_size] == [ex.blocks.block_map[(shared, i)] for i in range(hit // block_size)]
    c, reused = _count(ex, b)
    _check(c, b)
    assert c.flops["qkv_proj"] == 2 * (51 - hit) * SPEC.hidden_size * SPEC.qkv_out * SPEC.num_layers
    fresh = _executor(runtime, trace, block_size)
    fresh.apply("chunk", 1, 51, 0, 0)
    full = _logits(fresh, Batch(0, [(1, 51, 0, 0)], 0, 0, 1))
    torch.testing.assert_close(reused, full, rtol=1e-4, atol=1e-4)


def test_reuse_across_chunk_boundaries_and_within_one_step(runtime):
    """Request 2 hits the prefix request 1 inserts in the same step (its KV is written by the layer
    before it is read), then finishes in chunks that do not align with blocks."""
    trace = _trace()
    tree = PrefixTree(trace)
    shared = int(tree.parent[tree.req_node[0]])
    B = 16
    ex = _executor(runtime, trace, B)
    ex.apply("chunk", 1, 51, 0, 0)
    ex.apply("insert", 1, shared, 0, 2)  # 32 of the 40 shared tokens are whole blocks
    ex.apply("chunk", 2, 5, 32, 32)
    _logits(ex, Batch(0, [(1, 51, 0, 0), (2, 5, 32, 32)], 0, 0, 1))
    ex.apply("chunk", 2, 11, 37, 0)
    ex.apply("decode", 1, 51, 0, 0)
    _logits(ex, Batch(1, [(2, 11, 37, 0)], 1, 51, 1, [(1, 51)]))
    ex.apply("chunk", 2, 6, 48, 0)
    ex.apply("decode", 1, 52, 0, 0)
    got = _logits(ex, Batch(2, [(2, 6, 48, 0)], 1, 52, 2, [(1, 52)]))
    fresh = _executor(runtime, trace, B)
    fresh.apply("chunk", 2, 54, 0, 0)
    want = _logits(fresh, Batch(0, [(2, 54, 0, 0)], 0, 0, 1))
    torch.testing.assert_close(got[:1], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("changes", [{"gated_mlp": False, "rope": False, "tie_word_embeddings": True},
                                     {"qkv_bias": True, "num_kv_heads": 8}])
def test_other_layouts_count_right(changes):
    """OPT-like (plain MLP, learned positions, tied LM head) and Qwen2-like MHA with a QKV bias."""
    from dataclasses import replace

    spec = replace(get_model("tiny"), **changes)
    ex = _executor(DeviceRuntime(spec, seed=1), _trace())
    ex.apply("chunk", 4, 30, 0, 0)
    ex.apply("chunk", 7, 20, 0, 0)
    b = Batch(0, [(4, 30, 0, 0), (7, 20, 0, 0)], 0, 0, 1)
    c, logits = _count(ex, b)
    _check(c, b, spec)
    assert torch.isfinite(logits).all()


def test_same_seed_same_weights_and_logits():
    trace = _trace()
    outs = []
    for _ in range(2):
        ex = _executor(DeviceRuntime(SPEC, seed=7), trace)
        ex.apply("chunk", 5, 40, 0, 0)
        outs.append(_logits(ex, Batch(0, [(5, 40, 0, 0)], 0, 0, 1)))
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], _logits_seed(trace, 8))
    assert np.isfinite(outs[0].numpy()).all()


def _logits_seed(trace, seed):
    ex = _executor(DeviceRuntime(SPEC, seed=seed), trace)
    ex.apply("chunk", 5, 40, 0, 0)
    return _logits(ex, Batch(0, [(5, 40, 0, 0)], 0, 0, 1))
