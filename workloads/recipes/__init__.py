"""Synthetic trace recipes, found by name.

A recipe is a frozen options dataclass (typed fields; ``metadata["help"]`` documents each one and is
reused as CLI help) plus a function turning validated options into a :class:`~workloads.trace.Trace`.
Every recipe is seeded: the same options give a byte-identical trace file. Recipe modules are
imported only when asked for, so listing names stays cheap. :class:`Recipe` and the helpers the
recipe modules share live in ``recipes.base`` (re-exported here), so a recipe module never imports
this registry that loads it.

>>> from blendsim.workloads.recipes import synthesize
>>> trace = synthesize("batchllm", prefix_len=2000, distinct_len=200, share_degree=4, requests=64)
"""

from __future__ import annotations

import importlib

from blendsim.sim.errors import UserError
from blendsim.workloads.recipes.base import (
    Recipe,
    lengths_with_mean_sd,
    option_help,
    paths,
    poisson_arrivals,
    popularity,
    require_positive,
    rngs,
)

_MODULES = ("blendserve", "batchllm", "preble", "accelgen")  # each defines RECIPE


def recipe_names() -> list[str]:
    return list(_MODULES)


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name`` (UserError listing the choices otherwise)."""
    if name in _MODULES:
        return importlib.import_module(f"blendsim.workloads.recipes.{name}").RECIPE
    raise UserError(f"unknown recipe {name!r}; choose one of {', '.join(recipe_names())}")


def synthesize(name: str, **options):
    """Build the trace of recipe ``name`` with ``options`` (field names of its options dataclass)."""
    return get_recipe(name).make(**options)


__all__ = ["Recipe", "get_recipe", "lengths_with_mean_sd", "option_help", "paths", "poisson_arrivals", "popularity",
           "recipe_names", "require_positive", "rngs", "synthesize"]
