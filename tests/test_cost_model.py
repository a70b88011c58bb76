"""The cost model: per-operator accounting, roofline properties, fast paths, published and measured
kernel times, engine overheads, and calibration profiles.

Accounting tests spell out every FLOP and byte by hand (per GPU, one layer for layer operators):
a GEMM of M rows, K inputs and N outputs does 2 M K N FLOPs and moves its K x N weights, M x K inputs
and M x N outputs once; elementwise kernels read and write their tensors once.
"""

from __future__ import annotations

import json
import math
from functools import cache, lru_cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blendsim.sim.batch import Batch, BatchFeatures, features_arrays
from blendsim.sim.build_cost import build_cost_model
from blendsim.sim.cost import CostModel
from blendsim.sim.deployment import Deployment
from blendsim.sim.engines import PROFILES, get_profile
from blendsim.sim.errors import UserError
from blendsim.sim.hardware import get_hardware
from blendsim.sim.models import ModelSpec, get_model
from blendsim.sim.profile import OpFit, Profile, ProfileTimer, load_profile, model_shape
from blendsim.sim.timers import RooflineTimer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@cache
def dep(model: str = "llama-3-8b", hw: str = "a100-80gb", tp: int = 1) -> Deployment:
    return Deployment(get_model(model), get_hardware(hw), tp, kv_capacity_override=10**12)


@cache
def cm(model: str = "llama-3-8b", hw: str = "a100-80gb", tp: int = 1, mode: str = "sequential",
       engine: str = "ideal") -> CostModel:
    """The roofline at the preset's efficiencies with ``engine``'s per-step overhead (no CUDA graphs)."""
    return CostModel(dep(model, hw, tp), mode, get_profile(engine, {}))


def rows(model_cm: CostModel, f: BatchFeatures) -> dict[str, tuple[float, float]]:
    return {r["op"]: (r["flops"], r["bytes"]) for r in model_cm.breakdown(f)}


def step_of(c: CostModel, f: BatchFeatures):
    return c.step(f.num_tokens, f.num_prefill_tokens, f.num_prefill_seqs, f.attn_pairs, f.prefill_kv_tokens,
                  f.num_decode, f.decode_ctx_sum, f.num_logits)


# The three batches of the accounting tests.
# P: one prefill chunk of 512 new tokens after 1024 context tokens; it finishes its prompt (1 logit).
PREFILL = BatchFeatures.from_parts([(0, 512, 1024, 0)], 0, 0, 1)
# D: 64 decoding sequences whose contexts sum to 128,000 tokens.
DECODE = BatchFeatures(num_tokens=64, num_decode=64, decode_ctx_sum=128_000, num_logits=64)
# M: a 256-token chunk after 512 tokens (prompt not finished: no logit) plus 100 decodes (150,000 ctx).
MIXED = BatchFeatures.from_parts([(0, 256, 512, 0)], 100, 150_000, 100)


