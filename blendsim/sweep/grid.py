"""The sweep's grid: value lists from the command line, the spec, and its cells.

A *workload* is one trace: a (density, sharing) grid point synthesised for one model and hardware.
A *cell* is one simulation: a workload under one policy. Every workload and cell has a stable name
that is also its place in the sweep directory::

    SWEEP_DIR/traces/<model>/<hardware>/<workload>.parquet
    SWEEP_DIR/runs/<model>/<hardware>/<workload>/<policy>/      (a run directory + cell.json)

Names come from the numbers (``d0.85-s0.05``), never from how they were typed, so ``0.8`` and
``0.80`` name the same workload.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path

from blendsim.sim.errors import UserError
from blendsim.sim.rundir import run_dir_name

MAX_VALUES = 10_000  # more grid values than this is a typo, not a sweep
DEFAULT_POLICIES = ("dfs", "random", "blendserve")  # a sweep's policies when none are named


def default_policies() -> tuple[str, ...]:
    """Those of :data:`DEFAULT_POLICIES` that are registered (the command's and the API's default)."""
    from blendsim.policies.registry import policy_names

    known = set(policy_names())
    return tuple(p for p in DEFAULT_POLICIES if p in known)


def parse_values(text: str, flag: str) -> tuple[float, ...]:
    """``start:stop:step`` (inclusive, decimal steps are exact) or a comma list, as sorted floats.

    >>> parse_values("0.80:1.40:0.05", "--densities")[-1], len(parse_values("0.05:0.45:0.10", "-s"))
    (1.4, 5)
    """
    s = str(text).strip()
    bad = f"{flag} {text!r}: expected start:stop:step (e.g. 0.80:1.40:0.05) or a comma list (e.g. 0.8,1.1)"
    try:
        if ":" in s:
            parts = [Decimal(p.strip()) for p in s.split(":")]
            if len(parts) != 3 or not all(p.is_finite() for p in parts):
                raise UserError(bad)
            start, stop, step = parts
            if step <= 0 or stop < start:
                raise UserError(f"{flag} {text!r}: need step > 0 and stop >= start")
            count = int((stop - start) / step) + 1  # Decimal arithmetic: 0.05 steps land exactly on stop
            if count > MAX_VALUES:
                raise UserError(f"{flag} {text!r}: {count} values is more than {MAX_VALUES}")
            values = [start + k * step for k in range(count)]
        else:
            values = [Decimal(p.strip()) for p in s.split(",") if p.strip()]
            if not values or not all(v.is_finite() for v in values):
                raise UserError(bad)
    except InvalidOperation:
        raise UserError(bad) from None
    out = sorted({float(v) for v in values})
    if len(out) > MAX_VALUES:
        raise UserError(f"{flag} {text!r}: more than {MAX_VALUES} values")
    return tuple(out)


# a file-name-safe form of a model/hardware/policy name: a run folder's (one rule for runs and sweep cells)
slug = run_dir_name


def workload_name(density: float, sharing: float) -> str:
    return f"d{density:g}-s{sharing:g}"


@dataclass(frozen=True, slots=True)
class Workload:
    """One trace of the sweep."""

    density: float  # target compute density rho of the grid point
    sharing: float  # target optimal prefix sharing ratio s of the grid point
    model: str  # model argument as given (preset name or config.json path)
    model_name: str  # resolved model name (the ModelSpec's)
    hardware: str  # hardware preset
    # --fixed-trace: the model and hardware the trace is synthesised for (every model runs that one trace);
    # empty: this workload's own
    trace_model: str = ""
    trace_model_name: str = ""
    trace_hardware: str = ""
    seed: int = -1  # --seeds: this replicate's seed (trace and policies); -1: the sweep's --seed

    @property
    def synth_model(self) -> str:
        return self.trace_model or self.model

    @property
    def synth_hardware(self) -> str:
        return self.trace_hardware or self.hardware

    @property
    def name(self) -> str:
        return workload_name(self.density, self.sharing) + (f"-seed{self.seed}" if self.seed >= 0 else "")

    @property
    def key(self) -> tuple:
        return (self.model_name, self.hardware, self.density, self.sharing, self.seed)

    def trace_relpath(self) -> str:
        return f"traces/{slug(self.trace_model_name or self.model_name)}/{slug(self.synth_hardware)}/{self.name}.parquet"


@dataclass(frozen=True, slots=True)
class Cell:
    """One simulation of the sweep: a workload under a policy."""

    workload: Workload
    policy: str

    @property
    def key(self) -> tuple:
        return (*self.workload.key, self.policy)

    def run_relpath(self) -> str:
        w = self.workload
        return f"runs/{slug(w.model_name)}/{slug(w.hardware)}/{w.name}/{slug(self.policy)}"

    def label(self) -> dict:
        """The cell's identity columns in results.parquet (also its cell.json)."""
        w = self.workload
        return {"workload": w.name, "model": w.model_name, "hardware": w.hardware, "grid_density": w.density,
                "grid_sharing": w.sharing, "policy": self.policy, "run_dir": self.run_relpath(),
                "trace_for": f"{w.trace_model_name or w.model_name}/{w.synth_hardware}",
                **({"grid_point": workload_name(w.density, w.sharing), "grid_seed": w.seed} if w.seed >= 0 else {})}


