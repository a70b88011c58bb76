"""The fitted-parameters file (``sim/engine_params.json``, ``fidelity --params-file``): its one check.

Every value a parameters file gives is checked where the file is read, so a hand-edited or foreign file
stops with one line naming the file and the field (``engine.trtllm.fixed_s``) instead of predicting a
negative or NaN throughput, or skipping every row for a reason it does not have. Layout::

    {"engine":   {PROFILE or PROFILE@VERSION[:serve]: {"fixed_s" | "per_seq_s" | "per_token_s": seconds},
                  PROFILE@VERSION:server: {"token_s" | "request_s": seconds}},
     "global":   {EFF: value},
     "arch":     {ARCH: {EFF: value}},            (a GPU architecture's: blendsim.sim.hardware.ARCH)
     "hardware": {HARDWARE: {EFF: value}},
     "regime":   {REGIME: {"*" | HARDWARE: {EFF: value}}},
     "bounds":   {"dotted.name": [lo, hi]},
     "fitted_on": {"rows": N, ...}}

``EFF`` is one of ``blendsim.sim.efficiency.BOUNDS``' names.
"""

from __future__ import annotations

import math

from blendsim.sim.errors import UserError

# "profile": the header `blendsim calibrate engine` writes (what was fitted, on what; sim.engines reads it)
TOP = ("engine", "global", "arch", "hardware", "regime", "bounds", "fitted_on", "profile")
OVERHEADS = ("fixed_s", "per_seq_s", "per_token_s")
SERVER = ("token_s", "request_s")  # a server stage's (a key ending ":server"; EngineProfile.server_s)
MAX_OVERHEAD_S = 1.0  # a per-step, per-sequence or per-token engine overhead of a second or more is no engine's


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def check_params(obj, where: str = "parameters", profiles=(), regimes=()) -> dict:
    """``obj`` (a parsed parameters file) if every field is well-formed; else UserError naming ``where`` and
    the field. ``profiles``: the keys an engine's fitted overhead may have (profile names and NAME@VERSION,
    ``blendsim.sim.engines.overhead_keys``, whose loader calls this); ``regimes``: the kernel regimes the engine
    profiles select (empty: any name). A GPU architecture or hardware name that no preset has, or an efficiency
    outside its bounds (the file's own ``bounds`` entry for it, else ``blendsim.sim.efficiency.BOUNDS``' floor and
    ceiling), is refused: a hand-edited file's ``Ampere`` for ``ampere`` would otherwise be read as no value at all
    and price that GPU at its preset."""
    from blendsim.sim.efficiency import BOUNDS
    from blendsim.sim.hardware import PRESETS

    PROFILES = tuple(profiles)
    ARCHS = sorted({h.arch for h in PRESETS.values()})
    REGIMES = tuple(regimes)

    def fail(field: str, what: str):
        raise UserError(f"{where}: field {field}: {what}")

    def known(name: str, field: str, names, what: str) -> None:
        if name not in names:
            fail(f"{field}.{name}", f"unknown {what}; {what}s are {', '.join(names)}")

    def table(v, field: str) -> dict:
        if not isinstance(v, dict):
            fail(field, f"expected an object ({{name: ...}}), got {_short(v)}")
        for k in v:
            if not isinstance(k, str) or not k:
                fail(field, f"names must be non-empty strings, got {_short(k)}")
        return v

    bounds = obj.get("bounds", {}) if isinstance(obj, dict) else {}

    def effs(v, field: str) -> None:
        for k, x in table(v, field).items():
            f = f"{field}.{k}"
            if k not in BOUNDS:
                fail(f, f"unknown parameter; parameters are {', '.join(BOUNDS)}")
            own = bounds.get(f) if isinstance(bounds, dict) else None
            if isinstance(own, list) and len(own) == 2 and all(_number(y) for y in own) and own[0] <= own[1]:
                lo, hi, whose = own[0], own[1], "the file's bounds"
            else:
                lo, hi, whose = BOUNDS[k][0], max(1.0, BOUNDS[k][1]), "blendsim's bounds"
            if not (_number(x) and lo <= x <= hi):
                fail(f, f"must be a number from {lo:g} to {hi:g} ({whose}), got {_short(x)}")

    if not isinstance(obj, dict):
        raise UserError(f"{where}: expected a JSON object of fitted parameters, got {type(obj).__name__}")
    unknown = [k for k in obj if k not in TOP]
    if unknown:
        fail(str(unknown[0]), f"unknown section; sections are {', '.join(TOP)}")
    head = table(obj.get("profile", {}), "profile")
    for k in ("kind", "engine"):
        if head and not isinstance(head.get(k), str):
            fail(f"profile.{k}", f"must be a string, got {_short(head.get(k))}")
    for eng, vals in table(obj.get("engine", {}), "engine").items():
        if eng not in PROFILES:
            fail(f"engine.{eng}", f"unknown engine profile; profiles and their fitted loops and server stages: "
                                  f"{', '.join(PROFILES)}")
        names = SERVER if eng.endswith(":server") else OVERHEADS
        for k, x in table(vals, f"engine.{eng}").items():
            if k not in names:
                fail(f"engine.{eng}.{k}", f"unknown parameter; parameters are {', '.join(names)}")
            if not (_number(x) and 0 <= x < MAX_OVERHEAD_S):
                fail(f"engine.{eng}.{k}", f"must be a number of seconds >= 0 and < {MAX_OVERHEAD_S:g}, got {_short(x)}")
    effs(obj.get("global", {}), "global")
    for arch, vals in table(obj.get("arch", {}), "arch").items():
        known(arch, "arch", ARCHS, "GPU architecture")
        effs(vals, f"arch.{arch}")
    for hw, vals in table(obj.get("hardware", {}), "hardware").items():
        known(hw, "hardware", list(PRESETS), "hardware preset")
        effs(vals, f"hardware.{hw}")
    for reg, per in table(obj.get("regime", {}), "regime").items():
        if REGIMES:
            known(reg, "regime", REGIMES, "kernel regime")
        for hw, vals in table(per, f"regime.{reg}").items():
            known(hw, f"regime.{reg}", ["*", *ARCHS, *PRESETS], "key (*, a GPU architecture or a hardware preset)")
            effs(vals, f"regime.{reg}.{hw}")
    for k, b in table(obj.get("bounds", {}), "bounds").items():
        if not (isinstance(b, list) and len(b) == 2 and all(_number(x) for x in b) and b[0] <= b[1]):
            fail(f"bounds.{k}", f"expected [lower, upper] with lower <= upper, got {_short(b)}")
    fitted = table(obj.get("fitted_on", {}), "fitted_on")
    if "rows" in fitted and not (isinstance(fitted["rows"], int) and not isinstance(fitted["rows"], bool)
                                 and fitted["rows"] >= 0):
        fail("fitted_on.rows", f"expected a whole number >= 0, got {_short(fitted['rows'])}")
    return obj


__all__ = ["OVERHEADS", "SERVER", "TOP", "check_params"]
