"""One command for a GPU day: kernel profile, replay of three traces under two policies, predicted vs measured.

    python benchmarks/gpu_validation.py                       # on a lent GPU: llama-3-8b, bf16, cuda
    python benchmarks/gpu_validation.py --device cpu --small  # the CPU path CI runs (tiny model, small sizes)

Steps, each an ordinary ``blendsim`` command (printed before it runs, so any step can be re-run by hand):

1. ``blendsim calibrate`` -- profile the model's operators on the device (``--quick`` with ``--small``);
2. three traces made by seeded recipes: ``batchllm`` (groups sharing a long prefix), ``blendserve`` (a
   compute/memory mix at a target density and sharing; ``preble --kind embodied`` with ``--small``, whose
   tiny model's 4,096-token context the blendserve recipe's long outputs exceed) and ``preble --kind
   toolbench`` (tool prompts; all requests at t=0);
3. ``blendsim validate`` of each trace under two policies (``--policies fcfs,blendserve``) with that profile:
   per-step predicted vs measured time, per-operator-class error, throughput error, speedup error;
4. ``SUMMARY.md`` and ``summary.json`` in the output folder: one predicted-vs-measured table over the three
   replays, and the commands that produced them.

Everything is written under ``--out`` (default ``docs/gpu-days/<date>-<gpu>-<model>``, beside earlier days' results
and outside the ``reports`` package's source folder), which must not exist
yet: this script never replaces an earlier day's results. Measured on one H200 (26 Nov 2026, pure-Python
step path): the full calibration took about 160 s and the three validations at ``--max-steps 64`` 115-140 s,
so a day fits 15 minutes of device time with ``--max-steps 64``; the default 400 steps take about 6x longer.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

POLICIES = "fcfs,blendserve"


def traces(small: bool, model: str, hardware: str) -> dict[str, list[str]]:
    """The three recipe commands (trace name -> ``blendsim workloads synth ...`` arguments)."""
    if small:
        return {
            "batchllm": ["batchllm", "--prefix-len", "64", "--distinct-len", "32", "--share-degree", "4",
                         "--requests", "16", "--output-len", "8"],
            # the blendserve recipe's video outputs (up to 16K tokens) do not fit the tiny model's context
            "embodied": ["preble", "--kind", "embodied", "--requests", "4", "--rate", "0"],
            "toolbench": ["preble", "--kind", "toolbench", "--requests", "4", "--rate", "0"],
        }
    return {
        "batchllm": ["batchllm", "--prefix-len", "1024", "--distinct-len", "256", "--share-degree", "16",
                     "--requests", "512", "--output-len", "128"],
        "blendserve": ["blendserve", "--requests", "600", "--model", model, "--hardware", hardware],
        "toolbench": ["preble", "--kind", "toolbench", "--requests", "600", "--rate", "0"],
    }


def default_out(device: str, model: str) -> Path:
    """``docs/gpu-days/<today>-<hardware preset of the GPU, else the device>-<model>``."""
    import contextlib
    import datetime

    name = device.replace(":", "")
    # no torch or no GPU here: the device's name stands in, and validate reports the problem in one line
    with contextlib.suppress(Exception):
        if device.startswith("cuda"):
            import torch

            from blendsim.sim.hardware import preset_for_device

            idx = torch.device(device).index or 0
            name = preset_for_device(torch.cuda.get_device_name(idx),
                                     torch.cuda.get_device_properties(idx).total_memory) or name
    return Path("docs/gpu-days") / f"{datetime.date.today().isoformat()}-{name}-{model}"


def run(cmd: list[str], log) -> float:
    """Run one command, echoing it to the log; stop the day on failure (its own one-line error is shown)."""
    line = " ".join(shlex.quote(c) for c in cmd)
    print(f"$ {line}", flush=True)
    log.write(f"$ {line}\n")
    log.flush()
    t = time.perf_counter()
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log.write(res.stdout)
    log.flush()
    if res.returncode:
        sys.stdout.write(res.stdout[-2000:])
        raise SystemExit(f"gpu_validation: step failed (exit {res.returncode}): {line}")
    return time.perf_counter() - t


def device_missing(device: str) -> str | None:
    """Why ``device`` (cuda or cuda:N) cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "no torch installed (pip install torch): the GPU day needs it"
    if not torch.cuda.is_available():
        return f"no GPU available for --device {device} (torch {torch.__version__}); --device cpu runs the CPU path"
    idx = int(device.partition(":")[2] or 0)
    if idx >= torch.cuda.device_count():
        return f"--device {device}: this machine has {torch.cuda.device_count()} GPU(s)"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (cuda:N) or cpu")
    ap.add_argument("--model", default=None, help="model preset (default: llama-3-8b on cuda, tiny on cpu)")
    ap.add_argument("--hardware", default=None, help="hardware preset for the simulation (default: guessed "
                                                     "from the GPU's name by validate; cpu on cpu)")
    ap.add_argument("--dtype", default=None, help="bf16, fp16 or fp32 (default: the model's)")
    ap.add_argument("--small", action="store_true", help="tiny sizes: the CI path")
    ap.add_argument("--max-steps", type=int, default=None, help="steps replayed per replica (default 400; "
                                                                "12 with --small)")
    ap.add_argument("--out", type=Path, default=None, help="output folder (must not exist)")
    ap.add_argument("--profile", type=Path, default=None, help="use this calibration profile instead of "
                                                               "profiling (step 1 skipped)")
    ap.add_argument("--blendsim", default=None, help="the blendsim executable (default: next to python)")
    a = ap.parse_args(argv)
    cpu = a.device == "cpu"
    model = a.model or ("tiny" if cpu else "llama-3-8b")
    out = a.out or default_out(a.device, model)
    if a.max_steps is not None and a.max_steps < 1:
        return _bad(f"--max-steps must be >= 1, got {a.max_steps}")
    if a.profile and not a.profile.exists():
        return _bad(f"--profile {a.profile} does not exist")
    if (out / INCOMPLETE).exists() and not (out / "SUMMARY.md").exists():
        import shutil

        shutil.rmtree(out)  # an interrupted or failed day of this script's own: started over
    if out.exists():
        return _bad(f"{out} exists; choose another --out (earlier results are kept)")
    if not cpu:  # before any folder is made: a machine without the device stops here, with one line
        why = device_missing(a.device)
        if why:
            print(f"gpu_validation: {why}", file=sys.stderr)
            return 2
    exe = a.blendsim or str(Path(sys.executable).with_name("blendsim"))
    if not Path(exe).exists():
        exe = "blendsim"
    if a.profile:  # before any folder is made: a corrupt or foreign profile stops here, with blendsim's one line
        chk = subprocess.run([exe, "calibrate", "show", str(a.profile)], capture_output=True, text=True)
        if chk.returncode:
            return _bad((chk.stderr.strip().splitlines() or [f"--profile {a.profile}: unreadable"])[-1]
                        .removeprefix("blendsim: error: "))
    out.mkdir(parents=True)
    (out / INCOMPLETE).write_text("a gpu_validation day under way, or stopped before its SUMMARY.md; rerunning the "
                                  "same command starts it over\n")
    steps = a.max_steps or (12 if a.small else 400)
    sim_hw = a.hardware or ("cpu" if cpu else "h100-80gb")
    timings, commands = {}, []
    with (out / "commands.log").open("w") as log:
        profile = a.profile or out / "profile.json"
        if not a.profile:
            cal = [exe, "calibrate", "--device", a.device, "--model", model, "-o", str(profile)]
            cal += ["--quick", "--holdout", "0"] if a.small else []
            cal += ["--dtype", a.dtype] if a.dtype else []
            commands.append(cal)
            timings["calibrate"] = run(cal, log)
        replays = {}
        for name, args in traces(a.small, model, sim_hw).items():
            trace = out / f"{name}.parquet"
            cmd = [exe, "workloads", "synth", *args, "-o", str(trace)]
            commands.append(cmd)
            timings[f"synth {name}"] = run(cmd, log)
            val = out / name
            cmd = [exe, "validate", str(trace), "--policies", POLICIES, "--model", model, "--device", a.device,
                   "--profile", str(profile), "--max-steps", str(steps), "-o", str(val), "--json"]
            cmd += ["--hardware", a.hardware] if a.hardware else []
            cmd += ["--dtype", a.dtype] if a.dtype else []
            commands.append(cmd)
            timings[f"validate {name}"] = run(cmd, log)
            replays[name] = json.loads((val / "summary.json").read_text())
    summary = {"device": a.device, "model": model, "policies": POLICIES.split(","), "max_steps": steps,
               "small": a.small, "timings_s": {k: round(v, 1) for k, v in timings.items()},
               "commands": [" ".join(shlex.quote(c) for c in cmd) for cmd in commands],
               "replays": {n: table_row(s) for n, s in replays.items()}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    (out / "SUMMARY.md").write_text(markdown(summary))
    (out / INCOMPLETE).unlink()
    print(f"wrote {out / 'SUMMARY.md'}")
    return 0


INCOMPLETE = "INCOMPLETE"  # in a day's folder until its SUMMARY.md is written (a rerun may then replace the folder)


def _bad(msg: str) -> int:
    print(f"gpu_validation: {msg}", file=sys.stderr)
    return 2


def _get(d: dict, *path):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def table_row(s: dict) -> dict:
    """The figures of one validation summary (``blendsim validate``'s summary.json) the day's table shows."""
    rows = {}
    base = s.get("speedup_base")  # the policy the speedups are over first, the rest in their order
    for name, pol in sorted((s.get("policies") or {}).items(), key=lambda kv: kv[0] != base):
        e2e, step = pol.get("end_to_end") or {}, pol.get("step_error") or {}
        rows[name] = {"steps": step.get("steps"), "median_abs_step_error": step.get("median_abs_err"),
                      "p90_abs_step_error": step.get("p90_abs_err"), "throughput_error": e2e.get("throughput_err"),
                      "predicted_tok_s": e2e.get("throughput_pred_tok_s"),
                      "measured_tok_s": e2e.get("throughput_meas_tok_s"), "complete": pol.get("complete"),
                      "speedup_error": _get(s, "speedup", name, "speedup_err"),
                      "host_bound_fraction": pol.get("host_bound_fraction"),
                      # per operator class, the median over operator-timed steps of |predicted / measured - 1|
                      "op_class_error": {c: v.get("median_abs_err") for c, v in (pol.get("op_class_error") or {}).items()}}
    return {"status": s.get("status"), "per_policy": rows, "speedup_base": s.get("speedup_base"),
            "sdpa_kernel_by_call": s.get("sdpa_kernel_by_call")}


def _pct(x, sign: bool = True) -> str:
    if not isinstance(x, (int, float)):
        return "-"
    return f"{100 * x:+.1f}%" if sign else f"{100 * x:.1f}%"


def _num(x) -> str:
    return "-" if not isinstance(x, (int, float)) else f"{x:,.0f}"


def markdown(summary: dict) -> str:
    lines = [f"# Validation on {summary['device']} ({summary['model']})", "",
             "Produced by `python benchmarks/gpu_validation.py` "
             f"({'--small, ' if summary['small'] else ''}{summary['max_steps']} steps per replay at most). "
             "Predicted = the simulator with this day's kernel profile; measured = the replay of the same schedule "
             "on the device. GEMM / attention / other: median |error| per operator-timed step of each operator "
             "class (the kernels); host-bound steps: share of steps whose host issue time was at least 90% of "
             "their device time (the replay's Python set their pace, not the kernels).", "",
             "| trace | policy | steps | median step error (p90) | predicted tok/s | measured tok/s | "
             "throughput error | speedup error vs first policy | GEMM / attention / other error | host-bound steps |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in summary["replays"].items():
        for pol, x in r["per_policy"].items():
            oc = x.get("op_class_error") or {}
            lines.append(f"| {name} | {pol} | {x.get('steps') or '-'} | {_pct(x.get('median_abs_step_error'), False)} "
                         f"({_pct(x.get('p90_abs_step_error'), False)}) | {_num(x.get('predicted_tok_s'))} | "
                         f"{_num(x.get('measured_tok_s'))} | {_pct(x.get('throughput_error'))} | "
                         f"{_pct(x.get('speedup_error'))} | "
                         f"{' / '.join(_pct(oc.get(c), False) for c in ('gemm', 'attention', 'other'))} | "
                         f"{_pct(x.get('host_bound_fraction'), False)} |")
    kernels = {n: r["sdpa_kernel_by_call"] for n, r in summary["replays"].items() if r.get("sdpa_kernel_by_call")}
    if kernels:  # torch_sdpa on CUDA: a 'math' kernel means that attention ran unfused (slow, not an engine's)
        lines += ["", "SDPA kernel per attention call: " + "; ".join(
            f"{n}: " + ", ".join(f"{c} {k}" for c, k in v.items()) for n, v in kernels.items())]
    lines += ["", "Seconds per command: " + ", ".join(f"{k} {v}" for k, v in summary["timings_s"].items()), "",
              "Commands:", "", "```", *summary["commands"], "```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:  # a Ctrl-C (or the lease ending): one line, the folder left for a rerun to replace
        print("gpu_validation: interrupted; run the same command again to start the day over", file=sys.stderr)
        raise SystemExit(130) from None
