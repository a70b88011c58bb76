"""Calibration profiles: the JSON schema, loading with checks, and the polynomial op timer.

A Profile holds, per operator, a polynomial fitted to kernel times measured on one device for one
model, dtype and tensor-parallel shard (``blendsim calibrate`` writes them). Schema (version 1)::

    {
      "schema": "blendsim.profile", "schema_version": 1,
      "model": "llama-3-8b", "model_shape": {hidden_size, num_layers, num_heads, num_kv_heads,
                                             intermediate_size, vocab_size, head_dim},
      "dtype": "bf16", "tp": 1,
      "device": {"kind": "cuda", "name": ..., ...pynvml identity...},
      "software": {"torch": ..., "cuda": ..., "attention_backend": ...},
      "produced_by": {"tool": "blendsim calibrate", "version": ..., "command": ..., "quick": false},
      "ops": {
        "<op>": {"vars": ["tokens"] | ["tokens", "context"] | ["batch", "context"],
                 "terms": [[e1, e2], ...], "coef": [...], "scale": [...],
                 "domain": [[lo, hi], ...],
                 "fit": {"degree": d, "median_rel_err": ..., "max_rel_err": ...,
                         "heldout_median_rel_err": ..., "n_points": ...},
                 "grid": [[x1, x2], ...], "median_s": [...], "p10_s": [...], "p90_s": [...]}
      },
      "interference": 0.21 | null,  "overlap": {...measured points...} | null,
      "hardware": {"peak_flops": ..., "mem_bandwidth": ...} | null,
      "skipped": [{"op": ..., "point": [...], "reason": ...}]
    }

Times are seconds for one call of the operator (one layer for layer operators). ``terms`` are the
exponents of each monomial in the scaled variables ``x / scale``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from blendsim.sim.deployment import Deployment
from blendsim.sim.errors import UserError
from blendsim.sim.io import read_json, write_json
from blendsim.sim.models import DTYPE_BYTES
from blendsim.sim.ops import MLA_OPS, MOE_OPS, OPS, PROFILED_OPS, window_decode
from blendsim.sim.profile_check import check_profile
from blendsim.sim.timers import RooflineTimer

SCHEMA = "blendsim.profile"
SCHEMA_VERSION = 1
SHAPE_KEYS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size",
              "head_dim")
OP_VARS = PROFILED_OPS  # which features feed each operator's polynomial (sim.ops.OP_TABLE)


@dataclass
class OpFit:
    """One operator's fitted polynomial and the measurements behind it."""

    op: str
    vars: tuple
    terms: list  # exponent tuples, one per coefficient
    coef: list
    scale: list
    domain: list  # [[lo, hi]] per variable, the measured range
    fit: dict = field(default_factory=dict)
    grid: list = field(default_factory=list)
    median_s: list = field(default_factory=list)
    p10_s: list = field(default_factory=list)
    p90_s: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self._terms = np.asarray(self.terms, dtype=float).reshape(len(self.coef), len(self.vars))
        self._coef = np.asarray(self.coef, dtype=float)
        self._floor = 0.5 * min(self.median_s) if self.median_s else 0.0

    def predict(self, *xs):
        """Seconds at ``xs`` (numbers or arrays). Inside the measured domain: the polynomial. Beyond
        its upper end: the edge value scaled linearly (GEMM and attention times grow linearly in
        tokens, batch and context there). Below its lower end: the edge value."""
        xs = np.broadcast_arrays(*[np.asarray(x, dtype=float) for x in xs])  # a scalar batch, an array of contexts
        ratio = 1.0
        clamped = []
        for x, (lo, hi) in zip(xs, self.domain):
            c = np.clip(x, lo, hi)
            ratio = ratio * np.where(x > hi, x / hi, 1.0)
            clamped.append(c)
        z = np.stack([c / s for c, s in zip(clamped, self.scale)], axis=-1)
        mono = np.prod(z[..., None, :] ** self._terms, axis=-1)
        y = mono @ self._coef
        return np.maximum(y, self._floor) * ratio

    def predict_scalar(self, *xs) -> float:
        """Pure-Python :meth:`predict` for one point (the engine's hot path)."""
        ratio = 1.0
        z = []
        for x, (lo, hi), s in zip(xs, self.domain, self.scale):
            if x > hi:
                ratio *= x / hi
                x = hi
            elif x < lo:
                x = lo
            z.append(x / s)
        y = 0.0
        for c, e in zip(self.coef, self.terms):
            v = c
            for zi, ei in zip(z, e):
                if ei:
                    v *= zi ** ei
            y += v
        return max(y, self._floor) * ratio

    def to_dict(self) -> dict:
        return {"vars": list(self.vars), "terms": [list(map(int, t)) for t in self.terms], "coef": list(self.coef),
                "scale": list(self.scale), "domain": [list(d) for d in self.domain], "fit": self.fit,
                "grid": self.grid, "median_s": self.median_s, "p10_s": self.p10_s, "p90_s": self.p90_s}


