"""Host-memory and disk tiers under the GPU's prefix cache: evicted prefix blocks spill down, hits load back.

A block evicted from the GPU moves to host memory, one evicted from host memory moves to disk, one
evicted from disk is gone (an exclusive hierarchy, written on eviction as TensorRT-LLM's host cache
does). Per static-tree node the tiers hold consecutive runs of the node's full blocks:

    GPU  [0, cached)   host  [cached, cached + host)   disk  [cached + host, cached + host + disk)

so the GPU's tail-first eviction of a node moves its last GPU blocks to the front of its host run, and
the host's tail-first eviction moves its last host blocks to the front of its disk run; every tier keeps
the node's blocks contiguous. Each lower tier evicts least-recently-used nodes first (ties: deepest).

A prefix hit is the longest run of the prompt's blocks held in any tier. Blocks found in host memory or
on disk are *loaded*: on admission they leave their tier and become GPU cache blocks of the (locked)
path nodes, and the transfer is priced on the replica's links:

* the host link (PCIe or NVLink-C2C; per GPU, times the GPUs of the replica) is full duplex: loads
  (host -> GPU) and offload writes (GPU -> host) each have a busy-until clock of their own at the
  link's per-direction rate (the GPU's copy engines run both directions at once). A load that had to
  evict blocks to make room for itself ends no earlier than the writes that carry those blocks out
  (their GPU slots are what it fills), which queue behind earlier writes;
* the disk (the node's NVMe share per GPU) serves reads first: a read queues behind earlier reads only,
  and write-backs take the drive's remaining time (they start after the reads queued before them, and a
  read that meets a write backlog pushes it back by its own length, so the drive's busy time is the sum of
  both). A GPU -> host write that needs host room emptied to disk lands no sooner than one block after
  those disk writes, so a slow drive backs up the host link's write direction and, through it, the loads
  that evict. A disk hit is read from disk and streamed over the host link.

The step that runs the request's first chunk waits for its loads: ``stall`` adds the wait before the
step's compute, ``overlap`` (layer-by-layer prefetch) makes the step last the longer of the two, and
``async`` (vLLM V1's connectors) leaves the loading request out of the steps until its load has arrived
while the others run on (``Scheduler.loading``; the engine profile's ``kv_load``). Offload writes are off the critical path; they only delay later
loads on the shared link. Evictions during a fast-forwarded decode run are stamped at its start.

Pipeline parallelism (``pp`` > 1): each stage's GPUs hold only the KV of their own layers, in GPU memory and
in the lower tiers alike, as per-rank KV offloading does (vLLM's KV connectors, e.g. LMCache's, run in every
worker and save and load the KV of the layers that worker's model part holds; LMCache keys a stored chunk by
``world_size`` and ``worker_id`` besides its token hash: ``CacheEngineKey`` in LMCache's ``lmcache/utils.py``). So a tier of ``X`` GB per replica holds ``X / kv_bytes_per_token`` tokens,
as the whole replica's GPUs together would, and a prefix block reloaded from host memory is reloaded by every
stage for its own layers, in parallel over each stage's own links: stage ``i`` moves its share of the block's
bytes (``kv_bytes_per_token // layers * stage_layers[i]``, the split ``Deployment`` sizes GPU KV with) over
its ``tp`` GPUs' host links (and NVMe shares), each stage on its own busy-until clocks (:class:`StageLinks`).
The replica's ``pp`` virtual engines split the tier's blocks evenly, as they split the GPU's (vLLM v0's
``Scheduler`` divides both ``num_gpu_blocks`` and ``num_cpu_blocks`` by ``pipeline_parallel_size``), and
share the stages' links. A load delays only the stage that waits for it: ``stall`` adds stage ``i``'s load
seconds before that stage's compute for the step, ``overlap`` makes the stage's time the longer of the two
(``sim.engine.PipelinedReplica``). A stage's transfers queue on its links from when the step is scheduled
(as without PP), and the stage waits for what is left of them when it takes the batch up: the part of a load
that ran while the earlier stages computed is hidden, so a stage never waits longer than its links worked. (An
engine whose stage starts its load only when it takes the batch up would wait up to the whole load there.)

Attention data parallelism (``Deployment.dp`` > 1: SGLang's --enable-dp-attention, TensorRT-LLM's
enable_attention_dp on MoE models): a sequence's KV is whole on one GPU of the group rather than split over its
``tp`` GPUs, so the load of its prefix crosses that GPU's host link (and NVMe share) alone, at one GPU's rate, while
loads of sequences on other ranks run beside it; each rank has its own busy-until clocks (:class:`RankChannels`; a
load takes the rank whose link frees first). Offload writes come from every rank's cache and are spread evenly.

With no tier (0 GB) the plain :class:`~blendsim.sim.kv.KVCache` runs unchanged.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from blendsim.sim.errors import UserError
from blendsim.sim.kv import KVCache

GB = 1e9
LOAD_MODES = ("stall", "overlap", "async")
TIER_OPTIONS = ("host_kv_gb", "disk_kv_gb")


class Channel:
    """A link used by one transfer at a time (FIFO): a busy-until clock and its busy seconds."""

    __slots__ = ("name", "free_at", "busy_s")
    scale = 1  # one sequence's transfer runs at the whole channel's rate

    def __init__(self, name: str):
        self.name = name
        self.free_at = 0.0
        self.busy_s = 0.0

    def transfer(self, start: float, seconds: float) -> float:
        """Occupy the channel for ``seconds`` from ``start`` (or when it frees up); the end time."""
        s = self.free_at if self.free_at > start else start
        e = s + seconds
        self.free_at = e
        self.busy_s += seconds
        return e

    def pick(self) -> int:
        """The lane one sequence's load takes (a plain link has one; see :class:`RankChannels`)."""
        return 0

    def load(self, lane: int, start: float, seconds: float) -> float:
        """One sequence's transfer, ``seconds`` at the whole channel's rate."""
        return self.transfer(start, seconds)

    def free(self, lane: int) -> float:
        """When lane ``lane`` (the one lane) is free."""
        return self.free_at

    def defer(self, lane: int, start: float, end: float) -> None:
        """A transfer with priority over this clock's on the same device (a read on the drive) ran from
        ``start`` to ``end``: work still queued here at ``start`` is pushed back by its length."""
        if self.free_at > start:
            self.free_at += end - start

    def write_after(self, first, start: float, seconds: float) -> None:
        """Writes of ``seconds`` from ``start`` that begin no sooner than ``first`` (the same device's reads, which
        go first) is free."""
        f = first.free_at
        self.transfer(f if f > start else start, seconds)

    def floor(self, before, extra: float) -> None:
        """What is queued here ends no sooner than ``extra`` after ``before`` is free (writes into slots that
        ``before``'s transfers empty)."""
        t = before.free_at + extra
        if t > self.free_at:
            self.free_at = t


