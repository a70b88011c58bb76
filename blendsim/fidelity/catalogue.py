"""The fidelity catalogue: one published throughput measurement per CSV row, and its workload.

Columns: ``id, source, model, hardware, gpus, tp, pp, ep, weights, kv_dtype, engine, engine_version,
policy, workload, requests, metric, scope, value, note``, and optionally ``host_kv_gb`` / ``disk_kv_gb`` (the run's
KV tiers, GB per replica). A malformed catalogue (a missing column, a
number that is not one, an unknown metric) stops with one line naming the file, row and field; a
well-formed row the simulator cannot run is *skipped* later, with its reason.

Workloads:

* ``const:ISL/OSL`` -- ``requests`` requests of ISL prompt and OSL output tokens, unique prompts;
* ``file:PATH[?key=value&...]`` -- PATH relative to the catalogue's folder: a blendsim trace (Parquet),
  a CSV ``workloads load`` reads (format by its columns; a ``.jsonl`` is read as the ``jsonl`` format, token ids,
  so a block-hash JSONL is first converted with ``workloads load --format mooncake``), or a plain CSV of prompt/output lengths
  (columns like prompt_tokens/output_tokens, num_prefill_tokens/num_decode_tokens,
  ContextTokens/GeneratedTokens, input_len/output_len); the first ``requests`` rows after the optional
  filter ``min_len`` (both lengths at least this), ``max_prompt``, ``max_total`` (prompt + output); with
  ``mean_prompt`` / ``mean_output`` each length column of that selection is scaled (and rounded, at least 1)
  so its mean is the given one -- for a published run whose sample is not available but whose token totals
  are. A length CSV's prompts may instead be scaled by ``prompt_scale``, cut at a seeded uniform length with
  ``cap_prompt=LO-HI`` (kept whole where shorter; with ``mean_prompt`` the mean is then that of the cut prompts, the
  scale found to give it) and given uniform outputs with ``output=LO-HI`` (sglang's July 2024 random dataset).
  A relative PATH not found next to the catalogue is looked up in each folder of ``$BLENDSIM_DATA``
  (``:``-separated): third-party length files that may not be copied into the package stay outside it;
* ``random:ISL/OSL[?range_ratio=R]`` -- ``requests`` requests whose prompt and output lengths are drawn uniformly
  from [ISL (1 - R), ISL (1 + R)] and [OSL (1 - R), OSL (1 + R)] (whole numbers, ends included), 0 <= R < 1, as
  ``vllm bench serve --dataset-name random --random-range-ratio R`` draws them (vllm/benchmarks/datasets.py,
  ``RandomDataset.sample``); seeded, so a row gives the same lengths every run; R = 0 is ``const:ISL/OSL``;
* ``synth:RECIPE?key=value&...`` -- ``blendsim workloads synth RECIPE`` with those options (seeded),
  ``requests`` is passed as the recipe's ``requests`` unless given.

A row's command (``engine_version``) may state a client's cap on requests in flight, ``--max-concurrency N``
(``vllm bench serve``, sglang ``bench_serving``): the engine then never holds more than N sequences, so N caps its
``max_seqs`` (below the engine's own limit only).
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl

import numpy as np

from blendsim.sim.errors import UserError
from blendsim.workloads.trace import MAX_TOKENS

COLUMNS = ("id", "source", "model", "hardware", "gpus", "tp", "pp", "ep", "weights", "kv_dtype", "engine",
           "engine_version", "policy", "workload", "requests", "metric", "scope", "value", "note")
OPTIONAL_COLUMNS = ("host_kv_gb", "disk_kv_gb")  # the measurement's KV tiers per replica (GB)
METRICS = ("output_tok_s", "total_tok_s", "req_s")
SCOPES = ("system", "per_gpu")
# a row simulates every one of its requests on every one of its replicas: bounds that keep a typo (10**12
# requests, 10**30 GPUs) from allocating terabytes or building replicas until memory runs out
MAX_REQUESTS = 1_000_000
MAX_GPUS = 4096
_PAIRS = (("prompt_tokens", "output_tokens"), ("num_prefill_tokens", "num_decode_tokens"),
          ("ContextTokens", "GeneratedTokens"), ("input_len", "output_len"), ("input_length", "output_length"),
          ("Request tokens", "Response tokens"), ("prompt_len", "output_len"), ("isl", "osl"))


@dataclass(frozen=True)
class Row:
    """One measurement."""

    id: str
    source: str
    model: str
    hardware: str
    gpus: int
    tp: int
    pp: int
    ep: int
    weights: str
    kv_dtype: str
    engine: str
    engine_version: str
    policy: str
    workload: str
    requests: int
    metric: str
    scope: str
    value: float
    note: str
    folder: Path  # the catalogue's folder (workload and model paths are relative to it)
    line: int  # CSV line number, for messages
    host_kv_gb: float = 0.0  # optional columns: the measurement's host-memory / disk KV tiers per replica
    disk_kv_gb: float = 0.0

    @property
    def replicas(self) -> int:
        return self.gpus // (self.tp * self.pp)


class Skip(Exception):
    """The simulator cannot run this row (its data file is absent, a precision or an engine version is not
    modelled, a request longer than the model's context); the message is the reason. A malformed row is a
    UserError instead."""


def read_catalogue(path: str | Path) -> list[Row]:
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:  # a spreadsheet's byte-order mark is no column
            reader = csv.DictReader(fh)
            header = [h.strip() if isinstance(h, str) else h for h in (reader.fieldnames or [])]
            dup = sorted({h for h in header if header.count(h) > 1 and h})
            if dup:
                raise UserError(f"{path}: column {dup[0]!r} appears more than once in the header")
            reader.fieldnames = header
            missing = [c for c in COLUMNS if c not in header]
            if missing:
                raise UserError(f"{path}: missing column(s) {', '.join(missing)}")
            from blendsim.sim.checks import misspelt

            typo = misspelt(header, OPTIONAL_COLUMNS, COLUMNS)
            if typo:  # host_kv_GB would run the row with no tier, unsaid
                raise UserError(f"{path}: column {typo[0]!r} is not one blendsim reads; did you mean {typo[1]!r}?")
            raw = list(reader)
    except OSError as e:
        raise UserError(f"{path}: cannot read catalogue: {e.strerror or e}") from None
    except (csv.Error, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a readable CSV: {e}") from None
    rows, seen = [], set()
    for i, r in enumerate(raw):
        line = i + 2
        extra = r.get(None)  # csv.DictReader's cells past the header's columns
        if extra:
            raise UserError(f"{path}: row {line} (id {r.get('id') or '?'}): {len(header) + len(extra)} cells for the "
                            f"header's {len(header)} columns (an unquoted comma, in the note perhaps?); quote the cell")
        rows.append(_row(path, line, r))
        if rows[-1].id in seen:
            raise UserError(f"{path}: row {line}: id {rows[-1].id!r} appears twice")
        seen.add(rows[-1].id)
    if not rows:
        raise UserError(f"{path}: the catalogue has no rows")
    return rows


def _row(path: Path, line: int, r: dict) -> Row:
    def where(field: str) -> str:
        return f"{path}: row {line} (id {r.get('id') or '?'}), field {field!r}"

    def integer(field: str, default: int | None = None, minimum: int = 1, maximum: int | None = None) -> int:
        v = (r.get(field) or "").strip()
        if not v and default is not None:
            return default
        try:
            x = int(v)
        except ValueError:
            raise UserError(f"{where(field)}: expected an integer, got {v!r}") from None
        if x < minimum:
            raise UserError(f"{where(field)}: must be >= {minimum}, got {x}")
        if maximum is not None and x > maximum:
            raise UserError(f"{where(field)}: must be <= {maximum:,}, got {x}")
        return x

    def text(field: str, required: bool = True) -> str:
        v = (r.get(field) or "").strip()
        if required and not v:
            raise UserError(f"{where(field)}: empty")
        return v

    try:
        if "_" in text("value"):  # Python's float() reads 1_000; a spreadsheet or a reader of the CSV does not
            raise ValueError
        value = float(text("value"))
    except ValueError:
        raise UserError(f"{where('value')}: expected a number, got {r.get('value')!r}") from None
    if not (value > 0 and np.isfinite(value)):
        raise UserError(f"{where('value')}: must be a positive number, got {value}")
    metric, scope = text("metric"), text("scope")
    if metric not in METRICS:
        raise UserError(f"{where('metric')}: {metric!r} is not one of {', '.join(METRICS)}")
    if scope not in SCOPES:
        raise UserError(f"{where('scope')}: {scope!r} is not one of {', '.join(SCOPES)}")
    gpus, tp, pp = integer("gpus", maximum=MAX_GPUS), integer("tp", 1, maximum=MAX_GPUS), integer("pp", 1, maximum=MAX_GPUS)
    if gpus % (tp * pp):
        raise UserError(f"{where('gpus')}: {gpus} GPUs is not a multiple of tp x pp = {tp * pp}")
    wl = text("workload")
    if not wl.startswith(("const:", "random:", "file:", "synth:")):
        raise UserError(f"{where('workload')}: {wl!r} is not const:ISL/OSL, random:ISL/OSL?range_ratio=R, file:PATH "
                        f"or synth:RECIPE?...")
    if wl.startswith("const:") and not re.fullmatch(r"const:\d+/\d+", wl):
        raise UserError(f"{where('workload')}: {wl!r} is not const:ISL/OSL (two whole numbers)")
    ep = integer("ep", 1, maximum=MAX_GPUS)
    _check_names(path, r, where, ep)
    _check_version(path, r, where)
    def gb(field: str) -> float:
        from blendsim.sim.kv_tiers import check_tier_gb

        v = (r.get(field) or "").strip()
        try:
            return check_tier_gb(v or 0, field) if v else 0.0
        except UserError as e:
            raise UserError(f"{where(field)}: {e}") from None

    row = Row(id=text("id"), source=text("source", False), model=text("model"), hardware=text("hardware"),
               gpus=gpus, tp=tp, pp=pp, ep=ep, weights=text("weights", False) or "bf16",
               kv_dtype=text("kv_dtype", False), engine=text("engine"), engine_version=text("engine_version", False),
               policy=text("policy", False), workload=wl, requests=integer("requests", maximum=MAX_REQUESTS), metric=metric,
               scope=scope, value=value, note=text("note", False), folder=path.resolve().parent, line=line,
               host_kv_gb=gb("host_kv_gb"), disk_kv_gb=gb("disk_kv_gb"))
    kind, _, spec = wl.partition(":")
    try:  # a malformed file or synth workload stops here, before any row runs (an absent file is only skipped)
        if kind == "file":
            _file_options(row, spec)
        elif kind == "random":
            _random_options(row, spec)
        elif kind == "synth":
            _synth_options(row, spec)
        elif kind == "const":
            _const_lengths(row, spec)
    except UserError as e:
        raise UserError(f"{path}: {e}") from None
    return row


def _check_names(path: Path, r: dict, where, ep: int) -> None:
    """A row's model, hardware and policy name what blendsim has (UserError naming the row and field): a model
    preset or a config.json beside the catalogue, a hardware preset, a policy (or none); expert parallelism on a MoE
    model only. Engines are not checked here: a row of an engine blendsim does not model is skipped with its reason."""
    from blendsim.policies.registry import resolve_policy
    from blendsim.sim.hardware import get_hardware
    from blendsim.sim.models import KV_DTYPES, PRESETS, WEIGHT_PRECISIONS, get_model

    for field, known in (("weights", WEIGHT_PRECISIONS), ("kv_dtype", KV_DTYPES)):
        v = (r.get(field) or "").strip()
        if v and v not in known:
            raise UserError(f"{where(field)}: {v!r} is not one of {', '.join(known)}")

    engine = (r.get("engine") or "").strip()
    from blendsim.sim.engines import PROFILES as ENGINES

    near = next((n for n in ENGINES if n.lower() == engine.lower()), None)
    if near is not None and near != engine:  # a name blendsim models, written another way: a typo, not another engine
        raise UserError(f"{where('engine')}: {engine!r}: engine names are lower-case; write {near!r}")
    name, at, version = engine.partition("@")
    if at and name.strip().lower() in ENGINES:  # --engine's NAME@VERSION: a row says the version in its own column
        raise UserError(f"{where('engine')}: {engine!r}: write the engine's name alone ({name.strip().lower()!r}) "
                        f"and its version in engine_version ({version.strip()!r})")
    model, hardware, policy = ((r.get(k) or "").strip() for k in ("model", "hardware", "policy"))
    field = "model"
    try:
        if model not in PRESETS and not (path.resolve().parent / model).exists():  # the value as the row gives it
            beside = path.resolve().parent / model
            raise UserError(f"unknown model {model!r}: not a preset ({', '.join(PRESETS)}) nor a config.json "
                            f"at {beside}")
        spec = get_model(model if model in PRESETS else str(path.resolve().parent / model))
        field = "hardware"
        get_hardware(hardware)
        field = "policy"
        if policy:
            resolve_policy(policy)
    except UserError as e:
        raise UserError(f"{where(field)}: {e}") from None
    if ep > 1 and not spec.is_moe:
        raise UserError(f"{where('ep')}: ep {ep} on {model}, a dense model (expert parallelism needs experts)")


# How a row's engine_version text may name each engine, for the version written right after the name
_ENGINE_WORDS = {"vllm": r"vllm", "sglang": r"sglang", "trtllm": r"(?:tensorrt[-_ ]?llm|trt[-_ ]?llm)",
                 "deepspeed-fastgen": r"(?:deepspeed[-_ ]?(?:mii|fastgen)|mii|fastgen)", "nanoflow": r"nanoflow"}


def _version_after_name(engine: str, text: str):
    """The match of the version the text states (group 1 the full release): the one written right after the
    engine's name (``vLLM 0.5.3``, ``vLLM v0.6.0``, ``TensorRT-LLM ~v0.13``, ``vLLM version 0.5.3``, ``SGLang: 0.4.1``),
    else a version standing alone at the start of the text or after a comma, semicolon, colon or bracket (``0.6.0``,
    ``v1.0 (PyTorch backend)``, ``vLLM for Llama-3.1 models, 0.5.3``, an image tag ``vllm/vllm-openai:v0.6.3``) -- never a number that follows another word
    (``CUDA 12.4``, ``Llama 3.1``) or is part of a name (``Llama-3.1``); None when the text states none."""
    import re

    word = _ENGINE_WORDS.get(engine, re.escape(engine))
    return (re.search(rf"(?<![\w-]){word}[\s:=@~-]*(?:version\s*)?v?(\d+(?:\.\d+)+)", text, re.I)
            or re.search(r"(?:^|[,;:(\[]\s*)~?v?(\d+(?:\.\d+)+)(?![\w-])", text.strip(), re.I))


def engine_version_key(row: Row) -> str:
    """``engine@MAJOR.MINOR`` from the row's engine and its ``engine_version`` text: the version it states
    (:func:`_version_after_name`: ``CUDA 12.4, vLLM 0.5.3`` -> ``vllm@0.5``, never CUDA's or a model's number); the
    engine alone (its newest modelled version) when the text is empty or the engine has no versions. A text that
    states no version is refused when the catalogue is read (:func:`_check_version`)."""
    m = _version_after_name(row.engine, row.engine_version or "")
    if not m:
        return row.engine
    major, minor = (m.group(1).split(".") + ["0"])[:2]
    return f"{row.engine}@{int(major)}.{int(minor)}"


def _check_version(path: Path, r: dict, where) -> None:
    """A row of an engine blendsim models in versions states its version (:func:`_version_after_name`) or nothing (its
    newest modelled version, as ``--engine NAME`` is): a version read from elsewhere in the text (CUDA's, a model's)
    or none at all would silently price another release. UserError naming the row and field."""
    from blendsim.sim.engines import PROFILES, versions_of

    engine, text = ((r.get(k) or "").strip() for k in ("engine", "engine_version"))
    if engine not in PROFILES or not versions_of(engine) or not text or _version_after_name(engine, text):
        return
    raise UserError(f"{where('engine_version')}: {text[:60]!r} states no {engine} version (write it right after "
                    f"the engine's name, '{engine} 0.5.3', 'v0.5.3' or '~v0.5.3', or first in the field; leave the field "
                    f"empty for the newest modelled {engine}; modelled: {', '.join(versions_of(engine))})")


# Engine flags a row's ``engine_version`` text may state (its server or benchmark command), as the scheduler
# settings they set: vLLM's --max-num-batched-tokens / --max-num-seqs / --gpu-memory-utilization /
# --[no-]enable-prefix-caching, SGLang's --chunked-prefill-size / --max-running-requests / --mem-fraction-static
# (--mem-frac) / --disable-radix-cache, trtllm-build's --max_batch_size / --max_num_tokens. A value that is not a
# number is not read, but for ``--max-num-seqs = num prompts`` (the row's request count).
_FLAGS = (
    (r"--max-num-batched-tokens[ =]+(\d+)\b", "token_budget", int),
    (r"--chunked-prefill-size[ =]+(\d+)\b", "token_budget", int),
    (r"--max-num-seqs[ =]+(\d+)\b", "max_seqs", int),
    (r"--max-running-requests[ =]+(\d+)\b", "max_seqs", int),
    (r"--gpu-memory-utilization[ =]+([\d.]+\d)\b", "gpu_memory_utilization", float),
    (r"--mem-frac(?:tion-static)?[ =]+([\d.]+\d)\b", "gpu_memory_utilization", float),
    (r"--max_batch_size[ =]+(\d+)\b", "max_seqs", int),  # trtllm-build: the engine's in-flight batch cap
    (r"--max_num_tokens[ =]+(\d+)\b", "token_budget", int),  # trtllm-build: tokens per in-flight step
)


def engine_flags(row: Row) -> dict:
    """Scheduler settings the row's engine command states (:data:`_FLAGS`)."""
    import re

    text = row.engine_version or ""
    out = {}
    for pat, key, kind in _FLAGS:
        m = re.search(pat, text)
        if m:
            out[key] = kind(m.group(1))
    if re.search(r"--max-num-seqs\s*=\s*num(ber of)? prompts", text):  # the whole dataset in one batch
        out["max_seqs"] = row.requests
    if re.search(r"--disable-radix(?:-cache)?\b|--no-enable-prefix-caching", text):  # argparse takes the prefix
        out["prefix_caching"] = False
    elif "--enable-prefix-caching" in text:
        out["prefix_caching"] = True
    return out


def build_dataset(row: Row) -> tuple[float, float] | None:
    """``(ISL, OSL)`` of the dataset a ``trtllm-bench build`` engine was tuned on, where the row's command says
    ``engine built from a ISL/OSL dataset`` (one engine benchmarked on datasets of other lengths keeps the batch and
    token limits its build dataset gave it); None otherwise (each run's own dataset tunes it)."""
    import re

    m = re.search(r"engine built from an? (\d+)/(\d+) dataset", row.engine_version or "")
    return (float(m.group(1)), float(m.group(2))) if m else None


def serves(row: Row) -> bool:
    """Whether the row ran behind the engine's API server (``vllm serve``, ``launch_server``,
    ``benchmark_serving``) rather than its offline entry point: vLLM picks smaller batch limits there."""
    import re

    return bool(re.search(r"\bserve\b|server|benchmark_serving|bench serve", row.engine_version or "", re.I))


def engine_release_key(row: Row) -> str:
    """:func:`engine_version_key`, with the full release the row states where that release is priced by another
    profile than its MAJOR.MINOR (``SGLang v0.5.3`` -> ``sglang@0.5.3``, modelled apart from 0.5.0-0.5.2); the
    profile a row runs on. Tables and the leave-one-engine-version-out folds group by MAJOR.MINOR."""
    from blendsim.sim.engines import release, resolve_version

    key = engine_version_key(row)
    name, _, minor = key.partition("@")
    full = release(_stated_version(row)) if minor else None
    if not full or full == minor or not full.startswith(minor + "."):
        return key
    return f"{name}@{full}" if resolve_version(name, full) is not resolve_version(name, minor) else key


def row_engine_key(row: Row) -> str:
    """The ``--engine`` key a row runs on: its engine at its release (:func:`engine_release_key`), behind the engine's
    API server (``:serve=1``) where its command says so (:func:`serves`)."""
    key = engine_release_key(row)
    opts = ((["serve=1"] if serves(row) else []) + (["async_scheduling=1"] if asynchronous(row) else [])
            + (["attn_dp=1"] if attention_dp(row) and _attn_dp_modelled(row, key) else []))
    return f"{key}:{','.join(opts)}" if opts else key


def _attn_dp_modelled(row: Row, key: str) -> bool:
    """Whether the row's release has its attention data parallelism modelled (``EngineProfile.attn_dp_since``); an
    older release's row runs with attention split, as its profile says why."""
    from blendsim.sim.engines import attn_dp_modelled, get_profile

    try:
        prof = get_profile(key, {})
    except UserError:
        return True  # the row is refused further on, with its own message
    return attn_dp_modelled(prof, _stated_version(row))


def attention_dp(row: Row) -> bool:
    """Whether the row's command runs attention data-parallel over the TP group: TensorRT-LLM's ``enable_attention_dp:
    true``, or SGLang's ``--enable-dp-attention`` -- with ``--dp``/``--dp-size`` equal to the TP degree from 0.4.4 on
    (sgl-project/sglang PR #4390: "Now you need to explicitly specify --dp and --tp"; its server_args turn the flag off
    at a data-parallel size of 1), on its own before (it set the size to the TP degree). Attention DP over fewer GPUs
    than the TP group is not modelled and runs split."""
    import re

    text = row.engine_version or ""
    if re.search(r"enable_attention_dp\s*[:=]\s*true", text, re.I):
        return True
    if not re.search(r"--enable-dp-attention\b", text):
        return False
    dp = re.search(r"--dp(?:-size)?[ =]+(\d+)\b", text)
    if dp:
        return int(dp.group(1)) == row.tp
    from blendsim.sim.engines import SGLANG_ATTN_DP_SINCE, version_order

    version = _stated_version(row)
    return bool(version) and version_order(version) < version_order(SGLANG_ATTN_DP_SINCE)


def _stated_version(row: Row) -> str:
    """The full release the row's ``engine_version`` states (:func:`_version_after_name`: ``0.4.1``), or ""."""
    m = _version_after_name(row.engine, row.engine_version or "")
    return m.group(1) if m else ""


def asynchronous(row: Row) -> bool:
    """Whether the row's command turns on the engine's opt-in asynchronous scheduler (vLLM's
    ``--async-scheduling``)."""
    import re

    return re.search(r"--async[-_]scheduling\b", row.engine_version or "") is not None


def engine_settings(row: Row, profile, hardware) -> dict:
    """The row's scheduler settings: the profile's on its hardware and entry point, then its stated flags; where the
    profile's budget follows the context length (``EngineProfile.budget_from_context``: vLLM V0) and the command
    states ``--max-model-len L`` (up to 32,768, above which V0 chunks its prefills) but no budget, max(L, 2048)."""
    import re

    flags = engine_flags(row)
    m = re.search(r"--max[-_]model[-_]len[ =]+(\d+)\b", row.engine_version or "")
    if profile.budget_from_context and m and int(m.group(1)) <= 32768 and "token_budget" not in flags:
        flags["token_budget"] = max(int(m.group(1)), 2048)
    out = {**profile.scheduler_for(hardware, serves(row), tp=row.tp, pp=row.pp), **flags}
    cap = client_concurrency(row)
    if cap is not None:  # the client never has more in flight; the engine's own cap may be lower
        out["max_seqs"] = min(out.get("max_seqs") or cap, cap)
    return out


def client_concurrency(row: Row) -> int | None:
    """The benchmark client's cap on requests in flight the row's command states (``--max-concurrency N``, vLLM's
    ``bench serve`` and sglang's ``bench_serving``; ``--concurrency N``, ``trtllm-bench throughput``), else None."""
    m = re.search(r"--(?:max[-_])?concurrency[ =]+(\d+)\b", row.engine_version or "")
    return max(1, int(m.group(1))) if m else None


# ---- workloads ----------------------------------------------------------------------------
def build_workload(row: Row):
    """The row's Trace (every request at t=0). UserError for a workload that cannot be built."""
    kind, _, spec = row.workload.partition(":")
    if kind == "const":
        return _const(row, spec)
    if kind == "random":
        return _random(row, spec)
    if kind == "file":
        return _file(row, spec)
    if kind == "synth":
        return _synth(row, spec)
    raise _bad(row, f"{row.workload!r} is not const:ISL/OSL, random:ISL/OSL?range_ratio=R, file:PATH or "
                    f"synth:RECIPE?...")


def _bad(row: Row, what: str) -> UserError:
    return UserError(f"row {row.line} (id {row.id}), field 'workload': {what}")


def _const_lengths(row: Row, spec: str) -> tuple[int, int]:
    """``const:ISL/OSL``'s lengths (UserError naming the row for a malformed or out-of-range one)."""
    try:
        isl, osl = (int(x) for x in spec.split("/"))
    except ValueError:
        raise _bad(row, f"const:{spec!r} is not const:ISL/OSL") from None
    if not (1 <= isl <= MAX_TOKENS and 1 <= osl <= MAX_TOKENS):
        raise _bad(row, f"ISL and OSL must be in 1..{MAX_TOKENS:,} (MAX_TOKENS), got const:{spec}")
    return isl, osl


def _const(row: Row, spec: str):
    from blendsim.workloads.trace import unique_prompts

    isl, osl = _const_lengths(row, spec)
    n = row.requests
    return unique_prompts(np.full(n, isl, dtype=np.int64), np.full(n, osl, dtype=np.int64))


def _random_options(row: Row, spec: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """The prompt and output length ranges ``((lo, hi), (lo, hi))``, ends included, of a
    ``random:ISL/OSL[?range_ratio=R]`` workload (UserError for a malformed one)."""
    head, opts = _query(row, spec)
    if not re.fullmatch(r"\d+/\d+", head):
        raise _bad(row, f"random:{spec!r} is not random:ISL/OSL[?range_ratio=R] (two whole numbers)")
    isl, osl = (int(x) for x in head.split("/"))
    unknown = set(opts) - {"range_ratio"}
    if unknown:
        raise _bad(row, f"unknown random option(s) {', '.join(sorted(unknown))}; use range_ratio")
    try:
        r = float(opts.get("range_ratio", "0"))
    except ValueError:
        r = -1.0
    if not 0 <= r < 1:  # also rejects nan
        raise _bad(row, f"option range_ratio={opts.get('range_ratio')!r} must be a number in [0, 1)")
    ranges = tuple((int(x * (1 - r)), int(x * (1 + r))) for x in (isl, osl))
    if min(lo for lo, _ in ranges) < 1 or max(hi for _, hi in ranges) > MAX_TOKENS:
        (pl, ph), (ol, oh) = ranges
        raise _bad(row, f"random:{spec}: every length must be in 1..{MAX_TOKENS:,} (MAX_TOKENS), "
                        f"got [{pl}, {ph}] / [{ol}, {oh}]")
    return ranges


def _random(row: Row, spec: str):
    """Uniform lengths as vLLM's random dataset draws them (``_random_options``), from a fixed seed."""
    from blendsim.workloads.trace import unique_prompts

    rng = np.random.default_rng(0)  # fixed: the same row gives the same lengths
    p, d = (rng.integers(lo, hi + 1, size=row.requests).astype(np.int64) for lo, hi in _random_options(row, spec))
    return unique_prompts(p, d)


def _query(row: Row, spec: str) -> tuple[str, dict]:
    head, _, q = spec.partition("?")
    try:
        pairs = parse_qsl(q, keep_blank_values=True, strict_parsing=bool(q))
    except ValueError:
        raise _bad(row, f"cannot parse options {q!r} (key=value&key=value)") from None
    opts: dict = {}
    for k, v in pairs:
        if k in opts:  # which one was meant? (--opt and --recipe-opt refuse this too)
            raise _bad(row, f"option {k} is given twice ({k}={opts[k]} and {k}={v})")
        opts[k] = v
    return head, opts


# a file workload's options (see _file): integers, a prompt scale, and LO-HI length ranges; those after the
# filters (scaling, cutting, drawing lengths) apply to length CSVs only
_FILE_INTS = ("min_len", "max_prompt", "max_total", "mean_prompt", "mean_output")
_FILE_RANGES = ("cap_prompt", "output")
_FILE_OPTIONS = (*_FILE_INTS, "prompt_scale", *_FILE_RANGES)
_CSV_ONLY = ("mean_prompt", "mean_output", "prompt_scale", *_FILE_RANGES)


def _file(row: Row, spec: str):
    rel, lim = _file_options(row, spec)
    path = data_path(row.folder, rel)
    if path is None:  # not malformed: the data file (e.g. a ShareGPT sample blendsim may not ship) is elsewhere
        raise Skip(f"row {row.line} (id {row.id}), field 'workload': file {row.folder / rel} does not exist (nor in "
                   f"$BLENDSIM_DATA: {os.environ.get('BLENDSIM_DATA') or 'unset'})")
    return _file_body(row, path, lim)


def _file_options(row: Row, spec: str) -> tuple[str, dict]:
    """A file workload's path and options, checked without reading the file (UserError for a malformed one)."""
    rel, opts = _query(row, spec)
    unknown = set(opts) - set(_FILE_OPTIONS)
    if unknown:
        raise _bad(row, f"unknown file option(s) {', '.join(sorted(unknown))}; use {', '.join(_FILE_OPTIONS)}")
    lim = {}
    for k, v in opts.items():
        if k in _FILE_RANGES:
            lim[k] = _length_range(row, k, v)
            continue
        if k == "prompt_scale":
            try:
                lim[k] = float(v)
            except ValueError:
                lim[k] = 0.0
            if not 0 < lim[k] <= 100:  # also rejects nan and inf
                raise _bad(row, f"option prompt_scale={v!r} must be a number in (0, 100]")
            continue
        try:
            lim[k] = int(v)
        except ValueError:
            raise _bad(row, f"option {k}={v!r} is not an integer") from None
        if k.startswith("mean_") and lim[k] < 1:
            raise _bad(row, f"option {k}={v!r} must be >= 1")
    if "prompt_scale" in lim and "mean_prompt" in lim:
        raise _bad(row, "use one of prompt_scale and mean_prompt")
    if Path(rel).suffix in (".parquet", ".jsonl") and set(lim) & set(_CSV_ONLY):
        raise _bad(row, f"{'/'.join(_CSV_ONLY)} apply to length CSVs only")
    return rel, lim


def _file_body(row: Row, path: Path, lim: dict):
    if path.suffix == ".parquet":
        from blendsim.workloads.trace import read_trace

        t = read_trace(path)
        p, d = t.input_len, t.output_len
        keep = _keep(p, d, lim)
        idx = np.flatnonzero(keep)[:row.requests]
        if len(idx) < row.requests:
            raise _bad(row, f"{path} has {len(idx)} usable requests, fewer than requests={row.requests}")
        return t.take(idx).offline()
    if path.suffix == ".jsonl":
        from blendsim.workloads.loaders import load

        t = load(path, "jsonl")
        idx = np.flatnonzero(_keep(t.input_len, t.output_len, lim))[:row.requests]
        if len(idx) < row.requests:
            raise _bad(row, f"{path} has {len(idx)} usable requests, fewer than requests={row.requests}")
        return t.take(idx).offline()
    import pandas as pd

    from blendsim.sim.io import check_csv_aligned

    try:
        df = pd.read_csv(path)
        check_csv_aligned(path, df)
    except (OSError, ValueError, UserError) as e:
        raise _bad(row, f"cannot read {path}: {e}") from None
    cols = {c.lower(): c for c in df.columns}
    pair = next(((cols[a.lower()], cols[b.lower()]) for a, b in _PAIRS if a.lower() in cols and b.lower() in cols),
                None)
    if pair is None:
        raise _bad(row, f"{path}: no prompt/output length columns (e.g. prompt_tokens, output_tokens; "
                        f"has {', '.join(map(str, df.columns))})")
    p = pd.to_numeric(df[pair[0]], errors="coerce").to_numpy()
    d = pd.to_numeric(df[pair[1]], errors="coerce").to_numpy()
    for name, v in ((pair[0], p), (pair[1], d)):
        big = np.flatnonzero(np.isfinite(v) & (v > MAX_TOKENS))
        if len(big):  # cast to int64, it would wrap to a negative length
            raise _bad(row, f"{path}: data row {int(big[0]) + 1}, column {name}: {float(v[big[0]])!r} is over "
                            f"{MAX_TOKENS:,} tokens (MAX_TOKENS)")
    ok = np.isfinite(p) & np.isfinite(d) & (p >= 1) & (d >= 1) & _keep(np.nan_to_num(p), np.nan_to_num(d), lim)
    idx = np.flatnonzero(ok)[:row.requests]
    if len(idx) < row.requests:
        raise _bad(row, f"{path} has {len(idx)} usable rows, fewer than requests={row.requests}")
    from blendsim.workloads.trace import unique_prompts

    cut_mean = lim.get("mean_prompt") if "cap_prompt" in lim else None  # with a cut, the mean is the cut prompts'
    p = _to_mean(p[idx], None if cut_mean else lim.get("mean_prompt"))
    d = _to_mean(d[idx], lim.get("mean_output"))
    if "prompt_scale" in lim:
        p = _scaled(p, lim["prompt_scale"])
    rng = np.random.default_rng(0)  # fixed: the same row gives the same lengths
    if "cap_prompt" in lim:  # the prompt cut at a length drawn uniformly from LO..HI (it is kept whole if shorter)
        cut = rng.integers(lim["cap_prompt"][0], lim["cap_prompt"][1] + 1, size=len(p))
        if cut_mean:
            p = _scaled(p, _scale_for_cut_mean(row, p, cut, cut_mean))
        p = np.minimum(p, cut)
    if "output" in lim:  # outputs drawn uniformly from LO..HI (the benchmark's ignore_eos lengths)
        d = rng.integers(lim["output"][0], lim["output"][1] + 1, size=len(d)).astype(np.int64)
    return unique_prompts(p, d)



def _length_range(row: Row, key: str, text: str) -> tuple[int, int]:
    """``LO-HI`` token lengths, 1 <= LO <= HI <= MAX_TOKENS."""
    try:
        lo, hi = (int(x) for x in text.split("-"))
    except ValueError:
        raise _bad(row, f"option {key}={text!r} is not LO-HI (two integers, e.g. 512-1024)") from None
    if not 1 <= lo <= hi <= MAX_TOKENS:
        raise _bad(row, f"option {key}={text!r} needs 1 <= LO <= HI <= {MAX_TOKENS:,} (MAX_TOKENS)")
    return lo, hi


def _scaled(p: np.ndarray, scale: float) -> np.ndarray:
    return np.maximum(np.rint(p * scale), 1).astype(np.int64)


def _scale_for_cut_mean(row: Row, p: np.ndarray, cut: np.ndarray, mean: int) -> float:
    """The prompt scale (in (0, 100]) whose scaled prompts, cut at ``cut``, average ``mean`` tokens: a source that
    states the mean of the prompts it sent after the cut (sglang's July 2024 random dataset) fixes the scale of the
    stand-in lengths that way. Bisection on a mean that never falls as the scale grows; deterministic."""
    def cut_mean(s: float) -> float:
        return float(np.minimum(_scaled(p, s), cut).mean())

    lo, hi = 1e-6, 100.0
    if cut_mean(hi) < mean - 0.5:
        raise _bad(row, f"mean_prompt={mean} is more than prompts cut at cap_prompt can average "
                        f"({cut_mean(hi):.0f} at prompt scale 100)")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cut_mean(mid) < mean else (lo, mid)
    return hi


def _to_mean(x: np.ndarray, mean: int | None) -> np.ndarray:
    """Lengths ``x`` scaled so their mean is ``mean`` (rounded, at least 1); unchanged without one."""
    x = np.asarray(x, dtype=np.float64)
    if mean is not None:
        x = np.maximum(np.rint(x * (mean / x.mean())), 1.0)
    return x.astype(np.int64)


def data_path(folder: Path, rel: str) -> Path | None:
    """``rel`` next to the catalogue, else in a ``$BLENDSIM_DATA`` folder; None when in neither."""
    path = Path(rel)
    if path.is_absolute():
        return path if path.exists() else None
    for base in [folder, *(Path(d) for d in os.environ.get("BLENDSIM_DATA", "").split(os.pathsep) if d)]:
        if (base / rel).exists():
            return base / rel
    return None


def _keep(p, d, lim: dict):
    keep = np.ones(len(p), dtype=bool)
    if "min_len" in lim:
        keep &= (p >= lim["min_len"]) & (d >= lim["min_len"])
    if "max_prompt" in lim:
        keep &= p <= lim["max_prompt"]
    if "max_total" in lim:
        keep &= p + d <= lim["max_total"]
    return keep


def _synth(row: Row, spec: str):
    recipe, kw = _synth_options(row, spec)
    return recipe.make(**kw).offline()


def _synth_options(row: Row, spec: str):
    """A synth workload's recipe and its options, checked without building it (UserError for a malformed one)."""
    from blendsim.workloads.recipes import get_recipe

    name, opts = _query(row, spec)
    try:
        recipe = get_recipe(name)
    except UserError as e:
        raise _bad(row, str(e)) from None
    hints = typing.get_type_hints(recipe.options)
    fields = {f.name for f in dataclasses.fields(recipe.options)}
    kw = {}
    for k, v in opts.items():
        if k not in fields:
            raise _bad(row, f"recipe {name} has no option {k!r}; options are {', '.join(sorted(fields))}")
        typ = hints[k]
        try:
            kw[k] = (v.lower() in ("1", "true", "yes")) if typ is bool else typ(v)
        except (TypeError, ValueError):
            raise _bad(row, f"recipe option {k}={v!r} is not a {getattr(typ, '__name__', typ)}") from None
    if "requests" in fields and "requests" not in kw:
        kw["requests"] = row.requests
    missing = sorted(f.name for f in dataclasses.fields(recipe.options)
                     if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in kw)
    if missing:
        raise _bad(row, f"recipe {name} needs option(s) {', '.join(missing)} (synth:{name}?{missing[0]}=...)")
    try:  # the recipe's own checks of the values, named as the row gives them (density, not --density)
        recipe.options(**kw)
    except UserError as e:
        msg = str(e)
        for k in kw:
            msg = msg.replace(f"--{k.replace('_', '-')} ", f"recipe option {k} ", 1)
        raise _bad(row, msg) from None
    return recipe, kw


__all__ = ["COLUMNS", "MAX_GPUS", "MAX_REQUESTS", "METRICS", "Row", "SCOPES", "Skip", "build_workload", "client_concurrency",
           "engine_release_key", "engine_version_key", "read_catalogue", "row_engine_key", "serves"]
