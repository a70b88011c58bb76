"""Attention kernels to profile: prefill of one chunk after its context, and batched decode over a KV cache.

The fastest backend available is used, in this order: FlashAttention (``flash_attn``, varlen/KV-cache
kernels, GQA native), FlashInfer (single-request prefill, paged batch decode), then PyTorch's
``scaled_dot_product_attention``. The first two only on CUDA; a backend that imports but fails a
smoke call is passed over with its reason recorded.

Semantics match the cost model (``sim.ops``): a prefill chunk of ``n`` new tokens after ``c`` cached
tokens attends causally to ``c + n`` keys, with the causal diagonal aligned to the *end* (chunked
prefill); a decode step of ``b`` sequences reads each sequence's ``c`` cached tokens plus its new one.
Query and KV heads are the per-GPU shard (GQA kept: KV heads are never expanded for a GQA-aware kernel).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BACKENDS = ("flash_attn", "flashinfer", "torch_sdpa")


class Attention:
    """Prefill and decode kernels for one shard's heads on one device."""

    def __init__(self, backend: str, q_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: str,
                 seed: int = 0):
        self.backend = backend
        self.hq, self.hk, self.d = q_heads, kv_heads, head_dim
        self.dtype = dtype
        self.device = device
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)
        self._gqa_sdpa = _sdpa_has_gqa()
        self._fi_workspace = None

    def _rand(self, *shape) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen, device=self.device, dtype=torch.float32).to(self.dtype)

    # ---- prefill --------------------------------------------------------------------------
    def prefill(self, n: int, ctx: int):
        """A callable running one sequence's chunk of ``n`` new tokens after ``ctx`` cached ones."""
        L = ctx + n
        if self.backend == "flash_attn":
            from flash_attn import flash_attn_func

            q, k, v = self._rand(1, n, self.hq, self.d), self._rand(1, L, self.hk, self.d), self._rand(1, L, self.hk, self.d)
            return lambda: flash_attn_func(q, k, v, causal=True)  # bottom-right causal since FA 2.1
        if self.backend == "flashinfer":
            import flashinfer

            q, k, v = self._rand(n, self.hq, self.d), self._rand(L, self.hk, self.d), self._rand(L, self.hk, self.d)
            return lambda: flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True)
        q = self._rand(1, self.hq, n, self.d)
        k, v = self._sdpa_kv(1, L)
        if ctx == 0:
            return lambda: self._sdpa(q, k, v, is_causal=True)
        # query i (position ctx + i) sees keys 0 .. ctx + i: SDPA's is_causal aligns top-left, so mask
        keep = torch.arange(L, device=self.device)[None, :] <= (ctx + torch.arange(n, device=self.device))[:, None]
        return lambda: self._sdpa(q, k, v, attn_mask=keep)

    # ---- decode ---------------------------------------------------------------------------
    def decode(self, batch: int, ctx: int):
        """A callable running one decode step of ``batch`` sequences with ``ctx`` cached tokens each."""
        L = ctx + 1  # the new token's K and V are already written (kv_write)
        if self.backend == "flash_attn":
            from flash_attn import flash_attn_with_kvcache

            q = self._rand(batch, 1, self.hq, self.d)
            kc, vc = self._rand(batch, L, self.hk, self.d), self._rand(batch, L, self.hk, self.d)
            lens = torch.full((batch,), L, dtype=torch.int32, device=self.device)
            return lambda: flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)
        if self.backend == "flashinfer":
            return self._flashinfer_decode(batch, L)
        q = self._rand(batch, self.hq, 1, self.d)
        k, v = self._sdpa_kv(batch, L)
        return lambda: self._sdpa(q, k, v)

    # ---- internals ------------------------------------------------------------------------
    def _sdpa_kv(self, batch: int, L: int):
        k, v = self._rand(batch, self.hk, L, self.d), self._rand(batch, self.hk, L, self.d)
        if not self._gqa_sdpa and self.hk != self.hq:
            # NOTE: torch < 2.5 has no GQA in SDPA; expanding reads hq/hk times the KV bytes (recorded)
            k, v = (t.repeat_interleave(self.hq // self.hk, dim=1) for t in (k, v))
        return k, v

    def _sdpa(self, q, k, v, **kw):
        if self._gqa_sdpa and self.hk != self.hq:
            kw["enable_gqa"] = True
        return F.scaled_dot_product_attention(q, k, v, **kw)

    def _flashinfer_decode(self, batch: int, L: int, page: int = 16):
        import flashinfer

        if self._fi_workspace is None:
            self._fi_workspace = torch.empty(128 * 2**20, dtype=torch.uint8, device=self.device)
        pages_per_seq = -(-L // page)
        n_pages = batch * pages_per_seq
        cache = self._rand(n_pages, 2, page, self.hk, self.d)  # NHD paged layout
        i32 = {"dtype": torch.int32, "device": self.device}
        indptr = torch.arange(0, n_pages + 1, pages_per_seq, **i32)
        indices = torch.randperm(n_pages, generator=self.gen, device=self.device).to(torch.int32)
        last = torch.full((batch,), L - (pages_per_seq - 1) * page, **i32)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(self._fi_workspace, "NHD")
        plan = getattr(w, "plan", None) or w.begin_forward
        try:
            plan(indptr, indices, last, self.hq, self.hk, self.d, page, q_data_type=self.dtype,
                 kv_data_type=self.dtype)
        except TypeError:  # flashinfer < 0.2
            plan(indptr, indices, last, self.hq, self.hk, self.d, page, data_type=self.dtype)
        run = getattr(w, "run", None) or w.forward
        q = self._rand(batch, self.hq, self.d)
        return lambda: run(q, cache)


def _version(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def _sdpa_has_gqa() -> bool:
    import inspect

    try:
        return "enable_gqa" in inspect.signature(F.scaled_dot_product_attention).parameters
    except (TypeError, ValueError):  # a builtin without a signature: try it
        try:
            x = torch.zeros(1, 2, 1, 4)
            F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
            return True
        except (TypeError, RuntimeError):
            return False


def pick_backend(device: str, q_heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> tuple[str, dict]:
    """The fastest working backend and what was found: ``(name, info)``; info goes in ``software``."""
    info: dict = {}
    passed_over = {}
    for name in (BACKENDS[:-1] if device == "cuda" else ()):
        try:
            mod = __import__(name)
            if name == "flash_attn" and _version(getattr(mod, "__version__", "0")) < (2, 1):
                raise RuntimeError("flash_attn < 2.1 aligns the causal mask top-left (wrong for chunked prefill)")
            att = Attention(name, q_heads, kv_heads, head_dim, dtype, device)
            att.prefill(16, 16)()
            att.decode(2, 32)()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - any failure (absent, no kernel for this GPU/dtype): next one
            first = str(e).splitlines()[0][:160] if str(e) else ""
            passed_over[name] = f"{type(e).__name__}: {first}"
            continue
        info["attention_version"] = getattr(mod, "__version__", "unknown")
        break
    else:
        name = "torch_sdpa"
        info["attention_version"] = torch.__version__
        info["attention_gqa_native"] = _sdpa_has_gqa() or q_heads == kv_heads
    if passed_over:
        info["attention_passed_over"] = passed_over
    return name, info


__all__ = ["Attention", "BACKENDS", "pick_backend"]