class RankChannels:
    """A stage's host links (or NVMe shares) under attention data parallelism: one :class:`Channel` per
    attention-DP rank, each with its GPU's share of the stage's bandwidth. A sequence's KV is whole on one rank
    (``Deployment.attn_dp``), so the load of its prefix crosses that rank's link alone -- the rank whose link frees
    first, a balanced placement -- while the writes of evicted blocks, from every rank's cache, spread evenly
    over all of them. ``busy_s`` is the busiest rank's."""

    __slots__ = ("name", "lanes", "scale")

    def __init__(self, name: str, ranks: int):
        self.name = name
        self.lanes = [Channel(f"{name} (rank {r})") for r in range(ranks)]
        self.scale = ranks  # one sequence's transfer crosses one rank's link: ``ranks`` times the stage's seconds

    @property
    def busy_s(self) -> float:
        return max(ch.busy_s for ch in self.lanes)

    def pick(self) -> int:
        lanes = self.lanes
        return min(range(len(lanes)), key=lambda r: lanes[r].free_at)

    def load(self, lane: int, start: float, seconds: float) -> float:
        """One sequence's transfer on rank ``lane``'s link: ``seconds`` at the stage's rate is ``ranks`` times
        that on one rank's."""
        return self.lanes[lane].transfer(start, seconds * self.scale)

    def free(self, lane: int) -> float:
        return self.lanes[lane].free_at

    def defer(self, lane: int, start: float, end: float) -> None:
        """As :meth:`Channel.defer`, on rank ``lane``."""
        self.lanes[lane].defer(0, start, end)

    def write_after(self, first, start: float, seconds: float) -> None:
        """As :meth:`Channel.write_after`, each rank's share after that rank's reads."""
        for ch, f in zip(self.lanes, first.lanes):
            ch.write_after(f, start, seconds)

    def floor(self, before, extra: float) -> None:
        """As :meth:`Channel.floor`, rank by rank."""
        for ch, b in zip(self.lanes, before.lanes):
            ch.floor(b, extra)

    def transfer(self, start: float, seconds: float) -> float:
        """Writes spread evenly: each rank's link carries its share of them at its share of the rate."""
        end = start
        for ch in self.lanes:
            e = ch.transfer(start, seconds)
            if e > end:
                end = e
        return end


