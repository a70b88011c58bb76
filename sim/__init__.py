"""blendsim core: specs, prefix tree, cost model, engine, metrics and the CLI."""

__version__ = "0.1.0"