@dataclass
class Profile:
    model: str
    model_shape: dict
    dtype: str
    tp: int
    ops: dict  # op -> OpFit
    device: dict = field(default_factory=dict)
    software: dict = field(default_factory=dict)
    produced_by: dict = field(default_factory=dict)
    interference: float | None = None
    overlap: dict | None = None
    hardware: dict | None = None
    skipped: list = field(default_factory=list)
    path: str = ""

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "model": self.model,
                "model_shape": self.model_shape, "dtype": self.dtype, "tp": self.tp, "device": self.device,
                "software": self.software, "produced_by": self.produced_by,
                "ops": {k: v.to_dict() for k, v in sorted(self.ops.items())}, "interference": self.interference,
                "overlap": self.overlap, "hardware": self.hardware, "skipped": self.skipped}

    def save(self, path: str | Path) -> Path:
        return write_json(path, self.to_dict())

    def check_matches(self, dep: Deployment) -> None:
        """Refuse a profile made for another model shape, dtype or tensor-parallel degree."""
        m = dep.model
        shape = model_shape(m)
        where = self.path or "profile"
        if self.model_shape and any(int(self.model_shape.get(k, -1)) != shape[k] for k in SHAPE_KEYS):
            diff = ", ".join(f"{k} {self.model_shape.get(k)} vs {shape[k]}" for k in SHAPE_KEYS
                             if int(self.model_shape.get(k, -1)) != shape[k])
            raise UserError(f"{where}: fitted for model {self.model!r}, not {m.name!r} ({diff})")
        if self.dtype != m.dtype:
            raise UserError(f"{where}: fitted for dtype {self.dtype}, but the run uses {m.dtype} (use --dtype)")
        if int(self.tp) != dep.tp:
            raise UserError(f"{where}: fitted for tp={self.tp}, but the run uses tp={dep.tp}")
        made_on = self.hardware_preset()
        from blendsim.sim.hardware import PRESETS

        if self.device.get("kind") == "cuda" and dep.hardware.name == "cpu":  # a GPU's kernel times on a CPU run
            raise UserError(f"{where}: timed on a GPU ({self.device.get('name') or 'cuda'}), but the run is on the cpu "
                            f"preset: kernel times do not carry to another device (calibrate on the CPU)")

        # against a preset only: calibration's own deployment (calibrate/run.py) is of no GPU
        if made_on and dep.hardware.name in PRESETS and made_on != dep.hardware.name:
            raise UserError(f"{where}: timed on {self.device.get('name') or made_on} (the {made_on} preset), but the run is on "
                            f"{dep.hardware.name}: kernel times do not carry to another GPU (use --hardware {made_on}, "
                            f"or calibrate on that GPU)")

    def hardware_preset(self) -> str | None:
        """The hardware preset of the device the kernels were timed on (None: not recorded or no preset)."""
        from blendsim.sim.hardware import preset_for_device

        if self.device.get("kind") == "cpu":  # a CPU's own name (an EPYC, a Xeon) names no GPU preset
            return "cpu"
        name = self.device.get("name") or self.device.get("nvml_name")
        if not isinstance(name, str) or not name:
            return None
        mem = self.device.get("memory_total_bytes") or self.device.get("memory_bytes") or 0
        return preset_for_device(name, int(mem) if isinstance(mem, (int, float)) else 0)


