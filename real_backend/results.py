"""The validation folder: collected rows and their atomic writing.

``VAL_DIR/`` holds ``summary.json`` (``"kind": "blendsim.validation"``), ``steps.parquet`` (one row per
replayed step: the Batch's counts, predicted and measured seconds, cost-model FLOPs and bytes),
``ops.parquet`` (per operator, on the steps whose operators were timed), ``nvml.parquet`` (GPU samples)
and ``sim/<policy>/`` (each policy's simulated run, ``schedule.parquet`` included, for later replays;
the folder name made file-safe by ``blendsim.sim.rundir.run_dir_name``).
Everything is written into a temporary folder beside ``VAL_DIR`` that replaces it only once complete,
so an interrupted write never leaves half a folder; a run stopped by a fault writes what it measured (beside a
complete validation already in ``VAL_DIR``, in ``VAL_DIR.stopped``, never over it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from blendsim.sim.errors import UserError

KIND = "blendsim.validation"
STEP_COLUMNS = ("policy", "replica", "step", "kind", "num_tokens", "num_prefill_tokens", "num_prefill_seqs",
                "num_decode", "decode_ctx_sum", "attn_pairs", "num_logits", "predicted_s", "pred_compute_s",
                "pred_memory_s", "measured_s", "host_s", "prep_s", "rel_err", "flops", "bytes", "kv_blocks_used",
                "checksum")
OP_COLUMNS = ("policy", "replica", "step", "op", "op_class", "predicted_s", "measured_s")


class Rows:
    """Column-wise rows of one table."""

    def __init__(self, columns: tuple):
        self.columns = columns
        self.cols = {c: [] for c in columns}

    def add(self, **values) -> None:
        for c in self.columns:
            self.cols[c].append(values[c])

    def __len__(self) -> int:
        return len(self.cols[self.columns[0]])

    def arrays(self) -> dict:
        return {c: np.asarray(v) for c, v in self.cols.items()}


class ValidationStopped(UserError):
    """The replay stopped early (out of memory, corrupt schedule, interrupted); partial results saved."""

    exit_code = 1


def check_val_dir(out: str | Path) -> Path:
    """Refuse to overwrite a folder that holds something other than an earlier validation."""
    from blendsim.sim.io import read_json, refuse_unsafe_dir

    d = refuse_unsafe_dir(out)
    if d.exists() and (not d.is_dir() or any(d.iterdir())):
        s = d / "summary.json"
        if not (d.is_dir() and s.exists() and read_json(s, "summary").get("kind") == KIND):
            raise UserError(f"{d}: exists and is not a blendsim validation folder; choose another -o")
    return d


def stopped_dir(out: str | Path) -> Path:
    """Where a stopped run writes: ``out``, unless ``out`` holds a complete validation, which a stopped run never
    replaces; then ``OUT.stopped`` (itself replaced by the next stopped run, never when it holds anything else)."""
    from blendsim.sim.io import read_json

    d = Path(out)
    s = d / "summary.json"
    if not (d.is_dir() and s.exists() and read_json(s, "summary").get("status") == "complete"):
        return d
    # beside it: OUT.stopped, or the first OUT.stopped-N that is free or a validation folder (never losing the
    # measurements at the end of a long run to a folder of something else)
    for i in range(1, 1000):
        c = d.with_name(d.name + (".stopped" if i == 1 else f".stopped-{i}"))
        if not c.exists() or (c.is_dir() and not any(c.iterdir())):
            return c
        try:
            check_val_dir(c)
            return c
        except UserError:
            continue
    return d.with_name(d.name + ".stopped")


def write_results(out: str | Path, summary: dict, tables: dict, sims: dict) -> Path:
    """Write the folder atomically; ``tables`` maps a name to a :class:`Rows`, ``sims`` a policy to its
    ``blendsim.sim.rundir.RunResult``."""
    import pyarrow.parquet as pq

    from blendsim.sim import columns as col
    from blendsim.sim.io import atomic_dir, write_json
    from blendsim.sim.rundir import run_dir_name, write_run

    d = check_val_dir(out)
    with atomic_dir(d, "summary.json", "blendsim validation folder") as tmp:
        write_json(tmp / "summary.json", summary)
        for name, rows in tables.items():
            if rows is not None and len(rows):
                pq.write_table(col.table(rows.arrays()), tmp / f"{name}.parquet", compression="zstd")
        for policy, res in sims.items():
            write_run(res, tmp / "sim" / run_dir_name(policy))
    return d


__all__ = ["KIND", "ValidationStopped", "OP_COLUMNS", "Rows", "STEP_COLUMNS", "check_val_dir", "write_results"]
