"""Paged KV memory of the real backend: a device-free block manager and the device tensors it indexes.

:class:`BlockManager` owns physical block ids. Every running sequence has a *block table* (its logical
blocks -> physical blocks) and holds one reference on each block in it. The *block map*, keyed by
``(static prefix-tree node, block index within the node)``, is the prefix cache: it mirrors
``blendsim.sim.kv.KVCache`` exactly because it changes only through the simulator's own ``insert`` / ``evict``
events (``blendsim.sim.scheduler.Scheduler.events``). A sequence admitted with ``h`` cached tokens points its first
``h / block_size`` table entries at the mapped blocks, so sequences sharing a prefix share physical KV.
A block returns to the free list when no table references it and the map does not hold it.

:class:`PagedKVCache` holds K and V per layer in the slot-addressed NHD layout
``[num_blocks * block_size, kv_heads, head_dim]`` (slot = block * block_size + offset), the layout
vLLM, FlashInfer ("NHD" pages) and the calibration's ``kv_write`` use.
"""

from __future__ import annotations

import numpy as np


class KVExhausted(RuntimeError):
    """More physical blocks were needed than the cache has (the schedule does not fit)."""


class ScheduleMismatch(RuntimeError):
    """A schedule event contradicts the sequences' state (a corrupt or foreign schedule)."""


