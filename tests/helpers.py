"""Small builders shared by the tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from blendsim.workloads.trace import from_columns


def random_trace(rng: np.random.Generator, n: int | None = None, arrivals: bool = False, slos: bool = False,
                 max_out: int = 120):
    """A small trace whose prompts share segments (a few prefixes, unique tails)."""
    n = int(rng.integers(1, 40)) if n is None else n
    depth = int(rng.integers(1, 4))
    lengths: dict[int, int] = {}
    prompts = []
    for i in range(n):
        path = [(int(rng.integers(0, 3)) + 10 * k, int(rng.integers(1, 40))) for k in range(depth - 1)]
        path.append((1000 + i, int(rng.integers(1, 60))))
        prompts.append([(s, lengths.setdefault(s, ln)) for s, ln in path])
    p = [sum(ln for _, ln in pr) for pr in prompts]
    kw = {}
    if arrivals:
        kw["arrival_s"] = np.sort(rng.random(n) * 3.0)
    if slos:
        kw["ttft_slo_s"] = rng.choice([0.5, 5.0], n)
        kw["tbt_slo_s"] = rng.choice([0.05, 1.0], n)
    return from_columns(input_len=p, output_len=rng.integers(1, max_out, n), prompts=prompts, **kw)


def tiny_capacity_bytes(trace, extra_tokens: int = 0, block_size: int = 16) -> int:
    """KV bytes (tiny model: 4096 B/token) that just fit the largest request plus ``extra_tokens``."""
    need = int((trace.input_len + trace.output_len).max()) + extra_tokens + 2 * block_size
    return need * 4096


def one_line_error(r, *needles: str) -> str:
    """A CLI result that ended with one ``blendsim: error:`` line (exit 2, no traceback) naming ``needles``."""
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert err.startswith("blendsim: error: ") and "\n" not in err and "Traceback" not in r.output, r.output
    for n in needles:
        assert n in err, err
    return err


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str):
    """A script of ``benchmarks/`` (``name`` without ``.py``) imported as a module, for its functions."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_catalogue(tmp_path, rows, name: str = "cat.csv") -> Path:
    """A fidelity catalogue CSV of ``rows`` (dicts of its columns) in ``tmp_path``."""
    import csv

    from blendsim.fidelity.catalogue import COLUMNS

    p = tmp_path / name
    with p.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow(r)
    return p


def catalogue_row(**kw) -> dict:
    """A fidelity catalogue row (a dict of its columns) for tests: a small constant-length TensorRT-LLM run on one
    H100, with ``kw`` over it."""
    base = {"id": "r", "source": "test", "model": "llama-3-8b", "hardware": "h100-80gb", "gpus": 1, "tp": 1, "pp": 1,
            "ep": 1, "weights": "bf16", "kv_dtype": "bf16", "engine": "trtllm", "engine_version": "", "policy": "",
            "workload": "const:256/64", "requests": 200, "metric": "output_tok_s", "scope": "system",
            "value": 5000, "note": ""}
    base.update(kw)
    return base


def stdout_on_both_step_paths(code: str, timeout: int = 600) -> tuple[str, str]:
    """What ``python -c code`` prints on the compiled step path and under ``BLENDSIM_PURE_PYTHON`` (each must exit 0)."""
    import os
    import subprocess
    import sys

    from blendsim.sim import _compiled

    outs = []
    for pure in (False, True):
        env = {k: v for k, v in os.environ.items() if k != _compiled.ENV}
        if pure:
            env[_compiled.ENV] = "1"
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
        assert p.returncode == 0, p.stderr[-3000:]
        outs.append(p.stdout)
    return outs[0], outs[1]