def _profile_digest(engine: str | None) -> str | None:
    """The SHA-256 of the calibrated profile file ``engine`` names (None for a named engine or a missing file,
    which the engine check reports)."""
    from blendsim.sim.engines import is_profile_file, profile_file_digest

    if not engine or not is_profile_file(engine) or not Path(engine).is_file():
        return None
    return profile_file_digest(engine)


@dataclass(frozen=True)
class SweepSpec:
    """What a sweep runs. ``settings()`` are the parts every cell of one SWEEP_DIR must share."""

    recipe: str
    densities: tuple[float, ...]
    sharing: tuple[float, ...]
    policies: tuple[str, ...]
    models: tuple[str, ...]
    hardware: tuple[str, ...]
    requests: int
    mode: str | None = None  # None: the engine's
    engine: str | None = None  # the one engine every cell is priced on (None: sim.engines.DEFAULT_ENGINE)
    engine_of: str | None = None  # run every cell on this policy's engine settings (None: each its own)
    seed: int = 0
    recipe_options: dict = field(default_factory=dict)  # further recipe options (e.g. source)
    # weights / kv_dtype / tp / ep / pp / replicas given on the command line (the deployment of every cell)
    precision: dict = field(default_factory=dict)
    model_names: dict = field(default_factory=dict)  # model argument -> resolved name (filled by validate)
    # KV tiers given on the command line: host_kv_gb / disk_kv_gb, and kv_load / host_link_gbps / disk_read_gbps /
    # disk_write_gbps (how loads meet the step, the link's and drive's speeds)
    tiers: dict = field(default_factory=dict)
    # one trace for every model and hardware, synthesised for the first of each (None: so when there are
    # several models or hardware, else each workload its own)
    fixed_trace: bool | None = None
    seeds: int = 1  # replicates per grid point, seeds seed, seed + 1, ... (trace and policies)

    @property
    def fixed(self) -> bool:
        return bool(self.fixed_trace) if self.fixed_trace is not None else (
            len(self.models) > 1 or len(self.hardware) > 1)

    def settings(self) -> dict:
        """The settings that define every cell besides its grid point, policy, model and hardware."""
        out = {"recipe": self.recipe, "requests": self.requests, "mode": self.mode, "engine": self.engine,
               "engine_of": self.engine_of, "seed": self.seed, "recipe_options": dict(sorted(self.recipe_options.items()))}
        if self.precision:  # only when given, so sweeps made before these options still resume
            out["precision"] = dict(sorted(self.precision.items()))
        if self.tiers:  # likewise
            out["tiers"] = dict(sorted(self.tiers.items()))
        if self.seeds > 1:  # likewise
            out["seeds"] = self.seeds
        if self.fixed:  # likewise: only when on
            out["fixed_trace"] = f"{self.model_names.get(self.models[0], self.models[0])}/{self.hardware[0]}"
        digest = _profile_digest(self.engine)
        if digest:  # a calibrated profile file: its content, so an edited file is not mixed with the old one
            out["engine_sha256"] = digest
        from blendsim.runner import simulator_digest

        # the simulator, policies and trace code the cells ran: cells of two versions are never one table
        out["simulator"] = simulator_digest(("sweep/tasks.py", "sweep/grid.py", "policy_spec.py"))
        return out

    def run_settings(self) -> dict:
        """RunConfig fields every cell shares: mode, engine and, with ``engine_of``, that policy's
        declared scheduler settings (token budget, block size, ...)."""
        out = {"mode": self.mode, "engine": self.engine, "seed": self.seed, **self.precision,  # cells: their own seed
               **self.tiers}
        if self.engine_of:
            from blendsim.policies.registry import get_policy
            from blendsim.runner import ENGINE_FIELDS

            pol = get_policy(self.engine_of)
            out.update({k: v for k, v in pol.engine_defaults.items() if k in ENGINE_FIELDS})
        return out

    def run_config(self, policy: str, model: str, hardware: str, seed: int | None = None):
        """The RunConfig of ``policy`` (a spec, ``NAME[key=value,...]``: its options are the run's --opt) on
        ``model`` and ``hardware`` with the settings every cell shares; ``seed``: a replicate's own."""
        from blendsim.policy_spec import split_policy
        from blendsim.runner import RunConfig

        name, opts = split_policy(policy)
        return RunConfig(policy=name, model=model, hardware=hardware, options=opts,
                         **{**self.run_settings(), **({"seed": seed} if seed is not None else {})})

    def workloads(self) -> list[Workload]:
        """Every workload, in a fixed order (model, hardware, density, sharing)."""
        ref = (self.models[0], self.model_names.get(self.models[0], self.models[0]), self.hardware[0]) if self.fixed \
            else ("", "", "")
        seeds = [self.seed + i for i in range(self.seeds)] if self.seeds > 1 else [-1]
        return [Workload(d, s, m, self.model_names.get(m, m), h, *ref, seed=k)
                for m in self.models for h in self.hardware for d in self.densities for s in self.sharing
                for k in seeds]

    def cells(self) -> list[Cell]:
        """Every cell, grouped by workload; policies in the order given."""
        return [Cell(w, p) for w in self.workloads() for p in self.policies]

    def _density_tp(self, w: Workload) -> int:
        """The TP degree of the replica a recipe measures density on: the cells' --tp, or --tp x --pp where the
        model splits that many ways, so that a model too big for --tp GPUs fits the pipeline's GPUs (a recipe's
        replica has no stages). A recipe's compute/memory ratio is of the deployment it is run on."""
        tp, pp = self.precision.get("tp", 1), self.precision.get("pp", 1)
        return tp * pp if pp > 1 and _fits_tp(w.synth_model, w.synth_hardware, tp * pp) else tp

    def recipe_kwargs(self, w: Workload) -> dict:
        """Options for ``get_recipe(recipe).make(**...)`` for workload ``w``."""
        from blendsim.workloads.recipes import get_recipe

        names = {f.name for f in dataclasses.fields(get_recipe(self.recipe).options)}
        kw = {"density": w.density, "sharing": w.sharing}
        gpus = self._density_tp(w) if "tp" in names else 1
        for k, v in (("requests", self.requests), ("model", w.synth_model), ("hardware", w.synth_hardware),
                     ("seed", w.seed if w.seed >= 0 else self.seed), ("tp", gpus if gpus > 1 else None)):
            if k in names and v is not None:
                kw[k] = v
        kw.update(self.recipe_options)
        return kw


