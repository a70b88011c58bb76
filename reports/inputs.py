"""What a report reads: sweep directories, run directories and validation directories.

* a **sweep directory** has ``sweep.json`` (``blendsim sweep``); its rows come from results.parquet,
  or straight from its run directories when the table is missing or older than them;
* a **run directory** has ``summary.json`` and ``steps.parquet`` (``blendsim simulate``, a sweep cell);
* a **validation directory** (``blendsim validate``) has ``summary.json`` (``"kind":
  "blendsim.validation"``) and ``steps.parquet`` with ``step``, ``predicted_s`` and ``measured_s``
  (optionally ``policy``, ``replica``); any run directory with such a step table counts as one too;
* a folder of run directories (e.g. the demo's ``runs/``) stands for each of them.

``load_inputs`` returns one pandas row per run (summary keys plus ``workload``, ``group``, ``label``,
``run_path``, ``origin``) and the validation directories found.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from blendsim.sim.errors import UserError

VALIDATION_COLUMNS = ("predicted_s", "measured_s")


@dataclass
class Inputs:
    runs: pd.DataFrame  # one row per run
    validations: list = field(default_factory=list)  # (directory, per-step Parquet file) pairs
    sources: list = field(default_factory=list)  # (path, kind) of every argument, for the report's header
    notes: list = field(default_factory=list)  # what a reader must know of the inputs (a sweep's missing cells)


def load_inputs(paths: list) -> Inputs:
    """Classify and read every path (UserError naming a path that is none of the kinds)."""
    if not paths:
        raise UserError("give at least one sweep, run or validation directory")
    frames, validations, sources, notes = [], [], [], []
    for p in map(Path, paths):
        kind = classify(p)
        sources.append((str(p), kind))
        if kind == "sweep":
            frames.append(_sweep_rows(p))
            notes += _sweep_gaps(p, frames[-1])
        elif kind == "validation":
            f = validation_file(p)
            if f is None:
                raise UserError(f"{p}: a validation directory without a per-step table (steps.parquet with "
                                f"{', '.join(VALIDATION_COLUMNS)})")
            validations.append((p, f))
        elif kind == "run":
            frames.append(_run_rows([p], origin=p))
        else:  # a folder of runs
            frames.append(_run_rows(run_dirs(p), origin=p))
    runs = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if "run_path" in runs:  # a run given twice (itself and the folder holding it) is one run
        runs = runs[~runs["run_path"].map(lambda s: str(Path(s).resolve())).duplicated()].reset_index(drop=True)
    if "t_opt_practical_s" in runs and "t_reference_s" not in runs:  # summaries written before issue 28
        runs = runs.rename(columns={"t_opt_practical_s": "t_reference_s", "frac_of_practical_opt": "frac_of_reference"})
    for k in [k for k, kind in SUMMARY_FIELDS.items() if kind == "number"] + list(OPTIONAL_NUMBERS):
        if k in runs:  # checked numbers or null (check_summary): a column of nulls alone stays numeric (NaN)
            runs[k] = pd.to_numeric(runs[k]).astype(float)
    if len(runs):
        runs = _label(_tier_columns(runs), notes)
    return Inputs(runs, validations, sources, notes)


def _sweep_gaps(d: Path, df: pd.DataFrame) -> list[str]:
    """A note where a sweep has fewer finished cells than its grid (sweep.json) holds: some failed
    (failures.json) or were never run (an interrupted sweep), so its tables and heatmaps leave those points out."""
    import math

    try:
        marker = json.loads((d / "sweep.json").read_text())
        grid = marker.get("grid", {})
        want = math.prod(len(grid.get(k) or []) for k in ("densities", "sharing", "models", "hardware", "policies"))
        want *= int(marker.get("settings", {}).get("seeds", 1) or 1)
    except (OSError, ValueError, TypeError, AttributeError):
        return []
    have = len(df)
    if not want or have >= want:
        return []
    failed = 0
    with contextlib.suppress(OSError, ValueError, AttributeError):  # none, or not the driver's {"failures": [...]}
        failed = len(json.loads((d / "failures.json").read_text()).get("failures", []))
    parts = [f"{failed} failed (see {d / 'failures.json'})"] if failed else []
    if want - have - failed > 0:
        parts.append(f"{want - have - failed} not run yet (run the same sweep command again to finish them)")
    return [f"{d}: {have} of its {want} cells finished ({'; '.join(parts)}); the tables and heatmaps leave the "
            f"missing grid points out"]


def _tier_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Host/disk KV tier figures (issue 26) as flat columns, left empty for runs without a tier so the
    tables show them only where some run had one: prompt tokens served from host and from disk, GB
    loaded back to the GPU and seconds steps waited on those loads."""
    if "prefix_hit_tokens" not in df:
        return df
    hits = [json.loads(v) if isinstance(v, str) else v for v in df["prefix_hit_tokens"]]
    tier = (df.get("host_kv_gb", 0).fillna(0).astype(float) + df.get("disk_kv_gb", 0).fillna(0).astype(float)) > 0
    df = df.copy()
    for name, key in (("host_hit_tokens", "host"), ("disk_hit_tokens", "disk")):
        df[name] = [float(h.get(key, 0)) if isinstance(h, dict) and t else np.nan for h, t in zip(hits, tier)]
    df["kv_load_gb"] = np.where(tier, df.get("kv_load_bytes", 0) / 1e9, np.nan)
    df["kv_load_stall_s"] = np.where(tier, df.get("kv_load_stall_s", 0), np.nan)
    return df