def model_shape(m) -> dict:
    return {k: int(getattr(m, k)) for k in SHAPE_KEYS}


def load_profile(path: str | Path) -> Profile:
    """Read and check a profile (every field: :func:`blendsim.sim.profile_check.check_profile`); a corrupt or foreign
    file is one clear error."""
    path = Path(path)
    d = read_json(path, "profile")
    where = str(path)
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        from blendsim.sim.engines import PROFILE_KIND

        head = d.get("profile") if isinstance(d, dict) else None
        if isinstance(head, dict) and head.get("kind") == PROFILE_KIND:  # `calibrate engine -o`: an engine's fit
            raise UserError(f"{where}: an engine profile (blendsim calibrate engine), not a kernel profile: pass it "
                            f"as --engine {where} (blendsim engines {where} shows it)")
        raise UserError(f"{where}: not a blendsim profile (missing \"schema\": \"{SCHEMA}\")")
    v = d.get("schema_version")
    if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= SCHEMA_VERSION:
        raise UserError(f"{where}: profile schema version {repr(v)[:40]} is not supported (this blendsim reads "
                        f"{SCHEMA_VERSION})")
    for k in ("model", "dtype", "tp", "ops"):
        if k not in d:
            raise UserError(f"{where}: missing field {k!r}")
    check_profile(d, where, OP_VARS, SHAPE_KEYS, DTYPE_BYTES)
    ops = {}
    for name, o in d["ops"].items():
        ops[name] = OpFit(op=name, vars=tuple(o["vars"]), terms=o["terms"], coef=o["coef"], scale=o["scale"],
                          domain=o["domain"], fit=o.get("fit", {}), grid=o.get("grid", []),
                          median_s=o.get("median_s", []), p10_s=o.get("p10_s", []), p90_s=o.get("p90_s", []))
    return Profile(model=d["model"], model_shape=d.get("model_shape") or {}, dtype=d["dtype"], tp=d["tp"], ops=ops,
                   device=d.get("device") or {}, software=d.get("software") or {},
                   produced_by=d.get("produced_by") or {}, interference=d.get("interference"),
                   overlap=d.get("overlap"), hardware=d.get("hardware"), skipped=d.get("skipped") or [], path=where)