class BlockManager:
    """Physical blocks, block tables, reference counts and the prefix-cache block map."""

    def __init__(self, num_blocks: int, block_size: int, tree):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("need at least one block of at least one token")
        self.num_blocks = int(num_blocks)
        self.B = B = int(block_size)
        self._free = list(range(self.num_blocks - 1, -1, -1))  # pop() hands out the lowest id first
        self._ref = np.zeros(self.num_blocks, dtype=np.int32)  # tables holding each block
        self._in_map = np.zeros(self.num_blocks, dtype=bool)
        self.block_map: dict[tuple[int, int], int] = {}  # (node, index in node) -> physical block
        self.tables: dict[int, list[int]] = {}  # request -> physical blocks, logical order
        self.lengths: dict[int, int] = {}  # request -> tokens in its KV
        self.peak = 0  # most blocks ever in use
        start = np.asarray(tree.start, dtype=np.int64)
        end = start + np.asarray(tree.tokens, dtype=np.int64)
        self._blk_start = (start // B).tolist()  # first global block index owned by each node
        self._nblocks = (end // B - start // B).tolist()
        self._parent = np.asarray(tree.parent).tolist()
        self._req_node = np.asarray(tree.req_node).tolist()

    # ---- queries --------------------------------------------------------------------------
    @property
    def num_used(self) -> int:
        """Blocks held by a table or by the block map (the simulator's cache + private blocks)."""
        return self.num_blocks - len(self._free)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def path_of(self, req: int) -> list[int]:
        """Static-tree nodes from the root's child down to the end of ``req``'s prompt."""
        out, x = [], self._req_node[req]
        while x > 0:
            out.append(x)
            x = self._parent[x]
        return out[::-1]

    def slots(self, req: int, start: int, end: int) -> np.ndarray:
        """KV slots (block * block_size + offset) of positions ``start .. end-1`` of ``req``."""
        pos = np.arange(start, end, dtype=np.int64)
        table = np.asarray(self.tables[req], dtype=np.int64)
        return table[pos // self.B] * self.B + pos % self.B

    def table(self, req: int) -> np.ndarray:
        return np.asarray(self.tables[req], dtype=np.int64)

    # ---- acting (one method per schedule event) -------------------------------------------
    def admit(self, req: int, cached_tokens: int) -> None:
        """Start a block table for ``req``; its first ``cached_tokens`` tokens come from the block map."""
        if req in self.tables:
            raise ScheduleMismatch(f"request {req} admitted while it still holds KV")
        if cached_tokens % self.B:
            raise ScheduleMismatch(f"request {req}: {cached_tokens} cached tokens is not a whole number of blocks")
        hit = cached_tokens // self.B
        table: list[int] = []
        for x in self.path_of(req):
            if len(table) >= hit:
                break
            for i in range(min(self._nblocks[x], hit - len(table))):
                b = self.block_map.get((x, i))
                if b is None:
                    raise ScheduleMismatch(f"request {req}: cached block {i} of node {x} is not in the cache")
                table.append(b)
        if len(table) < hit:
            raise ScheduleMismatch(f"request {req}: {hit} cached blocks but its prompt has only {len(table)}")
        for b in table:
            self._ref[b] += 1
        self.tables[req] = table
        self.lengths[req] = cached_tokens

    def extend(self, req: int, tokens: int) -> None:
        """Grow ``req``'s KV to ``tokens`` tokens, taking fresh blocks as needed."""
        table = self.tables[req]
        need = -(-tokens // self.B) - len(table)
        if need > len(self._free):
            raise KVExhausted(f"request {req} needs {need} more KV blocks, {len(self._free)} are free")
        for _ in range(need):
            b = self._free.pop()
            self._ref[b] = 1
            table.append(b)
        self.lengths[req] = tokens
        used = self.num_blocks - len(self._free)
        if used > self.peak:
            self.peak = used

    def insert(self, req: int, node: int, index: int, count: int) -> None:
        """Blocks ``index .. index+count-1`` of ``node``, computed by ``req``, enter the block map."""
        table = self.tables.get(req)
        first = self._blk_start[node] + index
        if table is None or first + count > len(table):
            raise ScheduleMismatch(f"insert of node {node} blocks {index}+{count}: request {req} has not "
                                   f"allocated them")
        for k in range(count):
            key = (node, index + k)
            if key in self.block_map:
                raise ScheduleMismatch(f"block {index + k} of node {node} is already cached")
            b = table[first + k]
            self.block_map[key] = b
            self._in_map[b] = True

    def evict(self, node: int, index: int, count: int) -> None:
        """Blocks ``index .. index+count-1`` of ``node`` leave the block map."""
        for k in range(count):
            b = self.block_map.pop((node, index + k), None)
            if b is None:
                raise ScheduleMismatch(f"evict of block {index + k} of node {node}, which is not cached")
            self._in_map[b] = False
            if self._ref[b] == 0:
                self._free.append(b)

    def release(self, req: int) -> None:
        """``req`` finished or was preempted: drop its references; unmapped blocks become free."""
        table = self.tables.pop(req, None)
        if table is None:
            raise ScheduleMismatch(f"request {req} released but holds no KV")
        del self.lengths[req]
        for b in table:
            r = self._ref[b] - 1
            self._ref[b] = r
            if r == 0 and not self._in_map[b]:
                self._free.append(b)

    # ---- introspection for tests ----------------------------------------------------------
    def cached_per_node(self) -> dict[int, int]:
        """Cached blocks per node (keys present only for nodes with some)."""
        out: dict[int, int] = {}
        for x, _ in self.block_map:
            out[x] = out.get(x, 0) + 1
        return out

    def check(self) -> None:
        """Recount references and the free list from the tables and the map (slow; tests only)."""
        ref = np.zeros(self.num_blocks, dtype=np.int32)
        for t in self.tables.values():
            np.add.at(ref, np.asarray(t, dtype=np.int64), 1)
        assert (ref == self._ref).all()
        in_map = np.zeros(self.num_blocks, dtype=bool)
        in_map[list(self.block_map.values())] = True
        assert (in_map == self._in_map).all()
        free = np.zeros(self.num_blocks, dtype=bool)
        free[self._free] = True
        assert len(set(self._free)) == len(self._free)
        assert (free == ((ref == 0) & ~in_map)).all()


class PagedKVCache:
    """K and V of every layer, slot-addressed: ``k[layer]`` is ``[num_blocks * block_size, kv_heads, head_dim]``."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype, device):
        import torch

        self.block_size = block_size
        self.num_blocks = num_blocks
        shape = (num_blocks * block_size, kv_heads, head_dim)
        # NOTE: zero-filled so a bug that reads an unwritten slot gives a wrong number, never NaN noise
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def write(self, layer: int, slots, k, v) -> None:
        """Scatter this step's new K and V (``[tokens, kv_heads, head_dim]``) into their slots."""
        self.k[layer].index_copy_(0, slots, k)
        self.v[layer].index_copy_(0, slots, v)

    def paged(self, layer: int):
        """K and V of ``layer`` as pages ``[num_blocks, block_size, kv_heads, head_dim]`` (views)."""
        B = self.block_size
        k, v = self.k[layer], self.v[layer]
        return k.view(-1, B, *k.shape[1:]), v.view(-1, B, *v.shape[1:])

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
        return 2 * num_layers * block_size * kv_heads * head_dim * dtype_bytes


__all__ = ["BlockManager", "KVExhausted", "PagedKVCache", "ScheduleMismatch"]