def test_batch_features_by_hand():
    # causal pairs of a chunk of n after c: token j sees c + j keys, sum = n c + n (n + 1) / 2
    assert PREFILL.attn_pairs == 512 * 1024 + 512 * 513 // 2 == 655_616
    assert PREFILL.prefill_kv_tokens == 1536
    assert (MIXED.num_tokens, MIXED.num_prefill_tokens, MIXED.attn_pairs) == (356, 256, 256 * 512 + 256 * 257 // 2)
    b = Batch(step=0, prefill=[("r1", 100, 0, 0), ("r2", 28, 72, 72)], num_decode=5, decode_ctx_sum=900,
              num_logits=6)
    f = b.features()
    assert (b.num_tokens, b.num_seqs, f.num_tokens, f.num_prefill_seqs) == (133, 7, 133, 2)
    assert f.attn_pairs == 100 * 101 // 2 + 28 * 72 + 28 * 29 // 2
    assert BatchFeatures.decode_only(8, 100) == BatchFeatures(8, 0, 0, 0, 0, 8, 800, 8)


# ---- accounting: llama-3-8b (GQA, 8 KV heads) -------------------------------------------------
# per GPU at tp=1: H 4096, q 4096, kv 8 x 128 = 1024, gate+up 2 x 14336, I 14336, V 128256, bf16.


def test_llama3_8b_prefill_chunk_accounting():
    got = rows(cm("llama-3-8b"), PREFILL)
    T = 512
    exp = {
        "qkv_proj": (2 * T * 4096 * 6144, 2 * (4096 * 6144 + T * 4096 + T * 6144)),  # 25.77 GFLOP, 60.8 MB
        "rope": (6 * T * (4096 + 1024), 2 * 2 * T * (4096 + 1024)),  # rotate q and k in place
        "kv_write": (0, 2 * 2 * T * 2 * 1024),  # read new K and V, write them into the cache
        # QK^T and PV: 2 x 2 FLOPs per (query, key) pair per query channel; Q read and O written once,
        # K and V of all 1536 keys read once
        "attn_prefill": (4 * 4096 * 655_616, 2 * (2 * T * 4096 + 1536 * 2 * 1024)),
        "attn_decode": (0, 0),
        "o_proj": (2 * T * 4096 * 4096, 2 * (4096 * 4096 + T * 4096 + T * 4096)),
        # two fused residual-add + RMSNorm kernels: each reads x and the residual, writes both
        "norm": (2 * 5 * T * 4096, 2 * 2 * (4 * T * 4096 + 4096)),
        "gate_up_proj": (2 * T * 4096 * 28672, 2 * (4096 * 28672 + T * 4096 + T * 28672)),  # 120.26 GFLOP
        "act": (4 * T * 14336, 2 * 3 * T * 14336),  # SiLU(gate) * up: read two, write one
        "down_proj": (2 * T * 14336 * 4096, 2 * (14336 * 4096 + T * 14336 + T * 4096)),
        "embedding": (0, 2 * 2 * T * 4096),  # gather a row, write it
        # one sampled row: final norm (read, write) + head input read; fp32 logits written
        "lm_head": (2 * 1 * 4096 * 128256, 2 * (4096 * 128256 + 3 * 4096) + 4 * 128256),
        "allreduce": (0, 0),
    }
    assert got == {k: (float(a), float(b)) for k, (a, b) in exp.items()}
    assert exp["qkv_proj"][0] == 25_769_803_776 and exp["lm_head"][1] == 1_051_210_752


def test_llama3_8b_decode_accounting():
    got = rows(cm("llama-3-8b"), DECODE)
    T = D = 64
    keys = 128_000 + 64  # each new token attends its context and itself
    assert got["qkv_proj"] == (2 * T * 4096 * 6144, 2 * (4096 * 6144 + T * 4096 + T * 6144))
    assert got["attn_prefill"] == (0, 0)
    # decode attention reads every key's K and V (GQA: 1024 wide) and the query/output rows
    assert got["attn_decode"] == (4 * 4096 * keys, 2 * (keys * 2 * 1024 + 2 * D * 4096))
    assert got["attn_decode"][1] == 525_598_720  # 2 x (262,275,072 + 524,288)
    assert got["kv_write"] == (0, 2 * 2 * T * 2 * 1024)
    assert got["lm_head"] == (2 * 64 * 4096 * 128256, 2 * (4096 * 128256 + 3 * 64 * 4096) + 4 * 64 * 128256)
    assert got["down_proj"] == (2 * T * 14336 * 4096, 2 * (14336 * 4096 + T * 14336 + T * 4096))


def test_llama3_8b_mixed_accounting_lm_head_only_sampled_rows():
    got = rows(cm("llama-3-8b"), MIXED)
    T, D, N = 356, 100, 100  # the unfinished chunk samples nothing: 100 logit rows, not 356
    assert got["gate_up_proj"] == (2 * T * 4096 * 28672, 2 * (4096 * 28672 + T * 4096 + T * 28672))
    assert got["attn_prefill"] == (4 * 4096 * (256 * 512 + 256 * 257 // 2),
                                   2 * (2 * 256 * 4096 + (512 + 256) * 2 * 1024))
    assert got["attn_decode"] == (4 * 4096 * 150_100, 2 * (150_100 * 2 * 1024 + 2 * D * 4096))
    assert got["lm_head"] == (2 * N * 4096 * 128256, 2 * (4096 * 128256 + 3 * N * 4096) + 4 * N * 128256)
    # the same batch with the chunk finishing its prompt pays for one more row, and only one
    more = rows(cm("llama-3-8b"), BatchFeatures.from_parts([(0, 256, 512, 0)], 100, 150_000, 101))
    assert more["lm_head"][0] - got["lm_head"][0] == 2 * 4096 * 128256
    assert more["qkv_proj"] == got["qkv_proj"]


# ---- accounting: llama-2-7b (MHA) ------------------------------------------------------------
# per GPU at tp=1: H 4096, q = kv = 4096 (32 KV heads), gate+up 2 x 11008, I 11008, V 32000.


def test_llama2_7b_mha_accounting():
    p = rows(cm("llama-2-7b"), PREFILL)
    T = 512
    assert p["qkv_proj"] == (2 * T * 4096 * 12288, 2 * (4096 * 12288 + T * 4096 + T * 12288))
    assert p["rope"] == (6 * T * 8192, 2 * 2 * T * 8192)
    assert p["kv_write"] == (0, 2 * 2 * T * 2 * 4096)
    assert p["attn_prefill"] == (4 * 4096 * 655_616, 2 * (2 * T * 4096 + 1536 * 2 * 4096))
    assert p["gate_up_proj"] == (2 * T * 4096 * 22016, 2 * (4096 * 22016 + T * 4096 + T * 22016))
    assert p["act"] == (4 * T * 11008, 2 * 3 * T * 11008)
    assert p["down_proj"] == (2 * T * 11008 * 4096, 2 * (11008 * 4096 + T * 11008 + T * 4096))
    assert p["lm_head"] == (2 * 4096 * 32000, 2 * (4096 * 32000 + 3 * 4096) + 4 * 32000)
    d = rows(cm("llama-2-7b"), DECODE)
    # MHA reads 4x the KV of llama-3-8b's GQA for the same keys
    assert d["attn_decode"] == (4 * 4096 * 128_064, 2 * (128_064 * 2 * 4096 + 2 * 64 * 4096))
    m = rows(cm("llama-2-7b"), MIXED)
    assert m["o_proj"] == (2 * 356 * 4096 * 4096, 2 * (4096 * 4096 + 2 * 356 * 4096))
    assert m["attn_decode"][1] == 2 * (150_100 * 2 * 4096 + 2 * 100 * 4096)


# ---- accounting: opt-13b (plain MLP, learned positions, no rotary, fp16) -------------------------
# per GPU at tp=1: H 5120, q = kv = 5120, fc1 20480 (no gate), I 20480, V 50272, fp16.


def test_opt13b_non_gated_accounting():
    p = rows(cm("opt-13b"), PREFILL)
    T = 512
    assert p["qkv_proj"] == (2 * T * 5120 * 15360, 2 * (5120 * 15360 + T * 5120 + T * 15360))
    assert p["rope"] == (0, 0)  # learned positions: no rotary kernel
    assert p["gate_up_proj"] == (2 * T * 5120 * 20480, 2 * (5120 * 20480 + T * 5120 + T * 20480))
    assert p["act"] == (T * 20480, 2 * 2 * T * 20480)  # ReLU: read one, write one
    assert p["down_proj"] == (2 * T * 20480 * 5120, 2 * (20480 * 5120 + T * 20480 + T * 5120))
    assert p["embedding"] == (0, 2 * 2 * T * 5120 * 2)  # token row and position row
    assert p["lm_head"] == (2 * 5120 * 50272, 2 * (5120 * 50272 + 3 * 5120) + 4 * 50272)
    d = rows(cm("opt-13b"), DECODE)
    assert d["attn_decode"] == (4 * 5120 * 128_064, 2 * (128_064 * 2 * 5120 + 2 * 64 * 5120))
    assert rows(cm("opt-13b"), MIXED)["act"] == (356 * 20480, 2 * 2 * 356 * 20480)


# ---- accounting: tensor parallelism ---------------------------------------------------------


def test_tp2_halves_gemm_flops_and_adds_allreduce():
    one = rows(cm("llama-3-8b", tp=1), MIXED)
    two = rows(cm("llama-3-8b", tp=2), MIXED)
    for op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head", "attn_prefill", "attn_decode"):
        assert two[op][0] * 2 == one[op][0], op
    # per GPU: q 2048, kv 4 x 128 = 512, gate+up 14336, V 64128; all-reduce of the 356 x 4096 bf16
    # hidden state after attention and after the MLP in each of 32 layers
    assert two["qkv_proj"] == (2 * 356 * 4096 * 3072, 2 * (4096 * 3072 + 356 * 4096 + 356 * 3072))
    assert two["allreduce"] == (0, 2 * 356 * 4096 * 2 * 32)
    assert one["allreduce"] == (0, 0)
    c1, c2 = cm("llama-3-8b", tp=1).cost(MIXED), cm("llama-3-8b", tp=2).cost(MIXED)
    assert c1.comm_s == 0 and c2.comm_s > 0
    # ring all-reduce: 64 launches x 8 us + 2 (t - 1) / t x bytes / 300 GB/s
    assert c2.comm_s == pytest.approx(64 * 8e-6 + 2 * 0.5 * 2 * 356 * 4096 * 2 * 32 / 300e9, rel=1e-12)


# ---- roofline operator times by hand ----------------------------------------------------------


def _plain_max(model: str) -> CostModel:
    """The roofline with max(compute, memory) for GEMMs (the blend is tested on its own below)."""
    hw = get_hardware("a100-80gb").with_(gemm_roofline_blend=0)
    return CostModel(Deployment(get_model(model), hw))


def test_roofline_gemm_and_attention_times_by_hand():
    c = _plain_max("llama-3-8b")
    gemm = 312e12 * 0.70  # achievable FLOP/s
    bw = 2.039e12 * 0.80  # achievable bytes/s
    t = {r["op"]: r["time_s"] for r in c.breakdown(BatchFeatures.prefill_only(130))}
    # 130 rows run as two 128-row tiles: 256 rows of work
    flops = 2 * 256 * 4096 * 28672
    nbytes = 2 * (4096 * 28672 + 130 * 4096 + 130 * 28672)
    assert t["gate_up_proj"] == pytest.approx(max(flops / gemm, nbytes / bw) + 4e-6, rel=1e-12)
    # one decode row is weight-bound
    t1 = {r["op"]: r["time_s"] for r in c.breakdown(BatchFeatures.decode_only(1, 1000))}
    assert t1["qkv_proj"] == pytest.approx(2 * (4096 * 6144 + 4096 + 6144) / bw + 4e-6, rel=1e-12)
    keys = 1001
    assert t1["attn_decode"] == pytest.approx(2 * (keys * 2048 + 2 * 4096) / bw + 4e-6, rel=1e-12)
    # elementwise: bytes at 45% of the bandwidth plus a launch per kernel (norm runs two)
    assert t1["norm"] == pytest.approx(2 * 2 * (4 * 4096 + 4096) / (2.039e12 * 0.45) + 8e-6, rel=1e-12)


def test_gemm_blend_by_hand():
    # 100 rows sit near the A100 ridge: (tc^3 + tm^3)^(1/3) with tc on a 128-row tile
    t = {r["op"]: r["time_s"] for r in cm("llama-3-8b").breakdown(BatchFeatures.prefill_only(100))}
    tc = 2 * 128 * 4096 * 28672 / (312e12 * 0.70)
    tm = 2 * (4096 * 28672 + 100 * 4096 + 100 * 28672) / (2.039e12 * 0.80)
    assert t["gate_up_proj"] == pytest.approx((tc**3 + tm**3) ** (1 / 3) + 4e-6, rel=1e-12)
    assert t["gate_up_proj"] > max(tc, tm) + 4e-6
    # 40 rows run on a 64-row tile
    t40 = {r["op"]: r["time_s"] for r in cm("llama-3-8b").breakdown(BatchFeatures.prefill_only(40))}
    tc40 = 2 * 64 * 4096 * 28672 / (312e12 * 0.70)
    tm40 = 2 * (4096 * 28672 + 40 * 4096 + 40 * 28672) / (2.039e12 * 0.80)
    assert t40["gate_up_proj"] == pytest.approx((tc40**3 + tm40**3) ** (1 / 3) + 4e-6, rel=1e-12)


def test_each_sampled_row_adds_only_its_own_lm_head_bytes():
    c = _plain_max("llama-3-8b")
    t = {N: {r["op"]: r["time_s"] for r in c.breakdown(BatchFeatures.from_parts([(0, 512, 0, 0)], 0, 0, N))}
         for N in (1, 2)}
    # one more sampled row adds its 2 x 4096 x 128256 FLOPs and bytes, not another weight read
    extra_bytes = 2 * 3 * 4096 + 4 * 128256
    assert t[2]["lm_head"] - t[1]["lm_head"] == pytest.approx(extra_bytes / (2.039e12 * 0.8), rel=1e-9)


# a GEMM with no rows does not run: an LM head that samples nothing reads no weights


def test_lm_head_free_when_no_row_samples():
    # a 512-token chunk that does not finish its prompt samples nothing: no LM head should run
    t = {r["op"]: r["time_s"] for r in cm("llama-3-8b").breakdown(BatchFeatures.from_parts([(0, 512, 0, 0)], 0, 0, 0))}
    assert t["lm_head"] == 0.0  # actual: 1,050,673,152 B / 1.631 TB/s = 0.644 ms


def test_idle_step_costs_nothing():
    f = BatchFeatures()
    assert cm("llama-3-8b").cost(f).time_s == 0.0  # actual: 9.2 ms: every weight matrix read once


# ---- properties -------------------------------------------------------------------------------

MODELS = ("llama-3-8b", "llama-2-7b", "opt-13b")


@FAST
@given(model=st.sampled_from(MODELS), mode=st.sampled_from(["sequential", "overlap"]),
       engine=st.sampled_from(sorted(PROFILES)), t1=st.integers(1, 8192), t2=st.integers(1, 8192),
       ctx=st.integers(0, 16384))
def test_more_prefill_tokens_never_faster(model, mode, engine, t1, t2, ctx):
    lo, hi = sorted((t1, t2))
    c = cm(model, mode=mode, engine=engine)
    assert c.cost(BatchFeatures.prefill_only(lo, ctx)).time_s <= c.cost(BatchFeatures.prefill_only(hi, ctx)).time_s


@FAST
@given(model=st.sampled_from(MODELS), mode=st.sampled_from(["sequential", "overlap"]), n=st.integers(1, 4096),
       c1=st.integers(0, 32768), c2=st.integers(0, 32768), d=st.integers(0, 1024))
def test_more_context_never_faster(model, mode, n, c1, c2, d):
    lo, hi = sorted((c1, c2))
    c = cm(model, mode=mode, engine="vllm")
    a = c.cost(BatchFeatures.from_parts([(0, n, lo, 0)], d, d * lo, d + 1)).time_s
    b = c.cost(BatchFeatures.from_parts([(0, n, hi, 0)], d, d * hi, d + 1)).time_s
    assert a <= b


@FAST
@given(model=st.sampled_from(MODELS), mode=st.sampled_from(["sequential", "overlap"]), b1=st.integers(1, 1024),
       b2=st.integers(1, 1024), ctx=st.integers(1, 16384), tp=st.sampled_from([1, 2, 4]))
def test_larger_decode_batch_never_faster(model, mode, b1, b2, ctx, tp):
    lo, hi = sorted((b1, b2))
    c = cm(model, tp=tp, mode=mode)
    assert c.cost(BatchFeatures.decode_only(lo, ctx)).time_s <= c.cost(BatchFeatures.decode_only(hi, ctx)).time_s


@st.composite
def batches(draw, max_chunks: int = 4):
    """Random mixed batches: prefill chunks (64-8192 tokens after 0-16K context) and decodes."""
    chunks = draw(st.lists(st.tuples(st.integers(1, 8192), st.integers(0, 16384), st.booleans()),
                           max_size=max_chunks))
    d = draw(st.integers(0, 1024))
    cd = draw(st.integers(d, d * 16384)) if d else 0
    if not chunks and d == 0:
        d, cd = 1, draw(st.integers(1, 16384))
    parts = [(i, n, c, 0) for i, (n, c, _) in enumerate(chunks)]
    return BatchFeatures.from_parts(parts, d, cd, d + sum(done for *_, done in chunks))


@FAST
@given(f=batches(), model=st.sampled_from(MODELS), tp=st.sampled_from([1, 2, 4]))
def test_overlap_between_max_and_sequential(f, model, tp):
    seq = cm(model, tp=tp, mode="sequential").cost(f)
    ovl = cm(model, tp=tp, mode="overlap").cost(f)
    assert (ovl.compute_s, ovl.memory_s) == (seq.compute_s, seq.memory_s)
    assert ovl.time_s <= seq.time_s * (1 + 1e-12)
    assert ovl.time_s >= max(ovl.compute_s, ovl.memory_s, ovl.comm_s)
    assert seq.time_s == pytest.approx(seq.compute_s + seq.memory_s + seq.other_s + seq.comm_s, rel=1e-12)


def test_overlap_collectives_take_their_sm_share_not_kappa():
    """NanoFlow's collectives run on ~15 thread blocks beside the GEMMs (pipeline.cu): overlapped, they delay a
    compute-bound step by that share of the SMs (15/108 on an A100), not by the compute/memory interference."""
    from blendsim.sim.cost import NET_BLOCKS, combine_times, net_share

    a100, h100 = get_hardware("a100-80gb"), get_hardware("h100-80gb")
    assert net_share(a100, 0.8) == pytest.approx(NET_BLOCKS / 108) == pytest.approx(88 / 6 / 108)
    assert net_share(h100, 0.8) == pytest.approx(NET_BLOCKS / 132)
    assert net_share(a100.with_(num_sms=0), 0.8) == 0.8  # no SM count: the interference stands in
    s = net_share(a100, 0.8)
    # compute-bound: the longer of compute and memory, kappa of the shorter, the SM share of the collectives
    assert combine_times("overlap", 0.8, 10.0, 4.0, 1.0, 3.0, s) == pytest.approx(10 + 0.8 * 4 + s * 3 + 1)
    # collectives longest: they bound the step
    assert combine_times("overlap", 0.8, 1.0, 1.0, 0.5, 9.0, s) == pytest.approx(9.5)
    # arrays take the same rule
    t = combine_times("overlap", 0.8, np.array([10.0, 1.0]), np.array([4.0, 1.0]), np.array([1.0, 0.5]),
                      np.array([3.0, 9.0]), s)
    np.testing.assert_allclose(t, [10 + 0.8 * 4 + s * 3 + 1, 9.5])
    # a TP-8 70B step: NanoFlow hides most of the all-reduces that its interference alone would not
    c = cm("llama-3-70b", tp=8, mode="overlap", engine="nanoflow")
    f = BatchFeatures.from_parts([(0, 640, 0, 0)], 1408, 1408 * 1000, 1409)
    st_ = c.cost(f)
    assert st_.comm_s > 0.1 * st_.compute_s
    kern = st_.time_s - st_.overhead_s - st_.other_s
    hi, lo = max(st_.compute_s, st_.memory_s), min(st_.compute_s, st_.memory_s)
    assert kern == pytest.approx(hi + c.kappa * lo + s * st_.comm_s)
    assert kern < hi + c.kappa * (lo + st_.comm_s)


@FAST
@given(f=batches(), model=st.sampled_from(MODELS), tp=st.sampled_from([1, 2]),
       mode=st.sampled_from(["sequential", "overlap"]), engine=st.sampled_from(sorted(PROFILES)))
def test_step_equals_cost(f, model, tp, mode, engine):
    c = cm(model, tp=tp, mode=mode, engine=engine)
    exact = c.cost(f)
    t, comp, mem = step_of(c, f)
    assert t == pytest.approx(exact.time_s, rel=1e-9)
    assert comp == pytest.approx(exact.compute_s, rel=1e-9, abs=1e-15)
    assert mem == pytest.approx(exact.memory_s, rel=1e-9, abs=1e-15)


def test_step_grows_its_tables_past_4096_tokens():
    c = CostModel(dep("llama-3-8b"), "overlap", get_profile("vllm", {}))
    f = BatchFeatures.from_parts([(0, 20_000, 3000, 0)], 17, 17 * 900, 18)
    assert step_of(c, f)[0] == pytest.approx(c.cost(f).time_s, rel=1e-9)


@settings(max_examples=20, deadline=None)
@given(fs=st.lists(batches(), min_size=1, max_size=40), mode=st.sampled_from(["sequential", "overlap"]),
       engine=st.sampled_from(["ideal", "vllm", "sglang"]), tp=st.sampled_from([1, 2]))
def test_cost_many_equals_cost(fs, mode, engine, tp):
    c = cm("llama-3-8b", tp=tp, mode=mode, engine=engine)
    arrays = features_arrays(**{k: [getattr(f, k) for f in fs] for k in BatchFeatures.__slots__})
    many = c.cost_many(arrays)
    for i, f in enumerate(fs):
        one = c.cost(f)
        for key in ("time_s", "compute_s", "memory_s", "other_s", "comm_s", "overhead_s"):
            assert many[key][i] == pytest.approx(getattr(one, key), rel=1e-9, abs=1e-15), key


def test_fast_paths_agree_when_communication_dominates():
    # a 1 GB/s link makes the all-reduce the longest of the three overlapped resources
    slow = Deployment(get_model("llama-3-8b"), get_hardware("a100-80gb").with_(link_bandwidth=1e9), 2,
                      kv_capacity_override=10**12)
    c = CostModel(slow, "overlap", get_profile("sglang", {}))
    fs = [PREFILL, DECODE, MIXED, BatchFeatures.decode_only(300, 4000)]
    many = c.cost_many(features_arrays(**{k: [getattr(f, k) for f in fs] for k in BatchFeatures.__slots__}))
    for i, f in enumerate(fs):
        one = c.cost(f)
        assert one.comm_s > max(one.compute_s, one.memory_s)
        assert one.time_s >= one.comm_s + one.other_s + one.overhead_s
        assert many["time_s"][i] == pytest.approx(one.time_s, rel=1e-9)
        assert step_of(c, f)[0] == pytest.approx(one.time_s, rel=1e-9)


@FAST
@given(d=st.integers(1, 2048), ctxs=st.lists(st.integers(1, 32768), min_size=1, max_size=30),
       mode=st.sampled_from(["sequential", "overlap"]), engine=st.sampled_from(["ideal", "vllm", "nanoflow"]))
def test_decode_many_equals_step(d, ctxs, mode, engine):
    c = cm("llama-3-8b", mode=mode, engine=engine)
    cd = np.array([d * x for x in ctxs])
    t, comp, mem = c.decode_many(d, cd)
    for i, x in enumerate(cd):
        ts, cs, ms = c.step(d, 0, 0, 0, 0, d, int(x), d)
        assert (t[i], comp[i], mem[i]) == pytest.approx((ts, cs, ms), rel=1e-9)


def test_unknown_mode_and_engine_are_user_errors():
    with pytest.raises(UserError, match="unknown mode 'fast'"):
        CostModel(dep(), "fast")
    with pytest.raises(UserError, match="unknown engine 'trt'"):
        get_profile("trt")


def test_users_own_engine_overhead_replaces_the_defaults():
    own = get_profile("fixed_s=0.002,per_seq_s=1e-5", {})
    assert own.overhead(100, 4096) == pytest.approx(0.002 + 100 * 1e-5)
    assert own.regime is None and own.cuda_graph_max == 0  # from ideal
    based = get_profile("vllm:per_token_s=0", {})
    v = PROFILES["vllm"]
    assert based.overhead(10, 1000) == pytest.approx(v.fixed_s + 10 * v.per_seq_s)
    assert (based.scheduler, based.cuda_graph_max, based.regime) == (v.scheduler, v.cuda_graph_max, v.regime)
    assert based.label == "vllm:per_token_s=0"
    c = build_cost_model(dep(), "sequential", "fixed_s=0.01")
    assert c.cost(BatchFeatures.decode_only(8, 1000)).overhead_s == pytest.approx(0.01)
    for bad, msg in (("fixed_s=abc", "must be a number"), ("speed=1", "unknown field"),
                     ("fixed_s=-1", ">= 0"), ("trt:fixed_s=1", "unknown engine 'trt'"),
                     ("vllm:cuda_graph_max=1.5", "whole number"),
                     ("vllm@0.10:per_seq_s=1e308", "over 1 s"), ("fixed_s=11", "over 10 s"),
                     ("trtllm@0.8:serve=1,server_request_s=61", "over 60 s"),
                     ("vllm@0.1", "older than every modelled version of vllm")):
        with pytest.raises(UserError, match=msg):
            get_profile(bad)


def test_override_changes_only_the_overhead_of_that_profile():
    # --engine vllm:fixed_s=A prices kernels exactly as --engine vllm (its regime's timer, its CUDA graphs)
    f = BatchFeatures.decode_only(100, 1000)  # padded to the 104-row CUDA graph under vllm
    base = build_cost_model(dep(), "sequential", "vllm").cost(f)
    for fixed in (0.001, 0.002):
        c = build_cost_model(dep(), "sequential", f"vllm:fixed_s={fixed}")
        assert c.timer_name == "roofline+fitted" and c.graph_cap == PROFILES["vllm"].cuda_graph_max
        sc = c.cost(f)
        assert (sc.compute_s, sc.memory_s, sc.other_s, sc.comm_s) == \
            (base.compute_s, base.memory_s, base.other_s, base.comm_s)
        v = get_profile("vllm")  # with the shipped fitted loop, under the override
        assert sc.overhead_s == pytest.approx(fixed + v.per_seq_s * 100 + v.per_token_s * 100, rel=1e-12)


def test_engine_keys_select_versions():
    assert get_profile("vllm-v0", {}).version == "0.6"  # NAME alone: the newest
    old = get_profile("vllm-v0@0.5", {})
    assert (old.version, old.label) == ("0.5", "vllm-v0@0.5")
    assert get_profile("vllm-v0@0.5:fixed_s=0", {}).per_seq_s == old.per_seq_s


# ---- BlendServe Table 1: Llama-3-8B on A100-80GB, one layer, decode at context 1024 ----------------


@pytest.mark.parametrize("batch, gemm_ms, attn_ms", [(512, 1.087, 1.317), (768, 1.537, 1.913), (1024, 2.005, 2.515)])
def test_blendserve_table1_within_10_percent(batch, gemm_ms, attn_ms):
    t = {r["op"]: r["time_s"] for r in cm("llama-3-8b").breakdown(BatchFeatures.decode_only(batch, 1024))}
    gemm = t["qkv_proj"] + t["o_proj"] + t["gate_up_proj"] + t["down_proj"]
    assert gemm * 1e3 == pytest.approx(gemm_ms, rel=0.10)
    assert t["attn_decode"] * 1e3 == pytest.approx(attn_ms, rel=0.10)


# ---- measured A100 kernels (../shared/data) -----------------------------------------------------

needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"shared measurement data not found at {DATA}")

# Vidur's operator -> ours. Vidur runs HF-style kernels: RMSNorm and the residual add separately,
# so our two fused add+norm kernels compare with both norms plus two adds.
VIDUR_OPS = {"qkv_proj": ["attn_pre_proj"], "o_proj": ["attn_post_proj"], "gate_up_proj": ["mlp_up_proj"],
             "down_proj": ["mlp_down_proj"], "rope": ["attn_rope"], "act": ["mlp_act"],
             "norm": ["input_layernorm", "post_attention_layernorm", "add", "add"]}


@lru_cache(maxsize=1)
def vidur_errors():
    """Relative error pred / measured - 1 of the a100-80gb roofline, per (op, tp, tokens)."""
    import pandas as pd

    d = pd.read_csv(DATA / "vidur_profile_a100_Llama-2-7b-hf_mlp.csv")
    d = d.groupby(["num_tensor_parallel_workers", "num_tokens"], as_index=False).median(numeric_only=True)
    out = []
    for tp, sub in d.groupby("num_tensor_parallel_workers"):
        T = sub["num_tokens"].to_numpy()
        timer = RooflineTimer(dep("llama-2-7b", tp=int(tp)))
        f = features_arrays(num_tokens=T, num_prefill_tokens=T, num_prefill_seqs=np.ones_like(T),
                            attn_pairs=0 * T, prefill_kv_tokens=0 * T, num_decode=0 * T, decode_ctx_sum=0 * T,
                            num_logits=0 * T)
        from blendsim.sim.ops import op_counts

        counts = op_counts(timer.shapes, f)
        for op, cols in VIDUR_OPS.items():
            pred = np.asarray(timer.op_time(op, *counts[op], f), dtype=float)
            meas = sum(sub[f"time_stats.{c}.median"].to_numpy() for c in cols) * 1e-3
            out.append(pd.DataFrame({"op": op, "tp": int(tp), "T": T, "err": pred / meas - 1}))
    return pd.concat(out, ignore_index=True)


@needs_data
def test_vidur_gemms_within_tolerance():
    """GEMMs at TP 1/2/4/8, 1-4096 tokens: median |error| <= 10%, 90th percentile <= 25%, worst <= 50%.

    The worst points are 65-128 tokens, where cuBLAS leaves the weight-streaming kernel but a 128-row
    tile is not yet compute-efficient (measured 15-30% above the roofline's max(compute, memory)).
    """
    e = vidur_errors()
    for op in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
        a = e[e.op == op].err.abs()
        assert a.median() <= 0.10 and a.quantile(0.9) <= 0.25 and a.max() <= 0.50, (op, a.median(), a.max())
    g = e[e.op.str.endswith("_proj")]
    # no regime-wide bias: weight-bound (<= 64 tokens) and compute-bound (>= 1024 tokens, tp 1)
    assert abs(g[g["T"] <= 64].err.median()) <= 0.12
    assert abs(g[(g["T"] >= 1024) & (g.tp == 1)].err.median()) <= 0.08


@needs_data
def test_vidur_elementwise_within_tolerance():
    """Norm, SiLU-and-mul and rotary: median |error| <= 30% per op; at >= 1024 tokens, where the
    bandwidth term dominates the launch, every point within 60%."""
    e = vidur_errors()
    for op in ("norm", "act", "rope"):
        x = e[e.op == op]
        assert x.err.abs().median() <= 0.30, op
        assert x[x["T"] >= 1024].err.abs().max() <= 0.60, op


@needs_data
def test_llmcompass_large_gemms_conservative_within_40_percent():
    """LLMCompass's A100 runs large fp16 GEMMs at 240-293 TFLOP/s (0.78-0.94 of peak) where the
    preset assumes 0.70: the roofline is slower, but by no more than 40%. Rows under 0.3 ms are left
    out: the 8192x64x64 GEMM's 30 us for 67 MFLOP shows their times include host-side launch cost."""
    import pandas as pd

    lc = pd.read_csv(DATA / "llmcompass_a100_real_matmul_fp16.csv")
    timer = RooflineTimer(dep("llama-2-7b"))
    checked = 0
    for r in lc.itertuples():
        if r.latency_ms < 0.3:
            continue
        f = features_arrays(num_tokens=r.M)
        pred = float(timer.op_time("qkv_proj", 2 * r.M * r.N * r.K, 2 * (r.M * r.K + r.K * r.N + r.M * r.N), 1, f))
        ratio = pred / (r.latency_ms * 1e-3)
        assert 0.95 <= ratio <= 1.40, (r.M, r.N, r.K, ratio)
        checked += 1
    assert checked >= 12


LLAMA2_70B = ModelSpec("llama-2-70b", 8192, 80, 64, 8, 28672, 32000, max_position_embeddings=4096)


@needs_data
def test_splitwise_real_engine_times():
    """Splitwise's llama2-70b times on DGX-A100/H100 (a 2023 engine): the ideal roofline never exceeds
    a measured per-token decode time, and at TP 2 on A100 (compute-bound prefill) prompt times are
    within 20% from 512 to 16K tokens. (Shorter prompts are dominated by the engine's fixed cost; the
    batch-64 row, 794 ms for 32K tokens, exceeds the engine's batched-token limit: not one step.)"""
    import pandas as pd

    d = pd.read_csv(DATA / "splitwise_sim_perf_model_a100_h100.csv")
    d = d[(d.model == "llama2-70b") & d.hardware.isin(["a100-80gb", "h100-80gb"])]
    g = d.groupby(["hardware", "tensor_parallel", "prompt_size", "batch_size", "token_size"],
                  as_index=False)[["prompt_time", "token_time"]].median()
    n_prompt = 0
    for r in g.itertuples():
        c = CostModel(Deployment(LLAMA2_70B, get_hardware(r.hardware), int(r.tensor_parallel)))
        dec = c.cost(BatchFeatures.decode_only(int(r.batch_size), int(r.prompt_size + r.token_size // 2))).time_s
        assert dec * 1e3 <= r.token_time, r
        if r.hardware == "a100-80gb" and r.tensor_parallel == 2 and 512 <= r.batch_size * r.prompt_size <= 16384:
            parts = [(i, int(r.prompt_size), 0, 0) for i in range(int(r.batch_size))]
            pre = c.cost(BatchFeatures.from_parts(parts, 0, 0, int(r.batch_size))).time_s
            assert pre * 1e3 == pytest.approx(r.prompt_time, rel=0.20), r
            n_prompt += 1
    assert n_prompt >= 13


# ---- engine overheads -------------------------------------------------------------------------


def test_engine_presets_and_step_overhead():
    assert {"ideal", "vllm", "sglang", "nanoflow"} <= set(PROFILES)
    assert PROFILES["ideal"].overhead(1000, 8192) == 0.0
    for e in PROFILES.values():
        assert min(e.fixed_s, e.per_seq_s, e.per_token_s) >= 0 and e.source
    f = MIXED  # 1 prefill sequence + 100 decodes, 356 tokens
    v = PROFILES["vllm"]
    sc = cm("llama-3-8b", engine="vllm").cost(f)
    assert sc.overhead_s == pytest.approx(v.fixed_s + 101 * v.per_seq_s + 356 * v.per_token_s, rel=1e-12)
    assert sc.time_s == pytest.approx(cm("llama-3-8b").cost(f).time_s + sc.overhead_s, rel=1e-12)


@pytest.mark.parametrize("seqs, tokens", [(1, 1), (64, 64), (256, 2048), (1024, 8192)])
def test_engines_ordered_by_how_much_cpu_work_they_expose(seqs, tokens):
    o = {k: get_profile(k, {}).overhead(seqs, tokens) for k in ("ideal", "nanoflow", "sglang", "vllm", "vllm-v0@0.5")}
    assert o["ideal"] <= o["nanoflow"] <= o["sglang"] <= o["vllm"] <= o["vllm-v0@0.5"]


def test_vllm_v0_loop_prior_reproduces_the_vllm_blogs_time_split():
    # vLLM blog 2024-09-05, v0.5.3, Llama 3 8B on one H100: scheduling with input/output handling 29% of the time,
    # GPU execution 38%; at the 256 sequences its ShareGPT run keeps in flight (~290-token mean context)
    f = BatchFeatures.decode_only(256, 290)
    gpu = cm("llama-3-8b", hw="h100-80gb").cost(f).time_s
    v0 = get_profile("vllm-v0@0.5", {})
    assert v0.overhead(256, 0) / gpu == pytest.approx(29 / 38, rel=0.02)
    # behind its API server (in the engine's process until 0.6) the server's 33% comes on top
    served = get_profile("vllm@0.5:serve=1", {})
    assert served.overhead(256, 0) / gpu == pytest.approx((29 + 33) / 38, rel=0.02)


def test_vllm_v1_loop_prior_reproduces_the_v1_blog_speedup():
    # V1 blog: up to 1.7x V0's throughput (no multi-step) for Llama-3.1-8B on one H100 (ShareGPT, 256 seqs); V0's
    # loop as the prior above, none of it taken as hidden by async output processing
    f = BatchFeatures.decode_only(256, 290)
    gpu = cm("llama-3-8b", hw="h100-80gb").cost(f).time_s
    v0 = gpu + get_profile("vllm@0.5", {}).overhead(256, 0)
    v1 = cm("llama-3-8b", hw="h100-80gb", engine="vllm").cost(f).time_s
    assert v0 / v1 == pytest.approx(1.7, rel=0.02)


# ---- calibration profiles ---------------------------------------------------------------------


def _fit(op, vars_, terms, coef, scale, domain, median_s=()):
    return OpFit(op=op, vars=tuple(vars_), terms=terms, coef=coef, scale=scale, domain=domain,
                 fit={"degree": 2}, median_s=list(median_s))


def make_profile(model: str = "llama-3-8b", dtype: str = "bf16", tp: int = 1) -> Profile:
    """A synthetic profile: quadratic GEMMs, bilinear decode attention, a prefill-attention fit."""
    ops = {
        "qkv_proj": _fit("qkv_proj", ["tokens"], [[0], [1], [2]], [3.0e-5, 5.0e-5, 1.0e-6], [1024.0],
                         [[1, 8192]], median_s=[3.1e-5, 4e-4]),
        "gate_up_proj": _fit("gate_up_proj", ["tokens"], [[0], [1]], [1.2e-4, 5.5e-4], [1024.0], [[1, 16384]]),
        "norm": _fit("norm", ["tokens"], [[0], [1]], [8e-6, 2e-5], [1024.0], [[1, 16384]]),
        "attn_decode": _fit("attn_decode", ["batch", "context"], [[0, 0], [1, 0], [1, 1]],
                            [5e-6, 2e-6, 8e-4], [64.0, 4096.0], [[1, 1024], [16, 32768]]),
        "attn_prefill": _fit("attn_prefill", ["tokens", "context"], [[0, 0], [1, 0], [2, 0], [1, 1]],
                             [1e-5, 1e-4, 6e-5, 1.5e-4], [1024.0, 4096.0], [[16, 8192], [0, 32768]]),
    }
    m = get_model(model, dtype)
    return Profile(model=model, model_shape=model_shape(m), dtype=dtype, tp=tp, ops=ops, interference=0.3,
                   device={"kind": "synthetic"}, produced_by={"tool": "test"})


def test_profile_round_trip(tmp_path):
    p = make_profile()
    path = p.save(tmp_path / "prof.json")
    q = load_profile(path)
    assert (q.model, q.dtype, q.tp, q.interference, q.model_shape) == ("llama-3-8b", "bf16", 1, 0.3, p.model_shape)
    assert q.to_dict() == p.to_dict()
    assert path.read_text() == q.save(tmp_path / "again.json").read_text()  # byte-identical re-save


def test_profile_timer_predictions_equal_fits(tmp_path):
    prof = make_profile()
    path = prof.save(tmp_path / "prof.json")
    c = build_cost_model(dep(), "overlap", "ideal", path)
    assert c.timer_name == "profile" and c.kappa == 0.3
    fits = load_profile(path).ops
    roof = RooflineTimer(dep())
    for f in (PREFILL, DECODE, MIXED, BatchFeatures.prefill_only(12_000, 0)):  # the last is past the domain
        t = {r["op"]: r["time_s"] for r in c.breakdown(f)}
        assert t["qkv_proj"] == pytest.approx(float(fits["qkv_proj"].predict(f.num_tokens)), rel=1e-12)
        assert t["gate_up_proj"] == pytest.approx(float(fits["gate_up_proj"].predict(f.num_tokens)), rel=1e-12)
        if f.num_decode:
            x = float(fits["attn_decode"].predict(f.num_decode, f.decode_ctx_sum / f.num_decode))
            assert t["attn_decode"] == pytest.approx(x, rel=1e-12)
        # a missing operator is priced by the roofline
        from blendsim.sim.ops import Shapes, op_counts

        fl, nb, k = op_counts(Shapes.of(dep()), f)["o_proj"]
        assert t["o_proj"] == pytest.approx(float(roof.op_time("o_proj", fl, nb, k, f)), rel=1e-12)
    # one chunk of n after context c: the prefill-attention fit is read at (n, c)
    t = {r["op"]: r["time_s"] for r in c.breakdown(PREFILL)}
    assert t["attn_prefill"] == pytest.approx(float(fits["attn_prefill"].predict(512, 1024)), rel=1e-12)
    # above the domain a GEMM time scales linearly from the edge
    assert float(fits["qkv_proj"].predict(16384)) == pytest.approx(2 * float(fits["qkv_proj"].predict(8192)))


def test_profile_missing_ops_give_one_note(tmp_path):
    c = build_cost_model(dep(), "sequential", "ideal", make_profile().save(tmp_path / "p.json"))
    notes = c.notes()
    assert len(notes) == 1
    for op in ("o_proj", "down_proj", "lm_head", "rope", "act", "kv_write", "embedding"):
        assert op in notes[0]
    assert "allreduce" not in notes[0]  # tp=1 never runs one
    assert "roofline" in notes[0]


@FAST
@given(f=batches(), mode=st.sampled_from(["sequential", "overlap"]))
def test_profile_step_equals_cost(f, mode):
    c = _profiled_cm(mode)
    exact = c.cost(f)
    assert step_of(c, f)[0] == pytest.approx(exact.time_s, rel=1e-9)
    assert step_of(c, f)[1] == pytest.approx(exact.compute_s, rel=1e-9)


@cache
def _profiled_cm(mode):
    return build_cost_model(dep(), mode, "vllm", make_profile())


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"model": "llama-2-7b"}, "fitted for model 'llama-2-7b', not 'llama-3-8b' (num_kv_heads 32 vs 8"),
        ({"dtype": "fp16"}, "fitted for dtype fp16, but the run uses bf16"),
        ({"tp": 2}, "fitted for tp=2, but the run uses tp=1"),
    ],
)
def test_profile_for_another_deployment_is_refused(tmp_path, kw, message):
    path = make_profile(**kw).save(tmp_path / "other.json")
    with pytest.raises(UserError) as e:
        build_cost_model(dep(), "sequential", "ideal", path)
    assert message in str(e.value) and str(path) in str(e.value)
    with pytest.raises(UserError):
        ProfileTimer(make_profile(**kw), dep())