def run_dirs(p: Path, first: bool = False) -> list:
    """The run directories under the folder ``p`` (a folder of runs, or a sweep's ``runs/`` or any part of it, whose
    cells lie four levels down): folders a run would be classified as (summary.json beside steps.parquet, not a
    validation); another tool's summary.json is not one. Hidden folders -- a sweep's staging leftovers, a virtual
    environment -- are not entered, nor is a run's own folder. ``first``: stop at the first one found."""
    found = []
    for root, dirs, files in os.walk(p):
        here = Path(root)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if here == p or "summary.json" not in files:
            continue
        if "steps.parquet" in files and _kind(here / "summary.json") != "blendsim.validation" \
                and validation_file(here) is None:
            found.append(here)
            dirs[:] = []  # a run's own folder holds no other run
            if first:
                break
    return sorted(found)


def classify(p: Path) -> str:
    """"sweep", "run", "validation" or "runs" (a folder of run directories)."""
    if not p.exists():
        raise UserError(f"{p}: no such directory")
    if not p.is_dir():
        raise UserError(f"{p}: not a directory (give a sweep, run or validation directory)")
    if (p / "sweep.json").exists():
        return "sweep"
    if (p / "summary.json").exists():
        if _kind(p / "summary.json") == "blendsim.validation" or validation_file(p) is not None:
            return "validation"
        if (p / "steps.parquet").exists():
            return "run"
        if _is_run_summary(p / "summary.json"):
            raise UserError(f"{p}: a run directory without steps.parquet (interrupted, or copied in part); "
                            f"run it again or leave it out")
    broken = partial_runs(p)
    if broken:  # a folder of runs with one half written: say so rather than report the others without it
        more = f" and {len(broken) - 3} more" if len(broken) > 3 else ""
        them = "them" if len(broken) > 1 else "it"
        raise UserError(f"{p}: {', '.join(str(b) for b in broken[:3])}{more}: run folder(s) without steps.parquet "
                        f"(interrupted, or copied in part); run {them} again, remove {them}, or give the complete "
                        f"runs by name")
    if run_dirs(p, first=True):
        return "runs"
    raise UserError(f"{p}: not a sweep, run or validation directory (no sweep.json, summary.json or runs in it)")


