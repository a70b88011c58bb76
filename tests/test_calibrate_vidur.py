"""``blendsim calibrate import-vidur`` on small CSVs written here in Vidur's documented layout
(microsoft/vidur vidur/profiling/mlp and vidur/profiling/attention), well-formed and malformed."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.sim.profile import load_profile

# an earlier profile of the user's (what -o may replace): a failed run must keep it as it was
PRECIOUS = '{"schema": "blendsim.profile", "precious": true}'

STATS = ("min", "max", "mean", "median", "std")
MLP_OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
           "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
TINY = {"n_head": 8, "n_kv_head": 2, "n_embd": 512, "n_expanded_embd": 1536, "vocab_size": 8192,
        "use_gated_mlp": True}


def ms(op: str, t: float, tp: int) -> float:
    """Synthetic per-call milliseconds: launch + per-token cost, split over tp for the sharded ops."""
    base = {"emb": (0.003, 2e-6), "input_layernorm": (0.004, 3e-6), "post_attention_layernorm": (0.004, 3e-6),
            "add": (0.003, 2e-6), "attn_rope": (0.005, 4e-6)}
    if op in base:
        a, b = base[op]
        return a + b * t
    width = {"attn_pre_proj": 768, "attn_post_proj": 512, "mlp_up_proj": 3072, "mlp_down_proj": 512,
             "mlp_act": 64}[op]
    return 0.01 + 1e-7 * width * t / tp


def _stats(prefix: str, v: float) -> dict:
    return {f"time_stats.{prefix}.{s}": (v if s != "std" else 0.01 * v) * (0.9 if s == "min" else 1.1 if s == "max"
                                                                             else 1.0) for s in STATS}


def write_mlp(folder, tps=(1, 2), shape=TINY, duplicate: float | None = None):
    rows = []
    for tp in tps:
        for t in TOKENS:
            r = {}
            for op in MLP_OPS:
                r.update(_stats(op, ms(op, t, tp)))
            r.update(shape, num_tokens=t, num_tensor_parallel_workers=tp)
            rows.append(r)
    if duplicate is not None:  # Vidur's CSVs repeat some points; the median wins
        r = dict(rows[5])
        r["time_stats.attn_pre_proj.median"] = duplicate
        rows += [r, dict(r)]
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(folder / "mlp.csv", index=False)
    return folder


def write_attention(folder, tps=(1, 2)):
    rows = []
    for tp in tps:
        hq = 8 // tp
        for n in (16, 64, 256, 1024):
            for c in (0, 256, 1024, 3072):
                if n + c > 4096:
                    continue
                r = {**_stats("attn_prefill", 0.008 + 1e-6 * hq * n * (c + n / 2) / 64),
                     **_stats("attn_kv_cache_save", 0.004 + 1e-6 * n), **_stats("attn_decode", float("nan"))}
                r.update(n_embd=512, n_q_head=8, n_kv_head=2, block_size=16, num_tensor_parallel_workers=tp,
                         max_model_len=4096, batch_size=1, prefill_chunk_size=n, kv_cache_size=c, is_prefill=True,
                         attention_backend="AttentionBackend.FLASHINFER")
                rows.append(r)
        for b in (1, 2, 8, 32, 128):
            for c in (32, 256, 1024, 4096):
                r = {**_stats("attn_decode", 0.006 + 2e-4 * b + 1e-6 * b * c / tp),
                     **_stats("attn_kv_cache_save", 0.004 + 1e-6 * b), **_stats("attn_prefill", float("nan"))}
                r.update(n_embd=512, n_q_head=8, n_kv_head=2, block_size=16, num_tensor_parallel_workers=tp,
                         max_model_len=4096, batch_size=b, prefill_chunk_size=0, kv_cache_size=c, is_prefill=False,
                         attention_backend="AttentionBackend.FLASHINFER")
                rows.append(r)
    pd.DataFrame(rows).to_csv(folder / "attention.csv", index=False)


def run(*args: str):
    return CliRunner().invoke(get_app(), ["calibrate", "import-vidur", *args])


def one_line_error(r, *needles: str) -> None:
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert err.startswith("blendsim: error: ") and "\n" not in err, r.output
    for n in needles:
        assert n in err, err


def test_mlp_and_attention_csvs_become_a_profile(tmp_path):
    d = write_mlp(tmp_path / "vidur")
    write_attention(d)
    out = tmp_path / "p.json"
    r = run(str(d), "--model", "tiny", "--tp", "2", "-o", str(out))
    assert r.exit_code == 0, r.output
    p = load_profile(out)
    assert (p.model, p.dtype, p.tp) == ("tiny", "fp16", 2)
    assert set(p.ops) == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj", "rope", "act", "embedding", "norm",
                          "kv_write", "attn_prefill", "attn_decode"}
    # milliseconds became seconds, the tp=2 rows were taken, the grid and raw medians kept
    q = p.ops["gate_up_proj"]
    assert [g[0] for g in q.grid] == TOKENS and q.domain == [[1.0, 4096.0]]
    assert q.median_s[-1] == pytest.approx(ms("mlp_up_proj", 4096, 2) * 1e-3, rel=1e-12)
    for t in (3, 100, 3000):
        assert q.predict_scalar(t) == pytest.approx(ms("mlp_up_proj", t, 2) * 1e-3, rel=1e-6)
    # norm = input_layernorm + post_attention_layernorm + add
    norm = sum(ms(o, 100, 2) for o in ("input_layernorm", "post_attention_layernorm", "add")) * 1e-3
    assert p.ops["norm"].predict_scalar(100) == pytest.approx(norm, rel=1e-6)
    # attention: prefill (chunk, context), decode (batch, context), KV save per new token
    assert p.ops["attn_prefill"].vars == ("tokens", "context")
    assert p.ops["attn_prefill"].predict_scalar(100, 500) == pytest.approx(
        (0.008 + 1e-6 * 4 * 100 * 550 / 64) * 1e-3, rel=1e-6)
    assert p.ops["attn_decode"].predict_scalar(10, 2000) == pytest.approx(
        (0.006 + 2e-3 + 1e-6 * 10 * 2000 / 2) * 1e-3, rel=1e-6)
    assert p.ops["kv_write"].predict_scalar(50) == pytest.approx((0.004 + 5e-5) * 1e-3, rel=1e-6)
    assert p.software["attention_backend"] == "AttentionBackend.FLASHINFER"
    assert any(s["op"] == "lm_head" for s in p.skipped)
    assert p.produced_by["measured_dtype"] == "fp16" and "import-vidur" in p.produced_by["tool"]
    # and the simulator takes it
    c = CliRunner().invoke(get_app(), ["cost", "--model", "tiny", "--hardware", "a100-80gb", "--tp", "2", "--dtype",
                                       "fp16", "--profile", str(out), "--decode-seqs", "16", "--context", "700",
                                       "--json"])
    assert c.exit_code == 0, c.output
    res = json.loads(c.stdout)
    assert res["cost_model"] == "profile"
    dec = next(x for x in res["per_layer"] if x["op"] == "attn_decode")
    assert dec["time_s"] == pytest.approx(p.ops["attn_decode"].predict_scalar(16, 700), rel=1e-12)


def test_model_is_inferred_from_the_shape_and_duplicates_merge_by_median(tmp_path):
    d = write_mlp(tmp_path / "v", tps=(1,), duplicate=0.5)
    out = tmp_path / "p.json"
    r = run(str(d), "-o", str(out))
    assert r.exit_code == 0, r.output
    p = load_profile(out)
    assert p.model == "tiny" and p.tp == 1
    q = p.ops["qkv_proj"]
    assert len(q.grid) == len(TOKENS)
    i = TOKENS.index(TOKENS[5])  # one original row and two duplicates at 0.5 ms: the median is 0.5 ms
    assert q.median_s[i] == pytest.approx(0.5e-3)
    assert any("attention.csv" in s["reason"] for s in p.skipped)
    # a renamed copy (PREFIXmlp.csv, as the shared data names Vidur's profile): read with its PREFIXattention.csv
    (d / "mlp.csv").rename(d / "a100_x_mlp.csv")
    renamed = tmp_path / "r.json"
    r = run(str(d / "a100_x_mlp.csv"), "-o", str(renamed))
    assert r.exit_code == 0, r.output
    assert load_profile(renamed).ops["qkv_proj"].median_s == q.median_s
    assert "no a100_x_attention.csv: roofline used" in r.output
    (d / "a100_x_mlp.csv").rename(d / "mlp.csv")
    # mlp.csv itself given: its folder is read, the same profile comes out
    again = tmp_path / "q.json"
    r = run(str(d / "mlp.csv"), "-o", str(again))
    assert r.exit_code == 0, r.output
    assert load_profile(again).ops["qkv_proj"].median_s == q.median_s


def test_no_mlp_csv(tmp_path):
    (tmp_path / "v").mkdir()
    one_line_error(run(str(tmp_path / "v"), "--model", "tiny", "-o", str(tmp_path / "p.json")), "no mlp.csv")
    one_line_error(run(str(tmp_path / "nope"), "-o", str(tmp_path / "p.json")), "no such file or folder")
    (tmp_path / "v" / "x.txt").write_text("")
    one_line_error(run(str(tmp_path / "v" / "x.txt"), "-o", str(tmp_path / "p.json")),
                   "not a folder, nor a file named ...mlp.csv")


def test_missing_columns(tmp_path):
    d = write_mlp(tmp_path / "v")
    df = pd.read_csv(d / "mlp.csv").drop(columns=["time_stats.mlp_up_proj.median", "num_tokens"])
    df.to_csv(d / "mlp.csv", index=False)
    one_line_error(run(str(d), "--model", "tiny", "-o", str(tmp_path / "p.json")), "mlp.csv", "missing column(s)",
                   "num_tokens", "time_stats.mlp_up_proj.median")


def test_non_numeric_cell_names_row_and_column(tmp_path):
    d = write_mlp(tmp_path / "v")
    df = pd.read_csv(d / "mlp.csv").astype({"num_tokens": object})
    df.loc[1, "num_tokens"] = "lots"
    df.to_csv(d / "mlp.csv", index=False)
    one_line_error(run(str(d), "--model", "tiny", "-o", str(tmp_path / "p.json")), "data row 2, field num_tokens",
                   "'lots'")


@pytest.mark.parametrize("value", [-0.5, float("inf")])
def test_a_negative_or_infinite_time_names_row_and_column(tmp_path, value):
    d = write_mlp(tmp_path / "v")
    df = pd.read_csv(d / "mlp.csv")
    col = next(c for c in df.columns if c.startswith("time_stats."))
    df.loc[1, col] = value
    df.to_csv(d / "mlp.csv", index=False)
    one_line_error(run(str(d), "--model", "tiny", "-o", str(tmp_path / "p.json")), f"data row 2, field {col}",
                   "is not a time or size")
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("field", ["num_tokens", "num_tensor_parallel_workers", "n_head"])
def test_a_fractional_count_names_row_and_column(tmp_path, field):
    d = write_mlp(tmp_path / "v")
    df = pd.read_csv(d / "mlp.csv").astype({field: float})
    df.loc[1, field] = df.loc[1, field] + 0.5
    df.to_csv(d / "mlp.csv", index=False)
    one_line_error(run(str(d), "--model", "tiny", "-o", str(tmp_path / "p.json")), f"data row 2, field {field}",
                   "is not a whole number")
    assert not (tmp_path / "p.json").exists()


def test_empty_and_garbage_files(tmp_path):
    d = tmp_path / "v"
    d.mkdir()
    (d / "mlp.csv").write_text("")
    one_line_error(run(str(d), "--model", "tiny", "-o", str(tmp_path / "p.json")), "not a readable CSV")
    (d / "mlp.csv").write_text("a,b\n1,2\n")
    one_line_error(run(str(d), "--model", "tiny", "-o", str(tmp_path / "p.json")), "missing column(s)")


def test_tp_not_profiled(tmp_path):
    d = write_mlp(tmp_path / "v", tps=(1, 2))
    one_line_error(run(str(d), "--model", "tiny", "--tp", "4", "-o", str(tmp_path / "p.json")),
                   "no rows for tp=4", "profiled: 1, 2")


def test_other_model_shape_is_refused(tmp_path):
    d = write_mlp(tmp_path / "v", shape={**TINY, "n_embd": 1024})
    one_line_error(run(str(d), "--model", "tiny", "-o", str(tmp_path / "p.json")), "another model",
                   "n_embd 1024 vs 512")
    one_line_error(run(str(d), "-o", str(tmp_path / "p.json")), "no model preset has its shape")


def test_malformed_attention_csv(tmp_path):
    d = write_mlp(tmp_path / "v")
    (d / "attention.csv").write_text("batch_size,kv_cache_size\n1,2\n")
    one_line_error(run(str(d), "--model", "tiny", "-o", str(tmp_path / "p.json")), "attention.csv",
                   "missing column(s)", "is_prefill")


def test_a_failed_import_keeps_the_existing_output(tmp_path):
    d = write_mlp(tmp_path / "v")
    df = pd.read_csv(d / "mlp.csv")
    df.loc[0, "num_tensor_parallel_workers"] = np.nan
    df.to_csv(d / "mlp.csv", index=False)
    out = tmp_path / "p.json"
    out.write_text(PRECIOUS)
    one_line_error(run(str(d), "--model", "tiny", "-o", str(out)), "data row 1, field num_tensor_parallel_workers")
    assert out.read_text() == PRECIOUS


def test_rows_of_another_model_and_an_unreadable_is_prefill_are_refused(tmp_path):
    import pandas as pd

    d = write_mlp(tmp_path / "mixed", tps=(1,))
    write_attention(d, tps=(1,))
    df = pd.read_csv(d / "mlp.csv")
    df.loc[5:, "n_embd"] = 1024
    df.to_csv(d / "mlp.csv", index=False)
    r = run(str(d), "-o", str(tmp_path / "m.json"))
    assert r.exit_code == 2 and "data row 6, field n_embd: 1024" in r.output and "another model" in r.output
    e = write_mlp(tmp_path / "yesno", tps=(1,))
    write_attention(e, tps=(1,))
    att = pd.read_csv(e / "attention.csv")
    att["is_prefill"] = att["is_prefill"].map({True: "yes", False: "no"})
    att.to_csv(e / "attention.csv", index=False)
    r = run(str(e), "-o", str(tmp_path / "y.json"))
    assert r.exit_code == 2 and "field is_prefill: 'yes' is not True/False" in r.output


def test_a_profile_without_its_model_shape_or_from_a_gpu_is_refused_for_a_cpu_run(tmp_path):
    import json

    from blendsim.sim.deployment import Deployment
    from blendsim.sim.errors import UserError
    from blendsim.sim.hardware import get_hardware
    from blendsim.sim.models import get_model
    from blendsim.sim.profile import load_profile

    d = write_mlp(tmp_path / "ok", tps=(1,))
    write_attention(d, tps=(1,))
    assert run(str(d), "-o", str(tmp_path / "ok.json")).exit_code == 0
    prof = json.loads((tmp_path / "ok.json").read_text())
    dep = Deployment(get_model("tiny", "fp16"), get_hardware("cpu"), 1)
    with pytest.raises(UserError, match="timed on a GPU"):
        load_profile(tmp_path / "ok.json").check_matches(dep)
    del prof["model_shape"]
    (tmp_path / "noshape.json").write_text(json.dumps(prof))
    with pytest.raises(UserError, match="field 'model_shape' is missing"):
        load_profile(tmp_path / "noshape.json")
