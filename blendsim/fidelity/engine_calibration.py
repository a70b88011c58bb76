"""``blendsim calibrate engine``: fit one engine's free parameters to your own benchmark runs.

Results it reads (one measurement per run; the format is told by the file's content, never its name: the whole
text as one JSON value, else one JSON value per line, each read by its keys; other text is a catalogue CSV):

* vLLM ``bench throughput --output-json`` (``elapsed_time``, ``num_requests``, ``total_num_tokens``, ...): the JSON
  does not record how the tokens split into prompt and output, so the run's workload (``const:ISL/OSL``, the
  ``--input-len``/``--output-len`` of the run) is required: ``--workload`` for every file, or ``FILE=WORKLOAD``
  for one file (``a.json=const:1024/128 b.json=const:512/512``: runs of different lengths in one command); its
  total is checked against ``total_num_tokens``;
* SGLang ``bench_offline_throughput --result-filename`` JSONL (``successful_requests``, ``total_latency``,
  ``total_input_tokens``, ``total_output_tokens``, ...): one run per line, workload = the mean lengths unless
  ``--workload`` is given;
* ``trtllm-bench throughput --report_json`` (``request_info``: ``num_requests``, ``avg_input_length``,
  ``avg_output_length``; ``performance``: ``system_output_throughput_tok_s``; ``world_info``: ``tp_size``,
  ``max_batch_size``, ``max_num_tokens``): workload = the mean lengths, run under the report's batch and token
  limits (as a catalogue row's ``--max_batch_size`` / ``--max_num_tokens``); a ``trtllm-bench latency`` report
  (``max_batch_size`` 1) and a run whose client capped the requests in flight (``--concurrency``, seen in
  ``avg_num_concurrent_requests``) are refused: blendsim prices a report's requests all queued at once;
* a fidelity catalogue CSV: its rows of ``--engine`` (and ``--hardware``).

The fit is :func:`blendsim.fidelity.fit.fit` -- the same least squares, bounds and prior as ``fidelity
--refit`` -- restricted to the parameters this engine on this GPU owns: its per-step overhead (``fixed_s``,
``per_seq_s``), the GPU's efficiencies (``gemm_eff``, ``mem_eff``, ``attn_mem_eff``) and, for an overlapping
engine, its interference ``kappa``; every other parameter stays at the shipped value. The output is a complete
parameters file (the shipped one with the fitted values in place) plus a ``profile`` header, so
``fidelity --params-file`` and ``--engine FILE.json`` read it as they read ``sim/engine_params.json``.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import re
from pathlib import Path

import numpy as np

from blendsim.sim.engines import PROFILE_KIND, modelled_profile  # one name for the header kind
from blendsim.sim.errors import UserError
from blendsim.sim.io import atomic_path, check_output_file, check_own_file, json_value

from .catalogue import Row, engine_release_key, engine_version_key, read_catalogue

OVERHEAD = ("fixed_s", "per_seq_s")


@dataclasses.dataclass(frozen=True)
class Setup:
    """What the result files do not say: the engine, GPU, model and precision of the runs."""

    engine: str
    version: str
    hardware: str
    model: str | None
    tp: int | None  # None: not given (a report's own, else 1)
    weights: str  # "": not given (what a trtllm-bench report's quantization states, else bf16)
    kv_dtype: str  # "": not given (the model's 16-bit KV, or what a trtllm-bench report states)
    workload: str | None
    workload_of: str = ""  # the results argument FILE=WORKLOAD that gave ``workload`` ("": --workload)


# a results argument FILE=WORKLOAD: the file, then a workload of a kind catalogue.build_workload reads (the first
# '=' before one: a workload's own options hold '=' too, random:1024/128?range_ratio=0.5)
_FILE_WORKLOAD = re.compile(r"^(.+?)=((?:const|random|file|synth):.+)$", re.S)


def split_result(arg: str | Path, setup: Setup) -> tuple[Path, Setup]:
    """A results argument as (file, setup): ``FILE=WORKLOAD`` gives that file its own workload in place of
    ``--workload``; a plain FILE (or a file whose name holds '=') keeps the command's."""
    text = str(arg)
    m = _FILE_WORKLOAD.match(text)
    if m is None or Path(text).exists():
        return Path(text), setup
    return Path(m.group(1)), dataclasses.replace(setup, workload=m.group(2), workload_of=text)


def _given(setup: Setup) -> str:
    """How the run's workload was given, for messages: ``--workload W`` or ``FILE=W``."""
    return setup.workload_of or f"--workload {setup.workload}"


def split_engine(spec: str) -> tuple[str, str]:
    """``NAME[@VERSION]`` -> (name, version), the version as its release (``v0.6`` -> ``0.6``); one line for a
    bad version, an engine or version that is not modelled, or overrides (the fit sets the loop, and a profile
    file takes none)."""
    from blendsim.sim.engines import get_profile, parse_key

    spec = str(spec).strip()
    if ":" in spec or "=" in spec:
        raise UserError(f"--engine {spec!r}: give NAME or NAME@VERSION of the engine that ran the benchmarks, "
                        f"without :field=value overrides (the fit sets the engine's loop; the profile it "
                        f"writes takes none)")
    if spec.lower().endswith(".json"):
        raise UserError(f"--engine {spec!r}: give NAME or NAME@VERSION of the engine that ran the benchmarks, "
                        f"not a profile file")
    k = parse_key(spec)  # a bad version or a name missing before '@': one line
    get_profile(spec, {})  # an unknown engine, or a version older than every modelled one: one line
    return k.name, k.version


