"""What a prefix load from the host/disk KV tiers takes, as ``sim.kv_tiers`` charges it.

The tier-aware policy options (``tiers=load`` of E2 and BlendServe; ours) weigh reusing a prefix held in host
memory or on disk against recomputing it. They price the load with :func:`load_s`, which reads the tiers' own
:class:`~blendsim.sim.kv_tiers.StageLinks` (per-block seconds of each stage's host link and disk) and
:class:`~blendsim.sim.kv_tiers.TierSpec` (attention-DP ranks), the objects ``TieredKVCache.load`` charges with,
rather than constants of its own."""

from __future__ import annotations


def load_s(links, ranks: int, blocks: float, disk_blocks: float = 0.0) -> float:
    """Seconds ``TieredKVCache.load`` takes, on idle links, to bring ``blocks`` blocks of a prefix into the GPU
    cache when ``disk_blocks`` of them are on disk (the rest in host memory): every block crosses the host link
    and the disk's are also read from the drive, and the later of the two ends a stage's load; each stage moves
    its own layers' share over its own links, so the slowest stage ends the load; under attention data parallelism
    (``ranks`` > 1) the sequence's KV crosses one rank's link and drive share, at 1/``ranks`` of the stage's rate
    (``RankChannels.load``). Queueing behind transfers already on the links is not included."""
    end = 0.0
    for t_link, t_dread in zip(links.t_link, links.t_dread):
        e = blocks * t_link
        if disk_blocks:
            d = disk_blocks * t_dread
            if d > e:
                e = d
        if e > end:
            end = e
    return end * ranks if ranks > 1 else end


def split_load_s_per_block(spec, links) -> float:
    """Seconds per block a prefix that left the GPU takes to come back, when where it sits is not known (an offline
    plan): the GPU's evictions go to host memory and sink to disk as host memory fills, so a prefix reused after
    an unknown amount of later evictions is taken to be in host memory with the host tier's share of the two
    tiers' blocks, on disk otherwise; a disk block costs the later of its link and drive times (:func:`load_s`)."""
    host = load_s(links, spec.ranks, 1.0)
    if not spec.disk_blocks:
        return host
    disk = load_s(links, spec.ranks, 1.0, 1.0)
    return host + (disk - host) * spec.disk_blocks / (spec.host_blocks + spec.disk_blocks)


__all__ = ["load_s", "split_load_s_per_block"]
