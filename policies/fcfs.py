"""``fcfs``: requests in arrival order (trace order for offline runs)."""

from __future__ import annotations

from blendsim.policies.base import Policy, register


@register("fcfs")
class FCFS(Policy):
    description = "first come, first served: arrival order, then trace order"
    paper = 'arrival order'
