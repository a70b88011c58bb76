"""The policy registry by name: this package's policies (found by importing every module of the package once),
installed packages' entry points, and files (``path/to/file.py:ClassName``).

It sits apart from ``policies.base`` because it imports every policy module by name and each of them imports
``base`` for ``Policy`` and ``register``: beside the base class, that discovery was an import circle."""

from __future__ import annotations

import functools
import importlib
import pkgutil

from blendsim.policies import _plugins
from blendsim.policies import base as _base
from blendsim.policies.base import Policy, PolicyRef, _class_source, _name_after_class, check_policy_class
from blendsim.sim.errors import UserError


def _discover() -> None:
    from blendsim import policies

    for m in pkgutil.iter_modules(policies.__path__):
        if not m.name.startswith("_") and m.name not in ("base", "registry", "option"):
            importlib.import_module(f"blendsim.policies.{m.name}")


def resolve_policy(spec) -> PolicyRef:
    """The policy ``spec`` names: a registered name, an installed package's entry point, a file
    (``path/to/file.py:ClassName``, or ``file.py`` when it defines one policy), or a Policy subclass."""
    if isinstance(spec, type):
        if not issubclass(spec, Policy):
            raise UserError(f"policy {spec.__qualname__}: not a subclass of blendsim.Policy")
        _name_after_class(spec)
        check_policy_class(spec)
        _discover()
        _name_is_its_own(spec)
        return PolicyRef(spec, spec.name, *_class_source(spec))
    spec = str(spec).strip()
    if _plugins.is_file_spec(spec):
        cls, path, digest = _plugins.load_file(spec, Policy)
        _name_after_class(cls)
        check_policy_class(cls)
        _name_is_its_own(cls, f" ({path})")
        return PolicyRef(cls, spec, str(path), digest)
    _discover()  # every built-in policy and router registered (cheap after the first call)
    if spec in _base._REGISTRY:
        return PolicyRef(_base._REGISTRY[spec], spec, *_class_source(_base._REGISTRY[spec]))
    ep = _plugins.entry_points().get(spec)
    if ep is None:
        if "[" in spec:  # plan's and sweep's NAME[key=value,...] given elsewhere, or its bracket left open
            raise UserError(f"policy {spec!r}: a policy's options go as NAME[key=value,...], closed by ']', in "
                            f"plan's and sweep's --policies; simulate takes them with --opt key=value")
        raise UserError(f"unknown policy {spec!r}; choose one of {', '.join(policy_names())}, "
                        f"or give a file: path/to/file.py:ClassName")
    cls = _plugins.load_entry_point(ep, Policy, _base._REGISTRY)
    if "name" not in cls.__dict__:
        cls.name = spec
    check_policy_class(cls)
    _name_is_its_own(cls, f" (entry point {ep.value})")
    return PolicyRef(cls, spec, _plugins.entry_point_source(ep), _class_source(cls)[1])


def _name_is_its_own(cls: type, where: str = "") -> None:
    """A user's class (given as a class or a file) may not carry a registered policy's name, as an entry point may
    not: runs and reports (summary.json's ``policy_name``, a sweep's rows) would take it for blendsim's own."""
    if cls.name not in _base._REGISTRY and cls.name not in _own_names():
        return  # no built-in's name: the policy modules stay unimported (a file policy's run imports none of them)
    _discover()
    taken = _base._REGISTRY.get(cls.name)
    if taken is not None and taken is not cls:
        raise UserError(f"policy {cls.__qualname__}{where}: its name {cls.name!r} is a registered policy's "
                        f"({taken.__module__}.{taken.__qualname__}); give your class a name of its own")


@functools.cache
def _own_names() -> frozenset:
    """The names this package's policy modules register, read from their source (``@register("name")``) without
    importing them; :func:`_discover` imports them where a name is one of these."""
    import re
    from pathlib import Path

    pattern = re.compile(r"""^@register\(\s*["']([^"']+)["']""", re.M)
    return frozenset(m.group(1) for f in Path(_base.__file__).parent.rglob("*.py") for m in pattern.finditer(f.read_text()))


def get_policy(spec) -> type:
    """The Policy subclass ``spec`` names (see :func:`resolve_policy`)."""
    return resolve_policy(spec).cls


def policy_names() -> list[str]:
    """Registered policies and those installed packages offer (files are not listed)."""
    _discover()
    return sorted(set(_base._REGISTRY) | set(_plugins.entry_points()))



__all__ = ["get_policy", "policy_names", "resolve_policy"]
