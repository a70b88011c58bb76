"""Attention over the paged KV cache: a ragged batch of prefill chunks and decode tokens.

Every backend has the same two calls: ``plan(inputs)`` once per step (host work, outside the timed
forward: block tables and index tensors, as FlashInfer's ``plan`` and vLLM's metadata builders do) and
``forward(layer, q, kv, ops)`` once per layer, after the layer's new K/V are written (so a request that
reuses blocks another request of the same step just computed reads them). Semantics are the cost
model's (``blendsim.sim.ops``): a chunk of n new tokens after c cached ones attends causally to c + n keys with
the diagonal at the *end*; a decode token reads its whole context plus itself. GQA heads are never
expanded where the kernel supports GQA.

Backends, fastest first: ``flash_attn`` (varlen with a block table; upstream FlashAttention-2 pages
only in multiples of 256 tokens), ``flashinfer`` (paged prefill and decode wrappers, any page size),
``torch_sdpa`` (gathers each sequence's blocks into a workspace and calls
``scaled_dot_product_attention``; decodes are grouped by length so one call serves many sequences with
at most a quarter of padding). The first two need CUDA.

``torch_sdpa`` never asks SDPA for GQA together with a mask: that pair has no fused CUDA kernel and runs
in the math backend, which materialises the scores in fp32 (H200, 26 Nov 2026: decode attention 5-16x the
profile's prediction in replayed steps whose lengths differ, while calibration's equal-length batches,
unmasked, ran the flash kernel). A decode group folds the query heads that share a KV head into that
head's queries (one query per head becomes ``q_heads / kv_heads`` queries per KV head), so its mask needs no
GQA. A prefill chunk after cached context takes the lower-right causal bias on CUDA in 16-bit (the flash
kernel, as for a chunk with no context, so calibration's (tokens, context) grid has no kernel switch at
context 0; the H200 day's one off-grid point at 69 tokens of context missed by 93%), elsewhere a mask with
the KV heads expanded. Decode groups are always masked, so calibration and replay time the same kernel.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F

from blendsim.real_backend.sequences import StepInputs

try:
    from torch.nn.attention.bias import CausalBias, causal_lower_right
except ImportError:  # torch < 2.3
    CausalBias = causal_lower_right = None

BACKENDS = ("flash_attn", "flashinfer", "torch_sdpa")
DECODE_PAD = 0.75  # a decode group holds sequences at least this fraction of its longest one


def sdpa_backends(device):
    """The SDPA kernels ``torch_sdpa`` lets torch choose from on ``device``: on CUDA every one but cuDNN's.

    NOTE: cuDNN's attention builds an execution plan on the host for each new query/key shape (tens of ms
    each); a replay meets new shapes at nearly every step, so with cuDNN allowed the first (timed) forward
    of a step was host-bound (H200, torch 2.11, 26 Nov 2026: steps measured 2-10x the sum of their
    operators) while calibration, which repeats each shape, never saw it. Flash and memory-efficient
    attention have no per-shape planning, like the engines' own kernels.
    """
    if torch.device(device).type != "cuda":
        return None
    try:
        from torch.nn.attention import SDPBackend
    except ImportError:  # torch < 2.3: no cuDNN backend to leave out
        return None
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def lower_right_causal(device, dtype, gqa: bool) -> bool:
    """Whether a prefill chunk after cached context can use SDPA's lower-right causal bias
    (``torch.nn.attention.bias.causal_lower_right``): on CUDA in 16-bit, where it runs the flash kernel
    (bottom-right aligned, GQA native) with no mask at all, the same kernel as a chunk with no context."""
    if CausalBias is None or torch.device(device).type != "cuda":
        return False
    if dtype not in (torch.float16, torch.bfloat16):
        return False
    import inspect

    return not gqa or "enable_gqa" in inspect.signature(CausalBias._dispatch).parameters


def sdpa_context(backends):
    """A context restricting SDPA to ``backends`` (a no-op for None)."""
    if backends is None:
        return nullcontext()
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(backends)


def _sdpa_gqa() -> bool:
    try:
        x = torch.zeros(1, 2, 1, 4)
        F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False


def _slots(table: np.ndarray, length: int, B: int) -> np.ndarray:
    """KV slots of positions 0 .. length-1 through a block table."""
    return (table[:, None] * B + np.arange(B)).ravel()[:length]


class TorchSDPA:
    """Gather the blocks, then ``scaled_dot_product_attention`` (works on CPU and CUDA)."""

    name = "torch_sdpa"

    def __init__(self, device, q_heads: int, kv_heads: int, head_dim: int, dtype, block_size: int):
        self.device, self.hq, self.hk, self.d, self.dtype, self.B = device, q_heads, kv_heads, head_dim, dtype, block_size
        self.gqa = _sdpa_gqa() if q_heads != kv_heads else False
        self._expand = q_heads // kv_heads if (q_heads != kv_heads and not self.gqa) else 1
        self._wk = self._wv = None
        self._backends = sdpa_backends(device)
        self._lower_right = lower_right_causal(device, dtype, q_heads != kv_heads)
        self.prefill: list = []  # (row start, row end, slot index, mask or None)
        self.groups: list = []  # (query rows, slot index, keys per sequence, mask or None)

    def plan(self, inp: StepInputs) -> None:
        dev, B = self.device, self.B
        p = inp.num_prefill_seqs
        self.prefill, self.groups, need = [], [], 0
        for i in range(p):
            a, e, L = int(inp.q_start[i]), int(inp.q_start[i + 1]), int(inp.kv_len[i])
            n, ctx = e - a, L - (e - a)
            idx = torch.from_numpy(_slots(inp.block_tables[i], L, B)).to(dev)
            mask = None
            if ctx and self._lower_right:
                mask = causal_lower_right(n, L)
            elif ctx:
                keep = np.arange(L)[None, :] <= ctx + np.arange(n)[:, None]
                mask = torch.from_numpy(keep).to(dev)
            self.prefill.append((a, e, idx, mask))
            need = max(need, L)
        lens = inp.kv_len[p:]
        order = np.argsort(-lens, kind="stable")
        i = 0
        while i < len(order):
            top = int(lens[order[i]])
            j = i
            while j < len(order) and lens[order[j]] >= DECODE_PAD * top:
                j += 1
            members = order[i:j] + p
            idx = np.zeros((j - i, top), dtype=np.int64)
            for g, s in enumerate(members):
                L = int(inp.kv_len[s])
                idx[g, :L] = _slots(inp.block_tables[s], L, B)
            glens = inp.kv_len[members]
            # a mask even when every length is top: uniform (calibration) and ragged (replay) groups then run
            # the same kernel
            mask = torch.from_numpy((np.arange(top)[None, :] < glens[:, None])[:, None, None, :]).to(dev)
            rows = torch.from_numpy(inp.q_start[members]).to(dev)
            self.groups.append((rows, torch.from_numpy(idx.ravel()).to(dev), top, mask))
            need = max(need, (j - i) * top)
            i = j
        if self._wk is None or self._wk.shape[0] < need:
            shape = (max(need, 1), self.hk, self.d)
            self._wk = torch.empty(shape, dtype=self.dtype, device=dev)
            self._wv = torch.empty(shape, dtype=self.dtype, device=dev)

    def forward(self, layer: int, q: torch.Tensor, kv, ops) -> torch.Tensor:
        with sdpa_context(self._backends):
            return self._forward(layer, q, kv, ops)

    def _forward(self, layer: int, q: torch.Tensor, kv, ops) -> torch.Tensor:
        kf, vf = kv.k[layer], kv.v[layer]
        out = torch.empty_like(q)
        if self.prefill:
            with ops("attn_prefill"):
                for a, e, idx, mask in self.prefill:
                    k, v = self._gather(kf, vf, idx)  # [L, hk, d]
                    qa = q[a:e].transpose(0, 1).unsqueeze(0)
                    k, v = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
                    if mask is None:  # no cached context: causal, GQA in the kernel
                        o = self._sdpa(qa, k, v, None)
                    elif CausalBias is not None and isinstance(mask, CausalBias):
                        # causal from the bottom right: the flash kernel, no mask tensor, GQA in the kernel
                        gqa = {"enable_gqa": True} if self.hq != self.hk else {}
                        o = F.scaled_dot_product_attention(qa, k, v, attn_mask=mask, **gqa)
                    else:  # a mask with GQA would fall back to the math kernel: expand the KV heads instead
                        o = F.scaled_dot_product_attention(qa, self._heads(k), self._heads(v), attn_mask=mask)
                    out[a:e] = o[0].transpose(0, 1)
        if self.groups:
            rep = self.hq // self.hk
            with ops("attn_decode"):
                for rows, idx, top, mask in self.groups:
                    k, v = self._gather(kf, vf, idx)
                    G = len(rows)
                    k = k.view(G, top, self.hk, self.d).transpose(1, 2)  # [G, hk, top, d]
                    v = v.view(G, top, self.hk, self.d).transpose(1, 2)
                    # the query heads sharing a KV head become that head's queries (q head h reads KV head h // rep)
                    qg = q.index_select(0, rows).view(G, self.hk, rep, self.d)
                    o = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask)
                    out.index_copy_(0, rows, o.reshape(G, self.hq, self.d))
        return out

    def kernel_report(self) -> dict:
        """Which SDPA kernel each of this backend's three call shapes gets on CUDA (flash, efficient or math),
        as torch's own dispatch checks answer for a small example of each; {} elsewhere. A ``math`` entry
        means that attention is not timed on a fused kernel (26 Nov 2026: the reason a replay missed by 5-16x).
        """
        return self._kernel_report() if torch.device(self.device).type == "cuda" else {}

    def _kernel_report(self) -> dict:
        try:
            from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention
        except ImportError:
            return {}
        dev, dt, hq, hk, d, rep = self.device, self.dtype, self.hq, self.hk, self.d, self.hq // self.hk
        t = lambda *shape: torch.empty(*shape, dtype=dt, device=dev)  # noqa: E731
        mask = torch.ones(4, 1, 1, 64, dtype=torch.bool, device=dev)
        kv = t(1, hk, 96, d)
        calls = {  # (q, k, mask, is_causal, enable_gqa) as _forward makes them
            "prefill": (t(1, hq, 96, d), kv, None, True, hq != hk),
            "prefill_after_context": ((t(1, hq, 32, d), kv, None, False, hq != hk) if self._lower_right
                                      else (t(1, hq, 32, d), t(1, hq, 96, d), torch.ones(32, 96, dtype=torch.bool,
                                                                                         device=dev), False, False)),
            "decode": (t(4, hk, rep, d), t(4, hk, 64, d), mask, False, False),
        }
        out = {}
        with sdpa_context(self._backends):
            for name, (q, k, m, causal, gqa) in calls.items():
                try:
                    params = SDPAParams(q, k, k, m, 0.0, causal, gqa)
                except TypeError:  # torch < 2.5: no enable_gqa
                    params = SDPAParams(q, k, k, m, 0.0, causal)
                out[name] = ("flash" if can_use_flash_attention(params) else
                             "efficient" if can_use_efficient_attention(params) else "math")
        return out

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """KV heads repeated to the query heads ([1, hk, L, d] -> [1, hq, L, d])."""
        rep = self.hq // self.hk
        return x.repeat_interleave(rep, 1) if rep > 1 else x

    def _gather(self, kf, vf, idx):
        n = len(idx)
        return (torch.index_select(kf, 0, idx, out=self._wk[:n]), torch.index_select(vf, 0, idx, out=self._wv[:n]))

    def _sdpa(self, q, k, v, mask, causal: bool = True):
        if self._expand > 1:  # torch < 2.5: no GQA in SDPA
            k, v = k.repeat_interleave(self._expand, 1), v.repeat_interleave(self._expand, 1)
        kw = {"enable_gqa": True} if self.gqa else {}
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **kw)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


class FlashInfer:
    """FlashInfer's paged prefill and decode wrappers over the NHD pages (CUDA)."""

    name = "flashinfer"

    def __init__(self, device, q_heads: int, kv_heads: int, head_dim: int, dtype, block_size: int):
        import flashinfer

        self.hq, self.hk, self.d, self.dtype, self.B, self.device = q_heads, kv_heads, head_dim, dtype, block_size, device
        ws = lambda: torch.empty(256 * 2**20, dtype=torch.uint8, device=device)  # noqa: E731
        self._pw = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws(), "NHD")
        self._dw = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws(), "NHD")
        if not hasattr(self._pw, "plan"):
            raise RuntimeError(f"flashinfer {getattr(flashinfer, '__version__', '?')} predates plan/run (0.2)")
        self.tp = 0  # prefill rows
        self.has_decode = False

    def _csr(self, inp: StepInputs, lo: int, hi: int):
        i32 = {"dtype": torch.int32, "device": self.device}
        lens = inp.kv_len[lo:hi]
        pages = -(-lens // self.B)
        indptr = np.concatenate([[0], np.cumsum(pages)])
        indices = np.concatenate([inp.block_tables[s][:pages[s - lo]] for s in range(lo, hi)])
        last = lens - (pages - 1) * self.B
        return (torch.tensor(indptr, **i32), torch.tensor(indices, **i32), torch.tensor(last, **i32))

    def plan(self, inp: StepInputs) -> None:
        p, S = inp.num_prefill_seqs, len(inp.kv_len)
        self.tp = int(inp.q_start[p])
        self.has_decode = S > p
        common = {"q_data_type": self.dtype, "kv_data_type": self.dtype}
        if p:
            qo = torch.tensor(inp.q_start[:p + 1], dtype=torch.int32, device=self.device)
            self._pw.plan(qo, *self._csr(inp, 0, p), self.hq, self.hk, self.d, self.B, causal=True, **common)
        if self.has_decode:
            self._dw.plan(*self._csr(inp, p, S), self.hq, self.hk, self.d, self.B, **common)

    def forward(self, layer: int, q: torch.Tensor, kv, ops) -> torch.Tensor:
        pages = kv.paged(layer)
        out = torch.empty_like(q)
        if self.tp:
            with ops("attn_prefill"):
                out[:self.tp] = self._pw.run(q[:self.tp], pages)
        if self.has_decode:
            with ops("attn_decode"):
                out[self.tp:] = self._dw.run(q[self.tp:], pages)
        return out


class FlashAttn:
    """FlashAttention-2 varlen with a block table (CUDA; pages of a multiple of 256 tokens)."""

    name = "flash_attn"

    def __init__(self, device, q_heads: int, kv_heads: int, head_dim: int, dtype, block_size: int):
        from flash_attn import flash_attn_varlen_func

        if block_size % 256:
            raise ValueError(f"flash_attn pages KV only in multiples of 256 tokens, not {block_size}")
        self._fn, self.B, self.device = flash_attn_varlen_func, block_size, device
        self.parts: list = []

    def plan(self, inp: StepInputs) -> None:
        i32 = {"dtype": torch.int32, "device": self.device}
        p, S = inp.num_prefill_seqs, len(inp.kv_len)
        self.parts = []
        for lo, hi, op in ((0, p, "attn_prefill"), (p, S, "attn_decode")):
            if hi == lo:
                continue
            qs = inp.q_start[lo:hi + 1] - inp.q_start[lo]
            lens = inp.kv_len[lo:hi]
            width = int(max(-(-lens // self.B)))
            bt = np.zeros((hi - lo, width), dtype=np.int64)
            for r, s in enumerate(range(lo, hi)):
                t = inp.block_tables[s]
                bt[r, :len(t)] = t[:width]
            self.parts.append((op, int(inp.q_start[lo]), int(inp.q_start[hi]), torch.tensor(qs, **i32),
                               torch.tensor(np.concatenate([[0], np.cumsum(lens)]), **i32), int(np.diff(qs).max()),
                               int(lens.max()), torch.tensor(bt, **i32)))

    def forward(self, layer: int, q: torch.Tensor, kv, ops) -> torch.Tensor:
        kp, vp = kv.paged(layer)
        out = torch.empty_like(q)
        for op, a, e, cq, ck, mq, mk, bt in self.parts:
            with ops(op):
                out[a:e] = self._fn(q[a:e], kp, vp, cq, ck, mq, mk, causal=True, block_table=bt)
        return out


_CLASSES = {"flash_attn": FlashAttn, "flashinfer": FlashInfer, "torch_sdpa": TorchSDPA}


def select_backend(device, q_heads: int, kv_heads: int, head_dim: int, dtype, block_size: int,
                   prefer: str | None = None):
    """The fastest backend that builds here: ``(backend, {name: why it was passed over})``.

    ``prefer`` (e.g. the calibration profile's attention backend) is tried first.
    """
    names = list(BACKENDS) if torch.device(device).type == "cuda" else ["torch_sdpa"]
    if prefer in names:
        names.remove(prefer)
        names.insert(0, prefer)
    passed = {}
    for name in names:
        try:
            backend = _CLASSES[name](device, q_heads, kv_heads, head_dim, dtype, block_size)
            _smoke(backend, device, q_heads, kv_heads, head_dim, dtype, block_size)
            return backend, passed
        except Exception as e:  # noqa: BLE001 - absent package, no kernel for this GPU/dtype/page size
            passed[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    raise RuntimeError(f"no attention backend works here: {passed}")


def _smoke(backend, device, hq: int, hk: int, d: int, dtype, B: int) -> None:
    """One tiny step (a 3-token chunk after 2 cached tokens and a decode over 5) through ``backend``."""
    from blendsim.real_backend.paged_kv import PagedKVCache
    from blendsim.real_backend.timing import NULL_OPS

    kv = PagedKVCache(1, 2 * (-(-6 // B)), B, hk, d, dtype, device)
    nb = -(-6 // B)
    tables = [np.arange(nb, dtype=np.int64), np.arange(nb, 2 * nb, dtype=np.int64)]
    inp = StepInputs(np.zeros(4, np.int64), np.array([2, 3, 4, 5]), np.zeros(4, np.int64), np.array([2, 3]),
                     np.array([0, 3, 4]), np.array([5, 6]), tables, 1)
    backend.plan(inp)
    q = torch.zeros(4, hq, d, dtype=dtype, device=device)
    out = backend.forward(0, q, kv, NULL_OPS)
    if not bool(torch.isfinite(out.float()).all()):
        raise RuntimeError("the smoke step gave non-finite output")


__all__ = ["BACKENDS", "FlashAttn", "FlashInfer", "TorchSDPA", "select_backend"]
