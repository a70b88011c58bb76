"""How wall time and peak memory grow with the number of requests (issue 29): 100K, 1M, 10M requests.

    python benchmarks/bench_scale.py [--sizes 100000] [--workloads azure,blendserve] [--policies dfs,sarathi]
                                     [--data DIR] [--repeat 1] [--base PATH/TO/OTHER/blendsim] [--keep DIR]

Three workloads, all on llama-3-8b / a100-80gb (the first two with every request at t=0):

* ``azure``: the prompt and output lengths of ../shared/data/azure_llm_inference_2023_conv.csv (``--data``)
  repeated to the size, each request with a prompt of its own (no sharing: the issue's 1M measurement);
* ``blendserve``: the BlendServe recipe at density 1.4 and sharing 0.35 (shared prefixes), seed 0;
* ``accelgen``: the AccelGen recipe (Alpaca + ShareGPT + BookCorpus prompts with TTFT/TBT/JCT SLOs, arrivals at its
  default rate), seed 0, for the SLO-aware policies' own speed: ``--workloads accelgen --policies accelgen,fcfs
  --sizes 2000,20000`` (accelgen's urgent scan popped every waiting long prompt each step, quadratic in them: 11 s
  for 2,000 requests where fcfs takes 0.7 s).

Each trace is written to a Parquet file first (synthesis is not timed), then every (workload, size, policy) runs
as a whole ``blendsim simulate`` process: start-up, reading the trace, simulating and writing the run directory.
Wall is the process's wall time (median of ``--repeat``), peak is its maximum resident set (``ru_maxrss`` of the
child, as ``/usr/bin/time`` reports it), cpu its user + system CPU seconds: on a machine shared with other jobs
wall time swings several-fold with their load, CPU time far less, so compare versions on cpu there.
``x10`` is the growth from the previous size, scaled to a factor of 10.
Sizes default to 100,000 so a plain run is short; the issue's targets are 1M within 20 s and 10M (blendserve,
dfs) within 5 minutes and 8 GB.

Paired comparison against another version: ``--base EXE`` runs the same traces with another installation's
``blendsim`` executable, alternating the two runs job by job (so load from other jobs on the machine hits both
alike), and prints the ratio. To get such an executable for a commit::

    git worktree add /tmp/blendsim-base <commit>
    python -m venv --without-pip /tmp/blendsim-base/.venv
    echo DEPS > /tmp/blendsim-base/.venv/lib/python3.11/site-packages/deps.pth
    /tmp/blendsim-base/.venv/bin/python -m pip install --no-deps --no-build-isolation -e /tmp/blendsim-base
    python benchmarks/bench_scale.py --sizes 1000000 --base /tmp/blendsim-base/.venv/bin/blendsim

where DEPS is a site-packages folder that holds blendsim's dependencies (and setuptools, wheel) — on the team
machine /work/main/.venv/lib/python3.11/site-packages — so nothing is downloaded; or drop ``--without-pip`` and
the ``deps.pth`` line and install normally. Remove it afterwards with ``git worktree remove /tmp/blendsim-base``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from _proc import timed  # noqa: E402 (benchmarks/_proc.py, beside this script)

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
AZURE_FILE = "azure_llm_inference_2023_conv.csv"
WORKLOADS = ("azure", "blendserve", "accelgen")


def parse_sizes(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        p = part.strip().lower().replace("_", "")
        mult = 1
        if p.endswith("k"):
            p, mult = p[:-1], 1000
        elif p.endswith("m"):
            p, mult = p[:-1], 1_000_000
        try:
            n = int(float(p) * mult)
        except ValueError:
            sys.exit(f"--sizes: {part!r} is not a number of requests (e.g. 100000, 1m, 10m)")
        if n < 10:
            sys.exit(f"--sizes: {part!r} is fewer than 10 requests")
        out.append(n)
    return sorted(set(out))


def make_trace(kind: str, n: int, data: Path, out: Path) -> Path:
    """Write the ``kind`` trace of ``n`` requests to ``out`` (not timed)."""
    import numpy as np

    from blendsim.workloads.trace import unique_prompts, write_trace

    if kind == "azure":
        from blendsim.workloads.loaders import load

        src = load(data / AZURE_FILE, "azure")
        trace = unique_prompts(np.resize(src.input_len, n), np.resize(src.output_len, n),
                               arrival_s=np.zeros(n), meta={"name": f"azure-conv-x{n}"})
    elif kind == "blendserve":
        from blendsim.workloads.recipes import synthesize

        trace = synthesize("blendserve", density=1.4, sharing=0.35, requests=n).offline()
    elif kind == "accelgen":
        from blendsim.workloads.recipes import synthesize

        trace = synthesize("accelgen", requests=n, seed=0)
    else:
        sys.exit(f"--workloads: unknown workload {kind!r} ({', '.join(WORKLOADS)})")
    write_trace(trace, out)
    return out


def make_trace_apart(kind: str, n: int, data: Path, out: Path) -> None:
    """:func:`make_trace` in a child process, so the memory synthesis takes (~8 GB for 10M requests) is given back
    before the timed runs instead of staying with this process while they run."""
    import subprocess

    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); from pathlib import Path; "
            f"import bench_scale; bench_scale.make_trace({kind!r}, {n}, Path({str(data)!r}), Path({str(out)!r}))")
    rc = subprocess.run([sys.executable, "-c", code]).returncode
    if rc:
        sys.exit(f"making the {kind} trace of {n:,} requests failed (exit {rc})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100000", help="comma-separated request counts (100000, 1m, 10m)")
    ap.add_argument("--workloads", default="azure,blendserve")
    ap.add_argument("--policies", default="dfs,sarathi")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding the shared data files")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--exe", default=None, help="the blendsim executable to time (default: the one on PATH)")
    ap.add_argument("--base", default=None, help="another version's blendsim executable, for a paired comparison")
    ap.add_argument("--keep", type=Path, default=None, help="keep the traces in this folder (reused if present)")
    a = ap.parse_args(argv)
    sizes = parse_sizes(a.sizes)
    kinds = [k.strip() for k in a.workloads.split(",") if k.strip()]
    policies = [p.strip() for p in a.policies.split(",") if p.strip()]
    bad = [k for k in kinds if k not in WORKLOADS]
    if bad:
        sys.exit(f"--workloads: unknown workload {bad[0]!r} ({', '.join(WORKLOADS)})")
    if "azure" in kinds and not (a.data / AZURE_FILE).is_file():
        sys.exit(f"{a.data / AZURE_FILE}: not found (pass --data DIR, the folder holding {AZURE_FILE})")
    exe = a.exe or shutil.which("blendsim") or sys.exit("blendsim is not installed (pip install -e .)")
    if a.base and not os.access(a.base, os.X_OK):
        sys.exit(f"--base {a.base}: not an executable")
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    store = a.keep or tmp
    store.mkdir(parents=True, exist_ok=True)
    versions = [("new", exe)] + ([("base", a.base)] if a.base else [])
    print(f"{'workload':10s} {'requests':>10s} {'policy':8s} {'version':7s} {'wall s':>8s} {'x10':>6s} "
          f"{'cpu s':>8s} {'peak MB':>8s} {'x10':>6s}", flush=True)
    try:
        for kind in kinds:
            prev: dict = {}
            for n in sizes:
                path = store / f"{kind}-{n}.parquet"
                if not path.exists():
                    make_trace_apart(kind, n, a.data, path)
                for pol in policies:
                    runs: dict = {v: [] for v, _ in versions}
                    for _ in range(a.repeat):
                        for v, x in versions:  # alternate new and base, job by job
                            runs[v].append(timed([x, "simulate", str(path), "--policy", pol, "--model", "llama-3-8b",
                                                  "--hardware", "a100-80gb", "-o", str(tmp / f"run-{v}")]))
                            shutil.rmtree(tmp / f"run-{v}", ignore_errors=True)
                    walls, cpus = {}, {}
                    for v, _ in versions:
                        wall = statistics.median(w for w, _, _ in runs[v])
                        cpu = statistics.median(c for _, _, c in runs[v])
                        peak = max(m for _, m, _ in runs[v])
                        walls[v], cpus[v] = wall, cpu
                        gw = gm = ""
                        if (pol, v) in prev:  # growth per 10x: (ratio) ** (1 / log10(size ratio))
                            n0, w0, m0 = prev[(pol, v)]
                            e = 1 / math.log10(n / n0)
                            gw, gm = f"{(wall / w0) ** e:.2f}", f"{(peak / m0) ** e:.2f}"
                        prev[(pol, v)] = (n, wall, peak)
                        print(f"{kind:10s} {n:10,d} {pol:8s} {v:7s} {wall:8.2f} {gw:>6s} {cpu:8.2f} {peak:8.0f} "
                              f"{gm:>6s}", flush=True)
                    if a.base:
                        print(f"{'':10s} {'':10s} {pol:8s} base/new: wall {walls['base'] / walls['new']:.2f}x, "
                              f"cpu {cpus['base'] / cpus['new']:.2f}x", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
