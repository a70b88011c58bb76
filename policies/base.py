"""Policy and router base classes and the registry.

A policy is one file: a subclass of :class:`Policy` decorated with ``@register("name")``. It may

* preprocess the whole trace once (:meth:`Policy.prepare`) — offline policies sort, split, group;
* give every request a priority (:meth:`Policy.rank`, lower first): the waiting-queue order of the
  default scheduler and the order requests are handed to the router;
* supply its router (:meth:`Policy.make_router`, round-robin by default) and its per-replica
  scheduler (:meth:`Policy.make_scheduler`, ``blendsim.sim.scheduler.Scheduler`` with a rank queue by default);
* set engine defaults (token budget, sequence cap, block size, ...) and its engine-overhead style.

Policy files in this package are discovered automatically: adding a policy touches one file.

Outside the package a policy is named by its file, ``path/to/file.py:ClassName`` (any subclass of
:class:`Policy`, e.g. one from a notebook's repository), or registered by an installed package under
the ``blendsim.policies`` entry-point group (name = the policy's name, value = ``module:Class``).
:func:`resolve_policy` finds any of them and says where it came from (for summary.json).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from blendsim.policies import _plugins
from blendsim.policies.option import Option
from blendsim.sim.errors import UserError
from blendsim.sim.policy import PolicyContext
from blendsim.sim.scheduler import Scheduler
from blendsim.sim.seq import WaitQueue

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
    from blendsim import policies

    for m in pkgutil.iter_modules(policies.__path__):
        if not m.name.startswith("_") and m.name != "base":
            importlib.import_module(f"blendsim.policies.{m.name}")


@dataclass(frozen=True)
class PolicyRef:
    """A policy found by :func:`resolve_policy`: its class, how runs label it and where it came from."""

    cls: type
    label: str  # the name or file spec as given (a class given directly: its name)
    source: str  # policies/<module>.py, the user's file, or the entry point
    sha256: str | None = None  # of the source file, for policies from outside this package

    def summary(self) -> dict:
        """The summary.json fields that identify the policy."""
        out = {"policy": self.label, "policy_name": self.cls.name, "policy_source": self.source}
        if self.sha256:
            out["policy_sha256"] = self.sha256
        return out


def resolve_policy(spec) -> PolicyRef:
    """The policy ``spec`` names: a registered name, an installed package's entry point, a file
    (``path/to/file.py:ClassName``, or ``file.py`` when it defines one policy), or a Policy subclass."""
    if isinstance(spec, type):
        if not issubclass(spec, Policy):
            raise UserError(f"policy {spec.__qualname__}: not a subclass of blendsim.Policy")
        _name_after_class(spec)
        return PolicyRef(spec, spec.name, *_class_source(spec))
    spec = str(spec).strip()
    if _plugins.is_file_spec(spec):
        cls, path, digest = _plugins.load_file(spec, Policy)
        _name_after_class(cls)
        return PolicyRef(cls, spec, str(path), digest)
    if spec not in _REGISTRY:
        _discover()
    if spec in _REGISTRY:
        return PolicyRef(_REGISTRY[spec], spec, *_class_source(_REGISTRY[spec]))
    ep = _plugins.entry_points().get(spec)
    if ep is None:
        raise UserError(f"unknown policy {spec!r}; choose one of {', '.join(policy_names())}, "
                        f"or give a file: path/to/file.py:ClassName")
    cls = _plugins.load_entry_point(ep, Policy, _REGISTRY)
    if "name" not in cls.__dict__:
        cls.name = spec
    return PolicyRef(cls, spec, _plugins.entry_point_source(ep), _class_source(cls)[1])


def get_policy(spec) -> type:
    """The Policy subclass ``spec`` names (see :func:`resolve_policy`)."""
    return resolve_policy(spec).cls


def policy_names() -> list[str]:
    """Registered policies and those installed packages offer (files are not listed)."""
    _discover()
    return sorted(set(_REGISTRY) | set(_plugins.entry_points()))


def _name_after_class(cls: type) -> None:
    if "name" not in cls.__dict__:  # not registered and no name of its own: the class's name
        cls.name = cls.__name__


def _class_source(cls: type) -> tuple[str, str | None]:
    """Where ``cls`` is defined: policies/<module>.py for this package's policies (no hash: the
    package's version says it), else its file and the file's SHA-256."""
    import hashlib

    try:
        f = Path(inspect.getsourcefile(cls) or "")
    except TypeError:  # defined in an interactive session
        return f"{cls.__module__}.{cls.__qualname__}", None
    if not f.is_file():
        return f"{cls.__module__}.{cls.__qualname__}", None
    root = Path(__file__).resolve().parent
    if cls.__module__.startswith("blendsim.policies.") and f.resolve().is_relative_to(root):
        return f.resolve().relative_to(root.parent).as_posix(), None
    return str(f.resolve()), hashlib.sha256(f.read_bytes()).hexdigest()


def get_router(name: str) -> type:
    _discover()
    try:
        return _ROUTERS[name]
    except KeyError:
        raise UserError(f"unknown router {name!r}; choose one of {', '.join(sorted(_ROUTERS))}") from None


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
    # EngineConfig fields the policy needs, applied over the engine profile's (and printed where they
    # differ); the engine (--engine) prices every policy of a comparison alike: policies never choose pricing
    engine_defaults: ClassVar[dict] = {}
    needs_prefix_caching: ClassVar[bool] = False  # orders for prefix reuse: prefix caching is turned on for it
    reads_cost_model: ClassVar[bool] = False  # its plan reads step prices (the fidelity runner re-simulates it)
    options: ClassVar[dict] = {}  # option name -> policies.option.Option (or a (default, meaning) pair)
    paper: ClassVar[str] = ""  # where the policy comes from (a paper, a system), for `blendsim policies NAME`
    scheduler_cls: ClassVar[type] = Scheduler
    router: ClassVar[str] = "round-robin"

    def __init__(self, ctx: PolicyContext):
        self.ctx = ctx
        unknown = set(ctx.options) - set(self.options)
        if unknown:
            raise UserError(f"policy {self.name!r} has no option(s) {', '.join(sorted(unknown))}; "
                            f"it takes: {', '.join(self.options) or 'none'}")
        self.opt = {k: o.coerce(k, ctx.options.get(k, o.default)) for k, o in option_records(self).items()}

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


def option_records(policy) -> dict[str, Option]:
    """A policy's (class or instance) options as :class:`~blendsim.policies.option.Option` records."""
    return {k: Option.of(v) for k, v in policy.options.items()}


__all__ = ["Option", "option_records", "Policy", "PolicyContext", "PolicyRef", "Router", "RoundRobin", "get_policy", "get_router",
           "policy_names", "register", "register_router", "resolve_policy"]
