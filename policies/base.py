"""Policy and router base classes and the registry.

A policy is one file: a subclass of :class:`Policy` decorated with ``@register("name")``. It may

* preprocess the whole trace once (:meth:`Policy.prepare`) — offline policies sort, split, group;
* give every request a priority (:meth:`Policy.rank`, lower first): the waiting-queue order of the
  default scheduler and the order requests are handed to the router;
* supply its router (:meth:`Policy.make_router`, round-robin by default) and its per-replica
  scheduler (:meth:`Policy.make_scheduler`, ``sim.scheduler.Scheduler`` with a rank queue by default);
* set engine defaults (token budget, sequence cap, block size, ...) and its engine-overhead style.

Policy files in this package are discovered automatically: adding a policy touches one file.
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from sim.errors import UserError
from sim.scheduler import Scheduler
from sim.seq import WaitQueue

_REGISTRY: dict[str, type] = {}
_ROUTERS: dict[str, type] = {}


def register(name: str):
    """Class decorator: make a Policy available by ``name``."""

    def deco(cls):
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def register_router(name: str):
    def deco(cls):
        cls.name = name
        _ROUTERS[name] = cls
        return cls

    return deco


def _discover() -> None:
    import policies

    for m in pkgutil.iter_modules(policies.__path__):
        if not m.name.startswith("_") and m.name != "base":
            importlib.import_module(f"policies.{m.name}")


def get_policy(name: str) -> type:
    if name not in _REGISTRY:
        _discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UserError(f"unknown policy {name!r}; choose one of {', '.join(policy_names())}") from None


def policy_names() -> list[str]:
    _discover()
    return sorted(_REGISTRY)


def get_router(name: str) -> type:
    _discover()
    try:
        return _ROUTERS[name]
    except KeyError:
        raise UserError(f"unknown router {name!r}; choose one of {', '.join(sorted(_ROUTERS))}") from None


@dataclass
class PolicyContext:
    """What a policy may look at (all read-only)."""

    trace: object  # workloads.trace.Trace
    tree: object  # sim.prefix_tree.PrefixTree of the trace
    deployment: object  # sim.deployment.Deployment (one replica)
    cost_model: object  # sim.cost.CostModel of one replica
    engine: object  # sim.seq.EngineConfig in force
    replicas: int = 1
    seed: int = 0
    options: dict = field(default_factory=dict)  # policy-specific --opt key=value settings
    num_blocks: int = 0  # KV blocks per replica


class Router(ABC):
    """Chooses the replica of each arriving request."""

    name: ClassVar[str] = "router"

    def __init__(self, ctx: PolicyContext, replicas: list):
        self.ctx = ctx
        self.replicas = replicas  # sim.engine.Replica objects (read their schedulers' state)

    @abstractmethod
    def route(self, req: int, now: float) -> int:
        """The replica index for request ``req`` arriving at ``now``."""


@register_router("round-robin")
class RoundRobin(Router):
    """Requests go to replicas in turn, in the order they are handed over."""

    def __init__(self, ctx, replicas):
        super().__init__(ctx, replicas)
        self._next = 0

    def route(self, req: int, now: float) -> int:
        i = self._next
        self._next = (i + 1) % len(self.replicas)
        return i


class Policy:
    """Base policy: FCFS order, round-robin routing, the default scheduler."""

    name: ClassVar[str] = "base"
    description: ClassVar[str] = ""
    default_engine: ClassVar[str] = "ideal"  # engine-overhead style (sim.cost.ENGINES)
    engine_defaults: ClassVar[dict] = {}  # EngineConfig fields this policy sets by default
    options: ClassVar[dict] = {}  # option name -> (default, help)
    scheduler_cls: ClassVar[type] = Scheduler
    router: ClassVar[str] = "round-robin"

    def __init__(self, ctx: PolicyContext):
        self.ctx = ctx
        unknown = set(ctx.options) - set(self.options)
        if unknown:
            raise UserError(f"policy {self.name!r} has no option(s) {', '.join(sorted(unknown))}; "
                            f"it takes: {', '.join(self.options) or 'none'}")
        self.opt = {k: _coerce(k, ctx.options.get(k, d), d) for k, (d, _h) in self.options.items()}

    def prepare(self) -> None:
        """One-off preprocessing of the whole trace (offline policies)."""

    def rank(self) -> np.ndarray:
        """Priority of each request, lower first. Default: arrival time, then trace order."""
        t = self.ctx.trace
        return np.lexsort((np.arange(t.n), t.arrival_s)).argsort()

    def make_router(self, replicas: list) -> Router:
        return get_router(self.router)(self.ctx, replicas)

    def make_scheduler(self, replica: int, **kw) -> Scheduler:
        return self.scheduler_cls(queue=WaitQueue(self._rank), replica=replica, **kw)

    def summary_extra(self) -> dict:
        """Policy-specific figures for summary.json (deterministic values only)."""
        return {}

    # called by the runner once, after prepare()
    def _finalize(self) -> None:
        self._rank = np.asarray(self.rank())


def _coerce(key: str, value, default):
    if isinstance(default, bool):
        if isinstance(value, str):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise UserError(f"option {key}: expected true/false, got {value!r}")
        return bool(value)
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        try:
            v = type(default)(value) if isinstance(default, float) or str(value).lstrip("-").isdigit() \
                else float(value)
        except (TypeError, ValueError):
            raise UserError(f"option {key}: expected a number, got {value!r}") from None
        # NaN passes every `x < lo` check unnoticed; inf only where the option's default is inf
        if not math.isfinite(v) and not (math.isinf(v) and math.isinf(default) and (v > 0) == (default > 0)):
            raise UserError(f"option {key}: expected a finite number, got {value!r}")
        return v
    return value


__all__ = ["Policy", "PolicyContext", "Router", "RoundRobin", "get_policy", "get_router", "policy_names",
           "register", "register_router"]
