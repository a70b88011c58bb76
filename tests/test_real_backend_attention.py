"""The torch_sdpa attention backend against a naive per-sequence reference: prefill chunks with and without
cached context, decode groups of equal and of ragged lengths, GQA (query heads folded into a KV head's queries)
and plain multi-head attention."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from blendsim.real_backend.attention import TorchSDPA  # noqa: E402
from blendsim.real_backend.paged_kv import PagedKVCache  # noqa: E402
from blendsim.real_backend.sequences import StepInputs  # noqa: E402

B, D = 4, 16


def _null(_name):
    return contextlib.nullcontext()


def _reference(q, k_all, v_all, n_new, kv_len):
    """One sequence: its n_new queries (the last n_new of kv_len positions) attend causally, in float64."""
    hq, hk = q.shape[1], k_all.shape[1]
    k = k_all.double().repeat_interleave(hq // hk, 1)  # [L, hq, d]
    v = v_all.double().repeat_interleave(hq // hk, 1)
    s = torch.einsum("nhd,lhd->hnl", q.double(), k) / D ** 0.5
    pos = kv_len - n_new + torch.arange(n_new)
    s = s.masked_fill(torch.arange(kv_len)[None, None, :] > pos[None, :, None], float("-inf"))
    return torch.einsum("hnl,lhd->nhd", s.softmax(-1), v)


@pytest.mark.parametrize("hq,hk", [(8, 2), (4, 4)])
@pytest.mark.parametrize("decode_lens", [[9, 9, 9], [30, 23, 17, 5, 12, 29]])
def test_torch_sdpa_matches_a_naive_attention(hq, hk, decode_lens):
    _check(hq, hk, decode_lens, lower_right=False)


@pytest.mark.parametrize("hq,hk", [(8, 2), (4, 4)])
def test_the_lower_right_causal_path_matches_too(hq, hk):
    """The CUDA path of a chunk after cached context (``causal_lower_right``: no mask tensor), forced on the
    CPU, where SDPA materialises the same bias."""
    pytest.importorskip("torch.nn.attention.bias")
    _check(hq, hk, [30, 23, 17], lower_right=True)


def _check(hq, hk, decode_lens, lower_right):
    g = torch.Generator().manual_seed(0)
    # (new tokens, context) of each prefill chunk, then one new token per decode
    seqs = [(7, 0), (5, 11)] + [(1, c - 1) for c in decode_lens]
    kv_len = np.array([n + c for n, c in seqs])
    tables, nxt = [], 0
    for L in kv_len:  # each sequence its own blocks, handed out in a shuffled order
        nb = -(-int(L) // B)
        tables.append(np.arange(nxt, nxt + nb, dtype=np.int64)[::-1].copy())
        nxt += nb
    kv = PagedKVCache(1, nxt, B, hk, D, torch.float32, "cpu")
    kv.k[0].normal_(generator=g)
    kv.v[0].normal_(generator=g)
    q_start = np.concatenate([[0], np.cumsum([n for n, _ in seqs])])
    q = torch.randn(int(q_start[-1]), hq, D, generator=g)
    inp = StepInputs(input_ids=np.zeros(len(q), np.int64), positions=np.zeros(len(q), np.int64),
                     slots=np.zeros(len(q), np.int64), logits_rows=np.zeros(0, np.int64), q_start=q_start,
                     kv_len=kv_len, block_tables=tables, num_prefill_seqs=2)
    attn = TorchSDPA("cpu", hq, hk, D, torch.float32, B)
    attn._lower_right = lower_right
    attn.plan(inp)
    assert (type(attn.prefill[1][3]).__name__ == "CausalBias") == lower_right  # the chunk after 11 cached tokens
    got = attn.forward(0, q, kv, _null)
    assert len(attn.groups) == (1 if len(set(decode_lens)) == 1 else len(attn.groups)) >= 1
    for s, (n, _c) in enumerate(seqs):
        L = int(kv_len[s])
        slots = (tables[s][:, None] * B + np.arange(B)).ravel()[:L]
        want = _reference(q[q_start[s]:q_start[s + 1]], kv.k[0][slots], kv.v[0][slots], n, L)
        torch.testing.assert_close(got[q_start[s]:q_start[s + 1]].double(), want, rtol=1e-4, atol=1e-4)



@pytest.mark.parametrize("lower_right", [False, True])
def test_the_kernel_report_names_a_kernel_for_each_call(lower_right):
    """On CUDA the profile and the validation record which SDPA kernel each call shape gets; the check's own
    calls are exercised here (on the CPU, where no fused CUDA kernel applies: math), and the public report
    is empty off CUDA."""
    attn = TorchSDPA("cpu", 8, 2, D, torch.float32, B)
    attn._lower_right = lower_right
    assert attn.kernel_report() == {}
    assert attn._kernel_report() == {"prefill": "math", "prefill_after_context": "math", "decode": "math"}
