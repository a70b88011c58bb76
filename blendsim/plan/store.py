"""The plan directory (``-o DIR``): its marker, the sample trace, one small JSON per simulated deployment.

Like a sweep's, a plan directory resumes: a rerun with the same trace, model, sample size and seed reuses
every deployment already simulated (the deadline, prices and budget may change: they do not change a
simulation). A directory of another plan, or one that is no plan directory, is refused; nothing is deleted.
"""

from __future__ import annotations

import json
from pathlib import Path

from blendsim.sim.errors import UserError
from blendsim.sim.io import read_json, write_json

MARKER = "plan.json"


class PlanStore:
    def __init__(self, folder: str | Path, settings: dict):
        self.dir = Path(folder)
        d = self.dir
        if d.exists() and not d.is_dir():
            raise UserError(f"{d}: exists and is not a directory; choose another -o")
        marker = d / MARKER
        if d.exists() and any(d.iterdir()) and not marker.exists():
            raise UserError(f"{d}: exists and is not a blendsim plan directory (no {MARKER}); choose another -o")
        settings = json.loads(json.dumps(settings, sort_keys=True))
        from blendsim.runner import simulator_digest

        made_by = simulator_digest(("plan/tasks.py", "plan/space.py", "policy_spec.py"))
        if marker.exists():
            old = read_json(marker, "plan marker")
            was = old.get("settings") if isinstance(old, dict) else None
            if not isinstance(was, dict):
                raise UserError(f"{marker}: not a blendsim plan marker")
            if was != settings:
                diff = ", ".join(f"{k}={was.get(k)!r}" for k in sorted(settings) if was.get(k) != settings[k])
                raise UserError(f"{d}: was planned with other settings ({diff}); choose another -o")
            if old.get("simulator") != made_by:  # its cells' figures would mix with this version's
                raise UserError(f"{d}: its simulations were made by another version of blendsim's simulator or its "
                                f"fitted parameters (an upgrade or a refit since): choose another -o, so that no "
                                f"figure of the old version enters this plan")
        else:
            write_json(marker, {"kind": "blendsim-plan", "schema_version": 1, "settings": settings,
                                "simulator": made_by})
        self.settings = settings

    def _cell(self, key: str, kind: str) -> Path:
        return self.dir / "cells" / f"{key}.{kind}.json"

    def get(self, key: str, kind: str) -> dict | None:
        """A deployment simulated before, or None (then it is simulated again): a cell that is not JSON, or whose
        figures no simulation gives (a makespan that is not a positive number, a negative or non-finite count or
        rate), is not trusted."""
        try:
            v = json.loads(self._cell(key, kind).read_text())
        except (OSError, ValueError):
            return None
        return v if isinstance(v, dict) and _plausible(v) else None

    def put(self, key: str, kind: str, value: dict) -> None:
        write_json(self._cell(key, kind), value)

    def trace_files(self, trace, sample, path: Path | None = None):
        """Where workers read the trace (its own file when given) and the sample (written here once)."""
        from blendsim.workloads.trace import write_trace

        path = worker_readable(path)
        full = Path(path) if path is not None else self.dir / "trace.parquet"
        if path is None and not full.exists():
            write_trace(trace, full)
        s = self.dir / "sample.parquet"
        if sample is not None and not s.exists():
            write_trace(sample, s)
        return _Files(full, s if sample is not None else None)


def worker_readable(path) -> Path | None:
    """The trace file itself where the workers can read it (Parquet), else None: a JSONL trace is written out as
    Parquet for them."""
    return Path(path) if path is not None and Path(path).suffix.lower() == ".parquet" else None


def _plausible(v: dict) -> bool:
    import math

    def num(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0

    m = v.get("makespan_s")
    return (num(m) and m > 0 and all(num(v[k]) for k in ("throughput_tok_s", "n_requests", "input_tokens",
                                                             "output_tokens") if k in v)
            and (v.get("t_critical_s") is None or num(v["t_critical_s"]))
            and (v.get("prefix_sharing_ratio") is None or num(v["prefix_sharing_ratio"])))


class _Files:
    def __init__(self, full, sample):
        self.full, self.sample = full, sample


__all__ = ["MARKER", "PlanStore"]
