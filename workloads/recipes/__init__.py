"""Synthetic trace recipes, found by name.

A recipe is a frozen options dataclass (typed fields; ``metadata["help"]`` documents each one and is
reused as CLI help) plus a function turning validated options into a :class:`~workloads.trace.Trace`.
Every recipe is seeded: the same options give a byte-identical trace file. Recipe modules are
imported only when asked for, so listing names stays cheap.

>>> from workloads.recipes import synthesize
>>> trace = synthesize("batchllm", prefix_len=2000, distinct_len=200, share_degree=4, requests=64)
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sim.errors import UserError

# Recipe name -> module under workloads.recipes defining ``RECIPE``.
_MODULES = (("blendserve", "blendserve"), ("batchllm", "batchllm"), ("preble", "preble"), ("accelgen", "accelgen"))


@dataclass(frozen=True, slots=True)
class Recipe:
    """A named trace generator with typed options."""

    name: str
    summary: str  # one line for listings and CLI help
    options: type  # frozen dataclass; fields are the options, metadata["help"] describes each
    build: Callable[[Any], Any]  # options instance -> Trace

    def make(self, **options):
        """Validate ``options`` (UserError on a bad one) and build the trace."""
        names = {f.name for f in dataclasses.fields(self.options)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise UserError(f"recipe {self.name}: unknown option(s) {', '.join(unknown)}; "
                            f"options are {', '.join(sorted(names))}")
        missing = [f.name for f in dataclasses.fields(self.options)
                   if f.default is dataclasses.MISSING and f.name not in options]
        if missing:
            raise UserError(f"recipe {self.name}: missing option(s) "
                            f"{', '.join('--' + m.replace('_', '-') for m in missing)}")
        return self.build(self.options(**options))


def recipe_names() -> list[str]:
    return [name for name, _ in _MODULES]


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name`` (UserError listing the choices otherwise)."""
    for n, module in _MODULES:
        if n == name:
            return importlib.import_module(f"workloads.recipes.{module}").RECIPE
    raise UserError(f"unknown recipe {name!r}; choose one of {', '.join(recipe_names())}")


def synthesize(name: str, **options):
    """Build the trace of recipe ``name`` with ``options`` (field names of its options dataclass)."""
    return get_recipe(name).make(**options)


def option_help(options_cls: type) -> dict[str, str]:
    """Field name -> help text of an options dataclass."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(options_cls)}


__all__ = ["Recipe", "get_recipe", "option_help", "recipe_names", "synthesize"]
