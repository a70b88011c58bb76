"""CLI tests of `blendsim workloads synth ...` and `blendsim workloads load` (CliRunner, CPU)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.workloads.recipes import get_recipe, recipe_names
from blendsim.workloads.trace import read_trace


def invoke(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


def test_synth_help_lists_every_recipe():
    r = invoke("workloads", "synth", "--help")
    assert r.exit_code == 0
    for name in recipe_names():
        assert name in r.stdout


@pytest.mark.parametrize("name", ["blendserve", "batchllm", "preble", "accelgen"])
def test_every_recipe_option_has_help(name):
    r = invoke("workloads", "synth", name, "--help")
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    for f in dataclasses.fields(get_recipe(name).options):
        flag = "--" + f.name.replace("_", "-")
        assert flag in text and f.metadata["help"].split()[0] in text, flag
    assert "--output" in text


def test_load_and_stats_help():
    r = invoke("workloads", "load", "--help")
    assert r.exit_code == 0
    for word in ("burstgpt", "azure", "vidur", "jsonl", "--limit", "--output"):
        assert word in r.stdout


def test_synth_blendserve_writes_the_trace_and_prints_measured_values(tmp_path):
    out = tmp_path / "t.parquet"
    r = invoke("workloads", "synth", "blendserve", "--density", "0.9", "--sharing", "0.35", "--requests", "2000",
               "--seed", "2", "-o", out)
    assert r.exit_code == 0, r.output
    assert "measured density" in r.stdout and "measured sharing" in r.stdout
    t = read_trace(out)
    assert t.n == 2000 and t.meta["recipe"] == "blendserve" and t.meta["params"]["seed"] == 2
    s = invoke("workloads", "stats", out, "--json")
    stats = json.loads(s.stdout)
    assert stats["compute_density"] == pytest.approx(0.9, rel=0.02)
    assert stats["optimal_sharing_ratio"] == pytest.approx(0.35, rel=0.02)


@pytest.mark.parametrize(("args", "check"), [
    (["batchllm", "--prefix-len", "200", "--distinct-len", "2000", "--share-degree", "4", "--requests", "64"],
     lambda t: np.all(t.input_len == 2200)),
    (["preble", "--kind", "loogle", "--requests", "100", "--rate", "2"], lambda t: t.has_arrivals),
    (["preble", "--kind", "loogle"], lambda t: t.n == 673 and t.meta["rate"] == 6.0),  # Preble's size and rate
    (["preble", "--kind", "loogle", "--requests", "50", "--rate", "0"], lambda t: t.n == 50 and not t.has_arrivals),
    (["accelgen", "--requests", "300", "--rate", "0"], lambda t: t.has_slos and not t.has_arrivals),
])
def test_synth_other_recipes(tmp_path, args, check):
    out = tmp_path / "t.parquet"
    r = invoke("workloads", "synth", *args, "-o", out)
    assert r.exit_code == 0, r.output
    assert check(read_trace(out))


@pytest.mark.parametrize(("args", "want"), [
    (["blendserve", "--density", "1.0", "--sharing", "1.5", "--requests", "2000"], "--sharing must be in (0, 1)"),
    (["blendserve", "--density", "1.0", "--sharing", "0.9", "--requests", "2000"], "mmlu can lift sharing"),
    (["blendserve", "--density", "1.0", "--sharing", "0.2", "--source", "mmlu"], "--source must be one of"),
    (["preble", "--kind", "chat"], "--kind must be one of"),
    # a sign typo or 0 is refused, not read as Preble's figure (absence is)
    (["preble", "--kind", "toolbench", "--rate", "-5"], "--rate must be a finite number >= 0"),
    (["preble", "--kind", "toolbench", "--requests", "0"], "--requests must be >= 1, got 0 (leave it out for Preble's)"),
    (["preble", "--kind", "toolbench", "--prefixes", "0"], "--prefixes must be >= 1"),
    (["batchllm", "--prefix-len", "-1", "--distinct-len", "2", "--share-degree", "2"], "--prefix-len must be >= 0"),
    (["accelgen", "--jct-share", "2"], "--jct-share must be in [0, 1]"),
    (["blendserve", "--density", "1.0", "--sharing", "0.2", "--model", "gpt-9"], "unknown model"),
])
def test_bad_synth_options_exit_2_with_one_line(tmp_path, args, want):
    out = tmp_path / "t.parquet"
    r = invoke("workloads", "synth", *args, "-o", out)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("blendsim: error: ") and want in lines[0]
    assert not out.exists()


def test_load_jsonl_and_burstgpt(tmp_path):
    src = tmp_path / "r.jsonl"
    src.write_text("\n".join(json.dumps({"prompt_token_ids": [1, 2, i], "output_len": 3 + i}) for i in range(5)))
    out = tmp_path / "j.parquet"
    r = invoke("workloads", "load", src, "--format", "jsonl", "-o", out, "--limit", "3")
    assert r.exit_code == 0, r.output
    assert read_trace(out).output_len.tolist() == [3, 4, 5]
    burst = tmp_path / "b.csv"
    burst.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                     "5,ChatGPT,10,0,10,API log\n7,ChatGPT,10,4,14,API log\n")
    r = invoke("workloads", "load", burst, "-f", "burstgpt", "-o", out)
    assert r.exit_code == 0, r.output
    assert "skipped failed rows" in r.stdout and read_trace(out).n == 1


def test_load_unknown_format_and_missing_file(tmp_path):
    r = invoke("workloads", "load", tmp_path / "x.csv", "-f", "sharegpt", "-o", tmp_path / "o.parquet")
    assert r.exit_code == 2 and "unknown format 'sharegpt'" in r.stderr
    r = invoke("workloads", "load", tmp_path / "x.csv", "-f", "azure", "-o", tmp_path / "o.parquet")
    assert r.exit_code == 2 and "x.csv: no such file" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_runs_requests_table_is_refused_as_a_trace(tmp_path):
    """simulate's requests.parquet has a trace's length columns but no prompt tokens: read as a trace, its sharing
    would be none. stats and simulate say what it is instead."""
    from blendsim.workloads.trace import from_columns, write_trace

    trace = write_trace(from_columns(input_len=[32, 32], output_len=[4, 4], prompts=[[(1, 32)], [(1, 32)]]),
                        tmp_path / "t.parquet")
    r = invoke("simulate", trace, "-o", tmp_path / "run")
    assert r.exit_code == 0, r.output
    for cmd in (["workloads", "stats"], ["simulate"]):
        args = [*cmd, tmp_path / "run" / "requests.parquet"] + (["-o", tmp_path / "again"] if cmd == ["simulate"] else [])
        bad = invoke(*args)
        assert bad.exit_code == 2, bad.output
        assert "a run's per-request table (written by blendsim simulate), not a trace" in bad.output
    assert not (tmp_path / "again").exists()
    steps = invoke("workloads", "stats", tmp_path / "run" / "steps.parquet")
    assert steps.exit_code == 2 and "a run's per-step table (written by blendsim simulate), not a trace" in steps.output
    # a trace that has its prompts and, besides, columns named like a run's is a trace
    import pyarrow.parquet as pq

    t = pq.read_table(trace)
    for c in ("admit_s", "first_token_s", "finish_s", "generated_tokens", "prefill_computed"):
        t = t.append_column(c, [[0] * t.num_rows])
    pq.write_table(t, tmp_path / "extra.parquet")
    assert read_trace(tmp_path / "extra.parquet").n == 2


def test_load_a_blendsim_trace_to_cut_it_to_a_models_context(tmp_path):
    """`simulate` names this fix for requests beyond a model's context: `-f trace` re-reads a synthesised trace,
    and its recipe's measured density, no longer of these requests once they are cut, is not carried."""
    src = tmp_path / "t.parquet"
    assert invoke("workloads", "synth", "blendserve", "--requests", "300", "-o", src).exit_code == 0
    r = invoke("workloads", "load", src, "-f", "trace", "--max-context", "512", "--long", "truncate",
               "--limit", "200", "-o", tmp_path / "cut.parquet")
    assert r.exit_code == 0, r.output
    cut, whole = read_trace(tmp_path / "cut.parquet"), read_trace(src)
    assert cut.n == 200 and int((cut.input_len + cut.output_len).max()) <= 512
    assert "measured" in whole.meta and "measured" not in cut.meta and "measured density" not in r.output
    r = invoke("workloads", "load", src, "-f", "trace", "-o", tmp_path / "same.parquet")
    assert r.exit_code == 0 and read_trace(tmp_path / "same.parquet").n == 300
