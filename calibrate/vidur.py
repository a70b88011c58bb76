"""Import Vidur's profiling CSVs (microsoft/vidur ``data/profiling/compute/<gpu>/<model>/``) as a Profile.

``mlp.csv`` (Vidur's ``vidur/profiling/mlp``): one row per (num_tokens, num_tensor_parallel_workers)
with ``time_stats.<op>.{min,max,mean,median,std}`` in **milliseconds** per operator call, and the
model's whole-model shape (``n_head``, ``n_kv_head``, ``n_embd``, ``n_expanded_embd``, ``vocab_size``,
``use_gated_mlp``). ``attention.csv`` (``vidur/profiling/attention``, optional): one row per
(batch_size, prefill_chunk_size, kv_cache_size, is_prefill, num_tensor_parallel_workers) with
``time_stats.attn_prefill.*`` on prefill rows (batch 1: one chunk of ``prefill_chunk_size`` new tokens
after ``kv_cache_size`` cached ones), ``time_stats.attn_decode.*`` on decode rows (``batch_size``
sequences of ``kv_cache_size`` cached tokens each), and ``time_stats.attn_kv_cache_save.*`` on both;
plus ``n_q_head``, ``n_kv_head``, ``n_embd``, ``block_size``, ``attention_backend``.

Vidur's operators map onto the cost model's: attn_pre_proj -> qkv_proj, attn_post_proj -> o_proj,
mlp_up_proj -> gate_up_proj, mlp_down_proj -> down_proj, attn_rope -> rope, mlp_act -> act,
emb -> embedding, input_layernorm + post_attention_layernorm + add -> norm (Vidur counts ``add`` once
per layer), attn_kv_cache_save -> kv_write, attn_prefill / attn_decode -> the attention operators.
Vidur has no LM-head timing; the cost model uses its roofline for it. Medians are used; repeated
points are merged by their median. Vidur's profilers run float16.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from blendsim.calibrate.fit import fit_op
from blendsim.calibrate.run import shard_deployment
from blendsim.sim.errors import UserError
from blendsim.sim.models import PRESETS, get_model
from blendsim.sim.profile import Profile, model_shape

MLP_MAP = {"attn_pre_proj": "qkv_proj", "attn_post_proj": "o_proj", "mlp_up_proj": "gate_up_proj",
           "mlp_down_proj": "down_proj", "attn_rope": "rope", "mlp_act": "act", "emb": "embedding"}
NORM_PARTS = ("input_layernorm", "post_attention_layernorm", "add")
MLP_KEYS = ("num_tokens", "num_tensor_parallel_workers", "n_head", "n_kv_head", "n_embd", "n_expanded_embd")
ATTN_KEYS = ("is_prefill", "batch_size", "prefill_chunk_size", "kv_cache_size", "num_tensor_parallel_workers")
REQUIRED_GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
MS = 1e-3


def col(op: str) -> str:
    return f"time_stats.{op}.median"


def import_vidur(folder: str | Path, model: str | None = None, tp: int = 1, dtype: str = "fp16",
                 command: str = "") -> Profile:
    """A Profile from Vidur's ``mlp.csv`` (required) and ``attention.csv`` (if present) in ``folder``; or from a file
    named ``PREFIXmlp.csv`` (or ``PREFIXattention.csv``) and its ``PREFIX`` partner beside it, as copies of Vidur's
    profiles are often renamed (``vidur_profile_a100_Llama-2-7b-hf_mlp.csv``)."""
    folder = Path(folder)
    prefix = ""
    if folder.is_file():
        for kind in ("mlp.csv", "attention.csv"):
            if folder.name.endswith(kind):  # one of the pair given: the pair is its prefix's, in its folder
                prefix, folder = folder.name[: -len(kind)], folder.parent
                break
        else:
            raise UserError(f"{folder}: not a folder, nor a file named ...mlp.csv or ...attention.csv (give Vidur's "
                            f"mlp.csv or its folder)")
    if not folder.is_dir():
        raise UserError(f"{folder}: no such file or folder (give Vidur's mlp.csv or the folder holding it)")
    mlp_path = folder / f"{prefix}mlp.csv"
    if not mlp_path.is_file():
        raise UserError(f"{folder}: no {prefix}mlp.csv (Vidur's compute profile, written by vidur/profiling/mlp)")
    mlp = _read(mlp_path, MLP_KEYS, [col(o) for o in REQUIRED_GEMMS])
    spec = _model(mlp_path, mlp, model, dtype)
    dep = shard_deployment(spec, tp)  # checks tp against the model's heads and MLP
    rows = mlp[mlp["num_tensor_parallel_workers"] == tp]
    if rows.empty:
        have = ", ".join(str(int(v)) for v in sorted(mlp["num_tensor_parallel_workers"].unique()))
        raise UserError(f"{mlp_path}: no rows for tp={tp} (profiled: {have}); choose one with --tp")
    tokens = rows["num_tokens"].to_numpy(float)
    series: dict[str, tuple] = {}
    skipped: list = []
    for vop, op in MLP_MAP.items():
        if col(vop) in rows:
            series[op] = (tokens[:, None], rows[col(vop)].to_numpy(float) * MS)
        else:
            skipped.append({"op": op, "point": [], "reason": f"{mlp_path.name} has no {col(vop)}"})
    parts = [p for p in NORM_PARTS if col(p) in rows]
    if parts:
        series["norm"] = (tokens[:, None], sum(rows[col(p)].to_numpy(float) for p in parts) * MS)
    backend = None
    attn_path = folder / f"{prefix}attention.csv"
    if attn_path.is_file():
        backend = _attention(attn_path, spec, tp, series, skipped)
    else:
        skipped.append({"op": "attn_prefill", "point": [], "reason": f"no {attn_path.name}: roofline used"})
        skipped.append({"op": "attn_decode", "point": [], "reason": f"no {attn_path.name}: roofline used"})
    skipped.append({"op": "lm_head", "point": [], "reason": "Vidur profiles no LM head: roofline used"})
    ops = {}
    for op, (x, y) in series.items():
        grid, med, dropped = _merge(x, y)
        if dropped:
            skipped.append({"op": op, "point": [], "reason": f"{dropped} rows without a positive median dropped"})
        if len(med) < 3:
            skipped.append({"op": op, "point": [], "reason": f"only {len(med)} usable points: not fitted"})
            continue
        ops[op] = fit_op(op, grid, med)
    from blendsim.sim import __version__

    vocab = int(mlp["vocab_size"].iloc[0]) if "vocab_size" in mlp and pd.notna(mlp["vocab_size"].iloc[0]) else None
    return Profile(model=spec.name, model_shape=model_shape(spec), dtype=spec.dtype, tp=dep.tp, ops=ops,
                   device={"kind": "cuda", "name": "unknown (Vidur profile)", "source": str(folder.resolve())},
                   software={"source": "vidur", "attention_backend": backend},
                   produced_by={"tool": "blendsim calibrate import-vidur", "version": __version__, "command": command,
                                "quick": False, "source_dir": str(folder.resolve()), "measured_dtype": "fp16",
                                "units": "Vidur milliseconds converted to seconds", "vidur_vocab_size": vocab},
                   skipped=skipped)


# ---- internals ----------------------------------------------------------------------------
def _read(path: Path, keys, times) -> pd.DataFrame:
    try:
        df = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError, OSError) as e:
        raise UserError(f"{path}: not a readable CSV ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from None
    from blendsim.sim.io import check_csv_aligned

    check_csv_aligned(path, df)
    missing = [c for c in (*keys, *times) if c not in df.columns]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)} (is this Vidur's format?)")
    if df.empty:
        raise UserError(f"{path}: no rows")
    numeric = [k for k in keys if k != "is_prefill"] + [c for c in df.columns if c.startswith("time_stats.")]
    for c in numeric:
        v = pd.to_numeric(df[c], errors="coerce")
        bad = v.isna() & df[c].notna()
        if c in keys:
            bad |= df[c].isna()
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise UserError(f"{path}: data row {i + 1}, field {c}: not a number ({str(df[c].iloc[i])!r})")
        neg = (v < 0).to_numpy() | np.isinf(v.to_numpy(dtype=float))  # a time or size below 0 (or infinite): corrupt
        if neg.any():
            i = int(np.flatnonzero(neg)[0])
            raise UserError(f"{path}: data row {i + 1}, field {c}: {float(v.iloc[i]):g} is not a time or size "
                            f"(>= 0, finite)")
        if c in keys:  # the keys are counts (tokens, GPUs, heads, widths): 12.5 tokens is a corrupt row
            frac = (v != np.round(v)).to_numpy()
            if frac.any():
                i = int(np.flatnonzero(frac)[0])
                raise UserError(f"{path}: data row {i + 1}, field {c}: {float(v.iloc[i]):g} is not a whole number")
        df[c] = v
    return df


def _model(path: Path, mlp: pd.DataFrame, name: str | None, dtype: str):
    keys = ("n_embd", "n_head", "n_kv_head", "n_expanded_embd")
    for k in keys:  # one model's rows: another model's appended would be fitted into this one's profile
        other = np.flatnonzero(mlp[k].to_numpy() != mlp[k].iloc[0])
        if len(other):
            raise UserError(f"{path}: data row {int(other[0]) + 1}, field {k}: {mlp[k].iloc[other[0]]} where data row 1 "
                            f"has {mlp[k].iloc[0]} (rows of another model); give one model's profile")
    shape = {k: int(mlp[k].iloc[0]) for k in keys}
    want = {"n_embd": "hidden_size", "n_head": "num_heads", "n_kv_head": "num_kv_heads",
            "n_expanded_embd": "intermediate_size"}
    if name is None:
        same = [m for m in PRESETS.values() if all(getattr(m, a) == shape[k] for k, a in want.items())]
        if not same:
            raise UserError(f"{path}: no model preset has its shape ({_fmt(shape)}); give --model (a preset or a "
                            "config.json)")
        vocab = mlp["vocab_size"].iloc[0] if "vocab_size" in mlp else 0
        name = min(same, key=lambda m: abs(m.vocab_size - vocab)).name  # Vidur pads the vocabulary
    spec = get_model(name, dtype)
    diff = [f"{k} {shape[k]} vs {getattr(spec, a)}" for k, a in want.items() if shape[k] != getattr(spec, a)]
    if diff:
        raise UserError(f"{path}: profiled for another model than {spec.name} ({', '.join(diff)})")
    return spec


def _attention(path: Path, spec, tp: int, series: dict, skipped: list):
    df = _read(path, ATTN_KEYS, [])
    for k, a in (("n_q_head", "num_heads"), ("n_kv_head", "num_kv_heads"), ("n_embd", "hidden_size")):
        if k in df and (df[k] != getattr(spec, a)).any():
            raise UserError(f"{path}: profiled for another model ({k} {int(df[k].iloc[0])} vs {getattr(spec, a)})")
    df = df[df["num_tensor_parallel_workers"] == tp]
    backend = None
    if "attention_backend" in df and not df.empty:
        counts = df["attention_backend"].astype(str).value_counts()
        backend = counts.index[0]
        df = df[df["attention_backend"].astype(str) == backend]
    flag = df["is_prefill"].astype(str).str.strip().str.lower()
    odd = np.flatnonzero(~flag.isin(("true", "1", "1.0", "false", "0", "0.0")).to_numpy())
    if len(odd):  # read as decode it would price prompt attention as decoding: refused, not guessed
        raise UserError(f"{path}: data row {int(odd[0]) + 1}, field is_prefill: {df['is_prefill'].iloc[odd[0]]!r} is not "
                        f"True/False (or 1/0)")
    pre = flag.isin(("true", "1", "1.0"))
    p, d = df[pre], df[~pre]
    for op, rows, xcols in (("attn_prefill", p, ("prefill_chunk_size", "kv_cache_size")),
                            ("attn_decode", d, ("batch_size", "kv_cache_size"))):
        if col(op) in rows and not rows.empty:
            series[op] = (rows[list(xcols)].to_numpy(float), rows[col(op)].to_numpy(float) * MS)
        else:
            skipped.append({"op": op, "point": [], "reason": f"{path.name}: no {op} rows for tp={tp}"})
    if col("attn_kv_cache_save") in df and not df.empty:
        t = np.where(pre, df["prefill_chunk_size"], df["batch_size"]).astype(float)
        series["kv_write"] = (t[:, None], df[col("attn_kv_cache_save")].to_numpy(float) * MS)
    return backend


def _merge(x: np.ndarray, y: np.ndarray):
    """Median of repeated points; rows without a positive finite time dropped (counted)."""
    ok = np.isfinite(y) & (y > 0) & np.all(np.isfinite(x), axis=1)
    df = pd.DataFrame(x[ok], columns=[f"x{i}" for i in range(x.shape[1])])
    df["y"] = y[ok]
    g = df.groupby(list(df.columns[:-1]), sort=True)["y"].median()
    grid = [list(k) if isinstance(k, tuple) else [k] for k in g.index]
    return grid, g.to_numpy(float).tolist(), int((~ok).sum())


def _fmt(shape: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in shape.items())


__all__ = ["import_vidur"]