@dataclass(frozen=True)
class TierSpec:
    """Capacities and bandwidths of one replica's lower tiers (all GPUs of the replica together); with
    pipeline parallelism, the capacities of one virtual engine and the bandwidths of one stage."""

    host_blocks: int
    disk_blocks: int
    block_bytes: int  # KV bytes of one block on the replica (all layers)
    link_bw: float  # host link bytes/s per direction: the replica's GPUs together (with pp > 1: one stage's)
    disk_read_bw: float
    disk_write_bw: float
    load_mode: str = "stall"
    stage_bytes: tuple = ()  # pp > 1: KV bytes of one block each stage holds (its layers); (): one stage
    ranks: int = 1  # attention-DP ranks per stage (Deployment.dp): each its own link and NVMe share (RankChannels)

    @property
    def enabled(self) -> bool:
        return self.host_blocks > 0 or self.disk_blocks > 0

    @property
    def load_bytes_per_block(self) -> int:
        """Bytes of one block the slowest stage moves over its link (the whole block with one stage): the
        link seconds of a load are this over :attr:`link_bw` (every stage has the same links)."""
        return max(self.stage_bytes) if self.stage_bytes else self.block_bytes


class StageLinks:
    """The host links and disks of one replica's stages (one stage without pipeline parallelism), shared by the
    replica's virtual engines, and the seconds one block takes on each. Per stage: the host link's two
    directions (``host``: loads, host -> GPU; ``host_w``: offload writes, GPU -> host) and the drive's reads
    (``disk``) and write-backs (``disk_w``), a :class:`Channel` each (:class:`RankChannels` under attention DP)."""

    __slots__ = ("host", "host_w", "disk", "disk_w", "t_link", "t_dread", "t_dwrite")

    def __init__(self, spec: TierSpec):
        parts = spec.stage_bytes or (spec.block_bytes,)
        n = len(parts)
        stage = [""] if n == 1 else [f" (stage {i})" for i in range(n)]

        def chans(name: str) -> list:
            if spec.ranks > 1:  # attention data parallelism: a link per rank
                return [RankChannels(name + x, spec.ranks) for x in stage]
            return [Channel(name + x) for x in stage]

        self.host, self.host_w = chans("host link"), chans("host link writes")
        self.disk, self.disk_w = chans("disk"), chans("disk writes")
        self.t_link = [bb / spec.link_bw for bb in parts]
        self.t_dread = [bb / spec.disk_read_bw if spec.disk_read_bw > 0 else 0.0 for bb in parts]
        self.t_dwrite = [bb / spec.disk_write_bw if spec.disk_write_bw > 0 else 0.0 for bb in parts]


def check_tier_gb(value, flag: str, limit_bytes: float = 0.0, what: str = "") -> float:
    """A tier size in GB (1e9 bytes): finite and >= 0, and within ``limit_bytes`` when it is known."""
    if value is None:
        return 0.0
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{flag} must be a number of GB, got {value!r}") from None
    if not v >= 0 or v == float("inf"):  # NaN fails >= 0
        raise UserError(f"{flag} must be a finite number of GB >= 0, got {value!r}")
    if limit_bytes and v * GB > limit_bytes:
        raise UserError(f"{flag} {v:g} is more than {what} ({limit_bytes / GB:g} GB)")
    return v


def kv_load_mode(explicit: str | None, engine: str | None) -> str:
    """How tier loads meet the step: ``explicit`` if given, else the engine profile's ``kv_load``
    (sim.engines, cited there), else ``stall`` (an engine that documents no layer-wise prefetch)."""
    if explicit is not None:
        if explicit not in LOAD_MODES:
            raise UserError(f"--kv-load must be one of {', '.join(LOAD_MODES)}, got {explicit!r}")
        return explicit
    from blendsim.sim.engines import get_profile

    try:
        prof = get_profile(engine) if engine else None
    except UserError:  # not a profile (an overhead style of the cost model): no documented prefetch
        prof = None
    return getattr(prof, "kv_load", "stall") if prof is not None else "stall"


