"""Policy and router base classes and the registry.

A policy is one file: a subclass of :class:`Policy` decorated with ``@register("name")``. It may

* preprocess the whole trace once (:meth:`Policy.prepare`) — offline policies sort, split, group;
* give every request a priority (:meth:`Policy.rank`, lower first): the waiting-queue order of the
  default scheduler and the order requests are handed to the router;
* supply its router (:meth:`Policy.make_router`, round-robin by default) and its per-replica
  scheduler (:meth:`Policy.make_scheduler`, ``blendsim.sim.scheduler.Scheduler`` with a rank queue by default);
* declare the scheduler settings it needs (token budget, sequence cap, block size, ...), applied over the
  engine's and printed; the engine (``--engine``) prices every policy alike.

Policy files in this package are discovered automatically: adding a policy touches one file.

Outside the package a policy is named by its file, ``path/to/file.py:ClassName`` (any subclass of
:class:`Policy`, e.g. one from a notebook's repository), or registered by an installed package under
the ``blendsim.policies`` entry-point group (name = the policy's name, value = ``module:Class``).
:func:`resolve_policy` finds any of them and says where it came from (for summary.json).
"""

from __future__ import annotations

import inspect
import weakref
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


def _name_after_class(cls: type) -> None:
    if "name" not in cls.__dict__:  # not registered and no name of its own: the class's name
        cls.name = cls.__name__


def _class_source(cls: type) -> tuple[str, str | None]:
    """Where ``cls`` is defined: policies/<module>.py for this package's policies (no hash: the
    package's version says it), else its file and the file's SHA-256."""
    import hashlib

    try:
        f = Path(inspect.getsourcefile(cls) or "")
    except (TypeError, OSError):  # defined in an interactive session (a notebook cell, exec): no source file
        f = None
    codes = {_plugins.code_file(getattr(v, "__wrapped__", v)) for v in vars(cls).values() if inspect.isfunction(v)}
    if f is None or not f.is_file() or (codes and str(f) not in codes and str(f.resolve()) not in codes):
        # no file, or not the one its code came from (a class exec'd in a script's __main__)
        return _interactive_source(cls), None
    root = Path(__file__).resolve().parent
    if cls.__module__.startswith("blendsim.policies.") and f.resolve().is_relative_to(root):
        return f.resolve().relative_to(root.parent).as_posix(), None
    return str(f.resolve()), hashlib.sha256(f.read_bytes()).hexdigest()


def _interactive_source(cls: type) -> str:
    """What can be recorded of a class with no source file (a notebook's): where it was defined and a digest
    of its methods' code (the same class body gives the same digest in the same Python)."""
    import hashlib
    import marshal
    import sys

    h = hashlib.sha256()
    files = set()
    for k in sorted(vars(cls)):
        fn = vars(cls)[k]
        fn = getattr(fn, "__wrapped__", fn)
        code = getattr(fn, "__code__", None)
        if code is not None:
            files.add(code.co_filename)
            h.update(k.encode() + b"\0" + marshal.dumps(code.replace(co_filename="", co_firstlineno=1)))
    where = f" in {', '.join(sorted(files))}" if files else ""
    return (f"{cls.__module__}.{cls.__qualname__} (defined interactively{where}, no source file; code sha256 "
            f"{h.hexdigest()[:16]}, Python {sys.version_info.major}.{sys.version_info.minor})")


def get_router(name: str) -> type:
    """The router class registered as ``name``. A policy's router is registered by the policy's own module
    (imported before the policy can be named), and ``policies.registry.resolve_policy`` imports every built-in
    policy module first, so no discovery is needed here."""
    try:
        return _ROUTERS[name]
    except KeyError:
        raise UserError(f"unknown router {name!r}; choose one of {', '.join(sorted(_ROUTERS))}") from None


