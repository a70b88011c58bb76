"""Rich tables for profiles: fit quality per operator, coverage, device and what was skipped."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from blendsim.sim.ops import OPS
from blendsim.sim.profile import OP_VARS, Profile


def _pct(v) -> str:
    return "-" if v is None else f"{100 * float(v):.1f}%"


def _us(v) -> str:
    return f"{float(v) * 1e6:,.1f}"


def fit_table(profile: Profile, title: str = "Fit quality (relative error)") -> Table:
    """One row per operator: fitted form, points, fit error on the grid, held-out errors."""
    t = Table(title=title, caption="grid med/max: error at the fitted points; k-fold: held-out median over "
                                   "grid folds; holdout: median at off-grid points timed with the grid")
    for c in ("op", "form", "points", "grid med", "grid max", "k-fold", "holdout"):
        t.add_column(c, justify="left" if c in ("op", "form") else "right")
    for op in _ordered(profile.ops):
        f = profile.ops[op]
        fit = f.fit or {}
        h = fit.get("holdout") or {}
        form = fit.get("form") or str(fit.get("degree", "?"))
        held = f"{_pct(h.get('median_rel_err'))} ({len(h.get('grid', []))})" if h else "-"
        t.add_row(op, form, str(fit.get("n_points", len(f.median_s))), _pct(fit.get("median_rel_err")),
                  _pct(fit.get("max_rel_err")), _pct(fit.get("heldout_median_rel_err")), held)
    return t


def coverage_table(profile: Profile) -> Table:
    """Which operators the profile covers, over which ranges, and how fast at the ends of the range."""
    t = Table(title="Coverage")
    for c, j in (("op", "left"), ("covered", "left"), ("range", "left"), ("us at low end", "right"),
                 ("us at high end", "right")):
        t.add_column(c, justify=j)
    for op in _ordered(OP_VARS):
        f = profile.ops.get(op)
        if f is None:
            why = "tp=1: none" if op == "allreduce" and profile.tp == 1 else "no: roofline used"
            t.add_row(op, why, "-", "-", "-")
            continue
        rng = " x ".join(f"{v} {_int(lo)}..{_int(hi)}" for v, (lo, hi) in zip(f.vars, f.domain))
        lo = [d[0] for d in f.domain]
        hi = [d[1] for d in f.domain]
        t.add_row(op, "yes", rng, _us(f.predict(*lo)), _us(f.predict(*hi)))
    return t


def print_profile(profile: Profile, console: Console | None = None) -> None:
    """Everything ``blendsim calibrate show`` prints."""
    c = console or Console()
    d, sw, pb = profile.device or {}, profile.software or {}, profile.produced_by or {}
    c.print(f"[bold]{profile.path or 'profile'}[/]: {profile.model} {profile.dtype} tp={profile.tp} "
            f"({pb.get('tool', '?')} {pb.get('version', '')}{', quick' if pb.get('quick') else ''})")
    dev = ", ".join(f"{k} {v}" for k, v in d.items() if k != "kind" and v not in (None, ""))
    c.print(f"device: {d.get('kind', '?')}: {dev}")
    c.print("software: " + ", ".join(f"{k} {v}" for k, v in sw.items() if v is not None and not isinstance(v, dict)))
    if pb.get("timer"):
        c.print(f"timer: {pb['timer']}")
    c.print(fit_table(profile))
    c.print(coverage_table(profile))
    if profile.interference is not None:
        fit = (profile.overlap or {}).get("fit", {})
        c.print(f"overlap interference kappa = {profile.interference:.3f} (median error {_pct(fit.get('median_rel_err'))}"
                f" over {fit.get('n_points', '?')} GEMM + decode pairs)")
    else:
        c.print("overlap interference: not measured (the hardware preset's default applies in overlap mode)")
    hw = profile.hardware or {}
    if hw:
        c.print(f"measured peaks: memory {hw.get('mem_bandwidth', 0) / 1e9:,.1f} GB/s, matmul "
                f"{hw.get('peak_flops', 0) / 1e12:,.3f} TFLOP/s ({hw.get('peak_flops_dtype', profile.dtype)})")
        fields = hardware_fields(profile)
        c.print("HardwareSpec fields they imply: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                              for k, v in fields.items()))
    for s in profile.skipped or []:
        pt = f" at {s.get('point')}" if s.get("point") else ""
        c.print(f"skipped: {s.get('op')}{pt}: {s.get('reason')}")


def hardware_fields(profile: Profile) -> dict:
    """:class:`blendsim.sim.hardware.HardwareSpec` keyword arguments measured by a profile, for an unlisted device.

    ``mem_bandwidth`` is the measured copy bandwidth (bytes read + written per second); the matmul peak
    fills ``peak_flops_fp32`` for an fp32 profile, else ``peak_flops``; the efficiencies stay the preset
    defaults (they are fractions of these peaks).
    """
    hw = profile.hardware or {}
    if not hw:
        return {}
    out = {"mem_bandwidth": hw.get("mem_bandwidth"), "memory_bytes": int((profile.device or {}).get("memory_bytes", 0) or 0)}
    out["peak_flops_fp32" if profile.dtype == "fp32" else "peak_flops"] = hw.get("peak_flops")
    if (profile.device or {}).get("num_sms"):
        out["num_sms"] = int(profile.device["num_sms"])
    return {k: v for k, v in out.items() if v}


def _ordered(ops) -> list[str]:
    order = list(OPS)
    return sorted(ops, key=lambda o: (order.index(o) if o in order else len(order), o))


def _int(v) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


__all__ = ["coverage_table", "fit_table", "hardware_fields", "print_profile"]
