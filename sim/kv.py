"""Paged KV memory and the runtime prefix cache — device-free, shared by the simulator and the replay.

Memory is counted in blocks of ``block_size`` tokens. Prefix sharing is by whole blocks (vLLM's rule):
block j of a prompt (tokens [jB, (j+1)B)) can be shared by every request whose prompt agrees on its
first (j+1)B tokens. In the static prefix tree (``blendsim.sim.prefix_tree``) that block belongs to the node
containing token (j+1)B - 1, so the cache keeps, per tree node, how many of the node's own full blocks
are cached (always a prefix of them). ``block_size=1`` gives token-granular sharing (SGLang's default).

A running request holds a reference on the path nodes it uses; nodes with no reference are evictable,
deepest-first in least-recently-used order (SGLang's leaf LRU), a node's blocks from its tail. With
``retain=False`` a prefix lives only while a running request uses it (sharing among the requests in
memory together, no reuse after the last one finishes): :meth:`unlock_all` frees every unreferenced block
at each release. Every insertion and eviction can be reported to a listener, so a replay of the
schedule can mirror the cache exactly.

Counters are running totals; nothing here walks all blocks or all requests.
"""

from __future__ import annotations

import heapq
from array import array

import numpy as np

from blendsim.sim.prefix_tree import PrefixTree, node_path
from blendsim.sim.seq import int_list