def _is_run_summary(path: Path) -> bool:
    """Whether ``path`` is the summary.json of a blendsim run (not a validation's, not another tool's)."""
    try:
        s = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(s, dict) and "schema_version" in s and "makespan_s" in s and s.get("kind") is None


def partial_runs(p: Path) -> list:
    """Folders under ``p`` (not ``p`` itself, not hidden) holding a blendsim run's summary.json but no
    steps.parquet."""
    out = []
    for root, dirs, files in os.walk(p):
        here = Path(root)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        if here != p and "summary.json" in files:
            if "steps.parquet" not in files and _is_run_summary(here / "summary.json"):
                out.append(here)
            dirs[:] = []
    return sorted(out)


def _kind(summary: Path):
    try:
        s = json.loads(summary.read_text())
    except (OSError, ValueError):
        return None
    return s.get("kind") if isinstance(s, dict) else None


def validation_file(d: Path) -> Path | None:
    """The per-step Parquet file of a validation directory: steps.parquet, else the first other one
    with predicted_s and measured_s (a per-operator table is not it)."""
    import pyarrow.parquet as pq

    others = sorted(f for f in d.glob("*.parquet") if f.name not in ("steps.parquet", "ops.parquet"))
    for f in [d / "steps.parquet", *others]:
        try:
            names = set(pq.read_schema(f).names)
        except Exception:  # noqa: BLE001 - an unreadable file is simply not the one
            continue
        if set(VALIDATION_COLUMNS) <= names:
            return f
    return None


def _sweep_rows(d: Path) -> pd.DataFrame:
    from blendsim.reports.sweep_results import RESULTS, collect_rows

    table = d / RESULTS
    runs = d / "runs"
    newest = max((f.stat().st_mtime for f in runs.glob("*/*/*/*/summary.json")), default=0.0) if runs.exists() else 0.0
    df = None
    if table.exists() and table.stat().st_mtime >= newest:
        try:
            df = pd.read_parquet(table)
        except Exception as e:  # noqa: BLE001
            raise UserError(f"{table}: unreadable results table ({str(e).splitlines()[0]})") from None
        if "run_dir" in df and not all((d / str(r) / "summary.json").exists() for r in df["run_dir"]):
            df = None  # a cell folder removed since the table was written: the folders say what is there
    if df is None:  # an interrupted sweep, or a stale table: assemble from the finished cells
        df = pd.DataFrame(collect_rows(d))
    if df.empty:
        raise UserError(f"{d}: the sweep has no finished cells yet")
    where = table if table.exists() and "run_dir" in df else d / "runs"
    for i, row in enumerate(df.to_dict("records")):
        check_summary({k: None if _missing(v) else v for k, v in row.items()}, f"{where} (row {i + 1})")
    if "run_dir" not in df:
        raise UserError(f"{where}: field 'run_dir' is missing")
    df["run_path"] = [str(d / r) for r in df["run_dir"]]
    df["origin"] = str(d)
    return df


def _run_rows(dirs: list, origin: Path) -> pd.DataFrame:
    rows = []
    for r in dirs:
        try:
            s = json.loads((r / "summary.json").read_text())
        except (OSError, ValueError) as e:
            raise UserError(f"{r / 'summary.json'}: unreadable run summary ({e})") from None
        if not isinstance(s, dict) or "throughput_tok_s" not in s:
            raise UserError(f"{r / 'summary.json'}: not a blendsim run summary (no throughput_tok_s)")
        check_summary(s, r / "summary.json")
        cell = _cell_label(r)  # a sweep cell given on its own keeps its grid point
        rows.append({**s, **cell, "run_path": str(r), "origin": str(origin)})
    if not rows:
        raise UserError(f"{origin}: no run directories in it")
    return pd.DataFrame(rows)