def _gbps(value, flag: str, default: float) -> float:
    """A bandwidth override in GB/s (None: the preset's ``default`` bytes/s)."""
    if value is None:
        return default
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{flag} must be a number of GB/s, got {value!r}") from None
    if not (v > 0 and v != float("inf")):
        raise UserError(f"{flag} must be a finite number of GB/s > 0, got {value!r}")
    return v * GB


def tier_sizes(dep, host_kv_gb, disk_kv_gb, replicas: int = 1) -> tuple[float, float]:
    """The host and disk tier sizes in GB (each checked: finite, >= 0, and within what the replica's nodes have).

    A replica may use its nodes' host memory and NVMe: one node's whole, the nodes' for the share of the KV the
    busiest holds when its pipeline spans several, and a node's share when ``replicas`` smaller than a node share
    it (8 TP1 replicas on an 8-GPU node: an eighth each)."""
    hw = dep.hardware
    gpus, per_node = dep.tp * dep.pp, hw.gpus_per_node
    node_share = _node_share(dep) if dep.pp > 1 else 1.0
    sharing = max(1, min(int(replicas), per_node // gpus)) if gpus < per_node else 1
    share = node_share * sharing
    where = "per node" if node_share == 1.0 else f"for the {node_share:.0%} of the KV its busiest node holds"
    if sharing > 1:
        where += f"{'' if node_share == 1.0 else ','} shared by {sharing} replicas"
    host = check_tier_gb(host_kv_gb, "--host-kv-gb", hw.host_memory_bytes / share, f"{hw.name}'s host memory {where}")
    disk = check_tier_gb(disk_kv_gb, "--disk-kv-gb", hw.disk_bytes / share, f"{hw.name}'s local NVMe {where}")
    return host, disk


def tier_spec(dep, block_size: int, host_kv_gb, disk_kv_gb, load_mode: str = "stall", host_link_gbps=None,
              disk_read_gbps=None, disk_write_gbps=None, replicas: int = 1) -> TierSpec | None:
    """The replica's tiers for a deployment, or None when both are 0 (the GPU-only cache runs).

    Sizes are per replica; the preset's host memory and local NVMe (per node, when it gives them) bound
    them. Bandwidths (per GPU: the preset's cited defaults, or the ``*_gbps`` overrides) scale with the
    replica's GPUs: each GPU has its own host link and NVMe share.

    With ``dep.pp`` > 1 (see the module docstring): the capacities are each virtual engine's share
    (the replica's tokens // pp), the bandwidths one stage's (``tp`` GPUs), ``stage_bytes`` each stage's
    share of a block, and the size bound is the nodes' memory for the share of the KV each node holds
    (:func:`tier_sizes`; ``replicas`` smaller than a node split its memory)."""
    hw = dep.hardware
    link = _gbps(host_link_gbps, "--host-link-gbps", hw.host_link_bandwidth)
    dread = _gbps(disk_read_gbps, "--disk-read-gbps", hw.disk_read_bandwidth)
    dwrite = _gbps(disk_write_gbps, "--disk-write-gbps", hw.disk_write_bandwidth)
    pp = dep.pp
    host, disk = tier_sizes(dep, host_kv_gb, disk_kv_gb, replicas)
    if load_mode not in LOAD_MODES:
        raise UserError(f"kv_load must be one of {', '.join(LOAD_MODES)}, got {load_mode!r}")
    bb = int(dep.kv_bytes_per_token) * int(block_size)
    per_layer = int(dep.kv_bytes_per_token) // dep.model.full_attention_layers
    # a stage's full-attention layers (sliding-window ones hold no per-token KV)
    stage_bytes = (tuple(per_layer * dep.stage_full_attention_layers(i) * int(block_size) for i in range(pp))
                   if pp > 1 else ())
    spec = TierSpec(int(host * GB // bb) // pp, int(disk * GB // bb) // pp, bb, link * dep.tp, dread * dep.tp,
                    dwrite * dep.tp, load_mode, stage_bytes, dep.dp)
    if not spec.enabled:
        return None
    if spec.link_bw <= 0:
        raise UserError(f"hardware {hw.name!r} has no host link bandwidth: a host KV tier needs one")
    if spec.disk_blocks and not (spec.disk_read_bw > 0 and spec.disk_write_bw > 0):
        raise UserError(f"hardware {hw.name!r} has no disk bandwidth: a disk KV tier needs one")
    return spec


def _node_share(dep) -> float:
    """The largest share of a replica's KV (all layers) that one of its nodes holds: GPUs are placed in order
    (stage 0's TP group first), each GPU of stage ``i`` holds ``stage_layers[i] / layers / tp`` of it."""
    layers = dep.stage_layers()
    L, tp, per = dep.model.num_layers, dep.tp, dep.hardware.gpus_per_node
    nodes = [0.0] * dep.nodes
    for g in range(dep.tp * dep.pp):
        nodes[g // per] += layers[g // tp] / L / tp
    return max(nodes)


class TieredKVCache(KVCache):
    """A :class:`KVCache` whose evictions spill to host memory and then disk, and whose hits may load."""

    tiered = True

    def __init__(self, tree, num_blocks: int, block_size: int, caching: bool, spec: TierSpec, on_event=None,
                 retain: bool = True, links: StageLinks | None = None):
        super().__init__(tree, num_blocks, block_size, caching, on_event, retain)
        n = tree.num_nodes
        self.spec = spec
        self.host_cap = spec.host_blocks
        self.disk_cap = spec.disk_blocks
        self.host = [0] * n  # host blocks per node, after its GPU blocks
        self.disk = [0] * n  # disk blocks per node, after its host blocks
        self.hstamp = [0.0] * n  # LRU key of the node's host run (its last use when it came down)
        self.dstamp = [0.0] * n
        self._hheap: list = []  # (stamp, -node): lazily invalidated
        self._dheap: list = []
        self.host_used = 0
        self.disk_used = 0
        # the stages' links (one stage without PP), shared with the replica's other virtual engines
        self.links = links if links is not None else StageLinks(spec)
        self.link = self.links.host[0]
        self.disk_ch = self.links.disk[0]
        self.stage_ready = [0.0] * len(self.links.host)  # when each stage's loads issued at stage_ready_at end
        self.stage_ready_at = -1.0
        self.arrive: dict = {}  # node -> when the last load of its blocks arrives
        self.now = 0.0  # the scheduler's clock: when evictions (writes) are issued
        self.last_split = (0, 0)  # host and disk blocks of the last match's hit
        # lifetime totals, in blocks
        self.host_hit_blocks = 0
        self.disk_hit_blocks = 0
        self.load_blocks = 0
        self.offload_host_blocks = 0  # written GPU -> host
        self.offload_disk_blocks = 0  # written host -> disk
        self.dropped_blocks = 0  # evicted from the last tier

    # ---- queries --------------------------------------------------------------------------
    def match_tiers(self, path: list[int], max_blocks: int) -> int:
        """Blocks of the prefix along ``path`` held in any tier, at most ``max_blocks``; how many of them
        are in host memory and on disk is left in :attr:`last_split`."""
        self.last_split = (0, 0)
        if not self.caching:
            return 0
        hit = hh = dh = 0
        cached, host, disk, nb = self.cached, self.host, self.disk, self.nblocks
        for x in path:
            g = cached[x]
            h = host[x]
            d = disk[x]
            left = max_blocks - hit
            if g >= left:
                hit += left
                break
            hit += g
            left -= g
            if h:
                t = h if h < left else left
                hh += t
                hit += t
                left -= t
            if d and left:
                t = d if d < left else left
                dh += t
                hit += t
                left -= t
            if g + h + d < nb[x] or not left:
                break
        if hit > max_blocks:
            hit = max_blocks
        self.last_split = (hh, dh)
        return hit

    # ---- moving blocks between tiers ------------------------------------------------------
    def load(self, path: list[int], hit: int, now: float) -> float:
        """Bring the host and disk blocks of a ``hit``-block prefix along ``path`` (its nodes locked by
        the caller) into the GPU cache; the time the last of them has arrived."""
        nb, cached, host, disk = self.nblocks, self.cached, self.host, self.disk
        moves = []
        acc = hl_tot = dl_tot = 0
        for x in path:
            if acc >= hit:
                break
            g = cached[x]
            want = hit - acc
            own = g + host[x] + disk[x]
            if own > nb[x]:
                own = nb[x]
            take = (own if own < want else want) - g
            acc += g
            if take > 0:
                hl = host[x] if host[x] < take else take
                dl = take - hl
                host[x] -= hl
                disk[x] -= dl
                hl_tot += hl
                dl_tot += dl
                acc += take
                moves.append((x, take))
        self.host_used -= hl_tot
        self.disk_used -= dl_tot
        n = hl_tot + dl_tot
        if not n:
            return now
        free = self.total - self.cache_blocks - self.private
        made_room = n > free
        if made_room:
            self.evict(n - free)  # its writes go into the host room the loaded blocks left
        kids, parent = self.cached_children, self.parent
        for x, take in moves:
            if cached[x] == 0:
                p = parent[x]
                if p >= 0:
                    kids[p] += 1
            if self.on_event is not None:
                self.on_event("load", x, cached[x], take)
            cached[x] += take
        self.cache_blocks += n
        self.host_hit_blocks += hl_tot
        self.disk_hit_blocks += dl_tot
        self.load_blocks += n
        # disk blocks stream from the drive over the link: the later of the two transfers ends the load; each
        # stage moves its own layers' share over its own links
        L = self.links
        ready = self.stage_ready
        if now != self.stage_ready_at:  # a new step: its stages' loads start from none
            self.stage_ready_at = now
            for i in range(len(ready)):
                ready[i] = now
        last = now
        for i, ch in enumerate(L.host):
            lane = ch.pick()  # under attention DP, the rank that holds the sequence: its own link and drive share
            end = ch.load(lane, now, n * L.t_link[i])
            if made_room:  # the GPU slots it fills leave over the other direction first: its last block lands
                # one block's load after the last of those writes
                w = L.host_w[i].free(lane) + L.t_link[i] * ch.scale
                if w > end:
                    end = w
            if dl_tot:
                dch = L.disk[i]
                d_start = dch.free(lane)
                if d_start < now:
                    d_start = now
                d_end = dch.load(lane, now, dl_tot * L.t_dread[i])
                L.disk_w[i].defer(lane, d_start, d_end)  # write-backs wait out the read
                if d_end > end:
                    end = d_end
            if end > ready[i]:
                ready[i] = end
            if end > last:
                last = end
        arrive = self.arrive
        for x, _ in moves:  # when the blocks it brought are there to read (kv_load async: Scheduler.loading)
            if arrive.get(x, 0.0) < last:
                arrive[x] = last
        return last

    def arrives_at(self, path: list, nodes: int) -> float:
        """When the blocks of the first ``nodes`` nodes of ``path`` that a load brought back have all arrived (0 if
        none did): a request that hits them may not read them sooner."""
        arrive = self.arrive
        if not arrive:
            return 0.0
        t = 0.0
        for x in path[:nodes]:
            a = arrive.get(x, 0.0)
            if a > t:
                t = a
        return t

    def stage_loads(self, now: float) -> list[float]:
        """When each stage's loads of the step scheduled at ``now`` have arrived (``now`` where it loads none)."""
        if now != self.stage_ready_at:
            return [now] * len(self.stage_ready)
        return list(self.stage_ready)

    def evict(self, n: int) -> int:
        """Free at least ``n`` GPU blocks of unreferenced cache (deepest, oldest first): they move to host."""
        freed = 0
        heap = self._heap
        cached, ref, kids, access = self.cached, self.ref, self.cached_children, self.access
        host, hstamp, hheap = self.host, self.hstamp, self._hheap
        pop, push = heapq.heappop, heapq.heappush
        parent = self.parent
        ev = self.on_event
        moved = 0
        while freed < n and heap:
            t, x = pop(heap)
            c = cached[x]
            if c == 0 or ref[x] or kids[x] or t != access[x]:
                continue  # stale entry
            take = c if c < n - freed else n - freed
            cached[x] = c - take
            freed += take
            if ev is not None:
                ev("evict", x, c - take, take)
            if c > take:
                push(heap, (t, x))
            else:
                p = parent[x]
                if p >= 0:
                    kids[p] -= 1
                    if kids[p] == 0 and cached[p] and ref[p] == 0:
                        push(heap, (access[p], p))
            # down to host: the front of the node's host run
            h = host[x]
            host[x] = h + take
            moved += take
            if h == 0 or hstamp[x] != t:
                hstamp[x] = t
                push(hheap, (t, -x))
        self.cache_blocks -= freed
        self.evictable -= freed
        self.evicted_blocks += freed
        if moved:
            self.host_used += moved
            self.offload_host_blocks += moved
            L = self.links
            spilled = self.host_used > self.host_cap and self.disk_cap > 0
            if self.host_used > self.host_cap:  # room in host memory first: its LRU blocks go down to disk
                self._evict_host(self.host_used - self.host_cap)
            for i, ch in enumerate(L.host_w):
                ch.transfer(self.now, moved * L.t_link[i])
                if spilled:  # the host slots they fill are emptied by writes to the drive: the last lands one
                    ch.floor(L.disk_w[i], L.t_link[i])  # block after those
        return freed

    def _evict_host(self, n: int) -> None:
        """Move ``n`` host blocks (least recently used nodes first, a node's tail first) to disk."""
        host, disk, hstamp, dstamp = self.host, self.disk, self.hstamp, self.dstamp
        heap, dheap = self._hheap, self._dheap
        to_disk = self.disk_cap > 0  # else the blocks are dropped
        pop, push = heapq.heappop, heapq.heappush
        moved = 0
        while moved < n and heap:
            t, nx = pop(heap)
            x = -nx
            h = host[x]
            if h == 0 or t != hstamp[x]:
                continue
            take = h if h < n - moved else n - moved
            host[x] = h - take
            moved += take
            if host[x]:
                push(heap, (t, nx))
            if to_disk:
                disk[x] += take
                if dstamp[x] != t or disk[x] == take:
                    dstamp[x] = t
                    push(dheap, (t, nx))
        self.host_used -= moved
        if to_disk:
            self.disk_used += moved
            self.offload_disk_blocks += moved
            L = self.links
            for i, ch in enumerate(L.disk_w):  # after the reads already queued on the drive
                ch.write_after(L.disk[i], self.now, moved * L.t_dwrite[i])
            if self.disk_used > self.disk_cap:
                self._evict_disk(self.disk_used - self.disk_cap)
        else:
            self.dropped_blocks += moved

    def _evict_disk(self, n: int) -> None:
        disk, dstamp = self.disk, self.dstamp
        heap = self._dheap
        dropped = 0
        while dropped < n and heap:
            t, nx = heapq.heappop(heap)
            x = -nx
            d = disk[x]
            if d == 0 or t != dstamp[x]:
                continue
            take = d if d < n - dropped else n - dropped
            disk[x] = d - take
            dropped += take
            if disk[x]:
                heapq.heappush(heap, (t, nx))
        self.disk_used -= dropped
        self.dropped_blocks += dropped

    def insert(self, node: int, index: int, count: int) -> int:
        """As :meth:`KVCache.insert`; lower-tier copies of blocks the GPU now holds are dropped."""
        new = super().insert(node, index, count)
        if new:
            over = new
            h = self.host[node]
            if h:
                t = h if h < over else over
                self.host[node] = h - t
                self.host_used -= t
                over -= t
            d = self.disk[node]
            if d and over:
                # the disk run starts after the host run; only once the host run is gone does it overlap
                t = d if d < over else over
                self.disk[node] = d - t
                self.disk_used -= t
        return new

    # ---- introspection for tests ----------------------------------------------------------
    def check(self) -> None:
        super().check()
        host, disk = np.asarray(self.host), np.asarray(self.disk)
        assert (host >= 0).all() and (disk >= 0).all()
        assert self.host_used == int(host.sum()) <= self.host_cap, (self.host_used, int(host.sum()), self.host_cap)
        assert self.disk_used == int(disk.sum()) <= self.disk_cap, (self.disk_used, int(disk.sum()), self.disk_cap)
        assert (np.asarray(self.cached) + host + disk <= np.asarray(self.nblocks)).all()


def make_kv(tree, num_blocks: int, block_size: int, caching: bool, retain: bool, spec: TierSpec | None,
            links: StageLinks | None = None):
    """The replica's KV cache: tiered when ``spec`` has a tier, else the plain GPU cache. ``links``: the stages'
    links it shares with the other virtual engines of its pipelined replica (None: its own)."""
    if spec is None:
        return KVCache(tree, num_blocks, block_size, caching, retain=retain)
    return TieredKVCache(tree, num_blocks, block_size, caching, spec, retain=retain, links=links)


def tier_settings_used(spec: TierSpec | None, dep) -> dict:
    """summary.json's record of how a run's tiers moved blocks: the load mode and the per-GPU link and drive speeds
    (the preset's or the ones given), so a run says what it assumed; nothing without a tier."""
    if spec is None:
        return {}

    def per_gpu(bw: float) -> float:  # the spec's are the stage's GPUs together
        return round(bw / dep.tp / GB, 9)

    out = {"kv_load": spec.load_mode, "host_link_gbps": per_gpu(spec.link_bw)}
    if spec.disk_blocks:
        out.update(disk_read_gbps=per_gpu(spec.disk_read_bw), disk_write_gbps=per_gpu(spec.disk_write_bw))
    return out


def tier_summary(kvs, spec: TierSpec | None, hit_tokens: int, B: int, stall_s: float, pp: int = 1) -> dict:
    """summary.json's tier fields over a run's replicas (the same keys with no tier). ``stall_s``: the
    stage-seconds its steps waited for loads, summed over the (virtual) engines; reported over the ``pp``
    stages, so that a replica's stall is at most its makespan."""
    host_hit = disk_hit = load = off_h = off_d = 0
    link_busy = disk_busy = 0.0
    seen = set()
    for kv in kvs:
        if getattr(kv, "tiered", False):
            host_hit += kv.host_hit_blocks
            disk_hit += kv.disk_hit_blocks
            load += kv.load_blocks
            off_h += kv.offload_host_blocks
            off_d += kv.offload_disk_blocks
            L = kv.links
            if id(L) not in seen:  # a pipelined replica's virtual engines share their stages' links
                seen.add(id(L))
                # the run's busiest link (replica, stage, direction) and drive (its reads and writes take turns)
                link_busy = max(link_busy, *(ch.busy_s for ch in L.host + L.host_w))
                disk_busy = max(disk_busy, *(_drive_busy(r, w) for r, w in zip(L.disk, L.disk_w)))
    bb = spec.block_bytes if spec else 0
    return {
        "prefix_hit_tokens": {"gpu": int(hit_tokens - (host_hit + disk_hit) * B), "host": int(host_hit * B),
                              "disk": int(disk_hit * B)},
        "kv_load_bytes": int(load * bb),
        "kv_offload_bytes": int((off_h + off_d) * bb),
        "kv_load_stall_s": float(stall_s / pp),
        "host_link_busy_s": float(link_busy),
        "disk_busy_s": float(disk_busy),
    }


def tier_notes(summary: dict) -> list[str]:
    """A note where the drive sets the run's pace: its reads and write-backs take most of the makespan and steps
    waited for loads. Loads that evict wait for the writes that carry the evicted blocks down (module docstring),
    as an offloader does that frees a GPU block only once it has a place below: a drive slower to write than the
    GPU evicts can cost more than recomputing, which the run then shows."""
    busy, span = summary.get("disk_busy_s", 0.0), summary.get("makespan_s", 0.0)
    replicas = max(1, int(summary.get("replicas", 1)))
    stall = summary.get("kv_load_stall_s", 0.0) / replicas  # the summary's is summed over the replicas
    if not (span > 0 and busy > 0.5 * span and stall > 0.1 * span):
        return []
    who = "a replica's steps" if replicas > 1 else "steps"
    return [f"KV tiers: the busiest drive was busy {busy:,.1f} s of the {span:,.1f} s run (reads and the write-backs "
            f"that evictions wait for) and {who} waited {stall:,.1f} s for loads; every prefix hit on the drive is "
            f"read back, even where recomputing it would be faster (a model with much KV per token, such as a "
            f"multi-head-attention one), so a run without the disk tier, or with a larger host tier or a faster drive "
            f"(--disk-read-gbps, --disk-write-gbps), may finish sooner"]


def _drive_busy(reads, writes) -> float:
    """Seconds one stage's drive (under attention DP: its busiest rank's NVMe share) spent reading and writing."""
    if isinstance(reads, RankChannels):
        return max(r.busy_s + w.busy_s for r, w in zip(reads.lanes, writes.lanes))
    return reads.busy_s + writes.busy_s


__all__ = ["Channel", "LOAD_MODES", "RankChannels", "StageLinks", "TIER_OPTIONS", "TierSpec", "TieredKVCache", "check_tier_gb", "make_kv",
           "tier_notes", "tier_settings_used", "tier_spec", "tier_summary"]