def read_results(paths: list, setup: Setup, notes: list | None = None) -> list[Row]:
    """Every measurement in ``paths`` (files, or ``FILE=WORKLOAD``: :func:`split_result`) as a catalogue Row
    (UserError naming the file for anything unreadable); a catalogue's rows of the engine left out (another GPU,
    another modelled version) are counted in ``notes``."""
    rows: list[Row] = []
    command = setup
    for arg in paths:
        path, setup = split_result(arg, command)
        if not path.exists():
            raise UserError(f"{path}: no such results file")
        try:
            text = path.read_text(encoding="utf-8-sig")  # a byte-order mark allowed, as for a catalogue CSV
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: cannot read: {e}") from None
        if _is_catalogue(path, text):
            if setup.workload_of:
                raise UserError(f"{setup.workload_of}: a catalogue CSV's rows state their own workloads; give the "
                                f"file alone")
            rows += _catalogue_rows(path, setup, notes)
            continue
        objs = _objects(path, text)
        rows += [_measurement(path, line, obj, setup, len(objs)) for line, obj in objs]
    if not rows:
        raise UserError("no measurements in the given results")
    if notes is not None:
        notes += _same_runs(rows)
    rows = _distinct_ids(rows)
    dup = sorted(_repeated(rows))
    if dup:
        more = f" and {len(dup) - 5} more" if len(dup) > 5 else ""
        files = sorted({r.source for r in rows if r.id in dup and _is_file(r.source)})  # not a row's citation
        where = f" (in {', '.join(files[:3])})" if files else ""
        raise UserError(f"measurement id(s) {', '.join(dup[:5])}{more} appear twice{where}: a results file given "
                        f"twice, or a catalogue row repeating one")
    return rows


def _is_catalogue(path: Path, text: str) -> bool:
    """Whether a results file is a catalogue CSV: not JSON (which opens with '{' or '['), and named .csv or headed by
    the catalogue's columns."""
    if text.lstrip().startswith(("{", "[")):
        return False
    head = {c.strip() for c in (text.splitlines() or [""])[0].split(",")}
    return path.suffix.lower() == ".csv" or {"id", "engine", "workload", "value"} <= head


def _catalogue_rows(path: Path, setup: Setup, notes: list | None) -> list[Row]:
    """A catalogue's rows of the engine and version being calibrated, on ``setup.hardware`` (the others counted in
    ``notes``)."""
    every = [r for r in read_catalogue(path) if r.engine == setup.engine]
    got = [r for r in every if not setup.hardware or r.hardware == setup.hardware]
    if not got:
        raise UserError(f"{path}: no catalogue row of engine {setup.engine!r} on {setup.hardware!r}")
    # only the rows of the version being calibrated: another version's loop is another profile
    asked = f"{setup.engine}@{setup.version}" if setup.version else setup.engine
    want = modelled_profile(asked)
    mine = [r for r in got if modelled_profile(engine_release_key(r)) == want]
    if not mine:
        have = sorted({engine_version_key(r) for r in got})
        what = asked if want == asked else f"{asked} (modelled by {want})"
        raise UserError(f"{path}: no catalogue row of {what} on {setup.hardware!r} (its rows of "
                        f"{setup.engine} are of {', '.join(have)}); give --engine NAME@VERSION of one of them")
    # the rows left out, each counted once: this version's on other GPUs (another run calibrates them), then every
    # other version's, whatever its GPU (review of 1 Dec 2026, second: "75 on other GPUs" counted every version's)
    other_hw = sum(bool(setup.hardware) and r.hardware != setup.hardware
                   and modelled_profile(engine_release_key(r)) == want for r in every)
    other_ver = len(every) - len(mine) - other_hw
    if notes is not None and (other_hw or other_ver):
        left = ([f"{other_hw} of {want} on other GPUs (a calibration fits one GPU: run it again with their "
                 f"--hardware)"] if other_hw else []) + \
               ([f"{other_ver} of other {setup.engine} versions"] if other_ver else [])
        notes.append(f"{path}: {len(mine)} row(s) of {asked} on {setup.hardware} taken; left out: " + "; ".join(left))
    return mine


def _objects(path: Path, text: str) -> list[tuple[int | None, object]]:
    """The JSON values of a results file, by its content whatever its name: the whole text as one value (line None),
    else -- where JSON reports extra data after the first -- one value per non-blank line (line numbers from 1), as
    SGLang's bench_offline_throughput appends a line per run to its --result-filename."""
    from blendsim.sim.io import DuplicateKey, loads_strict

    try:
        return [(None, loads_strict(text))]
    except json.JSONDecodeError as e:
        if e.msg != "Extra data":
            raise UserError(f"{path}: not JSON: {e.msg}") from None
    except DuplicateKey as e:
        raise UserError(f"{path}: {e}") from None
    return [(i + 1, _json(path, line, i + 1)) for i, line in enumerate(text.splitlines()) if line.strip()]


