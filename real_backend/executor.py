"""TorchExecutor: runs one engine step on a device and measures it — a drop-in for ``blendsim.sim.engine.SimExecutor``.

``run(batch) -> seconds`` is the Executor protocol of the engine (``Replica.run_until``); ``.last`` is
the step's (compute, memory) seconds when per-operator timing ran on it, else (0, 0). The executor owns
one replica's paged KV (:class:`BlockManager` + :class:`PagedKVCache`) and its sequences' state. The
schedule's events reach it two ways:

* *live*: give it the scheduler's ``events`` list (``Scheduler(record=True)``); each ``run`` first
  applies the events appended since the last one — the previous step's finishes, then this step's
  preemptions, evictions, chunk allocations, cache inserts and decodes, in the scheduler's order;
* *replay*: ``blendsim.real_backend.replay`` calls :meth:`apply` for each recorded event and :meth:`execute` per step.

A :class:`DeviceRuntime` (model weights, clock) is shared by every executor of a validation run.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from blendsim.real_backend.attention import select_backend
from blendsim.real_backend.model import LlamaModel
from blendsim.real_backend.paged_kv import BlockManager, PagedKVCache
from blendsim.real_backend.sequences import SequenceBook, StepInputs
from blendsim.real_backend.timing import NULL_OPS, Clock
from blendsim.sim.ops import OPS


class DeviceRuntime:
    """The model on one device and the clock that times it."""

    def __init__(self, spec, device: str = "cpu", seed: int = 0, prefer_backend: str | None = None):
        self.spec = spec
        self.device = torch.device(device)
        self.model = LlamaModel(spec, self.device, seed)
        self.clock = Clock(self.device)
        self.prefer_backend = prefer_backend
        self._attention: dict = {}

    def attention(self, block_size: int):
        """The attention backend for ``block_size`` pages: ``(backend, {passed-over: why})``. One per page
        size, shared by the executors of this runtime (they run one at a time; workspaces are reused)."""
        if block_size not in self._attention:
            s = self.spec
            self._attention[block_size] = select_backend(self.device, s.num_heads, s.num_kv_heads, s.head_dim,
                                                         self.model.dtype, block_size, self.prefer_backend)
        return self._attention[block_size]

    def warmup(self, trace, tree, block_size: int, steps: int = 3) -> None:
        """Run a few throw-away steps (first-call allocations, kernel selection) on a scratch cache: a
        prefill chunk of the longest prompt (at most 256 tokens), the shortest prompt whole, its decodes."""
        from blendsim.sim.batch import Batch

        lo, hi = int(np.argmin(trace.input_len)), int(np.argmax(trace.input_len))
        p, n = int(trace.input_len[lo]), min(int(trace.input_len[hi]), 256)
        ex = TorchExecutor(self, trace, tree, block_size, -(-n // block_size) + -(-(p + steps) // block_size) + 2)
        ex.apply("chunk", hi, n, 0, 0)
        ex.execute(Batch(0, [(hi, n, 0, 0)], 0, 0, int(n == trace.input_len[hi])))
        if lo != hi:
            ex.apply("chunk", lo, p, 0, 0)
            ex.execute(Batch(1, [(lo, p, 0, 0)], 0, 0, 1))
            for k in range(steps):
                ex.apply("decode", lo, p + k, 0, 0)
                ex.execute(Batch(k + 2, [], 1, p + k, 1, [(lo, p + k)]))
        self.clock.sync()


@dataclass(slots=True)
class StepRecord:
    """What one executed step measured."""

    step: int
    measured_s: float  # device time of the forward (median over repeats)
    host_s: float  # host time to issue the forward (equals measured_s on CPU)
    prep_s: float  # host time to build the inputs and plan attention (not part of measured_s)
    repeats: list = field(default_factory=list)  # every repeat's device seconds
    ops: dict = field(default_factory=dict)  # per-operator seconds (summed over layers) when sampled
    checksum: int = 0  # sum of the greedy (argmax) token ids sampled this step


class TorchExecutor:
    """Executes Batches on a device with a paged KV cache; ``run(batch) -> seconds``."""

    def __init__(self, runtime: DeviceRuntime, trace, tree, block_size: int, num_blocks: int, *,
                 events: list | None = None, repeats: int = 1, op_every: int = 0):
        s = runtime.spec
        self.rt = runtime
        self.book = SequenceBook(trace, BlockManager(num_blocks, block_size, tree), s.vocab_size)
        self.kv = PagedKVCache(s.num_layers, num_blocks, block_size, s.num_kv_heads, s.head_dim,
                               runtime.model.dtype, runtime.device)
        self.attn, self.attn_passed_over = runtime.attention(block_size)
        self.events = events  # live mode: the scheduler's event list
        self._cursor = 0
        self.repeats = max(1, int(repeats))
        self.op_every = int(op_every)  # time operators on every op_every-th step (0: never)
        self.last = (0.0, 0.0)
        self.records: list[StepRecord] = []

    @property
    def blocks(self) -> BlockManager:
        return self.book.blocks

    # ---- the Executor protocol ------------------------------------------------------------
    def run(self, batch) -> float:
        """Apply the scheduler's new events (live mode), execute ``batch``, return its measured seconds."""
        self.catch_up()
        return self.execute(batch).measured_s

    def catch_up(self) -> None:
        """Live mode: apply the scheduler's events appended since the last call (e.g. a step's finishes)."""
        if self.events is not None:
            ev = self.events
            for e in ev[self._cursor:]:
                self.book.apply(*e[1:])
            self._cursor = len(ev)

    def apply(self, kind: str, req: int, a: int, b: int, c: int) -> None:
        """Apply one schedule event (replay mode)."""
        self.book.apply(kind, req, a, b, c)

    # ---- execution ------------------------------------------------------------------------
    def execute(self, batch, time_ops: bool | None = None) -> StepRecord:
        """Run ``batch`` (its events already applied) and record the measurement."""
        t0 = time.perf_counter()
        inp = self.book.inputs(batch)
        args = self._to_device(inp)
        self.attn.plan(inp)
        prep = time.perf_counter() - t0
        fwd = lambda ops: self.rt.model(*args, self.attn, self.kv, ops)  # noqa: E731
        times, hosts, logits = [], [], None
        for _ in range(self.repeats):
            logits, dt, host = self.rt.clock.time(lambda: fwd(NULL_OPS))
            times.append(dt)
            hosts.append(host)
        rec = StepRecord(batch.step, statistics.median(times), statistics.median(hosts), prep, times)
        if time_ops if time_ops is not None else (self.op_every and batch.step % self.op_every == 0):
            ops = self.rt.clock.ops()
            fwd(ops)
            rec.ops = ops.result()
            comp = sum(t for k, t in rec.ops.items() if OPS[k][0] == "compute")
            mem = sum(t for k, t in rec.ops.items() if OPS[k][0] == "memory")
            self.last = (comp, mem)
        else:
            self.last = (0.0, 0.0)
        # greedy sampling, outside the timed forward (the cost model prices it as engine overhead)
        rec.checksum = int(logits.argmax(-1).sum()) if logits.shape[0] else 0
        self.records.append(rec)
        return rec

    def _to_device(self, inp: StepInputs):
        dev = self.rt.device
        t = lambda a: torch.from_numpy(a).to(dev, non_blocking=True)  # noqa: E731
        return t(inp.input_ids), t(inp.positions), t(inp.slots), t(inp.logits_rows)


__all__ = ["DeviceRuntime", "StepRecord", "TorchExecutor"]
