"""Replay a recorded schedule on a device, step by step, exactly as the simulator formed it.

A schedule (``RunResult.schedule``, or ``RUN_DIR/schedule.parquet`` from ``blendsim simulate
--record-schedule``) lists every replica's events in order (``blendsim.sim.scheduler.Scheduler.events``). For each
step the replay applies that step's events — preemptions, evictions, chunk allocations, cache inserts,
decodes — rebuilds the step's :class:`blendsim.sim.batch.Batch` from its ``chunk`` and ``decode`` events, executes
it, then applies the step's ``finish`` events. The replayed Batches are the simulator's Batches (tested).

:func:`peak_blocks` runs the same events through a device-free block manager to find the most KV blocks
the schedule ever holds, so a schedule that cannot fit the device is refused before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from blendsim.real_backend.paged_kv import BlockManager, KVExhausted
from blendsim.real_backend.sequences import SequenceBook
from blendsim.sim.batch import Batch
from blendsim.sim.errors import UserError
from blendsim.sim.io import read_parquet

META_KEYS = ("block_size", "kv_capacity_blocks", "model", "policy", "dtype", "tp")


@dataclass(frozen=True)
class Schedule:
    """A recorded schedule: metadata and, per replica, its events ``(step, kind, request, a, b, c)``."""

    meta: dict
    events: dict  # replica -> list of event tuples, in order

    @property
    def block_size(self) -> int:
        return int(self.meta["block_size"])

    @property
    def capacity_blocks(self) -> int:
        return int(self.meta["kv_capacity_blocks"])


def load_schedule(src) -> Schedule:
    """A schedule from ``RunResult.schedule`` (a dict of columns), a ``schedule.parquet`` or a run folder."""
    if isinstance(src, dict):
        cols, meta = src, dict(src["_meta"])
    else:
        cols, meta = _read_parquet(Path(src))
    events: dict = {}
    rows = zip(cols["replica"], cols["step"], cols["kind"], cols["request"], cols["a"], cols["b"], cols["c"])
    for rep, step, kind, req, a, b, c in rows:
        events.setdefault(int(rep), []).append((int(step), str(kind), int(req), int(a), int(b), int(c)))
    return Schedule(meta, dict(sorted(events.items())))


def _read_parquet(path: Path):

    from blendsim.sim import columns as col

    if path.is_dir():
        path = path / "schedule.parquet"
    tab = read_parquet(path, "schedule", missing="no such schedule (simulate with --record-schedule)")
    md = {k.decode(): v.decode() for k, v in (tab.schema.metadata or {}).items()}
    missing = [k for k in ("replica", "step", "kind", "request", "a", "b", "c") if k not in tab.column_names]
    if missing or any(f"blendsim.{k}" not in md for k in META_KEYS):
        raise UserError(f"{path}: not a blendsim schedule (missing {', '.join(missing) or 'metadata'})")
    meta = {k: md[f"blendsim.{k}"] for k in META_KEYS}
    for k in ("block_size", "kv_capacity_blocks", "tp"):
        meta[k] = int(meta[k])
    return {c: col.to_numpy(tab.column(c)).tolist() for c in tab.column_names}, meta


def steps(events: list):
    """``(step, before, batch_parts, after)`` per step: the events applied before the forward, the
    step's chunks and decodes, and its finishes (applied after)."""
    i, n = 0, len(events)
    while i < n:
        step = events[i][0]
        before, chunks, decodes, after = [], [], [], []
        while i < n and events[i][0] == step:
            e = events[i]
            kind = e[1]
            if kind == "finish":
                after.append(e)
            else:
                if after:
                    raise UserError(f"schedule: step {step} has a {kind!r} event after a finish (corrupt schedule)")
                before.append(e)
                if kind == "chunk":
                    chunks.append((e[2], e[3], e[4], e[5]))
                elif kind == "decode":
                    decodes.append((e[2], e[3]))
            i += 1
        yield step, before, (chunks, decodes), after


def make_batch(step: int, chunks: list, decodes: list, book: SequenceBook) -> Batch:
    """The step's Batch; a chunk samples when it completes its request's target (events applied)."""
    logits = len(decodes) + sum(1 for r, n, c, _ in chunks if c + n == book.target(r))
    return Batch(step, list(chunks), len(decodes), sum(c for _, c in decodes), logits, list(decodes) or None)


def replay(executor, events: list, max_steps: int | None = None, on_step=None) -> int:
    """Execute a replica's events on ``executor`` (a :class:`TorchExecutor`); returns steps executed.

    ``on_step(batch, record)`` is called after every step (progress, checkpoints).
    """
    done = 0
    for step, before, (chunks, decodes), after in steps(events):
        if max_steps is not None and done >= max_steps:
            break
        for e in before:
            executor.apply(*e[1:])
        batch = make_batch(step, chunks, decodes, executor.book)
        rec = executor.execute(batch)
        for e in after:
            executor.apply(*e[1:])
        done += 1
        if on_step is not None:
            on_step(batch, rec)
    return done


def peak_blocks(events: list, trace, tree, block_size: int, capacity: int, max_steps: int | None = None) -> int:
    """The most KV blocks the replica's schedule holds at once (device-free dry run of its events)."""
    book = SequenceBook(trace, BlockManager(capacity, block_size, tree), 1)
    done = 0
    try:
        for _step, before, _parts, after in steps(events):
            if max_steps is not None and done >= max_steps:
                break
            for e in before + after:
                book.apply(*e[1:])
            done += 1
    except KVExhausted as e:
        raise UserError(f"schedule holds more KV than its own capacity of {capacity} blocks ({e}); "
                        f"corrupt schedule") from None
    return book.blocks.peak


__all__ = ["Schedule", "load_schedule", "make_batch", "peak_blocks", "replay", "steps"]