# what the report reads from a run summary: field -> kind ("text", "count" or "number")
SUMMARY_FIELDS = {
    "policy": "text", "model": "text", "hardware": "text", "mode": "text", "engine": "text", "cost_model": "text",
    "n_requests": "count", "input_tokens": "count", "output_tokens": "count", "recomputed_tokens": "count",
    "preemptions": "count", "makespan_s": "number", "throughput_tok_s": "number", "prefix_sharing_ratio": "number",
    "optimal_sharing_ratio": "number", "sharing_frac_of_opt": "number", "frac_of_opt": "number",
    "frac_of_reference": "number", "t_opt_s": "number", "t_reference_s": "number",
}
# read when present; null (a value JSON cannot hold, e.g. the density of a trace without decode work) is allowed
OPTIONAL_NUMBERS = ("compute_density", "t_critical_s", "latency_mean_s", "latency_p50_s", "latency_p99_s",
                    "ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "tbt_mean_s", "slo_attainment", "goodput_tok_s")


def check_summary(s: dict, where) -> None:
    """Every field the report reads is there with the right type (UserError naming file and field)."""
    for k, kind in SUMMARY_FIELDS.items():
        if k not in s:
            raise UserError(f"{where}: field {k!r} is missing (not a complete blendsim run summary)")
        v = s[k]
        if kind == "text":
            ok = isinstance(v, str)
        elif v is None:  # a bound that JSON could not hold; never the makespan or throughput
            ok = kind == "number" and k not in ("makespan_s", "throughput_tok_s")
        elif kind == "count":
            ok = isinstance(v, (int, np.integer)) and not isinstance(v, bool)
        else:
            ok = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
        if not ok:
            want = {"text": "text", "count": "a whole number", "number": "a number"}[kind]
            raise UserError(f"{where}: field {k!r} is {_describe(v)}, expected {want}")
        if kind != "text" and v is not None:
            _check_range(where, k, v)
    for k in OPTIONAL_NUMBERS:
        v = s.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating))):
            raise UserError(f"{where}: field {k!r} is {_describe(v)}, expected a number or null")
        if v is not None:
            _check_range(where, k, v)


def _check_range(where, k: str, v) -> None:
    """Every count, time, rate and fraction a run summary holds is finite and not negative; the makespan is
    positive (a simulation never gives otherwise: such a file was edited or damaged)."""
    if not np.isfinite(v) or v < 0 or (k == "makespan_s" and v == 0):
        want = "a positive number" if k == "makespan_s" else "a finite number >= 0"
        raise UserError(f"{where}: field {k!r} is {_describe(v)}, expected {want}")


def _describe(v) -> str:
    if v is None:
        return "null"
    text = repr(v)
    return f"{type(v).__name__} {text if len(text) <= 30 else text[:27] + '...'}"


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and np.isnan(v))


def _cell_label(r: Path) -> dict:
    try:
        c = json.loads((r / "cell.json").read_text())
    except (OSError, ValueError):
        return {}
    keys = ("workload", "grid_density", "grid_sharing")
    return {k: c[k] for k in keys if k in c} if isinstance(c, dict) else {}


def _deployment_detail(df: pd.DataFrame) -> pd.Series:
    """TP, PP, EP, replicas, weight and KV precision of each run ("tp2 pp1 ep1 x1 w:fp8 kv:bf16"), so a
    configuration change is a different deployment, never a policy speedup."""
    def col(name, default):
        v = df[name] if name in df else pd.Series(default, index=df.index)
        return v.where(v.notna(), default)

    def ints(name):
        return col(name, 1).map(lambda v: str(int(float(v))) if str(v) not in ("", "None") else "1")

    return ("tp" + ints("tp") + " pp" + ints("pp") + " ep" + ints("ep") + " x" + ints("replicas")
            + " w:" + col("weights", col("dtype", "?")).astype(str) + " kv:" + col("kv_dtype", col("dtype", "?")).astype(str))


