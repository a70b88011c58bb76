"""The policy registry by name: this package's policies (found by importing every module of the package once),
installed packages' entry points, and files (``path/to/file.py:ClassName``).

It sits apart from ``policies.base`` because it imports every policy module by name and each of them imports
``base`` for ``Policy`` and ``register``: beside the base class, that discovery was an import circle."""

from __future__ import annotations

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
        taken = _base._REGISTRY.get(spec.name)
        if taken is not None and taken is not spec:  # runs and reports would take it for the built-in
            raise UserError(f"policy {spec.__qualname__}: its name {spec.name!r} is a registered policy's "
                            f"({taken.__module__}.{taken.__qualname__}); give your class a name of its own")
        return PolicyRef(spec, spec.name, *_class_source(spec))
    spec = str(spec).strip()
    if _plugins.is_file_spec(spec):
        cls, path, digest = _plugins.load_file(spec, Policy)
        _name_after_class(cls)
        check_policy_class(cls)
        return PolicyRef(cls, spec, str(path), digest)
    _discover()  # every built-in policy and router registered (cheap after the first call)
    if spec in _base._REGISTRY:
        return PolicyRef(_base._REGISTRY[spec], spec, *_class_source(_base._REGISTRY[spec]))
    ep = _plugins.entry_points().get(spec)
    if ep is None:
        raise UserError(f"unknown policy {spec!r}; choose one of {', '.join(policy_names())}, "
                        f"or give a file: path/to/file.py:ClassName")
    cls = _plugins.load_entry_point(ep, Policy, _base._REGISTRY)
    if "name" not in cls.__dict__:
        cls.name = spec
    check_policy_class(cls)
    return PolicyRef(cls, spec, _plugins.entry_point_source(ep), _class_source(cls)[1])


def get_policy(spec) -> type:
    """The Policy subclass ``spec`` names (see :func:`resolve_policy`)."""
    return resolve_policy(spec).cls


def policy_names() -> list[str]:
    """Registered policies and those installed packages offer (files are not listed)."""
    _discover()
    return sorted(set(_base._REGISTRY) | set(_plugins.entry_points()))



__all__ = ["get_policy", "policy_names", "resolve_policy"]