def _fits_tp(model: str, hardware: str, tp: int) -> bool:
    """Whether ``model`` splits ``tp`` ways on ``hardware`` (heads and widths divide, weights fit)."""
    from blendsim.sim.deployment import make_deployment
    from blendsim.sim.errors import UserError

    try:
        make_deployment(model, hardware, tp)
    except UserError:
        return False
    return True


def precision_settings(weights=None, kv_dtype=None, tp: int = 1, ep: int = 1, pp: int = 1, replicas: int = 1) -> dict:
    """SweepSpec.precision from the options: only those given (degrees and replica counts other than 1), so a sweep
    made before an option existed still resumes."""
    return {k: v for k, v in (("weights", weights), ("kv_dtype", kv_dtype), ("tp", tp), ("ep", ep), ("pp", pp),
                              ("replicas", replicas))
            if v is not None and not (k in ("tp", "ep", "pp", "replicas") and v == 1)}


TIER_SETTINGS = ("host_kv_gb", "disk_kv_gb", "kv_load", "host_link_gbps", "disk_read_gbps", "disk_write_gbps")


def tier_settings(**given) -> dict:
    """SweepSpec.tiers from the options (:data:`TIER_SETTINGS`): only those given (sizes other than 0), so a sweep
    made before an option existed still resumes."""
    unknown = set(given) - set(TIER_SETTINGS)
    if unknown:
        raise TypeError(f"tier_settings: no setting(s) {', '.join(sorted(unknown))}")
    return {k: v for k, v in given.items() if v is not None and not (k in ("host_kv_gb", "disk_kv_gb") and v == 0)}


__all__ = ["TIER_SETTINGS", "Cell", "SweepSpec", "Workload", "parse_values", "precision_settings", "slug", "tier_settings",
           "workload_name"]