# what makes two runs of one policy on one workload and deployment the same run made twice (a re-run): the same
# result under the same settings, engine and seed
RERUN_KEYS = ("throughput_tok_s", "makespan_s", "n_requests", "input_tokens", "output_tokens", "engine", "mode",
              "cost_model", "seed", "policy_options", "token_budget", "max_seqs", "block_size", "round_tokens", "mix",
              "prefix_caching", "prefix_retain", "admission", "reserve_ratio", "kv_full", "gpu_memory_utilization",
              "host_kv_gb", "disk_kv_gb", "kv_load", "host_link_gbps", "disk_read_gbps", "disk_write_gbps",
              "expert_skew", "profile", "engine_sha256")


def _drop_reruns(df: pd.DataFrame, notes: list | None) -> pd.DataFrame:
    """``df`` without the runs that repeat another of its group and label (:data:`RERUN_KEYS` all equal): one run
    given twice in one input (a folder holding a copy or a re-run) would count twice in every mean and split the
    policy into rows of its folders. Runs of two inputs stay (a sweep and its --engine-of twin share the cells of
    the policy whose settings the twin took; each input is paired with its own baseline). A note names each one
    dropped."""
    keys = ["group", "label", *[k for k in ("origin", *RERUN_KEYS) if k in df]]
    same = df[keys].astype(str).duplicated(keep="first")
    if not same.any():
        return df
    first = df[keys].astype(str).drop_duplicates(keep="first")
    kept = {tuple(r[1:]): df.loc[r[0], "run_path"] for r in first.itertuples()}
    for i in df.index[same]:
        twin = kept[tuple(df.loc[[i], keys].astype(str).iloc[0])]
        if notes is not None:
            notes.append(f"{df.loc[i, 'run_path']} repeats {twin} (the same policy, workload, deployment, settings "
                         f"and result): counted once")
    return df[~same].reset_index(drop=True)


def _one_trace_two_names(df: pd.DataFrame, deploy: pd.Series) -> list[str]:
    """A note where one trace on one deployment is two workloads (two sweeps of one grid point: ``d1-s0.15`` and a
    --seeds sweep's ``d1-s0.15-seed0``): its runs count twice in every mean, heatmap and summary row."""
    cols = [c for c in ("n_requests", "input_tokens", "output_tokens", "optimal_sharing_ratio", "compute_density")
            if c in df]
    key = df[cols].astype(str).agg("|".join, axis=1) + " @ " + deploy
    names = df["workload"].astype(str).groupby(key).unique()
    twice = [sorted(v) for v in names if len(v) > 1]
    if not twice:
        return []
    said = "; ".join(" and ".join(v) for v in twice[:3]) + (f"; and {len(twice) - 3} more" if len(twice) > 3 else "")
    return [f"{len(twice)} trace(s) are each two workloads here ({said}: the same requests, tokens and sharing on one "
            f"deployment), so their runs count twice in the means and heatmaps; report those inputs apart"]


