"""Sweeps: every policy on a density x sharing grid of synthetic workloads (BlendServe sec. 6.5).

>>> from blendsim.sweep import SweepSpec, check_spec, make_backend, run_sweep
>>> spec = check_spec(SweepSpec("blendserve", (0.9, 1.2), (0.15, 0.35), ("dfs", "random"),
...                             ("llama-3-8b",), ("a100-80gb",), requests=400))
>>> outcome = run_sweep(spec, "out/sweep", make_backend("local", jobs=2))   # doctest: +SKIP

Modules: ``grid`` (values, spec, cells and their names), ``spec_check`` (validation), ``tasks``
(what workers run), ``backends`` (inline, process pool, Ray), ``store`` (the directory, atomic
installs), ``driver`` (scheduling and resume); ``blendsim.reports.sweep_results`` writes results.parquet and
``blendsim.cli.sweep`` is the command.

Calling the package, ``blendsim.sweep(out, ...)``, runs the Python API's sweep (``blendsim.api.sweep``).
"""

import sys
import types

from blendsim.reports.sweep_results import assemble_results, collect_rows
from blendsim.sweep.backends import make_backend
from blendsim.sweep.driver import SweepOutcome, run_sweep
from blendsim.sweep.grid import Cell, SweepSpec, Workload, parse_values
from blendsim.sweep.spec_check import check_spec

__all__ = ["Cell", "SweepOutcome", "SweepSpec", "Workload", "assemble_results", "check_spec", "collect_rows",
           "make_backend", "parse_values", "run_sweep"]


class _CallableSweep(types.ModuleType):
    """``blendsim.sweep`` is both this package and the Python API's ``sweep`` function."""

    def __call__(self, *args, **kwargs):
        from blendsim.api import sweep

        return sweep(*args, **kwargs)

    @property
    def __signature__(self):  # inspect.signature(blendsim.sweep), an IDE's or notebook's hint: the function's
        import inspect

        from blendsim.api import sweep

        return inspect.signature(sweep)


sys.modules[__name__].__class__ = _CallableSweep
