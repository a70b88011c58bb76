"""E2's global prefix tree, built online from the requests the router has seen.

Topology comes from the trace's static :class:`~sim.prefix_tree.PrefixTree`: its node ids name prompt
segments, and the longest common prefix of any two prompts ends on one of its node boundaries, so
matching a prompt against the prompts seen so far is walking its static path while nodes *exist*. The
state is online only: a node exists while a request inside the window H passed through it or some
replica is recorded as caching it (Preble sec. 3.2: a node with neither is removed), and per node
and replica the tree keeps

* ``alloc`` — the routing map, a replica bitmask: set along the path of every assignment, moved by
  rebalancing, widened by autoscaling, pruned when a replica reports the node evicted (no request
  through it outstanding there) or the window empties while the replica no longer holds it;
* ``ref`` — requests assigned and not yet finished (Preble's per-GPU reference counts);
* ``win`` — requests in the window H that passed through the node (total and per replica).

NOTE: the online radix tree merges chains that no seen request has split yet; a node here is a
static node, i.e. the online node after the splits later arrivals will cause. Counts are unchanged by
this (every seen request through a chain's head passes the whole chain), and the key node of a path
(below) is the one Preble's split-renaming ends with.
"""

from __future__ import annotations

from blendsim.sim.prefix_tree import node_path


class GlobalTree:
    """Online state over a static prefix tree, for ``R`` replicas whose KV caches are ``kvs``."""

    def __init__(self, static_tree, replicas: int, kvs: list, route_map: str = "evict"):
        t = static_tree
        # "evict": a replica leaves a node's route map when its cache drops the node (the paper);
        # "window": when no request through the node is left in the window H (Preble's code)
        self.by_window = route_map == "window"
        self.R = R = replicas
        self.parent = t.parent.tolist()
        self.tokens = t.tokens.tolist()
        self.start = t.start.tolist()
        self.end = (t.start + t.tokens).tolist()
        self.level = t.level.tolist()
        self.req_node = t.req_node.tolist()
        self.child_off = t.child_offsets.tolist()
        self.child_idx = t.child_index.tolist()
        n = t.num_nodes
        self.alloc = [0] * n
        self.ref = [0] * (n * R)  # index x * R + i
        self.win_n = [0] * n
        self.win = [0] * (n * R)
        self.active = [0] * R  # requests assigned and not finished, per replica
        self.kvs = kvs
        self.full_mask = (1 << R) - 1

    # ---- queries --------------------------------------------------------------------------
    def path(self, req: int) -> list[int]:
        """Static nodes from the root's child down to the end of ``req``'s prompt."""
        return node_path(self.parent, self.req_node[req])

    def exists(self, x: int) -> bool:
        return self.win_n[x] > 0 or self.alloc[x] != 0

    def match(self, path: list[int]) -> int:
        """How many leading path nodes exist (the matched prefix is ``path[:k]``)."""
        win_n, alloc = self.win_n, self.alloc
        k = 0
        for x in path:
            if win_n[x] == 0 and alloc[x] == 0:
                break
            k += 1
        return k

    def holders(self, path: list[int], k: int) -> int:
        """Replica mask of the deepest node of ``path[:k]`` that has one (0 if none)."""
        alloc = self.alloc
        for j in range(k - 1, -1, -1):
            m = alloc[path[j]]
            if m:
                return m
        return 0

    def key_index(self, path: list[int]) -> int:
        """Index in ``path`` of the key node: the deepest node whose own tokens outnumber the tokens
        before it (Preble App. A's key portion; the code's "important" node)."""
        tokens, start = self.tokens, self.start
        for j in range(len(path) - 1, -1, -1):
            x = path[j]
            if tokens[x] > start[x]:
                return j
        return 0

    def cached_tokens(self, i: int, path: list[int]) -> int:
        """Prompt tokens of ``path`` replica ``i`` holds or is about to hold: nodes with requests
        outstanding there count whole (they will be computed before the new one runs), others by the
        blocks the replica's prefix cache holds now."""
        R, ref, alloc = self.R, self.ref, self.alloc
        kv = self.kvs[i]
        if kv is None:
            return 0
        cached, nb, bs, B = kv.cached, kv.nblocks, kv.blk_start, kv.block_size
        tok = 0
        for x in path:
            if ref[x * R + i]:
                tok = self.end[x]
                continue
            c = cached[x]
            if c:
                t = (bs[x] + c) * B
                if t > tok:
                    tok = t
            if c < nb[x] or (nb[x] == 0 and not alloc[x] >> i & 1):
                break
        return tok

    def holds(self, i: int, x: int) -> bool:
        """Replica ``i`` has requests through ``x`` outstanding or blocks of ``x`` cached."""
        kv = self.kvs[i]
        return self.ref[x * self.R + i] > 0 or (kv is not None and kv.cached[x] > 0)

    # ---- updates --------------------------------------------------------------------------
    def assign(self, path: list[int], i: int) -> None:
        """Request with ``path`` went to replica ``i``: route map, reference and window counts."""
        R, bit = self.R, 1 << i
        alloc, ref, win_n, win = self.alloc, self.ref, self.win_n, self.win
        self.active[i] += 1
        for x in path:
            alloc[x] |= bit
            ref[x * R + i] += 1
            win_n[x] += 1
            win[x * R + i] += 1

    def finish(self, path: list[int], i: int) -> None:
        R, ref = self.R, self.ref
        self.active[i] -= 1
        for x in path:
            ref[x * R + i] -= 1

    def expire(self, path: list[int], i: int) -> None:
        """A request leaves the window; a node no request in the window shares keeps only the
        replicas that still hold it."""
        R, win_n, win, alloc = self.R, self.win_n, self.win, self.alloc
        for x in path:
            win[x * R + i] -= 1
            win_n[x] -= 1
            if win_n[x] == 0 and alloc[x]:
                m = alloc[x]
                for j in range(R):
                    if m >> j & 1 and not (self.ref[x * R + j] > 0 if self.by_window else self.holds(j, x)):
                        m &= ~(1 << j)
                alloc[x] = m

    def evicted(self, i: int, x: int) -> None:
        """Replica ``i`` reported ``x`` gone from its cache: drop it from the route map unless
        requests through ``x`` are outstanding there or it was cached again since."""
        if not self.by_window and self.alloc[x] >> i & 1 and not self.holds(i, x):
            self.alloc[x] &= ~(1 << i)

    def set_subtree(self, x: int, mask: int) -> None:
        """Route ``x`` and every existing node below it to ``mask`` (a rebalancing move)."""
        off, idx, stack = self.child_off, self.child_idx, [x]
        while stack:
            y = stack.pop()
            self.alloc[y] = mask
            for c in idx[off[y]:off[y + 1]]:
                if self.win_n[c] or self.alloc[c]:
                    stack.append(c)


__all__ = ["GlobalTree"]
