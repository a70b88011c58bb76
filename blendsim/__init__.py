"""blendsim: simulate, calibrate and compare schedulers for offline batch LLM inference.

The application layer: the Python API (``blendsim.api``, re-exported here), the command line
(``blendsim.cli``), the runner, sweeps, the demo and the validation flow sit here, on top of the
engine core (``sim``), the policies, workloads, calibration, real backend and reports.

>>> import blendsim                                                          # doctest: +SKIP
>>> trace = blendsim.synthesize("blendserve", requests=2000, density=1.1, sharing=0.3)
>>> r = blendsim.simulate(trace, policy="dfs", model="llama-3-8b", hardware="a100-80gb")
>>> r.summary["throughput_tok_s"], len(r.requests)

Attributes load on first use, so ``import blendsim`` (and the CLI's start-up) stays light.
"""

from __future__ import annotations

import importlib

# public name -> the module that defines it (imported on first use)
_EXPORTS = {
    "BlendsimError": "blendsim.api",
    "Result": "blendsim.api",
    "SweepResult": "blendsim.api",
    "load_trace": "blendsim.api",
    "write_trace": "blendsim.api",
    "make_trace": "blendsim.api",
    "synthesize": "blendsim.api",
    "simulate": "blendsim.api",
    "cost": "blendsim.api",
    "policy_names": "blendsim.api",
    "plan": "blendsim.plan",
    "Policy": "blendsim.policies.base",
    "Router": "blendsim.policies.base",
    "PolicyContext": "blendsim.sim.policy",
    "Trace": "blendsim.workloads.trace",
}
# submodules reachable as attributes (a function of one of them that belongs in the API goes in _EXPORTS).
# ``blendsim.sweep`` is the sweep package, and calling it runs blendsim.api.sweep (see blendsim/sweep/__init__.py).
_SUBMODULES = ("api", "cli", "fidelity", "runner", "sweep")

__all__ = sorted([*_EXPORTS, "sweep"])


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # later lookups skip this hook
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"blendsim.{name}")
    raise AttributeError(f"module 'blendsim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBMODULES))
