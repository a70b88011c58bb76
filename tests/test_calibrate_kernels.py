"""The profiled kernels do the work the cost model accounts for: shapes per TP shard, attention semantics
(chunked-prefill causality, decode over the whole cache, GQA), and the GPU path where a GPU exists."""

from __future__ import annotations

import math

import pytest
import torch

from calibrate.attention import Attention, pick_backend
from calibrate.kernels import TOKEN_OPS, TokenKernels
from calibrate.run import CalibrationConfig, Calibrator, shard_deployment
from sim.models import get_model
from sim.ops import Shapes


def _kernels(model: str, tp: int) -> tuple[TokenKernels, Shapes]:
    m = get_model(model, "fp32") if model != "tiny" else get_model(model)
    s = Shapes.of(shard_deployment(m, tp))
    return TokenKernels(s, m.head_dim, m.qkv_bias, "fp32", "cpu"), s


@pytest.mark.parametrize("tp", [1, 2])
def test_gemm_outputs_have_the_shards_shapes(tp):
    k, s = _kernels("tiny", tp)
    with torch.inference_mode():
        assert k.make("qkv_proj", 5)().shape == (5, s.q + 2 * s.kv)
        assert k.make("o_proj", 5)().shape == (5, s.hidden)
        assert k.make("gate_up_proj", 5)().shape == (5, s.mlp1)
        assert k.make("down_proj", 5)().shape == (5, s.hidden)
        logits = k.make("lm_head", 3)()
        assert logits.shape == (3, s.vocab) and logits.dtype == torch.float32
        assert k.make("act", 4)().shape == (4, s.inter)
        q, kk = k.make("rope", 6)()
        assert q.shape == (6, s.q // 64, 64) and kk.shape == (6, s.kv // 64, 64)
        assert k.make("norm", 7)().shape == (7, s.hidden)
        assert k.make("embedding", 9)().shape == (9, s.hidden)
        k.make("kv_write", 11)()
    assert s.q == 512 // tp and s.mlp1 == 2 * 1536 // tp and s.vocab == 8192 // tp


def test_plain_mlp_and_learned_positions_follow_the_model():
    m = get_model("opt-13b", "fp32")
    s = Shapes.of(shard_deployment(m, 8))
    k = TokenKernels(s, m.head_dim, m.qkv_bias, "fp32", "cpu")
    with torch.inference_mode():
        assert k.make("act", 2)().shape == (2, s.inter)  # ReLU, no gate
        assert k.make("embedding", 2)().shape == (2, s.hidden)
    with pytest.raises(ValueError):
        k.make("attn_decode", 2)
    assert set(TOKEN_OPS) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head", "norm", "rope", "act",
                              "kv_write", "embedding"}


def _reference(q, k, v, visible):
    """Plain attention of query rows q [hq, n, d] over keys [hk, L, d], row i seeing keys < visible[i]."""
    hq, hk = q.shape[0], k.shape[0]
    k = k.repeat_interleave(hq // hk, dim=0)
    v = v.repeat_interleave(hq // hk, dim=0)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.arange(k.shape[1])[None, :] < torch.as_tensor(visible)[:, None]
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def _capture_inputs(att: Attention):
    seen = []
    real = att._rand

    def rand(*shape):
        t = real(*shape)
        seen.append(t)
        return t

    att._rand = rand
    return seen


@pytest.mark.parametrize("n, ctx", [(4, 0), (3, 5), (1, 9)])
def test_chunked_prefill_attends_to_context_and_causally_within_the_chunk(n, ctx):
    att = Attention("torch_sdpa", 8, 2, 16, torch.float32, "cpu", seed=3)
    seen = _capture_inputs(att)
    out = att.prefill(n, ctx)()
    q, k, v = seen
    ref = _reference(q[0], k[0], v[0], [ctx + i + 1 for i in range(n)])
    torch.testing.assert_close(out[0], ref, rtol=1e-5, atol=1e-5)
    assert k.shape == (1, 2, ctx + n, 16)  # GQA: the KV heads are not expanded


def test_decode_reads_each_sequences_whole_cache():
    att = Attention("torch_sdpa", 8, 2, 16, torch.float32, "cpu", seed=4)
    seen = _capture_inputs(att)
    out = att.decode(3, 6)()
    q, k, v = seen
    assert k.shape == (3, 2, 7, 16)  # context plus the new token
    for b in range(3):
        torch.testing.assert_close(out[b], _reference(q[b], k[b], v[b], [7]), rtol=1e-5, atol=1e-5)


def test_cpu_uses_torch_sdpa():
    name, info = pick_backend("cpu", 8, 2, 64, torch.float32)
    assert name == "torch_sdpa" and info["attention_version"] == torch.__version__


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_quick_cuda_calibration(tmp_path):
    """The GPU path end to end: CUDA events, NVML identity, the attention backend, two-stream overlap."""
    cal = Calibrator(CalibrationConfig(model="tiny", device="cuda", dtype="bf16", quick=True, holdout=4))
    p = cal.run()
    assert {"qkv_proj", "lm_head", "attn_prefill", "attn_decode"} <= set(p.ops)
    assert p.device["kind"] == "cuda" and p.device["memory_bytes"] > 0
    assert p.software["attention_backend"] in ("flash_attn", "flashinfer", "torch_sdpa")
    assert p.interference is not None and 0 <= p.interference <= 1
    assert p.overlap["points"] and all(pt["t_together_s"] > 0 for pt in p.overlap["points"])
    assert p.hardware["mem_bandwidth"] > 1e11 and p.hardware["peak_flops"] > 1e13
    p.save(tmp_path / "p.json")