class KVCache:
    """Block accounting plus a prefix cache over a static prefix tree's nodes."""

    tiered = False  # True for blendsim.sim.kv_tiers.TieredKVCache (host/disk tiers below)

    def __init__(self, tree: PrefixTree, num_blocks: int, block_size: int = 16, caching: bool = True,
                 on_event=None, retain: bool = True):
        if num_blocks <= 0:
            raise ValueError("KV cache needs at least one block")
        self.tree = tree
        self.block_size = B = int(block_size)
        self.total = int(num_blocks)
        self.caching = caching
        self.retain = retain
        self.on_event = on_event  # callable(kind, node, index, count) for "insert"/"evict", or None
        start = tree.start
        end = start + tree.tokens
        # lists (read per step), equal values sharing one int object (sim.seq.int_list)
        self.blk_start = int_list(start // B)  # first block index owned by each node
        self.nblocks = int_list(end // B - start // B)  # full blocks ending inside each node
        self.parent = int_list(tree.parent)
        # read once per admission, not per step: an int64 array (8 bytes a request, not a list's ~40)
        self._req_node = array("q", np.ascontiguousarray(tree.req_node, dtype=np.int64).tobytes())
        n = tree.num_nodes
        self.cached = [0] * n  # cached blocks per node (a prefix of the node's blocks)
        self.ref = [0] * n  # running requests using the node
        # last use (simulated seconds): float64 array, not a list (every node's time would be a 24-byte float
        # object of its own: 0.3 GB at 10M requests); read and written per admission and finish, not per step
        self.access = array("d", bytes(8 * n))
        self.cached_children = [0] * n  # children with cached blocks (a node is a leaf when 0)
        self._heap: list = []  # (access, node) candidates for eviction, lazily invalidated
        self.cache_blocks = 0  # blocks held by the prefix cache (referenced or not)
        self.evictable = 0  # cache blocks of unreferenced nodes
        self.private = 0  # blocks held privately by running requests
        self.evicted_blocks = 0  # lifetime total

    # ---- queries --------------------------------------------------------------------------
    @property
    def free(self) -> int:
        return self.total - self.cache_blocks - self.private

    @property
    def available(self) -> int:
        """Blocks that can be had now: free plus evictable cache."""
        return self.total - self.cache_blocks - self.private + self.evictable

    @property
    def used(self) -> int:
        """Blocks holding live data of running requests (evictable cache excluded)."""
        return self.cache_blocks - self.evictable + self.private

    def path_of(self, req: int) -> list[int]:
        """Static-tree nodes from the root's child down to the end of ``req``'s prompt."""
        return node_path(self.parent, self._req_node[req])

    def match(self, path: list[int], max_blocks: int) -> int:
        """Blocks of the prefix along ``path`` that are cached, at most ``max_blocks``."""
        if not self.caching:
            return 0
        hit = 0
        cached, nb = self.cached, self.nblocks
        for x in path:
            c = cached[x]
            hit += c
            if c < nb[x] or hit >= max_blocks:
                break
        return min(hit, max_blocks)

    # the scheduler's admission match: with host/disk tiers (kv_tiers) it also counts their blocks, while
    # ``match`` (what policies read) stays the GPU's
    match_tiers = match

    # ---- acting ---------------------------------------------------------------------------
    def reserve(self, n: int) -> bool:
        """Take ``n`` private blocks, evicting unreferenced cache as needed; False if impossible."""
        if n > self.total - self.cache_blocks - self.private + self.evictable:
            return False
        short = n - (self.total - self.cache_blocks - self.private)
        if short > 0:
            self.evict(short)
        self.private += n
        return True

    def release(self, n: int) -> None:
        self.private -= n

    def lock(self, node: int, now: float) -> None:
        """A running request starts using ``node``."""
        r = self.ref[node]
        if r == 0:
            self.evictable -= self.cached[node]
        self.ref[node] = r + 1
        self.access[node] = now

    def unlock(self, node: int, now: float) -> None:
        r = self.ref[node] - 1
        self.ref[node] = r
        self.access[node] = now
        if r == 0 and self.cached[node]:
            self.evictable += self.cached[node]
            if self.cached_children[node] == 0:
                heapq.heappush(self._heap, (now, node))

    def unlock_all(self, nodes, now: float) -> None:
        """A running request (or a pin) stops using ``nodes``; without retention, every block no
        request uses any more is freed at once (after the whole path, so children go first)."""
        for x in nodes:
            self.unlock(x, now)
        if not self.retain and self.evictable:
            self.evict(self.evictable)

    def insert(self, node: int, index: int, count: int) -> int:
        """Offer blocks ``index .. index+count-1`` of ``node``, computed privately by a request that
        holds a reference on ``node``. Those that extend the node's cached prefix move from private to
        cache; the rest (already cached by another request, or after a gap) stay private. Returns how
        many moved."""
        if not self.caching:
            return 0
        c = self.cached[node]
        new = index + count - c
        if c < index or new <= 0:
            return 0
        if c == 0:
            p = self.parent[node]
            if p >= 0:
                self.cached_children[p] += 1
        self.cached[node] = index + count
        self.cache_blocks += new
        self.private -= new
        if self.on_event is not None:
            self.on_event("insert", node, c, new)
        return new

    def evict(self, n: int) -> int:
        """Free at least ``n`` blocks of unreferenced cache, deepest nodes first, oldest first."""
        freed = 0
        heap = self._heap
        cached, ref, kids, access = self.cached, self.ref, self.cached_children, self.access
        while freed < n and heap:
            t, x = heapq.heappop(heap)
            c = cached[x]
            if c == 0 or ref[x] or kids[x] or t != access[x]:
                continue  # stale entry
            take = min(c, n - freed)
            cached[x] = c - take
            freed += take
            if self.on_event is not None:
                self.on_event("evict", x, c - take, take)
            if cached[x]:
                heapq.heappush(heap, (t, x))  # its remaining blocks stay candidates
            else:
                p = self.parent[x]
                if p >= 0:
                    kids[p] -= 1
                    if kids[p] == 0 and cached[p] and ref[p] == 0:
                        heapq.heappush(heap, (access[p], p))
        self.cache_blocks -= freed
        self.evictable -= freed
        self.evicted_blocks += freed
        return freed

    # ---- introspection for tests ----------------------------------------------------------
    def check(self) -> None:
        """Recount every counter from scratch (slow; tests only)."""
        cached = np.asarray(self.cached)
        ref = np.asarray(self.ref)
        assert (cached >= 0).all() and (cached <= np.asarray(self.nblocks)).all()
        assert self.cache_blocks == int(cached.sum())
        assert self.evictable == int(cached[ref == 0].sum()), (self.evictable, int(cached[ref == 0].sum()))
        assert 0 <= self.private and self.cache_blocks + self.private <= self.total
        kids = np.bincount(np.asarray(self.parent)[1:][cached[1:] > 0], minlength=len(cached))
        assert (kids == np.asarray(self.cached_children)).all()


__all__ = ["KVCache"]
