"""The profiled operators do the work the cost model accounts for: every grid point is a step of the real
backend's model with the cost model's features, shapes are per TP shard, standalone kernels grow their
tables for large points, and the GPU path runs where a GPU exists."""

from __future__ import annotations

import pytest
import torch

from blendsim.calibrate.forward import backend_info
from blendsim.calibrate.kernels import TOKEN_OPS, TokenKernels
from blendsim.calibrate.run import CalibrationConfig, Calibrator, shard_deployment
from blendsim.sim.batch import BatchFeatures
from blendsim.sim.models import get_model
from blendsim.sim.ops import Shapes, op_counts


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


# ---- the forward probe: what calibration times ------------------------------------------
@pytest.fixture(scope="module")
def probe():
    from blendsim.calibrate.forward import ForwardProbe

    return ForwardProbe(get_model("tiny"), 1, "cpu", seed=1, max_position=64)


def _features(inp) -> BatchFeatures:
    """The cost model's features of a step's inputs."""
    p = inp.num_prefill_seqs
    kv = inp.kv_len
    return BatchFeatures(inp.num_tokens, int(inp.q_start[p]), p, inp.attn_pairs, int(kv[:p].sum()), len(kv) - p,
                         int((kv[p:] - 1).sum()), len(inp.logits_rows))


@pytest.mark.parametrize("op, point", [("qkv_proj", (7,)), ("lm_head", (5,)), ("attn_prefill", (6, 0)),
                                       ("attn_prefill", (5, 19)), ("attn_decode", (3, 21)), ("attn_decode", (1, 16))])
def test_probe_steps_have_the_cost_models_features(probe, op, point):
    """Each grid point is timed on a step whose features are the ones the cost model prices it with."""
    from blendsim.calibrate.validate import features

    if op == "attn_prefill":
        probe.prefill(*point)
    elif op == "attn_decode":
        probe.decode(*point)
    else:
        probe.tokens(point[0], point[0])
    got, want = _features(probe.last_inputs), features(op, point)
    s = Shapes.of(shard_deployment(get_model("tiny"), 1))
    counts, expected = op_counts(s, got), op_counts(s, want)
    assert counts[op] == expected[op]
    if op.startswith("attn"):
        assert got == want
    assert all(len(t) * probe.B >= k for t, k in zip(probe.last_inputs.block_tables, probe.last_inputs.kv_len))


def test_probe_times_every_operator_through_the_real_backend(probe):
    from blendsim.real_backend.attention import TorchSDPA

    assert isinstance(probe.attn, TorchSDPA) and probe.layers == get_model("tiny").num_layers
    with torch.inference_mode():
        tok = probe.tokens(9, 4)()
        pre = probe.prefill(8, 24)()
        dec = probe.decode(3, 40)()
    assert set(tok) == set(TOKEN_OPS) and all(v > 0 for v in tok.values())
    assert set(pre) == {"attn_prefill"} and pre["attn_prefill"] > 0
    assert set(dec) == {"attn_decode"} and dec["attn_decode"] > 0
    with torch.inference_mode():
        out = probe.decode_kernel(3, 40)()  # one layer's decode attention alone (the overlap measurement's)
    assert out.shape == (3, 8, 64) and bool(torch.isfinite(out).all())
    info = backend_info(probe)
    assert info["attention_backend"] == "torch_sdpa" and info["attention_block_size"] == probe.B


def test_probe_shards_heads_mlp_and_vocabulary():
    from blendsim.calibrate.forward import probe_layers, shard_spec

    m = get_model("llama-3-8b")
    s = shard_spec(m, 4, 2, max_position=200_000)
    sh = Shapes.of(shard_deployment(m, 4))
    assert (s.q_dim, s.kv_dim, s.mlp_in_out, s.vocab_size) == (sh.q, sh.kv, sh.mlp1, sh.vocab)
    assert s.hidden_size == sh.hidden and s.num_layers == 2 and s.max_position_embeddings == 200_000
    assert 2 <= probe_layers(m, 1) < m.num_layers  # capped by weight bytes, at least two
    assert probe_layers(get_model("tiny"), 1) == get_model("tiny").num_layers


def test_standalone_kernels_time_past_their_first_tables():
    """Tables sized at the first point grow for later, larger points (GPU grids reach 16K tokens)."""
    from blendsim.sim.models import ModelSpec

    k, s = _kernels("tiny", 1)
    opt = ModelSpec("opt-mini", 64, 2, 4, 4, 128, 500, rope=False, gated_mlp=False, dtype="fp32",
                    max_position_embeddings=8192)
    so = Shapes.of(shard_deployment(opt, 1))
    ko = TokenKernels(so, opt.head_dim, False, "fp32", "cpu")
    with torch.inference_mode():
        for t in (1, 5000):
            q, kk = k.make("rope", t)()
            assert q.shape == (t, s.q // 64, 64) and bool(torch.isfinite(q).all())
        for t in (1, 20000):
            k.make("kv_write", t)()
        assert k._weights["k_cache"].shape[0] >= 40000
        for t in (1, 6000):
            assert ko.make("embedding", t)().shape == (t, so.hidden)


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
