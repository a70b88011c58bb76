"""Check a sweep's spec before any work starts: every name known, every grid point valid.

A typo in the fifth policy or a sharing value of 1.2 should stop the command at once with one line,
not after an hour of cells.
"""

from __future__ import annotations

import dataclasses
import math

from blendsim.sim.errors import UserError
from blendsim.sweep.grid import SweepSpec

# Recipe options the sweep sets itself (from its own flags), so --recipe-opt may not. tp: the recipe measures
# density on the cells' replica (SweepSpec._density_tp), --tp or --tp x --pp GPUs.
SWEEP_SET = {"density": "--densities", "sharing": "--sharing", "requests": "--requests", "model": "--models",
             "hardware": "--hardware", "seed": "--seed", "tp": "--tp (and --pp)"}


def check_spec(spec: SweepSpec) -> SweepSpec:
    """``spec`` validated, with recipe options coerced to their types and model names resolved."""
    from blendsim.policies.registry import get_policy
    from blendsim.sim.cost import MODES
    from blendsim.sim.engines import get_profile
    from blendsim.sim.models import get_model
    from blendsim.workloads.recipes import get_recipe

    recipe = get_recipe(spec.recipe)
    fields = {f.name: f for f in dataclasses.fields(recipe.options)}
    if not {"density", "sharing"} <= set(fields):
        raise UserError(f"recipe {spec.recipe!r} has no density and sharing options; the sweep's grid needs "
                        f"a recipe that has (e.g. blendserve)")
    opts = {}
    for k, v in spec.recipe_options.items():
        if k in SWEEP_SET:
            raise UserError(f"--recipe-opt {k}: set it with {SWEEP_SET[k]}")
        if k not in fields:
            raise UserError(f"--recipe-opt {k}: recipe {spec.recipe} has no such option; "
                            f"options are {', '.join(sorted(set(fields) - set(SWEEP_SET)))}")
        opts[k] = _coerce(fields[k], v)
    if opts:  # the recipe's own checks of these values now (the rest at its defaults), not in every cell's worker
        try:
            recipe.options(**opts)
        except UserError as e:
            msg = str(e)
            for k in opts:
                msg = msg.replace(f"--{k.replace('_', '-')} ", f"--recipe-opt {k} ", 1)
            raise UserError(msg) from None
    from blendsim.policy_spec import canonical_policy, split_policy

    # NAME[key=value,...]: the policy with those options; checked and written one way, so two spellings are one cell
    spec = dataclasses.replace(spec, policies=tuple(dict.fromkeys(canonical_policy(p) for p in spec.policies)))
    if spec.engine_of:
        get_policy(spec.engine_of)
    from blendsim.sim.rundir import check_distinct_run_dirs

    check_distinct_run_dirs(spec.policies)  # each policy's cells get a folder named after it (sweep.grid.slug)
    pr = spec.precision
    specs = {m: get_model(m, None, pr.get("weights"), pr.get("kv_dtype")) for m in spec.models}
    # NOTE: configs compare by content; two different configs that share a name get their hash appended
    prints = [s.fingerprint() for s in specs.values()]
    if len(set(prints)) < len(prints):
        raise UserError(f"--models {','.join(spec.models)}: two of them are the same model")
    taken = [s.name for s in specs.values()]
    names = {m: s.name if taken.count(s.name) == 1 else f"{s.name}-{s.fingerprint()[:6]}" for m, s in specs.items()}
    from blendsim.runner import ENGINE_FIELDS, RunConfig, run_limits
    from blendsim.sim.deployment import make_deployment
    from blendsim.sim.engines import DEFAULT_ENGINE, require_hardware, require_pipeline
    from blendsim.sim.kv_tiers import tier_sizes

    # --tp / --ep / --pp must fit every model on every GPU: one line now, not per cell. Each policy's cells size
    # their replica from the scheduler limits they will run under (runner.run_limits: the engine's, per
    # attention-DP rank where it schedules each rank on its own, or the policy's), so the fit is checked with those
    prof = get_profile(spec.engine or DEFAULT_ENGINE)  # an unknown engine is one clear line here
    run = {k: v for k, v in spec.run_settings().items()
           if k in {"engine", "tp", "ep", "pp", "weights", "kv_dtype", *ENGINE_FIELDS}}
    require_pipeline(prof, pr.get("pp", 1))  # pipeline stages on an engine that runs none, before any cell
    from blendsim.sim.hardware import get_hardware

    for h in spec.hardware:  # an engine on a GPU it does not run on, before any cell
        require_hardware(prof, get_hardware(h))
    for m in spec.models:
        for h in spec.hardware:
            limits = dict.fromkeys(tuple(sorted(run_limits(RunConfig(
                policy=split_policy(p)[0], options=split_policy(p)[1], model=m, hardware=h, **run))[1].items()))
                for p in spec.policies)  # in policy order; the same limits checked once
            for lim in limits:
                dep = make_deployment(m, h, pr.get("tp", 1), None, pr.get("weights"), pr.get("kv_dtype"),
                                      ep=pr.get("ep", 1), pp=pr.get("pp", 1), **dict(lim))
                # the tier sizes against what this deployment's nodes hold, as each cell's run checks them
                tier_sizes(dep, spec.tiers.get("host_kv_gb"), spec.tiers.get("disk_kv_gb"))
    from blendsim.sim.kv_tiers import kv_load_mode

    kv_load_mode(spec.tiers.get("kv_load"), spec.engine)  # a load mode that is none: one line
    for p in spec.policies:  # every RunConfig field of a cell (replicas, link and drive speeds) checked once
        spec.run_config(p, spec.models[0], spec.hardware[0])
    if spec.mode is not None and spec.mode not in MODES:
        raise UserError(f"--mode {spec.mode!r}: use one of {', '.join(MODES)}")
    if spec.seed < 0:
        raise UserError(f"--seed must be >= 0, got {spec.seed}")
    if spec.requests < 1:
        raise UserError(f"--requests must be >= 1, got {spec.requests}")
    spec = dataclasses.replace(spec, recipe_options=opts, model_names=names)
    for w in spec.workloads():  # options dataclasses validate on construction (cheap, no synthesis)
        kw = spec.recipe_kwargs(w)
        try:
            recipe.options(**kw)
        except TypeError as e:
            raise UserError(f"recipe {spec.recipe}: {e}") from None
    return spec


def _coerce(f: dataclasses.Field, text):
    if not isinstance(text, str):
        return text
    kind = type(f.default) if f.default is not dataclasses.MISSING else \
        {"int": int, "float": float, "bool": bool}.get(str(f.type), str)
    try:
        if kind is bool:
            if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("1", "true", "yes")
        v = kind(text) if kind in (int, float) else text
        if kind is float and not math.isfinite(v):
            raise ValueError(text)
        return v
    except ValueError:
        raise UserError(f"--recipe-opt {f.name}={text}: expected a {'finite ' * (kind is float)}{kind.__name__}") from None


__all__ = ["check_spec"]