def _measurement(path: Path, line: int | None, obj, setup: Setup, count: int) -> Row:
    """One JSON value of a results file as a Row, its reader chosen by its keys; one line naming another tool's result
    (and what calibrate reads instead) or an unknown one."""
    where = f"{path}: line {line}" if line else str(path)
    if isinstance(obj, list) and obj and all(isinstance(x, dict) and "benchmark" in x and "metric" in x for x in obj):
        raise UserError(f"{where}: vLLM's PyTorch-benchmark-format copy of a result (NAME.pytorch.json, written beside "
                        f"it when SAVE_TO_PYTORCH_BENCHMARK_FORMAT is set): give the plain --output-json file")
    if not isinstance(obj, dict):
        raise UserError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "successful_requests" in obj:
        _engine_is(path, "sglang", "an SGLang bench_offline_throughput result", setup)
        return _sglang(path, line or 1, obj, setup)
    if "performance" in obj and "request_info" in obj:
        kind, engine, read = "a trtllm-bench report", "trtllm", _trtllm
    elif "elapsed_time" in obj and "num_requests" in obj:
        kind, engine, read = "a vLLM bench throughput result", "vllm", _vllm
    else:
        other = _foreign(obj)
        if other:
            raise UserError(f"{where}: {other}")
        many = f" (one of {count} JSON lines: an SGLang bench_offline_throughput result file?)" if line else ""
        raise UserError(f"{where}: not a vLLM 'bench throughput' JSON, an SGLang bench_offline_throughput "
                        f"result or a trtllm-bench report (no elapsed_time/num_requests, successful_requests "
                        f"or performance/request_info keys){many}")
    if line:
        raise UserError(f"{where}: {kind}, one of {count} JSON lines: give each such result in a file of its own")
    _engine_is(path, engine, kind, setup)
    return read(path, obj, setup)


def _foreign(obj: dict) -> str | None:
    """Another benchmark tool's result, named with what calibrate engine reads instead; None when not recognised.
    vLLM's ``bench serve`` (benchmark_serving.py) and SGLang's ``bench_serving`` write ``completed`` and
    ``duration``; vLLM's adds ``total_token_throughput`` (and ``model_id``), SGLang's ``input_throughput``."""
    if "completed" not in obj or "duration" not in obj:
        return None
    if "total_token_throughput" in obj or "model_id" in obj:
        return ("a vLLM bench serve result (completed, duration, total_token_throughput): calibrate engine reads "
                "vLLM's offline bench throughput --output-json file")
    if "input_throughput" in obj:
        return ("an SGLang bench_serving result (completed, duration, input_throughput): calibrate engine reads "
                "SGLang's offline bench_offline_throughput --result-filename file")
    return ("a serving benchmark's result (completed, duration: vLLM bench serve or SGLang bench_serving): calibrate "
            "engine reads offline runs, vLLM bench throughput --output-json or SGLang bench_offline_throughput")


def _engine_is(path: Path, engine: str, what: str, setup: Setup) -> None:
    """One line where a benchmark tool's result is given for another engine's calibration."""
    if setup.engine.removesuffix("-v0") != engine:
        raise UserError(f"{path}: {what}, but --engine {setup.engine}"
                        + (f"@{setup.version}" if setup.version else "") + f": calibrate {engine} with it")


def _same_runs(rows: list) -> list[str]:
    """A note for measurements identical in every figure (a results file copied under another name, a JSONL line
    appended twice): each is fitted as a run of its own, so such a run weighs double."""
    from collections import defaultdict

    seen = defaultdict(list)
    for r in rows:
        seen[(r.workload, r.requests, r.metric, r.value, r.tp, r.weights, r.kv_dtype)].append(r.id)
    return [f"measurements {', '.join(ids[:3])}{' ...' if len(ids) > 3 else ''} are identical in every figure "
            f"(one run given {len(ids)} times?); each is fitted as a run of its own"
            for ids in seen.values() if len(ids) > 1]


