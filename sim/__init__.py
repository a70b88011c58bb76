"""blendsim core: specs, prefix tree, cost model, engine, metrics and the CLI."""

__version__ = "0.1.0"

# the per-step modules load compiled where a current build of them exists, else as Python (sim/_compiled.py)
from blendsim.sim import _compiled  # noqa: E402

_compiled.install()