class Router(ABC):
    """Chooses the replica of each arriving request."""

    name: ClassVar[str] = "router"

    def __init__(self, ctx: PolicyContext, replicas: list | None = None):
        if replicas is None:  # MyRouter(replicas): the list taken for the context, the replicas missing
            raise TypeError(f"{type(self).__qualname__}(...) takes the policy's context and the replicas: "
                            f"return {type(self).__name__}(self.ctx, replicas) from make_router")
        self.ctx = ctx
        self.replicas = replicas  # sim.engine.Replica objects (read their schedulers' state)

    @abstractmethod
    def route(self, req: int, now: float) -> int:
        """The replica index for request ``req`` arriving at ``now``."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if _plugins.is_users(cls):  # a user's router: its failures and bad indices become one line
            for name, check in (("__init__", None), ("route", _check_route)):
                fn = cls.__dict__.get(name)
                if inspect.isfunction(fn) and not getattr(fn, "__blendsim_guarded__", False):
                    setattr(cls, name, _plugins.guard(_owner, name, fn, check))


def _owner(obj) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    kind = "router" if issubclass(cls, Router) else "policy"
    return f"{kind} {cls.__qualname__}"


def _check_route(router, out) -> str | None:
    n = len(router.replicas)
    if isinstance(out, (bool, np.bool_)) or not isinstance(out, (int, np.integer)) or not 0 <= int(out) < n:
        return f"returned {_plugins.describe(out)}; it must return a replica index in 0..{n - 1}"
    return None


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


class AssignedRouter(Router):
    """Each request goes to the replica an offline policy assigned it before the run (``assign[req]``: BlendServe's
    subtree shares, dfs's contiguous stretches). Built by the policy's ``make_router``, not by name."""

    def __init__(self, ctx, replicas, assign):
        super().__init__(ctx, replicas)
        self.assign = np.asarray(assign).tolist()

    def route(self, req: int, now: float) -> int:
        return self.assign[req]


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

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if _plugins.is_users(cls):  # a user's policy: its failures and unusable results become one line
            _guard_methods(cls)

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
        """Replica ``replica``'s scheduler: ``scheduler_cls(queue=self.wait_queue(), replica=replica, **kw)``, where
        ``kw`` is the engine's keywords: ``kv``, ``cfg``, ``prompt_len``, ``output_len``, ``records``, ``record``
        and ``output_hint`` (see ``blendsim.sim.scheduler.Scheduler``). An override passes them on."""
        return self.scheduler_cls(queue=self.wait_queue(), replica=replica, **kw)

    def wait_queue(self) -> WaitQueue:
        """A new waiting queue in this policy's ``rank()`` order, for the ``queue`` keyword of the scheduler
        that :meth:`make_scheduler` builds (one per replica: each replica's waiting requests are its own)."""
        if not hasattr(self, "_rank"):
            raise UserError(f"{_owner(self)}: wait_queue() is for make_scheduler(): the ranks it orders by are "
                            "known only after prepare() and rank()")
        return WaitQueue(self._rank)

    def summary_extra(self) -> dict:
        """Policy-specific figures for summary.json (deterministic values only)."""
        return {}

    def reads_shared_prefix_once(self) -> bool:
        """Whether the policy's decode steps read a shared prompt prefix's KV once for all the sequences that share
        it (a prefix-shared attention kernel that lowers ``Batch.decode_ctx_sum``, as BatchLLM's does): the run's
        T_o then leaves shared prefixes out of the keys every decode must read, so it stays a bound."""
        return False

    # called by the runner once, after prepare()
    def _finalize(self) -> None:
        out = self.rank()
        problem = _rank_problem(out, self.ctx.trace.n)
        if problem:
            fn = type(self).rank
            raise _plugins.bad_result(_owner(self), "rank()", getattr(fn, "__wrapped__", fn), problem)
        self._rank = np.array(out, copy=True)  # this run's own: a buffer the policy refills next run is not it


def _rank_problem(out, n: int) -> str | None:
    """What is wrong with ``rank()``'s result for ``n`` requests (None: one finite number per request)."""
    want = f"it must return one finite number per request ({n})"
    if out is None or isinstance(out, (dict, str, bytes, set)) or inspect.isgenerator(out) or np.isscalar(out):
        return f"returned {_plugins.describe(out)}; {want}"
    try:
        a = np.asarray(out)
    except (TypeError, ValueError) as e:
        return f"returned {_plugins.describe(out)} ({e}); {want}"
    if a.dtype.kind not in "biuf":
        return f"returned values of type {a.dtype} ({_plugins.describe(out)}); {want}"
    if a.shape != (n,):
        return f"returned an array of shape {a.shape}; {want}"
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        return f"returned NaN or infinite values (first at request {int(np.flatnonzero(~np.isfinite(a))[0])}); {want}"
    return None


def _check_scheduler(policy, out) -> str | None:
    """A user's ``make_scheduler`` result: a Scheduler, whose class's own hooks are then guarded as a
    ``scheduler_cls`` is (once per class: the scheduler of each replica is of the same class)."""
    if not isinstance(out, Scheduler):
        return f"returned {_plugins.describe(out)}; it must return a blendsim.sim.scheduler.Scheduler"
    cls = type(out)
    if cls not in _GUARDED_SCHEDULERS:
        guard_scheduler(cls)
    return None


def _check_router(policy, out) -> str | None:
    if not isinstance(out, Router):
        return f"returned {_plugins.describe(out)}; it must return a blendsim.Router"
    return None


def _check_extra(policy, out) -> str | None:
    import json

    from blendsim.sim.rundir import json_safe

    if not isinstance(out, dict):
        return f"returned {_plugins.describe(out)}; it must return a dict of JSON values for summary.json"
    try:
        json.dumps(json_safe(out), allow_nan=False, default=_no_json)
    except (TypeError, ValueError) as e:
        return f"returned a dict that is not JSON ({e}); it must return a dict of JSON values for summary.json"
    return None


def _no_json(o):
    if isinstance(o, (np.integer, np.floating)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"{type(o).__name__} is not a JSON value")


# a user's methods the runner calls, and what their results must be (rank(): checked in _finalize)
def _check_init(policy, out) -> str | None:
    """A user's ``__init__`` must leave what the base class sets: without ``super().__init__(ctx)`` the policy
    has no context (an AttributeError deep in the run) and its options go unchecked."""
    if not (hasattr(policy, "ctx") and hasattr(policy, "opt")):
        return "did not call super().__init__(ctx)"
    return None


def _check_bool(policy, out) -> str | None:
    return None if isinstance(out, (bool, np.bool_)) else f"returned {_plugins.describe(out)}; it must return True or False"


_USER_METHODS = {"__init__": _check_init, "prepare": None, "rank": None, "make_router": _check_router,
                 "make_scheduler": _check_scheduler, "summary_extra": _check_extra,
                 "reads_shared_prefix_once": _check_bool}


def _guard_methods(cls: type) -> None:
    """Wrap each of a user policy class's own hook methods not yet wrapped, so that a failure or an unusable
    result is one line naming its file and line."""
    for name, check in _USER_METHODS.items():
        fn = cls.__dict__.get(name)
        if inspect.isfunction(fn) and not getattr(fn, "__blendsim_guarded__", False):
            setattr(cls, name, _plugins.guard(_owner, name, fn, check))


def check_policy_class(cls: type) -> None:
    """A user's policy class declares what the runner reads: ``engine_defaults`` (EngineConfig fields),
    ``options`` (name -> (default, help)), ``default_engine``, ``router``, ``scheduler_cls``. One line naming
    the class's file otherwise."""
    import dataclasses

    from blendsim.sim.seq import EngineConfig

    if not _plugins.is_users(cls):
        return
    where = f"policy {cls.__qualname__} ({_class_source(cls)[0]})"
    name = cls.__dict__.get("name", cls.__name__)
    if not (isinstance(name, str) and name.strip()):
        raise UserError(f"{where}: name must be a non-empty string (it labels runs and reports), got "
                        f"{_plugins.describe(name)}")
    _guard_methods(cls)  # a method set on the class after it was made: guarded all the same
    ed = cls.engine_defaults
    fields = [f.name for f in dataclasses.fields(EngineConfig)]
    if not isinstance(ed, dict):
        raise UserError(f"{where}: engine_defaults must be a dict of EngineConfig fields, got {_plugins.describe(ed)}")
    unknown = sorted(str(k) for k in ed if k not in fields)
    if unknown:
        raise UserError(f"{where}: engine_defaults has unknown field(s) {', '.join(unknown)}; fields are "
                        f"{', '.join(fields)}")
    import typing

    from blendsim.sim.checks import by_type

    hints = typing.get_type_hints(EngineConfig)
    for k, v in ed.items():  # each value as the same setting given to simulate is checked ("no" is no switch)
        by_type(v, hints[k], f"{where}: engine_defaults[{k!r}]")
        _engine_default_in_range(k, v, f"{where}: engine_defaults[{k!r}]")
    opts = cls.options
    if not isinstance(opts, dict):
        raise UserError(f"{where}: options must be a dict of name -> (default, help), got {_plugins.describe(opts)}")
    for k, v in opts.items():
        from blendsim.policies.option import Option

        if not isinstance(k, str) or not (isinstance(v, Option) or (isinstance(v, tuple) and len(v) == 2)):
            raise UserError(f"{where}: options[{k!r}] must be a (default, help) pair, got {_plugins.describe(v)}")
        if isinstance(v, Option):  # its own default within its own range and choices: said as the policy's, now
            try:
                v.coerce(k, v.default)
            except UserError as e:
                raise UserError(f"{where}: option {k}'s default {v.default!r} is not one it accepts "
                                f"({str(e).partition(': ')[2]})") from None
    if not isinstance(cls.router, str):
        raise UserError(f"{where}: router must be a registered router's name (a string)")
    if not (isinstance(cls.scheduler_cls, type) and issubclass(cls.scheduler_cls, Scheduler)):
        raise UserError(f"{where}: scheduler_cls must be a subclass of blendsim.sim.scheduler.Scheduler")
    guard_scheduler(cls.scheduler_cls)


def _engine_default_in_range(key: str, value, label: str) -> None:
    """One ``engine_defaults`` value within the range the engine takes (EngineConfig's own checks, and the
    deployment's for gpu_memory_utilization), refused as the policy's, not as a flag the user never gave."""
    from blendsim.sim.checks import number
    from blendsim.sim.seq import EngineConfig

    if key == "gpu_memory_utilization":
        number(value, label, 0.0, 1.0, lo_open=True)
        return
    try:
        EngineConfig(**{key: value})
    except UserError as e:  # "--token-budget must be >= 1, got -5": the same, said of the policy's setting
        text = str(e)
        raise UserError(label + (text[text.index(" must "):] if " must " in text else f": {text}")) from None


def _is_index(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _check_candidate(sched, out) -> str | None:
    n = len(sched.P)  # the trace's requests (the scheduler's prompt lengths)
    if out is None:
        return None
    if not (_is_index(out) and 0 <= out < n):
        return f"returned {_plugins.describe(out)}: expected a waiting request's index (0..{n - 1}) or None"
    r = int(out)
    if r in sched.running:
        return f"returned request {r}, which is running already: expected a waiting request's index or None"
    rec = getattr(sched, "rec", None)
    if rec is not None and rec.finish_s[r] == rec.finish_s[r]:  # not NaN: it finished
        return f"returned request {r}, which has finished: expected a waiting request's index or None"
    here = getattr(sched, "replica", None)
    if rec is not None and here is not None and rec.replica[r] >= 0 and rec.replica[r] != here:  # admitted elsewhere
        return (f"returned request {r}, which replica {rec.replica[r]} admitted, not this one ({here}): expected a "
                f"request waiting here or None")
    # the default take_candidate() removes the queue's head: a scheduler that offers another request removes it itself
    peek = getattr(sched.waiting, "peek", None)
    if type(sched).take_candidate is Scheduler.take_candidate and peek is not None and r != peek():
        return (f"returned request {r}, not the waiting queue's head ({peek()}), which the default "
                f"take_candidate() removes: override take_candidate(req) too, to remove the request you offer "
                f"(self.waiting.remove(req))")
    return None


def _check_victim(sched, out) -> str | None:
    if out is None or sched.running.get(getattr(out, "req", None)) is out:
        return None
    return f"returned {_plugins.describe(out)}: expected one of the running sequences (self.running's values) or None"


def _check_blocks(sched, out) -> str | None:
    return None if _is_index(out) and out >= 0 else f"returned {_plugins.describe(out)}: expected a block count >= 0"


# what the engine reads from a scheduler's hooks: an unusable result is one line, not a TypeError deep in simpy
# (free_held is read for its truth alone: any value serves)
_SCHEDULER_RESULTS = {"next_candidate": _check_candidate, "pick_victim": _check_victim,
                      "max_hit_blocks": _check_blocks, "max_insert_blocks": _check_blocks}


# Scheduler classes guard_scheduler has seen (weakly held: a class made inside make_scheduler goes with its run)
_GUARDED_SCHEDULERS: weakref.WeakSet = weakref.WeakSet()


def guard_scheduler(sched: type) -> None:
    """A user's Scheduler subclass: every method it defines (its hooks) ends in one line naming the user's file
    and line when it raises or when a hook the engine reads returns something unusable, as a policy's methods do
    (the built-in Scheduler's own methods stay as they are, and so do the classes of blendsim's own policies)."""
    for klass in sched.__mro__:
        if klass is Scheduler or not _plugins.is_users(klass):
            continue
        for name, fn in list(vars(klass).items()):
            if inspect.isfunction(fn) and not getattr(fn, "__blendsim_guarded__", False):
                setattr(klass, name, _plugins.guard(lambda obj: f"scheduler {type(obj).__qualname__}", name, fn,
                                                    _SCHEDULER_RESULTS.get(name)))
    _GUARDED_SCHEDULERS.add(sched)


def option_records(policy) -> dict[str, Option]:
    """A policy's (class or instance) options as :class:`~blendsim.policies.option.Option` records."""
    return {k: Option.of(v) for k, v in policy.options.items()}


__all__ = ["AssignedRouter", "Option", "option_records", "Policy", "PolicyContext", "PolicyRef", "Router", "RoundRobin",
           "get_router",
           "register", "register_router"]