def _json(path: Path, text: str, line: int | None):
    from blendsim.sim.io import DuplicateKey, loads_strict

    where = f"{path}: line {line}" if line else str(path)
    try:
        return loads_strict(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: not JSON: {e.msg}") from None
    except DuplicateKey as e:
        raise UserError(f"{where}: {e}") from None


def _num(path: Path, obj: dict, *keys: str, where: str = "") -> float:
    for k in keys:
        v = obj.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v > 0:
            return float(v)
    raise UserError(f"{path}{where}: field {keys[0]!r} missing or not a positive number")


def _count(path: Path, obj: dict, key: str, where: str = "") -> int:
    """A request count: a whole number from 1 to the catalogue's MAX_REQUESTS (UserError naming file and field)."""
    from .catalogue import MAX_REQUESTS

    v = _num(path, obj, key, where=where)
    if v != int(v) or v > MAX_REQUESTS:
        raise UserError(f"{path}{where}: field {key!r} is {v:g}: expected a whole number of requests from 1 to "
                        f"{MAX_REQUESTS:,}")
    return int(v)


def _repeated(rows: list) -> set:
    """The ids more than one row has."""
    from collections import Counter

    return {i for i, n in Counter(r.id for r in rows).items() if n > 1}


def _is_file(text: str) -> bool:
    """Whether a row's source is a file (a results file's row names its path; a catalogue row, a citation)."""
    try:
        return Path(text).is_file()
    except (OSError, ValueError):  # a citation too long or odd for a path
        return False


def _distinct_ids(rows: list) -> list:
    """Rows whose ids (a result file's name) repeat across folders -- r1/result.json, r2/result.json, the usual
    layout of benchmark outputs -- take their path under the files' common folder instead."""
    import os

    twice = _repeated(rows)
    files = [Path(r.source) for r in rows if r.id in twice and _is_file(r.source)]
    if not files:
        return rows
    base = Path(os.path.commonpath([str(f.resolve().parent) for f in files]))

    def qualified(r):
        f = Path(r.source)
        if r.id not in twice or not _is_file(r.source) or not r.id.startswith(f.stem):
            return r
        return dataclasses.replace(r, id=f.resolve().with_suffix("").relative_to(base).as_posix() + r.id[len(f.stem):])

    return [qualified(r) for r in rows]


def _row(path: Path, n: int, setup: Setup, rid: str, workload: str, requests: int, metric: str, value: float,
         tp: int | None = None, note: str = "", pp: int = 1, ep: int = 1, weights: str | None = None,
         kv_dtype: str | None = None, flags: str = "") -> Row:
    """The measurement as a catalogue row; ``flags``: engine flags the run stated (``--max_batch_size 2048``), written
    after the version in ``engine_version`` as a catalogue row's command states them (catalogue.engine_flags)."""
    if not setup.model:
        raise UserError(f"{path}: give --model (a preset or a config.json) for benchmark result files")
    tp = tp or setup.tp or 1
    return Row(id=rid, source=str(path), model=setup.model, hardware=setup.hardware, gpus=tp * pp, tp=tp, pp=pp, ep=ep,
               weights=weights or setup.weights or "bf16", kv_dtype=setup.kv_dtype if kv_dtype is None else kv_dtype,
               engine=setup.engine, engine_version=f"{setup.version} {flags}".strip(),
               policy="", workload=workload, requests=requests, metric=metric, scope="system", value=value,
               note=note, folder=Path.cwd(), line=n)


def _workload_means(setup: Setup, requests: int, where: str) -> tuple[float, float]:
    """The mean prompt and output lengths of the workload given (``--workload``, ``FILE=WORKLOAD``) for ``requests`` requests (the trace a run of it would
    simulate)."""
    from .catalogue import Skip, build_workload

    row = Row(id="--workload", source="", model=setup.model or "", hardware=setup.hardware, gpus=1, tp=1, pp=1, ep=1,
              weights="", kv_dtype="", engine=setup.engine, engine_version="", policy="", workload=setup.workload,
              requests=requests, metric="output_tok_s", scope="system", value=1.0, note="", folder=Path.cwd(), line=0)
    try:
        t = build_workload(row)
    except (UserError, Skip) as e:  # Skip: a file: workload whose file is absent (a row is skipped; this is an input)
        raise UserError(f"{_given(setup)}: {str(e).split(': ', 1)[-1]}") from None
    return float(t.input_len.mean()), float(t.output_len.mean())


def _const(path: Path, setup: Setup, isl: float, osl: float, requests: int, where: str = "") -> str:
    """The run's workload: the file's mean lengths, or the one given (``--workload``, ``FILE=WORKLOAD``) where its
    means agree with them (5%)."""
    if setup.workload:
        mi, mo = _workload_means(setup, requests, where)
        if abs(mi / isl - 1) > 0.05 or abs(mo / osl - 1) > 0.05:
            raise UserError(f"{path}{where}: {_given(setup)} has mean lengths {mi:,.0f}/{mo:,.0f}, the file "
                            f"records {isl:,.0f}/{osl:,.0f} (more than 5% apart): drop the workload to use the "
                            f"file's own lengths, or give this run's")
        return setup.workload
    return f"const:{max(1, round(isl))}/{max(1, round(osl))}"


def _vllm(path: Path, obj: dict, setup: Setup) -> Row:
    n = _count(path, obj, "num_requests")
    elapsed = _num(path, obj, "elapsed_time")
    total = _num(path, obj, "total_num_tokens")
    # the rates vLLM writes beside the counts must agree with them: otherwise the file was edited or mixes two runs
    for key, derived, of in (("tokens_per_second", total / elapsed, "total_num_tokens / elapsed_time"),
                             ("requests_per_second", n / elapsed, "num_requests / elapsed_time")):
        if key in obj:
            v = _num(path, obj, key)
            if abs(v / derived - 1) > 0.05:
                raise UserError(f"{path}: field {key!r} is {v:,.1f}, but {of} is {derived:,.1f} (more than 5% apart): "
                                f"an edited file, or one mixing two runs; give the run's own file")
    if not setup.workload:
        raise UserError(f"{path}: vLLM's bench throughput JSON does not record the prompt/output split; give "
                        f"--workload const:ISL/OSL (the --input-len/--output-len of that run), or {path}=const:ISL/OSL "
                        f"for this file alone")
    mi, mo = _workload_means(setup, n, "")
    if abs(n * (mi + mo) / total - 1) > 0.05:
        raise UserError(f"{path}: {_given(setup)} gives {n * (mi + mo):,.0f} tokens for {n} requests, the JSON's "
                        f"total_num_tokens is {total:,.0f} (more than 5% apart); give each file its run's lengths as "
                        f"FILE=const:ISL/OSL (runs of different lengths in one command), or a catalogue CSV with a "
                        f"row per run (workload const:ISL/OSL, requests, metric total_tok_s, value tokens_per_second); "
                        f"or parallel sampling: from vLLM 0.8, a run with --n above 1 counts every sample's output "
                        f"tokens in total_num_tokens")
    return _row(path, 1, setup, path.stem, setup.workload, n, "total_tok_s", total / elapsed,
                note="vLLM bench throughput: total (prompt + output) tokens / elapsed_time")


def _sglang(path: Path, line: int, obj, setup: Setup) -> Row:
    if not isinstance(obj, dict):
        raise UserError(f"{path}: line {line}: expected a JSON object")
    where = f": line {line}"
    n = _count(path, obj, "successful_requests", where=where)
    lat = _num(path, obj, "total_latency", where=where)
    inp = _num(path, obj, "total_input_tokens", where=where)
    out = _num(path, obj, "total_output_tokens", where=where)
    return _row(path, line, setup, f"{path.stem}-{line}", _const(path, setup, inp / n, out / n, n, where), n,
                "output_tok_s", out / lat, note="SGLang bench_offline_throughput: total_output_tokens / total_latency")


def _section(path: Path, obj: dict, key: str, required: bool = True) -> dict:
    v = obj.get(key)
    if v is None and not required:
        return {}
    if not isinstance(v, dict):
        raise UserError(f"{path}: field {key}: expected an object, got {type(v).__name__}")
    return v


def _degree(path: Path, world: dict, key: str) -> int | None:
    """A parallel degree or limit the report's world_info states (None: not stated); one line for anything but a
    whole number >= 1."""
    v = world.get(key)
    if v is None:
        return None
    if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
        raise UserError(f"{path}: field world_info.{key}: expected a whole number >= 1, got {v!r}")
    return v


# trtllm-bench's engine.quantization / engine.kv_cache_dtype (TensorRT-LLM tensorrt_llm/bench/dataclasses/
# reporting.py, the report's "engine" section) hold TensorRT-LLM's QuantAlgo names (tensorrt_llm/quantization/mode.py);
# None/"None"/NO_QUANT is the model's own 16-bit. The weights' names blendsim models, as its precisions: FP8 whatever
# its scaling (per tensor, per channel and token, DeepSeek's 128x128 blocks: the scales add < 0.01% of the bytes);
# 4-bit floats as fp4, the W4A8 formats too -- their 4-bit weights are what blendsim prices (bytes, and the GEMM at
# the fp4 path's rate: FP4 tensor cores where the GPU has them, else dequantised to 16-bit), not FP8 activations';
# AWQ/GPTQ 4-bit integers as int4 (the layout sim/models.py prices).
_TRT_WEIGHTS = {"FP8": "fp8", "FP8_PER_CHANNEL_PER_TOKEN": "fp8", "FP8_BLOCK_SCALES": "fp8", "NVFP4": "fp4",
                "W4A8_NVFP4_FP8": "fp4", "W4A8_MXFP4_FP8": "fp4", "W4A8_MXFP4_MXFP8": "fp4", "W4A16_MXFP4": "fp4",
                "W4A16_AWQ": "int4", "W4A16_GPTQ": "int4"}
# the KV cache's: FP8 (INT8 and NVFP4 KV caches are not modelled)
_TRT_KV = {"FP8": "fp8"}
# names no TensorRT-LLM report writes there but a hand-made one may: taken, never offered
_ALIASES = {"FP16": "fp16", "BF16": "bf16", "BFLOAT16": "bf16", "FLOAT16": "fp16"}


def _stated(path: Path, field: str, v, given: str, flag: str, names: dict) -> str:
    """The precision a report states (``names``: the TensorRT-LLM names blendsim models there), checked against the one
    given (``given`` "" = not given): the report's."""
    if v is None or str(v).upper() in ("NONE", "", "AUTO", "NO_QUANT"):
        return given
    mine = names.get(str(v).upper()) or _ALIASES.get(str(v).upper())
    if mine is None:
        what = "a KV-cache precision" if names is _TRT_KV else "a precision"
        raise UserError(f"{path}: field {field}: {v!r} is {what} blendsim does not model (it models "
                        f"{', '.join(names)} or none)")
    if given and given not in (mine, "bf16" if mine == "fp16" else mine):
        raise UserError(f"{path}: field {field}: the report says {v}, but {flag} {given}")
    return mine


def _trtllm(path: Path, obj: dict, setup: Setup) -> Row:
    info, perf = _section(path, obj, "request_info"), _section(path, obj, "performance")
    world, eng = _section(path, obj, "world_info", False), _section(path, obj, "engine", False)
    n = _count(path, info, "num_requests", where=" request_info")
    isl = _num(path, info, "avg_input_length", where=" request_info")
    osl = _num(path, info, "avg_output_length", where=" request_info")
    v = _num(path, perf, "system_output_throughput_tok_s", where=" performance")
    tp, pp, ep = (_degree(path, world, k) for k in ("tp_size", "pp_size", "ep_size"))
    mbs, mnt = (_degree(path, world, k) for k in ("max_batch_size", "max_num_tokens"))
    if mbs == 1:
        raise UserError(f"{path}: field world_info.max_batch_size is 1: a trtllm-bench latency report (one request "
                        f"at a time); calibrate engine fits offline throughput runs: give trtllm-bench throughput "
                        f"--report_json reports")
    _check_queued(path, info, world, perf, n, mbs)
    if tp and setup.tp and tp != setup.tp:
        raise UserError(f"{path}: field world_info.tp_size: the report ran TP {tp}, but --tp {setup.tp}")
    version = eng.get("version")
    if isinstance(version, str) and version.strip():
        from blendsim.sim.engines import modelled_profile

        asked = f"trtllm@{setup.version}" if setup.version else "trtllm"
        ran = modelled_profile(f"trtllm@{version.strip()}")
        if ran is not None and ran != modelled_profile(asked):
            raise UserError(f"{path}: field engine.version: the report ran TensorRT-LLM {version.strip()} (modelled by "
                            f"{ran}), but --engine {asked} (modelled by {modelled_profile(asked)})")
    weights = _stated(path, "engine.quantization", eng.get("quantization"), setup.weights, "--weights", _TRT_WEIGHTS)
    kv = _stated(path, "engine.kv_cache_dtype", eng.get("kv_cache_dtype"), setup.kv_dtype, "--kv-dtype", _TRT_KV)
    # the limits the run had (the user's, else the tool's own from the dataset), as a catalogue row's command states them
    flags = " ".join(f"--{k} {v}" for k, v in (("max_batch_size", mbs), ("max_num_tokens", mnt)) if v)
    return _row(path, 1, setup, path.stem, _const(path, setup, isl, osl, n), n, "output_tok_s", v, tp=tp, pp=pp or 1,
                ep=ep or 1, weights=weights, kv_dtype=kv, flags=flags,
                note="trtllm-bench report: performance.system_output_throughput_tok_s")


def _check_queued(path: Path, info: dict, world: dict, perf: dict, n: int, mbs: int | None) -> None:
    """One line for a run whose client capped the requests in flight (``trtllm-bench throughput --concurrency N``): the
    report does not state N, but its ``avg_num_concurrent_requests`` (the requests' summed latencies over the run's,
    tensorrt_llm/bench/dataclasses/statistics.py) stays near it, where a run that queues every request at once -- what
    blendsim prices -- averages about half the requests or more. Requests of very uneven lengths can average less
    with none capped: such a run issued every request at the start, which ``world_info.issue_rate`` (requests over
    the time from the first issue to the last) shows far above the completion rate, so it is taken."""
    conc = info.get("avg_num_concurrent_requests")
    if not _positive(conc) or conc >= min(n, mbs or n) / 2:
        return
    issue, done = world.get("issue_rate"), perf.get("request_throughput_req_s")
    if _positive(issue) and _positive(done) and issue >= 10 * done:  # every request issued at the start
        return
    cap = f" and max_batch_size {mbs:,}" if mbs else ""
    raise UserError(f"{path}: field request_info.avg_num_concurrent_requests is {conc:,.1f} for {n:,} requests{cap}: "
                    f"a run whose client capped the requests in flight (trtllm-bench throughput --concurrency N); "
                    f"calibrate engine prices a report's requests all queued at once, so give this run as a "
                    f"catalogue CSV row whose engine_version states '--concurrency N'")


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and bool(np.isfinite(v)) and v > 0


def owned(engine: str, hardware: str):
    """The predicate of the parameters one engine on one GPU owns."""

    def keep(p) -> bool:
        kind = p.path[0]
        if kind == "engine":  # the engine's overhead, under its name or its version's own key (vllm@0.6)
            return p.path[1].split("@")[0] == engine
        if kind == "hardware":
            return p.path[1] == hardware
        if kind == "arch":  # the GPU's efficiencies are fitted per architecture (blendsim.fidelity.fit)
            from blendsim.sim.hardware import PRESETS

            return hardware in PRESETS and p.path[1] == PRESETS[hardware].arch
        return kind == "regime"  # an overlapping engine's interference (only its rows read it)

    return keep


def calibrate(rows: list[Row], engine: str, hardware: str, base: dict, progress=None,
              start: str = "the shipped parameters") -> tuple[dict, list[dict]]:
    """Fitted parameters (``base`` with this engine's and GPU's values refitted) and the per-row errors. ``start``
    names ``base`` in what the fit says (the shipped parameters, or the user's --params-file)."""
    from .catalogue import Skip
    from .fit import at_bound, fit, free_params, get_value, predict
    from .suite import prepare_row

    pairs, skipped = [], []
    for i, r in enumerate(rows):
        if progress:
            progress(i, len(rows), r.id)
        try:
            pr = prepare_row(r, base)
        except Skip as e:  # a run the model cannot price (its data file absent, a precision not modelled): said
            skipped.append(f"{r.id}: {e}")
            continue
        except UserError as e:  # a malformed measurement: nothing is fitted or written
            raise UserError(f"{r.id}: {e}") from None
        # the engine's overhead is free here whether or not the shipped profile fits it, one loop for the user's runs
        # whatever their entry point (no separate served loop: EngineProfile.served_loop)
        pr.profile = dataclasses.replace(pr.profile, fitted=tuple(dict.fromkeys((*pr.profile.fitted, *OVERHEAD))),
                                         served_loop=False, fit_offline=True)
        pairs.append((r, pr))
    if not pairs:
        raise UserError("no measurement could be simulated: " + "; ".join(skipped[:3]))
    shipped = _check_plausible(pairs, base, predict)
    select = owned(engine, hardware)
    free = [p for p in free_params(pairs) if select(p)]
    notes = []
    # NOTE: runs of one shape (workload, request count, deployment) are one point of the fit however many files
    # measure it: two of them cannot tell fixed_s from per_seq_s
    n = len({_shape(r) for r, _pr in pairs})
    runs = f"{n} distinct run(s)" + (f" ({len(pairs)} measurements)" if n < len(pairs) else "")
    if n < len(free):  # too few runs for the GPU's efficiencies too: the engine's own loop alone
        loop = [p for p in free if p.path[0] == "engine"]
        if not loop or n < len(loop):
            raise UserError(f"only {runs} for {len(loop) or len(free)} free parameters ("
                            f"{', '.join('.'.join(p.path) for p in loop or free)}); a fit needs at least one run per "
                            f"parameter, so nothing was written: give more runs (other lengths, batch sizes or models)")
        notes.append(f"only {runs} for the {len(free)} parameters of the engine and the GPU: fitted the "
                     f"engine's loop alone and kept the shipped {hardware} efficiencies (give {len(free)} runs or "
                     f"more to fit them too)")
        select = (lambda keep: lambda p: keep(p) and p.path[0] == "engine")(select)
    fitted = fit(pairs, base=copy.deepcopy(base), select=select)
    for key in {pr.profile.offline_key for _r, pr in pairs}:  # the calibrated loop prices it behind its server too:
        fitted.get("engine", {}).pop(f"{key}:serve", None)     # the shipped served loop goes
    new_bounds = fitted.pop("bounds", {})
    fitted["bounds"] = {**base.get("bounds", {}), **new_bounds}
    fitted["_fitted"] = sorted(new_bounds)
    predicted = [predict(r, pr, fitted) for r, pr in pairs]
    fit_err, ship_err = _median_error(pairs, predicted), _median_error(pairs, shipped)
    if not fit_err < ship_err:  # nothing silently worse: the profile prices these runs as the shipped parameters do
        _keep_shipped(fitted, base, [p for p in free if select(p)], pairs)
        predicted = [predict(r, pr, fitted) for r, pr in pairs]
        fitted["_kept_shipped"] = True
        notes.append(f"the fit's in-sample median |error| ({100 * fit_err:.1f}%) is no better than {start}' "
                     f"({100 * ship_err:.1f}%): kept their values of {', '.join(fitted['_fitted'])} "
                     f"(these runs constrain them too little, or pull them against their prior)")
    fitted["_start"] = start
    if not fitted.get("_kept_shipped"):  # a parameter the runs do not move is the start's value, not a measurement
        # where base lacks a parameter the fit started at its prior (fit.fit)
        still = [p.name for p in free if select(p) and _unmoved(get_value(fitted, p.path), p.prior if (
            v := get_value(base, p.path)) is None else v)]
        if still:
            notes.append(f"{', '.join(still)} stayed where the fit started ({start}; moved less than 0.1%): these "
                         "runs hardly constrain them, so the profile's figure is the start's, not a fit")
    fitted["_notes"] = notes + [f"{p.name} sits at its {side} bound {p.lo if side == 'lower' else p.hi:g}"
                                for p in free if select(p)
                                for side in [at_bound(float(get_value(fitted, p.path)), (p.lo, p.hi))] if side]
    report = [{"id": r.id, "metric": metric_name(r), "measured": r.value, "predicted": v, "error": v / r.value - 1,
               "shipped": s} for (r, _pr), v, s in zip(pairs, predicted, shipped)]
    report += [{"id": s.split(":")[0], "skipped": s} for s in skipped]
    return fitted, report


def _unmoved(new, old) -> bool:
    """Whether a fitted value stayed within 0.1% of where the fit started."""
    try:
        a, b = float(new), float(old)
    except (TypeError, ValueError):
        return False
    return abs(a - b) <= 1e-3 * max(abs(b), 1e-12)


def metric_name(r: Row) -> str:
    """What a run's figure measures, in words (``sim.metrics.METRIC_UNITS``: ``total tok/s`` for vLLM's JSON, prompt
    and output; ``output tok/s``; ``requests/s``), ``per GPU`` after it for a per-GPU figure."""
    from blendsim.sim.metrics import METRIC_UNITS

    return METRIC_UNITS.get(r.metric, r.metric) + (" per GPU" if r.scope == "per_gpu" else "")


def _median_error(pairs: list, predicted: list) -> float:
    """The median |predicted / measured - 1| of the runs."""
    return float(np.median([abs(v / r.value - 1) for (r, _pr), v in zip(pairs, predicted)]))


def _keep_shipped(params: dict, base: dict, free: list, pairs: list) -> None:
    """Put back in ``params`` the values ``base`` prices the runs with, for every fitted parameter: the engine's loop as
    the shipped profile runs it (under the calibrated version's key, which the profile file must hold), any other
    parameter as ``base`` has it (or none, where ``base`` has none: the model's own default)."""
    from .fit import get_value, set_value

    for p in free:
        v = get_value(base, p.path)
        if v is None and p.path[0] == "engine":
            prof = next(pr.profile for _r, pr in pairs if pr.profile.overhead_key == p.path[1])
            v = getattr(prof.with_params(prof.fitted_overhead(base)), p.path[-1])
        if v is not None:
            set_value(params, p.path, v)
            continue
        d = params
        for k in p.path[:-1]:
            d = d.get(k) if isinstance(d, dict) else None
        if isinstance(d, dict):
            d.pop(p.path[-1], None)


def _shape(r: Row) -> tuple:
    """What the fit sees of a run: its workload, request count, model, GPU, GPU count and parallelism (replicas share
    the requests), precisions, KV tiers and the limits its command states (batch and token caps, client concurrency)."""
    from .catalogue import client_concurrency, engine_flags

    return (r.workload, r.requests, r.model, r.hardware, r.gpus, r.tp, r.pp, r.ep, r.weights, r.kv_dtype,
            r.host_kv_gb, r.disk_kv_gb, tuple(sorted(engine_flags(r).items())), client_concurrency(r))


# A measurement this many times faster or slower than the shipped model's prediction is refused: the worst
# published run the model has seen is ~6x off (SGLang 0.5.4's gpt-oss-20b on one H100, validation.csv), so
# 20x is a wrong unit, count or file rather than an engine -- and one such run would drag every fitted
# parameter toward it (a value 1e300 takes A100's mem_eff to its bound).
IMPLAUSIBLE = 20.0


def _check_plausible(pairs: list, base: dict, predict) -> list[float]:
    """The shipped parameters' predictions of the runs; UserError naming the first run whose measurement is
    IMPLAUSIBLE times off its prediction."""
    out = []
    for r, pr in pairs:
        p = predict(r, pr, base)
        out.append(p)
        ratio = r.value / p if p > 0 else float("inf")
        if not (1 / IMPLAUSIBLE <= ratio <= IMPLAUSIBLE):
            raise UserError(f"{r.id}: measured {r.value:.6g} {r.metric} is {ratio:.3g}x what the shipped model "
                            f"predicts for this setup ({p:.6g}), more than {IMPLAUSIBLE:g}x off in either "
                            f"direction: check the run's units, request count, lengths and elapsed time; nothing "
                            f"was fitted or written")
    return out


def write_profile(path: Path, params: dict, setup: Setup, report: list[dict]) -> None:
    """The parameters file with a ``profile`` header (what was fitted, on what)."""
    out = copy.deepcopy(params)
    names = out.pop("_fitted", [])
    out.pop("_notes", None)
    kept = bool(out.pop("_kept_shipped", False))
    start = out.pop("_start", "the shipped parameters")
    errs = [abs(x["error"]) for x in report if "error" in x]
    ship = [abs(x["shipped"] / x["measured"] - 1) for x in report if "shipped" in x]
    out["profile"] = {"kind": PROFILE_KIND, "engine": setup.engine, "version": setup.version,
                      "hardware": setup.hardware, "fitted": names,
                      "fitted_on": [{k: x[k] for k in ("id", "metric", "measured", "predicted", "error", "shipped")
                                     if k in x} for x in report if "error" in x],
                      "median_abs_error": float(np.median(errs)) if errs else None,
                      # the in-sample error on the same runs of the parameters the fit started from (started_from:
                      # the shipped ones or a --params-file); kept_shipped: the fit was no better, so the file holds
                      # those values
                      "shipped_median_abs_error": float(np.median(ship)) if ship else None, "kept_shipped": kept,
                      "started_from": start}
    out.pop("fitted_on", None)
    path = check_profile_out(path)
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


def check_profile_out(path: Path) -> Path:
    """Fail now, with one line, unless ``path`` can take an engine profile: a new file in an existing, writable
    folder, or an earlier engine profile (never another file, which it would replace)."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise UserError(f"-o {path}: folder {path.parent} does not exist")
    check_output_file(path)
    return check_own_file(path, lambda p: json_value(p, "profile", "kind") == PROFILE_KIND, "blendsim engine profile")


def write_rows_csv(path: Path, rows: list[Row]) -> None:
    """Rows as a catalogue CSV (for tests and for keeping what was fitted on)."""
    from .catalogue import COLUMNS

    with Path(path).open("w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({c: getattr(r, c) for c in COLUMNS})


__all__ = ["PROFILE_KIND", "Setup", "calibrate", "metric_name", "owned", "read_results", "split_engine", "split_result",
           "write_profile", "write_rows_csv"]
