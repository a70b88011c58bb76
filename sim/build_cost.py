"""Build the cost model an engine selects: a deployment + an engine key + (optionally) fitted parameters or
a calibration profile -> :class:`blendsim.sim.cost.CostModel`.

The engine profile (``blendsim.sim.engines``) decides everything about pricing besides the kernels' shapes:
its overhead, its CUDA-graph sizes and its kernel-efficiency regime -- ``None`` (``ideal``) prices with the
plain roofline at the hardware preset's efficiencies (:class:`~blendsim.sim.timers.RooflineTimer`), a named
regime with the efficiencies fitted to it (:class:`~blendsim.sim.efficiency.EfficiencyTimer`). A calibration
profile (``--profile``: kernels measured on a device) replaces the timer on any engine.
"""

from __future__ import annotations

from blendsim.sim.cost import CostModel
from blendsim.sim.deployment import Deployment
from blendsim.sim.efficiency import Efficiency, EfficiencyTimer
from blendsim.sim.engines import EngineProfile, get_profile, load_params, require_hardware, require_pipeline
from blendsim.sim.errors import UserError
from blendsim.sim.profile import Profile, ProfileTimer, load_profile
from blendsim.sim.timers import RooflineTimer


def build_cost_model(dep: Deployment, mode: str | None = None, engine: str | EngineProfile | None = "ideal",
                     profile=None, params: dict | None = None) -> CostModel:
    """The cost model of engine ``engine`` (a key, ``NAME[@VERSION][:field=value,...]``, or a profile) on
    ``dep`` under ``mode`` (None: the engine's own, overlap for NanoFlow, else sequential). ``profile``: a calibration profile (path or Profile) whose measured kernels
    replace the roofline; ``params``: fitted parameters (default: ``sim/engine_params.json``)."""
    if params is None:  # a calibrated engine file brings its own fitted parameters
        prof = get_profile(engine, load_params())
        params = load_params(prof.params_file) if prof.params_file else load_params()
        prof = get_profile(engine, params)
    else:
        prof = get_profile(engine, params)
    require_pipeline(prof, dep.pp)  # an engine that runs no pipeline stages, or runs them unmodelled: one line
    require_hardware(prof, dep.hardware)  # an engine on a GPU it does not run on (TensorRT-LLM on an MI300X)
    mode = mode or prof.mode
    ar_max = prof.custom_allreduce_max(dep.tp)  # messages above it go through NCCL (RooflineTimer)
    if profile is not None:
        cal = profile if isinstance(profile, Profile) else load_profile(profile)
        m = dep.model
        for what, v in (("--weights", m.weights), ("--kv-dtype", m.kv_dtype)):
            if v != m.dtype:  # a profile measures one dtype throughout
                raise UserError(f"{cal.path or 'profile'}: measured in {cal.dtype}, but the run uses {what} {v}; "
                                f"calibrate with that precision or drop {what}")
        timer, kappa = ProfileTimer(cal, dep, ar_max), cal.interference
    elif prof.regime is None:
        timer, kappa = RooflineTimer(dep, ar_max), None
    else:
        eff = Efficiency.lookup(params, prof.regime, dep.hardware.name)
        timer, kappa = engine_timer(dep, eff, prof), eff.kappa
    return CostModel(dep, mode, prof, timer=timer, interference=kappa,
                     graph_sizes=prof.graph_sizes_for(dep))


def engine_timer(dep: Deployment, eff: Efficiency, prof) -> EfficiencyTimer:
    """The roofline at an engine regime's fitted efficiencies, with the engine's own kernels where they reach less:
    its all-reduce kernel's message limit (``EngineProfile.custom_allreduce_max``) and its prompt attention kernel's
    ceiling on this GPU (``EngineProfile.prefill_attn_cap``: FlashAttention-2 on Hopper). The one timer of an
    engine, for a run and for fidelity's re-pricing alike."""
    timer = EfficiencyTimer(dep, eff, prof.custom_allreduce_max(dep.tp))
    cap = prof.prefill_attn_cap(dep.hardware.arch)
    if cap is not None:
        timer.attn_rate = min(timer.attn_rate, cap * dep.hardware.flops_for(dep.model.dtype))
    return timer


__all__ = ["build_cost_model", "engine_timer"]