def _corrupt(d: dict, what: str) -> str:
    if what == "json":
        return '{"schema": "blendsim.profile", "ops": {'
    if what == "schema":
        d.pop("schema")
    elif what == "version":
        d["schema_version"] = 99
    elif what == "missing":
        d.pop("ops")
    elif what == "unknown_op":
        d["ops"]["flash_mla"] = d["ops"]["norm"]
    elif what == "vars":
        d["ops"]["norm"]["vars"] = ["batch"]
    elif what == "shape":
        d["ops"]["norm"]["coef"] = [1.0, 2.0, 3.0]  # two terms, three coefficients
    elif what == "nan":
        d["ops"]["norm"]["coef"] = [float("nan"), 1.0]
    elif what == "interference":
        d["interference"] = 1.5
    return json.dumps(d)


@pytest.mark.parametrize(
    "what, message",
    [
        ("json", "corrupt profile: invalid JSON"),
        ("schema", "not a blendsim profile"),
        ("version", "schema version 99 is not supported"),
        ("missing", "missing field 'ops'"),
        ("unknown_op", "ops.flash_mla: unknown operator"),
        ("vars", "ops.norm: variables ['batch'] should be ['tokens']"),
        ("shape", "ops.norm: malformed fit"),
        ("nan", "ops.norm: non-finite coefficient"),
        ("interference", "'interference' must be a number in [0, 1]"),
    ],
)
def test_corrupt_profiles_are_refused(tmp_path, what, message):
    path = tmp_path / "bad.json"
    path.write_text(_corrupt(make_profile().to_dict(), what))
    with pytest.raises(UserError) as e:
        load_profile(path)
    assert message in str(e.value) and str(path) in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_profile_file(tmp_path):
    with pytest.raises(UserError, match="no such profile"):
        load_profile(tmp_path / "absent.json")


def test_opfit_scalar_and_vector_agree():
    fit = make_profile().ops["attn_decode"]
    for b, c in [(1, 16), (37, 900.5), (1024, 32768), (3000, 50000), (0.5, 2)]:
        assert fit.predict_scalar(b, c) == pytest.approx(float(fit.predict(b, c)), rel=1e-12)
    assert math.isclose(float(fit.predict(2048, 1000)), 2 * float(fit.predict(1024, 1000)))

