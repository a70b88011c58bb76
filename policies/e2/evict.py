"""Which cached nodes a replica would evict next — read from its prefix cache without changing it.

E2's eviction cost M (Preble Alg. 2) needs the tree nodes that replica i would evict to make room
for a new request. The replica's cache (``blendsim.sim.kv.KVCache``) evicts unreferenced leaves, least recently
used first, a node's blocks from its tail, and a parent becomes a candidate once its last cached child
is gone. This walks the same order lazily: a best-first search over the cache's heap array (whose
entries may be stale, exactly as the cache treats them) plus the parents that would become leaves, so
it touches only the entries that precede the last victim in LRU order.
"""

from __future__ import annotations

import heapq

MAX_VISITS = 4096  # NOTE: safety bound on heap entries examined per call (stale entries included)


def lru_victims(kv, need: int) -> list[tuple[int, int, int]]:
    """``(node, blocks, blocks_left)`` the cache would evict, in order, to free ``need`` blocks
    (fewer if it holds fewer evictable ones)."""
    heap = kv._heap
    out: list = []
    if need <= 0 or not heap:
        return out
    cached, ref, kids, access, parent = kv.cached, kv.ref, kv.cached_children, kv.access, kv.parent
    frontier = [(heap[0][0], heap[0][1], 0)]
    gone: dict = {}  # parent -> children evicted in this walk
    done = set()
    freed = visits = 0
    n = len(heap)
    push, pop = heapq.heappush, heapq.heappop
    while frontier and freed < need and visits < MAX_VISITS:
        t, x, idx = pop(frontier)
        visits += 1
        if idx >= 0:
            j = 2 * idx + 1
            if j < n:
                e = heap[j]
                push(frontier, (e[0], e[1], j))
                j += 1
                if j < n:
                    e = heap[j]
                    push(frontier, (e[0], e[1], j))
        c = cached[x]
        if c == 0 or ref[x] or x in done or t != access[x] or kids[x] - gone.get(x, 0):
            continue
        done.add(x)
        take = c if c < need - freed else need - freed
        freed += take
        out.append((x, take, c - take))
        if take == c:
            p = parent[x]
            if p > 0:
                g = gone[p] = gone.get(p, 0) + 1
                if g == kids[p] and cached[p] and ref[p] == 0:
                    heapq.heappush(frontier, (access[p], p, -1))
    return out


__all__ = ["lru_victims"]
