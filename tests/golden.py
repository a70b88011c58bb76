"""Content digests of every policy's results on small traces: what the speed work must leave unchanged.

Each case runs one registered policy on a small seeded trace (shared prefixes or none; offline or with
arrivals; one or two replicas; prefix caching on or off; the schedule recorded or not) and digests
summary.json's text and the step, request and schedule tables (column names, Arrow types and the raw
values), not the Parquet files' bytes, which also carry the writing pyarrow's version.

    python tests/golden.py --write    # store the digests of the installed version in tests/golden_sha256.json

Regenerate only when a change of results is intended (and list the before/after in its commit).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

STORE = Path(__file__).with_name("golden_sha256.json")
POLICIES = ("accelgen", "batchllm", "blendserve", "dfs", "e2", "fcfs", "random", "sarathi", "vllm")


def traces():
    from blendsim.workloads.trace import unique_prompts

    sys.path.insert(0, str(Path(__file__).parent))
    from helpers import random_trace

    shared = random_trace(np.random.default_rng(7), n=60, max_out=90)
    timed = random_trace(np.random.default_rng(8), n=50, arrivals=True, slos=True, max_out=60)
    rng = np.random.default_rng(9)
    alone = unique_prompts(rng.integers(1, 300, 80), rng.integers(1, 80, 80))
    return {"shared": shared, "timed": timed, "alone": alone}


def cases():
    """(name, trace key, RunConfig keyword arguments)."""
    out = []
    for pol in POLICIES:
        out.append((f"{pol}-shared", "shared", {"policy": pol}))
        out.append((f"{pol}-alone", "alone", {"policy": pol, "offline": True}))
        out.append((f"{pol}-timed-2rep", "timed", {"policy": pol, "replicas": 2}))
        out.append((f"{pol}-shared-small-kv", "shared", {"policy": pol, "kv_capacity_override": 400 * 131072}))
    out.append(("fcfs-shared-noprefix", "shared", {"policy": "fcfs", "prefix_caching": False}))
    out.append(("sarathi-alone-noprefix", "alone", {"policy": "sarathi", "prefix_caching": False}))
    out.append(("vllm-shared-schedule", "shared", {"policy": "vllm", "record_schedule": True}))
    out.append(("fcfs-timed-schedule", "timed", {"policy": "fcfs", "record_schedule": True}))
    return out


def _table_digest(tab) -> str:
    h = hashlib.sha256()
    for name, col in zip(tab.column_names, tab.columns):
        h.update(f"{name}:{col.type}:{len(col)}:{col.null_count};".encode())
        for chunk in col.chunks:
            for buf in chunk.buffers():
                if buf is not None:
                    h.update(buf.to_pybytes())
    return h.hexdigest()


def digest(result) -> dict:
    from blendsim.sim.rundir import json_safe, requests_table, schedule_arrow, steps_table

    out = {
        "summary": hashlib.sha256(json.dumps(json_safe(result.summary), sort_keys=True).encode()).hexdigest(),
        "steps": _table_digest(steps_table(result)),
        "requests": _table_digest(requests_table(result)),
    }
    if result.schedule is not None:
        out["schedule"] = _table_digest(schedule_arrow(result))
    return out


def run_case(key: str, kwargs: dict, trace_by_key=None):
    from blendsim.runner import RunConfig, run_simulation

    tr = (trace_by_key or traces())[key]
    return run_simulation(tr, RunConfig(model="llama-3-8b", hardware="a100-80gb", **kwargs))


def compute() -> dict:
    tr = traces()
    return {name: digest(run_case(key, kw, tr)) for name, key, kw in cases()}


if __name__ == "__main__":
    got = compute()
    if "--write" in sys.argv:
        STORE.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(got)} cases to {STORE}")
    else:
        print(json.dumps(got, indent=1, sort_keys=True))