def _label(df: pd.DataFrame, notes: list | None = None) -> pd.DataFrame:
    """Add ``workload`` (runs of one trace share it), ``group`` (workload x deployment x mode: the
    runs compared side by side) and ``label`` (the policy, made unique within its group). A run that repeats
    another (:func:`_drop_reruns`) is dropped, with a note in ``notes``."""
    df = df.copy()
    for c in ("grid_density", "grid_sharing"):
        if c not in df:
            df[c] = np.nan
    if "workload" not in df:
        df["workload"] = None
    named = df["workload"].notna()
    if named.any():  # one grid name and deployment, several traces (sweeps of other seeds or sizes): each trace
        # its own workload (a model's own trace in a multi-model sweep is told apart by its deployment already)
        sub = df.loc[named]
        where = sub["workload"].astype(str) + " @ " + sub["model"].astype(str) + "/" + sub["hardware"].astype(str)
        fp = sub[["n_requests", "input_tokens", "output_tokens"]].astype(str).agg("|".join, axis=1)
        first: dict = {}
        for w, key in zip(where, fp, strict=True):
            first.setdefault(w, {}).setdefault(key, len(first.get(w, {})))
        df.loc[named, "workload"] = [name if first[w][key] == 0 else f"{name}#{first[w][key] + 1}"
                                     for name, w, key in zip(sub["workload"], where, fp, strict=True)]
    loose = df["workload"].isna()
    if loose.any():
        fp = df.loc[loose, ["n_requests", "input_tokens", "output_tokens", "optimal_sharing_ratio"]].astype(str).agg("|".join, axis=1)
        names: dict = {}
        for key, (_, r) in zip(fp, df.loc[loose].iterrows(), strict=True):
            if key not in names:
                name = r.get("trace_name")  # a loaded trace's file stem, else its density, sharing and size
                rho = pd.to_numeric(r.get("compute_density"), errors="coerce")
                dens = f"{rho:.2f}" if np.isfinite(rho) else "inf"  # null: no decode work
                base = name if isinstance(name, str) and name else \
                    f"d{dens}-s{r['optimal_sharing_ratio']:.2f}-n{int(r['n_requests'])}"
                taken = sum(1 for v in names.values() if v.split("#")[0] == base)
                names[key] = base if not taken else f"{base}#{taken + 1}"
        df.loc[loose, "workload"] = [names[k] for k in fp]
    deploy = df["model"].astype(str) + "/" + df["hardware"].astype(str) + "/" + df["mode"].astype(str) + " " \
        + _deployment_detail(df)
    if notes is not None:
        notes += _one_trace_two_names(df, deploy)
    many = deploy.nunique() > 1
    df["deployment"] = deploy
    df["group"] = (df["workload"] + " · " + deploy) if many else df["workload"]
    if "policy_options" in df:  # a run given options (--opt) is that policy with them, as sweep and plan name it:
        # dfs[router=contiguous] (blendsim.policy_spec), one label for one policy whichever command ran it
        from blendsim.policies.option import format_policy

        df["policy"] = [p if "[" in str(p) or not _options(o) else format_policy(str(p), _options(o))
                        for p, o in zip(df["policy"], df["policy_options"], strict=True)]
    df["label"] = df["policy"].astype(str)
    dup = df.duplicated(["group", "label"], keep=False)
    if dup.any():  # one run given twice (copied, or in two inputs): once
        df = _drop_reruns(df, notes)
        dup = df.duplicated(["group", "label"], keep=False)
    if dup.any() and "engine" in df:  # runs that differ in their engine (report --mixed): named by it, on every workload
        eng = df.groupby("label")["engine"].transform("nunique") > 1
        df.loc[eng, "label"] = df.loc[eng, "label"] + " [" + df.loc[eng, "engine"].astype(str) + "]"
        dup = df.duplicated(["group", "label"], keep=False)
    if dup.any() and "origin" in df:  # one policy in two inputs (a sweep and its --engine-of twin): named by input,
        # the same name on every workload of that input, so its rows still add up across the grid
        df.loc[dup, "label"] = df.loc[dup, "label"] + " (" + df.loc[dup, "origin"].astype(str) + ")"
        dup = df.duplicated(["group", "label"], keep=False)
    df.loc[dup, "label"] = df.loc[dup, "policy"] + " (" + df.loc[dup, "run_path"].map(lambda s: Path(s).name) + ")"
    dup = df.duplicated(["group", "label"], keep=False)  # runs of one name in different folders (a copied run)
    df.loc[dup, "label"] = df.loc[dup, "policy"] + " (" + df.loc[dup, "run_path"].astype(str) + ")"
    return df


def _options(v) -> dict:
    """A run's ``policy_options`` as a dict (a dict from summary.json, JSON text from a sweep's results; {} when
    none)."""
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return {}
    return v if isinstance(v, dict) else {}


__all__ = ["Inputs", "VALIDATION_COLUMNS", "classify", "load_inputs", "validation_file"]
