"""Block-hash traces (workloads/hashed.py): small files written here, every option, bad rows, and the
shared Mooncake conversation trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.sim.errors import UserError
from blendsim.sim.prefix_tree import PrefixTree
from blendsim.workloads.hashed import direct_sharing, limit_context, load_hashed, output_lengths
from blendsim.workloads.loaders import load
from blendsim.workloads.trace import from_columns, read_trace

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MOONCAKE = DATA / "mooncake_conversation_trace.jsonl"
needs_mooncake = pytest.mark.skipif(not MOONCAKE.is_file(), reason=f"Mooncake trace not found at {MOONCAKE}")

# 16-token blocks: shared (1, 2), a partial last block (3: 8 tokens) shared by two identical prompts, unique
# blocks, a floor-convention row (no id for its 5-token tail) and rows without output_length.
ROWS16 = [
    {"request_id": "a", "input_length": 40, "hash_ids": [1, 2, 3], "output_length": 5, "extra": "ignored"},
    {"request_id": "b", "input_length": 48, "hash_ids": [1, 2, 4]},
    {"request_id": 7, "input_length": 20, "hash_ids": [1, 9], "output_length": 3},
    {"input_length": 16, "hash_ids": [70]},
    {"input_length": 40, "hash_ids": [1, 2, 3], "output_length": 2},
    {"input_length": 37, "hash_ids": [1, 2]},
]
# distinct (id, length) blocks 1/16, 2/16, 3/8, 4/16, 9/4, 70/16 and the 5-token tail
UNIQUE16 = 16 + 16 + 8 + 16 + 4 + 16 + 5
TOTAL16 = 40 + 48 + 20 + 16 + 40 + 37


def write_jsonl(path: Path, rows: list, raw: list[str] | None = None) -> Path:
    lines = [json.dumps(r) for r in rows] + (raw or [])
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def small16(tmp_path) -> Path:
    return write_jsonl(tmp_path / "serve_batch.jsonl", ROWS16)


def test_segment_paths_follow_the_blocks(small16):
    t = load_hashed(small16, block_size=16, output_len=11)
    t.validate()
    assert t.n == 6 and list(t.ids) == ["a", "b", "7", "4", "5", "6"]  # request_id, else the line number
    paths = [t.prompt_repr(i) for i in range(t.n)]
    assert [[ln for _, ln in pr] for pr in paths] == [[16, 16, 8], [16, 16, 16], [16, 4], [16], [16, 16, 8],
                                                      [16, 16, 5]]
    seg = [[s for s, _ in pr] for pr in paths]
    assert seg[0][:2] == seg[1][:2] == seg[5][:2] and seg[2][0] == seg[0][0]  # shared blocks, one segment
    assert seg[0] == seg[4]  # identical prompts, the partial block included
    assert seg[1][2] != seg[0][2] and seg[2][1] not in seg[0] and seg[3][0] not in sum(seg[:3], [])
    assert seg[5][2] not in sum(seg[:5], [])  # the unhashed tail is the request's own
    np.testing.assert_array_equal(t.input_len, [r["input_length"] for r in ROWS16])
    assert t.meta["hashed"] == {"blocks": 14, "unique_blocks": 6, "unique_block_tokens": UNIQUE16,
                                "unhashed_tails": 1, "id_length_clashes": 0}
    assert t.meta["name"] == "serve_batch" and not t.has_arrivals


def test_optimal_sharing_is_the_direct_count_of_unique_blocks(small16, tmp_path):
    t = load_hashed(small16, block_size=16, output_len=11)
    direct = direct_sharing(small16, 16)
    assert direct == pytest.approx(1 - UNIQUE16 / TOTAL16)
    # the tree also recomputes the last token of a prompt identical to an earlier one (rows 1 and 5)
    assert PrefixTree(t).optimal_sharing_ratio() == pytest.approx(1 - (UNIQUE16 + 1) / TOTAL16)
    # 512-token blocks (Mooncake's), no duplicate prompt: the tree's s_o is the direct count exactly
    rows = [{"timestamp": 0, "input_length": 1300, "output_length": 9, "hash_ids": [0, 1, 2]},
            {"timestamp": 1500, "input_length": 1100, "output_length": 9, "hash_ids": [0, 1, 3]},
            {"timestamp": 2250, "input_length": 600, "output_length": 9, "hash_ids": [0, 4]},
            {"timestamp": 2250, "input_length": 200, "output_length": 9, "hash_ids": [5]}]
    f = write_jsonl(tmp_path / "mc.jsonl", rows)
    m = load_hashed(f, "mooncake")
    m.validate()
    assert [[ln for _, ln in m.prompt_repr(i)] for i in range(4)] == [[512, 512, 276], [512, 512, 76], [512, 88], [200]]
    unique = 512 + 512 + 276 + 76 + 88 + 200
    assert PrefixTree(m).optimal_sharing_ratio() == pytest.approx(1 - unique / 3200) == direct_sharing(f, 512)
    np.testing.assert_allclose(m.arrival_s, [0, 1.5, 2.25, 2.25])  # ms
    assert load_hashed(f, "hashed", block_size=512, time_unit="s").arrival_s[1] == 1500.0


def test_an_id_is_shared_only_after_the_same_prefix(tmp_path):
    """Ids of blocks hashed without their prefix: the same id after different blocks shares nothing."""
    rows = [{"input_length": 32, "hash_ids": [5, 6], "output_length": 1},
            {"input_length": 32, "hash_ids": [8, 5], "output_length": 1},
            {"input_length": 32, "hash_ids": [5, 7], "output_length": 1}]
    t = load_hashed(write_jsonl(tmp_path / "x.jsonl", rows), block_size=16)
    assert PrefixTree(t).optimal_sharing_ratio() == pytest.approx(16 / 96)  # only row 3's first block


def test_an_id_seen_with_two_lengths_is_two_segments(tmp_path):
    rows = [{"input_length": 32, "hash_ids": [1, 2], "output_length": 1},
            {"input_length": 20, "hash_ids": [1, 2], "output_length": 1}]
    t = load_hashed(write_jsonl(tmp_path / "x.jsonl", rows), block_size=16)
    t.validate()
    assert t.meta["hashed"]["id_length_clashes"] == 1
    assert PrefixTree(t).optimal_sharing_ratio() == pytest.approx(16 / 52)


def test_missing_outputs_need_an_option(small16):
    with pytest.raises(UserError, match=r"line 2 has no output_length \(3 of 6 rows lack one\); give "
                                        r"--output-len N or --output-from FILE"):
        load_hashed(small16, block_size=16)
    t = load_hashed(small16, block_size=16, output_len=11)
    np.testing.assert_array_equal(t.output_len, [5, 11, 3, 11, 2, 11])  # given lengths are kept
    assert t.meta["output_len"] == {"from_file": 3, "fixed": 11, "filled": 3}
    with pytest.raises(UserError, match="not both"):
        load_hashed(small16, block_size=16, output_len=11, output_from="x.csv")


def test_output_from_samples_seeded_from_a_length_file(small16, tmp_path):
    csv = tmp_path / "lengths.csv"
    csv.write_text("prompt_tokens,output_tokens,other\n" + "".join(f"{i},{v},{2 * v}\n" for i, v in
                                                                   enumerate([100, 200, 300, 0, 400])))
    a = load_hashed(small16, block_size=16, output_from=str(csv), seed=3)
    b = load_hashed(small16, block_size=16, output_from=str(csv), seed=3)
    np.testing.assert_array_equal(a.output_len, b.output_len)
    filled = a.output_len[[1, 3, 5]]
    assert set(filled) <= {100, 200, 300, 400}  # 0 (a failed request) is not in the pool
    assert a.meta["output_len"] == {"from_file": 3, "sampled_from": f"{csv}:output_tokens", "seed": 3, "pool": 4,
                                    "filled": 3}
    many = [load_hashed(small16, block_size=16, output_from=str(csv), seed=s).output_len[1] for s in range(12)]
    assert len(set(many)) > 1  # the seed matters
    col = load_hashed(small16, block_size=16, output_from=f"{csv}:other", seed=3).output_len[[1, 3, 5]]
    assert set(col) <= {200, 400, 600, 800}
    # another trace: a blendsim Parquet file or a JSONL trace
    pool, src = output_lengths(str(small16))
    assert sorted(pool) == [2, 3, 5] and src.endswith(":output_length")
    with pytest.raises(UserError, match="no output-length column"):
        output_lengths(_bad_csv(tmp_path))
    with pytest.raises(UserError, match="no such file"):
        output_lengths(str(tmp_path / "missing.csv"))


def _bad_csv(tmp_path: Path) -> str:
    f = tmp_path / "nolen.csv"
    f.write_text("a,b\n1,2\n")
    return str(f)


def test_output_from_a_blendsim_trace(small16, tmp_path):
    from blendsim.workloads.trace import write_trace

    src = write_trace(from_columns(input_len=[5, 5], output_len=[42, 42]), tmp_path / "src.parquet")
    t = load_hashed(small16, block_size=16, output_from=str(src))
    np.testing.assert_array_equal(t.output_len, [5, 42, 3, 42, 2, 42])


def test_context_limit_refuses_by_default_and_skips_or_truncates(small16):
    t = load_hashed(small16, block_size=16, output_len=11)  # contexts 45, 59, 23, 27, 42, 48
    with pytest.raises(UserError, match=r"3 of 6 requests need more context than 44 tokens \(row 1: prompt 40 "
                                        r"\+ output 5\); add --long skip .* or --long truncate"):
        limit_context(t, 44, None)
    s = limit_context(t, 44, "skip")
    assert list(s.ids) == ["7", "4", "5"]
    assert s.meta["context_limit"] == {"max_context": 44, "mode": "skip", "requests": 3, "tokens_dropped": 45 + 59 + 48}
    c = limit_context(t, 44, "truncate")
    assert list(c.ids) == list(t.ids) and np.all(c.input_len + c.output_len <= 44)
    np.testing.assert_array_equal(c.input_len, [39, 33, 20, 16, 40, 33])
    np.testing.assert_array_equal(c.output_len, t.output_len)
    paths = [c.prompt_repr(i) for i in range(c.n)]
    assert paths[0][:2] == paths[1][:2] and [ln for _, ln in paths[0]] == [16, 16, 7]
    assert [ln for _, ln in paths[1]] == [16, 16, 1] == [ln for _, ln in paths[5]]
    assert paths[1][2] != paths[5][2]  # block 4 and row 6's tail, cut alike, are still different tokens
    assert paths[1][2][0] not in {s for pr in (t.prompt_repr(i) for i in range(t.n)) for s, _ in pr}
    assert c.meta["context_limit"] == {"max_context": 44, "mode": "truncate", "requests": 3,
                                       "prompt_tokens_dropped": 1 + 15 + 4, "output_tokens_dropped": 0}
    assert PrefixTree(c).optimal_sharing_ratio() > 0
    # an output alone beyond the limit keeps max_context - 1 tokens and one prompt token
    long_out = from_columns(input_len=[10], output_len=[100], prompts=[[(3, 10)]])
    cut = limit_context(long_out, 50, "truncate")
    assert (int(cut.input_len[0]), int(cut.output_len[0])) == (1, 49)
    with pytest.raises(UserError, match="--long 'drop'"):
        limit_context(t, 44, "drop")


def test_truncation_keeps_identical_cuts_shared():
    t = from_columns(input_len=[32, 32, 32], output_len=[10, 10, 4], prompts=[[(1, 16), (2, 16)]] * 3)
    c = limit_context(t, 30, "truncate")
    paths = [c.prompt_repr(i) for i in range(3)]
    assert paths[0] == paths[1] and [ln for _, ln in paths[0]] == [16, 4] and paths[2][1][1] == 10
    assert paths[2][0] == paths[0][0] and paths[2][1][0] != paths[0][1][0]  # cut elsewhere: another segment


def test_context_limit_on_token_prompts():
    t = from_columns(input_len=[6, 3], output_len=[4, 1], prompts=[[1, 2, 3, 4, 5, 6], [1, 2, 9]])
    c = limit_context(t, 8, "truncate")
    assert c.prompt_repr(0) == [1, 2, 3, 4] and c.prompt_repr(1) == [1, 2, 9]


BAD = [
    ('{"input_length": "40", "hash_ids": [1, 2, 3]}', r"line 2, field input_length: '40' must be a whole number"),
    ('{"input_length": 40, "hash_ids": ["1", 2, 3]}', r"line 2, field hash_ids: '1' is not an integer block id"),
    ('{"input_length": 40, "hash_ids": [1.0, 2, 3]}', r"line 2, field hash_ids: 1.0 is not an integer"),
    ('{"input_length": 40, "hash_ids": [true, 2, 3]}', r"line 2, field hash_ids: True is not an integer"),
    ('{"input_length": 40, "hash_ids": [' + str(1 << 64) + ', 2, 3]}', r"line 2, field hash_ids: \d+ is not an integer"),
    ('{"input_length": 40, "hash_ids": "1,2,3"}', r"line 2, field hash_ids: must be a list"),
    ('{"input_length": 40}', r"line 2, field hash_ids: missing"),
    ('{"hash_ids": [1]}', r"line 2, field input_length: missing"),
    ('{"input_length": 0, "hash_ids": []}', r"line 2, field input_length: 0 must be a whole number >= 1"),
    ('{"input_length": 40, "hash_ids": [1, 2, 3, 4]}',
     r"line 2, field hash_ids: 4 block ids, but input_length 40 in 16-token blocks needs 3 \(or 2 without"),
    ('{"input_length": 40, "hash_ids": [1, 2, 3], "output_length": 0}', r"line 2, field output_length: 0 must"),
    ('{"input_length": 40, "hash_ids": [1, 2, 3], "timestamp": 5}', r"line 2, field timestamp: line 2 has a "
                                                                    r"timestamp but line 1 has none"),
    ('{"input_length": 40, "hash_ids": [1, 2, 3], "request_id": "a"}', r"line 2, field request_id: 'a' repeats "
                                                                      r"line 1's"),
    ('{"input_length": 40, "hash_ids": [1, 2, 3], "request_id": [1]}', r"line 2, field request_id: \[1\] must"),
    ('{"input_length": 40, ', r"line 2: not valid JSON"),
    ('[40, [1, 2, 3]]', r"line 2: expected a JSON object, found list"),
]


@pytest.mark.parametrize("line, msg", BAD, ids=[m.split(":")[0][:40] + str(i) for i, (_, m) in enumerate(BAD)])
def test_bad_rows_name_the_line_and_field(tmp_path, line, msg):
    f = write_jsonl(tmp_path / "bad.jsonl", [{"request_id": "a", "input_length": 7, "hash_ids": [0],
                                              "output_length": 1}], [line])
    with pytest.raises(UserError, match=msg):
        load_hashed(f, block_size=16)


def test_bad_options_and_files(tmp_path, small16):
    with pytest.raises(UserError, match="--format hashed needs --block-size N"):
        load_hashed(small16)
    with pytest.raises(UserError, match="field hash_ids: 3 block ids, but input_length 40 in 512-token blocks "
                                        "needs 1 .*is --block-size right"):
        load_hashed(small16, "mooncake")
    ts = write_jsonl(tmp_path / "ts.jsonl", [{"timestamp": 1.5, "input_length": 3, "hash_ids": [1],
                                              "output_length": 1}])
    with pytest.raises(UserError, match="say its unit with --time-unit s or --time-unit ms"):
        load_hashed(ts, block_size=16)
    with pytest.raises(UserError, match="--time-unit 'h'"):
        load_hashed(ts, block_size=16, time_unit="h")
    with pytest.raises(UserError, match="no such file"):
        load_hashed(tmp_path / "none.jsonl", block_size=16)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UserError, match="no requests"):
        load_hashed(tmp_path / "empty.jsonl", block_size=16)
    with pytest.raises(UserError, match="--block-size applies to --format mooncake or hashed, not azure"):
        load(small16, "azure", block_size=16)


def test_liberal_in_ids_and_extra_fields(tmp_path):
    big = (1 << 63) - 1
    rows = [{"input_length": 20, "hash_ids": [big, -3], "output_length": 2, "request_id": 10, "user": "x"},
            {"input_length": 16, "hash_ids": [big], "output_length": 2, "request_id": 11, "tokens": [1, 2]}]
    t = load_hashed(write_jsonl(tmp_path / "y.jsonl", rows), block_size=16, limit=2)
    assert list(t.ids) == ["10", "11"] and PrefixTree(t).optimal_sharing_ratio() == pytest.approx(16 / 36)


def test_cli_load_and_the_name_in_reports(small16, tmp_path):
    from blendsim.reports.inputs import load_inputs

    app = get_app()
    out = tmp_path / "t.parquet"
    r = CliRunner().invoke(app, ["workloads", "load", str(small16), "-f", "hashed", "--block-size", "16",
                                 "--output-len", "9", "--max-context", "44", "--long", "skip", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "3 dropped" in r.output and "output lengths filled" in r.output
    t = read_trace(out)
    assert t.meta["name"] == "serve_batch" and t.meta["context_limit"]["requests"] == 3
    r = CliRunner().invoke(app, ["workloads", "load", str(small16), "-f", "hashed", "--block-size", "16",
                                 "--output-len", "9", "--max-context", "44", "-o", str(tmp_path / "u.parquet")])
    assert r.exit_code == 2 and "add --long skip" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = CliRunner().invoke(app, ["workloads", "load", str(small16), "-f", "hashed", "--block-size", "16",
                                 "--output-len", "9", "--long", "skip", "-o", str(tmp_path / "u.parquet")])
    assert r.exit_code == 2 and "--long needs --max-context" in r.stderr
    run = tmp_path / "run"
    r = CliRunner().invoke(app, ["simulate", str(out), "--model", "tiny", "--hardware", "cpu", "-o", str(run)])
    assert r.exit_code == 0, r.output
    assert json.loads((run / "summary.json").read_text())["trace_name"] == "serve_batch"
    assert list(load_inputs([run]).runs["workload"]) == ["serve_batch"]


@needs_mooncake
def test_mooncake_conversation_trace():
    from blendsim.runner import RunConfig, run_simulation

    t = load(MOONCAKE, "mooncake")  # its load time is measured by benchmarks/bench_workloads.py
    assert t.n == 12_031
    t.validate()
    assert t.meta["name"] == "mooncake_conversation_trace" and t.meta["hashed"]["id_length_clashes"] == 0
    s_o = PrefixTree(t).optimal_sharing_ratio()
    direct = direct_sharing(MOONCAKE, 512)
    assert s_o == pytest.approx(direct, rel=0.01) and 0.36 < s_o < 0.38  # SOURCES.md: about 0.37
    assert t.arrival_s[0] == 0 and 3500 < t.arrival_s[-1] < 3600  # about an hour, ms -> s
    r = run_simulation(t, RunConfig(policy="dfs", model="llama-3-8b", hardware="h100-80gb", offline=True)).summary
    assert r["prefix_sharing_ratio"] >= 0.97 * s_o, r["prefix_sharing_ratio"]


def test_the_simulators_context_refusal_names_the_load_options():
    from blendsim.runner import RunConfig, run_simulation

    t = from_columns(input_len=[4000, 10], output_len=[200, 5])  # the tiny model's context is 4096
    with pytest.raises(UserError, match=r"row 1\) needs a context of 4200 .*--max-context 4096 --long skip\|truncate"):
        run_simulation(t, RunConfig(model="tiny", hardware="cpu"))
    fit = limit_context(t, 4096, "truncate")
    assert run_simulation(fit, RunConfig(model="tiny", hardware="cpu")).summary["n_requests"] == 2


def test_a_trace_cut_from_a_hashed_file_labels_the_files_block_counts(small16, tmp_path):
    """--long skip (or --limit of a trace file) keeps fewer requests than the file's block counts describe: the
    summary says they are the whole file's rather than print them as the kept requests'."""
    from blendsim.workloads.hashed import summary_rows
    from blendsim.workloads.loaders import load_blendsim
    from blendsim.workloads.trace import write_trace

    t = load_hashed(small16, block_size=16, output_len=11)
    assert "blocks (unique)" in summary_rows(t.meta)
    s = limit_context(t, 44, "skip")
    rows = summary_rows(s.meta)
    assert "blocks (unique)" not in rows and rows["blocks (unique), whole file"] == summary_rows(t.meta)["blocks (unique)"]
    head = load_blendsim(write_trace(t, tmp_path / "t.parquet"), limit=2)
    assert "blocks (unique), whole file" in summary_rows(head.meta) and "hashed" not in head.meta


@pytest.mark.parametrize("fmt, line, column", [
    ("jsonl", '{"prompt_token_ids":[1,2', 25),
    ("hashed", '{"input_length": 20, "hash_ids": [1', 36),
])
def test_a_record_cut_off_mid_write_is_placed_at_its_lines_end(tmp_path, fmt, line, column):
    """The parser, past the line's newline, would say column 1 of the next line."""
    from blendsim.workloads.loaders import load

    f = tmp_path / "cut.jsonl"
    f.write_text(line + "\n")
    opts = {"block_size": 16, "output_len": 5} if fmt == "hashed" else {}
    with pytest.raises(UserError, match=rf"line 1: not valid JSON \(Expecting ',' delimiter at column {column}\)"):
        load(f, fmt, None, **opts)


def test_a_missing_output_from_file_is_refused_even_when_no_row_needs_it(tmp_path):
    f = tmp_path / "h.jsonl"
    f.write_text('{"input_length": 20, "hash_ids": [1], "output_length": 5}\n')
    with pytest.raises(UserError, match="--output-from nofile.csv: no such file"):
        load_hashed(f, block_size=16, output_from="nofile.csv")
