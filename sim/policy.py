"""The contract between the engine core and a scheduling policy, defined here so the core depends on
no policy package.

A policy is found by the application layer (``blendsim.runner`` asks the registry in
``blendsim.policies.base``, which also loads policies from users' files and installed packages) and reaches
the core only through these shapes: it is built with a :class:`PolicyContext`, gives every request
a rank, and supplies one scheduler per replica (a ``blendsim.sim.scheduler.Scheduler``) and a router that the
cluster (``blendsim.sim.engine.Cluster``) calls as requests arrive. :class:`PolicyLike` and
:class:`RouterLike` state that structurally; ``blendsim.policies.base.Policy`` and ``blendsim.policies.base.Router``
are the base classes that implement it.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may look at (all read-only: a policy keeps what it computes on itself, ``self.x = ...``)."""

    trace: object  # workloads.trace.Trace
    tree: object  # sim.prefix_tree.PrefixTree of the trace
    deployment: object  # sim.deployment.Deployment (one replica)
    cost_model: object  # sim.cost.CostModel of one replica
    engine: object  # sim.seq.EngineConfig in force
    replicas: int = 1
    seed: int = 0
    options: dict = field(default_factory=dict)  # policy-specific --opt key=value settings
    num_blocks: int = 0  # KV blocks per replica
    tiers: object = None  # sim.kv_tiers.TierSpec: host/disk KV tiers per replica, or None (GPU only)


def _read_only(self, name, value=None) -> None:
    raise FrozenInstanceError(f"ctx.{name} is read-only: a policy cannot change its context (keep values of "
                              f"your own on the policy: self.{name} = ...)")


# frozen: setting or deleting a field raises, and says what to do instead (the policy's guard adds its file and line)
PolicyContext.__setattr__ = _read_only
PolicyContext.__delattr__ = _read_only


@runtime_checkable
class RouterLike(Protocol):
    """Chooses the replica of each arriving request (``blendsim.sim.engine.Cluster`` calls it)."""

    def route(self, req: int, now: float) -> int: ...


@runtime_checkable
class PolicyLike(Protocol):
    """A prepared policy as the runner drives it.

    Class attributes the runner also reads: ``name``, ``engine_defaults`` (``blendsim.sim.seq.EngineConfig``
    fields it needs, over the engine's), ``needs_prefix_caching``, ``reads_cost_model`` and ``options``.
    """

    ctx: PolicyContext

    def prepare(self) -> None: ...

    def rank(self): ...  # per request, lower first

    def make_router(self, replicas: list) -> RouterLike: ...

    def make_scheduler(self, replica: int, **kw): ...  # a sim.scheduler.Scheduler

    def summary_extra(self) -> dict: ...


__all__ = ["PolicyContext", "PolicyLike", "RouterLike"]