class ProfileTimer:
    """Operator times from a profile's polynomials; the roofline for operators it lacks."""

    name = "profile"

    def __init__(self, profile: Profile, dep: Deployment, custom_allreduce_max: float = float("inf")):
        """``custom_allreduce_max``: the engine's own all-reduce kernel's limit (``RooflineTimer``), for the
        all-reduces a profile does not measure."""
        profile.check_matches(dep)
        if dep.dp > 1:
            raise UserError(f"--profile {profile.path or ''}: a kernel profile times attention as the GPU ran it for "
                            f"the whole batch; attention data parallelism (attn_dp) is priced by the roofline "
                            f"timers only -- drop --profile or attn_dp")
        self.profile = profile
        self.roofline = RooflineTimer(dep, custom_allreduce_max)
        self.shapes = self.roofline.shapes
        self._missing = sorted(op for op in OP_VARS if op not in profile.ops
                               and not (op == "allreduce" and dep.tp == 1)
                               and not (op == "rope" and not dep.model.rope))

    def notes(self) -> list[str]:
        out = []
        if self._missing:
            out.append(f"profile {self.profile.path or ''} lacks {', '.join(self._missing)}: "
                       f"using the roofline for {'it' if len(self._missing) == 1 else 'them'}")
        s = self.shapes
        own = [op for op in OPS if s.applies(op) and op not in self.profile.ops
               and (op in MLA_OPS or op in MOE_OPS)]
        if own:
            out.append(f"profile {self.profile.path or ''} has no MoE/MLA operators: using the roofline for "
                       f"{', '.join(own)}")
        return out

    def op_time(self, op, flops, nbytes, kernels, f):
        fit = self.profile.ops.get(op)
        if fit is None:
            return self.roofline.op_time(op, flops, nbytes, kernels, f)
        on = np.asarray(kernels) > 0
        if op == "attn_prefill":
            np_ = np.maximum(np.asarray(f.num_prefill_seqs, dtype=float), 1)
            n = np.maximum(np.asarray(f.num_prefill_tokens, dtype=float) / np_, 1)
            ctx = np.maximum(np.asarray(f.attn_pairs, dtype=float) / np_ / n - (n + 1) / 2, 0)
            t = self._prefill_layers(n, ctx, fit.predict) * np_
        elif op == "attn_decode":  # sliding-window layers: the mean layer's keys (ops.window_decode)
            d = np.maximum(np.asarray(f.num_decode, dtype=float), 1)
            cd = window_decode(self.shapes, np.asarray(f.num_decode, dtype=float),
                               np.asarray(f.decode_ctx_sum, dtype=float))
            t = fit.predict(d, cd / d)
        else:
            x = f.num_logits if op == "lm_head" else f.num_tokens
            t = fit.predict(np.maximum(np.asarray(x, dtype=float), 1))
        return np.where(on, t, 0.0)

    def attn_scalars(self):
        rp, rd = self.roofline.attn_scalars()
        pf, dfit = self.profile.ops.get("attn_prefill"), self.profile.ops.get("attn_decode")

        s = self.shapes

        def chunk(n, c):
            return self._prefill_chunk(pf, n, c)

        def prefill(Tp, Np, pairs, pkv, chunks=None):
            if pf is None:
                return rp(Tp, Np, pairs, pkv)
            if chunks:  # exact: one kernel call per sequence's chunk
                return sum(self._prefill_layers(n, c, chunk) for _, n, c, _ in chunks)
            n = max(Tp / Np, 1.0)
            ctx = max(pairs / Np / n - (n + 1) / 2, 0.0)
            return self._prefill_layers(n, ctx, chunk) * Np

        def decode(D, Cd):
            if dfit is None:
                return rd(D, Cd)
            return dfit.predict_scalar(D, float(window_decode(s, D, Cd)) / D)

        return prefill, decode

    def _prefill_layers(self, n, c, price):
        """One chunk of ``n`` new tokens after ``c`` (numbers or arrays) averaged over the layers: a
        sliding-window layer computes at most ``window`` keys per query, priced as the measured chunk at the
        context it keeps, scaled by the pairs it computes (``price(n, c)`` prices one full chunk)."""
        s = self.shapes
        full = price(n, c)
        if not s.swa_layers:
            return full
        a, W = s.swa_layers / s.layers, s.window
        cw = np.minimum(c, W)
        pairs = n * c + n * (n + 1) / 2
        kept = n * cw + n * (n + 1) / 2
        return (1 - a) * full + a * price(n, cw) * np.minimum(pairs, n * W) / kept

    @staticmethod
    def _prefill_chunk(fit: OpFit, n: float, c: float) -> float:
        """One chunk of ``n`` new tokens after ``c`` of context. Beyond the measured range the time
        grows with the causal (query, key) pairs, n*c + n(n+1)/2 — superlinear in n — not linearly."""
        (nlo, nhi), (clo, chi) = fit.domain
        n2 = min(max(n, nlo), nhi)
        c2 = min(max(c, clo), chi)
        t = fit.predict_scalar(n2, c2)
        if n > nhi or c > chi:
            t *= (n * c + n * (n + 1) / 2) / max(n2 * c2 + n2 * (n2 + 1) / 2, 1.0)
        return t


__all__ = ["OP_VARS", "OpFit", "Profile", "ProfileTimer", "SCHEMA", "SCHEMA_VERSION", "load_profile", "model_shape"]
