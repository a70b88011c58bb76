"""The operators as the real backend runs them: its model's forward on synthetic steps, each operator timed.

A kernel timed alone in a loop runs with its weights, inputs and code hot in the caches. In a forward
pass it does not: every layer streams different weights, and on a CPU each small operator's dispatch
and memory traffic starts cold, which costs several times its hot-loop time. So calibration times
every operator inside forwards of the replay's own model (``blendsim.real_backend.model.LlamaModel``) and
attention backend (``blendsim.real_backend.attention.select_backend``: plan, then forward over a paged KV cache
with block tables), with the replay's per-operator timer (``blendsim.real_backend.timing``). Each grid point is a
synthetic step whose features are the cost model's for that point (``blendsim.calibrate.validate.features``):

* token operators at ``t`` tokens (``n`` sampling rows for ``lm_head``): ``t`` decode tokens, each
  writing its own slot of the cache and reading one cached token (attention negligible);
* ``attn_prefill`` at ``(n, c)``: one chunk of ``n`` new tokens after ``c`` cached ones;
* ``attn_decode`` at ``(b, c)``: ``b`` decode tokens after ``c`` cached tokens each.

The model is the deployment's per-GPU shard (heads, MLP and vocabulary split ``tp`` ways) with as many
layers as the real model, capped so their weights stay near ``LAYER_BUDGET_BYTES`` (enough to cycle the
largest caches); layer operators are reported per layer.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from blendsim.calibrate.kernels import TOKEN_OPS

BLOCK_SIZE = 16  # KV page size: the engines' default (``policies``), so the replay pages alike
LAYER_BUDGET_BYTES = 1 << 30
MODEL_OPS = ("embedding", "lm_head")


def shard_spec(model, tp: int, layers: int, max_position: int = 0):
    """The ModelSpec of one GPU's shard under tensor parallelism, with ``layers`` layers."""
    kv = max(1, model.num_kv_heads // tp)
    return dataclasses.replace(
        model, num_layers=layers, num_heads=model.num_heads // tp, num_kv_heads=kv,
        intermediate_size=model.intermediate_size // tp, vocab_size=-(-model.vocab_size // tp),
        head_dim=model.head_dim, max_position_embeddings=max(model.max_position_embeddings, max_position))


def longest_position(plan: dict) -> int:
    """The longest sequence a plan's attention points reach (the rotary table must cover it)."""
    return max([n + c for n, c in plan.get("attn_prefill", [])] + [c + 1 for _, c in plan.get("attn_decode", [])] + [1])


def probe_layers(model, tp: int, budget: int = LAYER_BUDGET_BYTES) -> int:
    """Layers the probe runs: all of them, or as many as ``budget`` bytes of weights (at least two)."""
    per_layer = model.layer_params // tp * model.dtype_bytes
    return int(min(model.num_layers, max(2, -(-budget // max(per_layer, 1)))))


class ForwardProbe:
    """The real backend's model shard on one device, run on synthetic steps with every operator timed."""

    def __init__(self, model, tp: int, device: str, seed: int = 0, max_position: int = 0,
                 prefer_backend: str | None = None, block_size: int = BLOCK_SIZE):
        from blendsim.real_backend.attention import select_backend
        from blendsim.real_backend.model import LlamaModel
        from blendsim.real_backend.timing import Clock

        self.layers = probe_layers(model, tp)
        self.spec = shard_spec(model, tp, self.layers, max_position)
        self.device = torch.device(device)
        self.B = block_size
        self.model = LlamaModel(self.spec, self.device, seed)
        s = self.spec
        self.attn, self.passed_over = select_backend(self.device, s.num_heads, s.num_kv_heads, s.head_dim,
                                                     self.model.dtype, block_size, prefer_backend)
        self.clock = Clock(self.device)
        self.rng = np.random.default_rng(seed)
        self.kv = None
        self.last_inputs = None  # the StepInputs of the step built last

    @property
    def backend(self) -> str:
        return self.attn.name

    # ---- synthetic steps ------------------------------------------------------------------
    def tokens(self, t: int, logits: int = 1, keep=TOKEN_OPS):
        """A step of ``t`` decode tokens over one cached token each, ``logits`` of them sampling."""
        B, nb = self.B, -(-t // self.B)
        # as decodes do, each token writes a slot of its own scattered through the cache (t slots in all)
        slots = self.rng.permutation(nb * B)[:t].astype(np.int64)
        tables = [np.array([x // B], dtype=np.int64) for x in slots.tolist()]
        pos = np.arange(t, dtype=np.int64) % self.spec.max_position_embeddings
        return self._step(t, pos, slots, min(logits, t), np.arange(t + 1), np.ones(t, dtype=np.int64), tables, 0,
                          nb, keep)

    def prefill(self, n: int, ctx: int, keep=("attn_prefill",)):
        """One sequence's chunk of ``n`` new tokens after ``ctx`` cached ones (the last one samples)."""
        L = ctx + n
        table = self._blocks(-(-L // self.B))
        pos = np.arange(ctx, L, dtype=np.int64)
        slots = table[pos // self.B] * self.B + pos % self.B
        return self._step(n, pos, slots, 1, np.array([0, n]), np.array([L]), [table], 1, len(table), keep)

    def decode(self, b: int, ctx: int, keep=("attn_decode",)):
        """``b`` decode tokens after ``ctx`` cached tokens each (every one samples)."""
        per = -(-(ctx + 1) // self.B)
        blocks = self._blocks(b * per)
        tables = [blocks[i * per:(i + 1) * per] for i in range(b)]
        slots = np.array([tb[ctx // self.B] * self.B + ctx % self.B for tb in tables], dtype=np.int64)
        return self._step(b, np.full(b, ctx, dtype=np.int64), slots, b, np.arange(b + 1),
                          np.full(b, ctx + 1, dtype=np.int64), tables, 0, b * per, keep)

    def decode_kernel(self, b: int, ctx: int):
        """A callable running one layer's decode attention alone (``b`` tokens after ``ctx`` each)."""
        from blendsim.real_backend.timing import NULL_OPS

        self.decode(b, ctx)  # allocates the blocks and builds the inputs
        self.attn.plan(self.last_inputs)
        s = self.spec
        q = torch.randn(b, s.num_heads, s.head_dim, device=self.device).to(self.model.dtype)
        return lambda: self.attn.forward(0, q, self.kv, NULL_OPS)  # run at once: another step re-plans

    def release(self) -> None:
        """Free the KV cache (after an out-of-memory point); the next step allocates what it needs."""
        self.kv = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ---- internals ------------------------------------------------------------------------
    def _blocks(self, n: int) -> np.ndarray:
        self._ensure(n)
        return self.rng.permutation(self.kv.num_blocks)[:n].astype(np.int64)

    def _ensure(self, blocks: int) -> None:
        from blendsim.real_backend.paged_kv import PagedKVCache

        if self.kv is None or self.kv.num_blocks < blocks:
            s = self.spec
            self.kv = None
            self.kv = PagedKVCache(self.layers, max(blocks, 1), self.B, s.num_kv_heads, s.head_dim,
                                   self.model.dtype, self.device)

    def _step(self, t, pos, slots, logits, q_start, kv_len, tables, prefills, blocks, keep):
        from blendsim.real_backend.sequences import StepInputs

        self._ensure(blocks)
        ids = self.rng.integers(0, self.spec.vocab_size, t)
        inp = StepInputs(ids, pos, slots, np.arange(t - logits, t, dtype=np.int64), np.asarray(q_start, np.int64),
                         np.asarray(kv_len, np.int64), tables, prefills)
        self.last_inputs = inp
        dev = self.device
        args = [torch.from_numpy(np.ascontiguousarray(a)).to(dev) for a in (ids, pos, slots, inp.logits_rows)]
        per_layer = 1.0 / self.layers
        keep = set(keep)

        def run() -> dict:
            self._ensure(blocks)  # a release() after an out-of-memory point may have freed the cache
            self.attn.plan(inp)  # host work before the step, as the replay plans it
            ops = self.clock.ops()
            self.model(*args, self.attn, self.kv, ops)
            out = ops.result()
            return {k: v * (1.0 if k in MODEL_OPS else per_layer) for k, v in out.items() if k in keep}

        return run


def backend_info(probe: ForwardProbe) -> dict:
    """The attention backend and how operators were timed, for the profile's ``software``."""
    name = probe.backend
    mod = torch if name == "torch_sdpa" else __import__(name)
    info = {"attention_backend": name, "attention_version": getattr(mod, "__version__", "unknown"),
            "attention_block_size": probe.B, "probe_layers": probe.layers,
            "timing": "each operator inside forwards of real_backend's model (calibrate.forward)"}
    if name == "torch_sdpa" and probe.attn._backends is not None:
        info["sdpa_kernels"] = ", ".join(b.name.lower() for b in probe.attn._backends)
        info["sdpa_kernel_by_call"] = ", ".join(f"{k} {v}" for k, v in probe.attn.kernel_report().items())
    if probe.passed_over:
        info["attention_passed_over"] = probe.passed_over
    return info


def measure_plan(probe: ForwardProbe, clock, plan: dict, passes: int = 1, skipped: list | None = None,
                 tick=None, release=None) -> dict:
    """Time every operator of ``plan`` (``{op: [point, ...]}``) with ``probe``: ``{op: OpData}``.

    Token operators share one sweep over the union of their points (one forward times them all);
    attention operators get a sweep each. ``tick(label)`` is called once per point and pass.
    """
    from blendsim.calibrate.measure import measure_steps

    tick = tick or (lambda label: None)
    out: dict = {}
    token_ops = [op for op in plan if op not in ("attn_prefill", "attn_decode")]
    at: dict = {}
    for op in token_ops:
        for p in plan[op]:
            at.setdefault(tuple(p), []).append(op)
    if at:
        build = lambda p: probe.tokens(p[0], p[0] if "lm_head" in at[p] else 1, keep=at[p])  # noqa: E731
        out.update(measure_steps(clock, sorted(at), build, lambda p: at[p], passes, skipped,
                                 on_point=lambda: tick("token ops"), release=release))
    for op, build in (("attn_prefill", lambda p: probe.prefill(*p)), ("attn_decode", lambda p: probe.decode(*p))):
        if plan.get(op):
            out.update(measure_steps(clock, sorted(set(map(tuple, plan[op]))), build, lambda p, op=op: (op,), passes,
                                     skipped, on_point=lambda op=op: tick(op), release=release))
    return out


def plan_steps(plan: dict) -> int:
    """How many points :func:`measure_plan` sweeps per pass."""
    token = {tuple(p) for op, pts in plan.items() if op not in ("attn_prefill", "attn_decode") for p in pts}
    return len(token) + sum(len({tuple(p) for p in plan.get(op, [])}) for op in ("attn_prefill", "attn_decode"))


__all__ = ["BLOCK_SIZE", "ForwardProbe", "backend_info", "longest_position", "measure_plan", "plan_steps",
           "probe_layers", "shard_spec"]
