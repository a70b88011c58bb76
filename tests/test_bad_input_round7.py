"""Bad input, round 7 (trace loading): a JSONL line without the arrival time other lines have, ``-o`` over the
``--output-from`` trace, compressed CSV and JSONL files, unpaired surrogates, JSON Python cannot hold in the
block-hash loader and in ``--output-from``, BurstGPT labels that depended on ``--limit``, lengths over MAX_TOKENS
named by the file's line and field, a key given twice in a block-hash line, distinct blocks counted per prefix,
and two misleading messages."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import zipfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.sim.prefix_tree import PrefixTree
from blendsim.workloads.loaders import load
from blendsim.workloads.trace import from_columns, read_trace, write_trace
from tests.helpers import one_line_error


def _run(*args):
    return CliRunner().invoke(get_app(), [str(a) for a in args])


def _load(src, fmt, out, *more):
    return _run("workloads", "load", src, "-f", fmt, "-o", out, *more)


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


JL = {"prompt_token_ids": [1, 2], "output_len": 3}
HL = {"input_length": 10, "output_length": 1, "hash_ids": [1]}


# ---- F1: a JSONL line without arrival_s among timed lines ---------------------------------------------------------
@pytest.mark.parametrize("second", [dict(JL), {**JL, "arrival_s": None}])
def test_a_jsonl_line_without_the_arrival_time_others_have_is_refused(tmp_path, second):
    src = _jsonl(tmp_path / "t.jsonl", [{**JL, "arrival_s": 5}, second])
    one_line_error(_load(src, "jsonl", tmp_path / "o.parquet"), f"{src}: line 2, field arrival_s",
                   "where line 1 has one", "give every line one")
    assert not (tmp_path / "o.parquet").exists()
    src = _jsonl(tmp_path / "u.jsonl", [JL, {**JL, "arrival_s": 5}])  # the untimed line first
    one_line_error(_load(src, "jsonl", tmp_path / "o.parquet"), "line 1, field arrival_s", "where line 2 has one")
    # every line or none: given times are kept as given (the trace's own clock), none is offline
    timed = load(_jsonl(tmp_path / "a.jsonl", [{**JL, "arrival_s": 100}, {**JL, "arrival_s": 200}]), "jsonl")
    assert timed.arrival_s.tolist() == [100.0, 200.0]
    assert load(_jsonl(tmp_path / "b.jsonl", [JL, JL]), "jsonl").arrival_s.tolist() == [0.0, 0.0]
    from blendsim.workloads.loaders import load_jsonl, load_vidur

    assert "as every loader's do" not in load_vidur.__doc__ and "kept as given" in load_jsonl.__doc__


# ---- F2: -o may not replace the --output-from file -------------------------------------------------------------
@pytest.mark.parametrize("suffix", ["", ":output_len"])
def test_output_may_not_replace_the_output_from_trace(tmp_path, suffix):
    lens = write_trace(from_columns(input_len=[5] * 4, output_len=[1, 2, 3, 4]), tmp_path / "lens.parquet")
    before = lens.read_bytes()
    src = _jsonl(tmp_path / "t.jsonl", [{"input_length": 1000, "hash_ids": [1, 2]}])
    one_line_error(_load(src, "mooncake", lens, "--output-from", f"{lens}{suffix}"), f"is the input {lens}",
                   "give the output another name")
    assert lens.read_bytes() == before
    assert _load(src, "mooncake", tmp_path / "o.parquet", "--output-from", f"{lens}{suffix}").exit_code == 0


# ---- F3: compressed files ---------------------------------------------------------------------------------------
HEADER = "Timestamp,Request tokens,Response tokens\n"
COMPRESS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def _compressed(path: Path, text: bytes | str) -> Path:
    data = text.encode() if isinstance(text, str) else text
    path.write_bytes(COMPRESS[path.suffix](data))
    return path


@pytest.mark.parametrize("suffix", sorted(COMPRESS))
def test_compressed_csvs_are_checked_on_their_decompressed_text(tmp_path, suffix):
    dup = _compressed(tmp_path / f"dup.csv{suffix}", "Timestamp,Request tokens,Request tokens,Response tokens\n0,10,11,5\n")
    one_line_error(_load(dup, "burstgpt", tmp_path / "o.parquet"), f"{dup}: column 'Request tokens' appears twice")
    trailing = _compressed(tmp_path / f"tr.csv{suffix}", HEADER + "0,10,5,\n1,20,6,\n")
    one_line_error(_load(trailing, "burstgpt", tmp_path / "o.parquet"),
                   f"{trailing}: data row 1 has 4 fields (a trailing comma?), the header 3")
    bad = _compressed(tmp_path / f"u.csv{suffix}", (HEADER + "0,10,5\n1,20,").encode() + b"\xff\n")
    one_line_error(_load(bad, "burstgpt", tmp_path / "o.parquet"), f"{bad}: data row 2: not UTF-8 text (byte 0xff")
    # a good one loads as its plain text does, byte for byte (with a limit too: the text path)
    body = HEADER + "".join(f"{i},{10 + i},{i % 3}\n" for i in range(30))
    (tmp_path / "plain.csv").write_text(body)
    good = _compressed(tmp_path / f"good.csv{suffix}", body)
    for limit in ([], ["--limit", "5"]):
        assert _load(tmp_path / "plain.csv", "burstgpt", tmp_path / "a.parquet", *limit).exit_code == 0
        assert _load(good, "burstgpt", tmp_path / "b.parquet", *limit).exit_code == 0
        a, b = read_trace(tmp_path / "a.parquet"), read_trace(tmp_path / "b.parquet")
        assert a.ids.tolist() == b.ids.tolist() and a.input_len.tolist() == b.input_len.tolist()


@pytest.mark.parametrize("suffix", sorted(COMPRESS))
def test_a_file_that_is_not_what_its_compression_suffix_says_is_one_line(tmp_path, suffix):
    kind = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz"}[suffix]
    plain = tmp_path / f"t.csv{suffix}"
    plain.write_text(HEADER + "0,10,5\n")
    one_line_error(_load(plain, "burstgpt", tmp_path / "o.parquet"), f"{plain}: not readable as {kind} data")
    cut = tmp_path / f"cut.csv{suffix}"
    cut.write_bytes(COMPRESS[suffix]((HEADER + "0,10,5\n" * 2000).encode())[:60])
    one_line_error(_load(cut, "burstgpt", tmp_path / "o.parquet"), f"{cut}: not readable as {kind} data")
    jl = tmp_path / f"t.jsonl{suffix}"
    jl.write_text(json.dumps(JL) + "\n")
    one_line_error(_load(jl, "jsonl", tmp_path / "o.parquet"), f"{jl}: not readable as {kind} data")


def test_other_compressions_and_archives_are_refused(tmp_path):
    z = tmp_path / "t.csv.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("t.csv", HEADER + "0,10,5\n")
    one_line_error(_load(z, "burstgpt", tmp_path / "o.parquet"), f"{z}: a .zip file is not read", "decompress it first")
    tgz = tmp_path / "t.tar.gz"
    tgz.write_bytes(gzip.compress(b"not a tar"))
    one_line_error(_load(tgz, "burstgpt", tmp_path / "o.parquet"), "a .tar.gz file is not read")
    zst = tmp_path / "t.jsonl.zst"
    zst.write_bytes(b"(\xb5/\xfd")
    one_line_error(_load(zst, "jsonl", tmp_path / "o.parquet"), "a .zst file is not read")


def test_compressed_jsonl_traces_and_length_files_load_as_their_plain_text(tmp_path):
    rows = [{**JL, "id": "a"}, {**JL, "prompt_token_ids": [1, 2, 3], "id": "b"}]
    plain = _jsonl(tmp_path / "t.jsonl", rows)
    gz = _compressed(tmp_path / "t.jsonl.gz", b"\xef\xbb\xbf" + plain.read_bytes())  # a byte-order mark too
    a, b = load(plain, "jsonl"), load(gz, "jsonl")
    assert a.ids.tolist() == b.ids.tolist() == ["a", "b"] and b.input_len.tolist() == [2, 3]
    hashed = _compressed(tmp_path / "m.jsonl.xz", json.dumps({"input_length": 600, "hash_ids": [1, 2]}) + "\n")
    lens = _compressed(tmp_path / "lens.csv.bz2", "output_tokens\n7\n")
    t = load(hashed, "mooncake", output_from=str(lens))
    assert t.output_len.tolist() == [7] and t.meta["output_len"]["sampled_from"] == f"{lens}:output_tokens"
    jlens = _compressed(tmp_path / "lens.jsonl.gz", json.dumps({"output_len": 9}) + "\n")
    assert load(hashed, "mooncake", output_from=str(jlens)).output_len.tolist() == [9]


# ---- F4: unpaired surrogates ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt, line, field, ch", [
    ("jsonl", '{"prompt_token_ids": [1], "output_len": 1, "id": "a\\ud800b"}', "id", "\\ud800"),
    ("jsonl", '{"prompt_token_ids": [1], "output_len": 1, "source": "\\udfff"}', "source", "\\udfff"),
    ("mooncake", '{"input_length": 10, "output_length": 1, "hash_ids": [1], "request_id": "\\ud800"}',
     "request_id", "\\ud800"),
])
def test_an_unpaired_surrogate_is_refused_at_parse_time(tmp_path, fmt, line, field, ch):
    good = json.dumps(JL if fmt == "jsonl" else {**HL, "request_id": "x"})
    src = _jsonl(tmp_path / "t.jsonl", [good, "", line])
    one_line_error(_load(src, fmt, tmp_path / "o.parquet"), f"{src}: line 3, field {field}: contains an unpaired "
                   f"surrogate ({ch})")
    assert not list(tmp_path.glob("*.parquet")) and not list(tmp_path.glob(".o.parquet*"))
    # a pair of surrogate escapes is one character, and loads
    ok = _jsonl(tmp_path / "ok.jsonl", [line.replace(ch, "\\ud83d\\ude00")])
    assert _load(ok, fmt, tmp_path / "ok.parquet").exit_code == 0


# ---- F5: JSON Python cannot hold, in the block-hash loader and --output-from -------------------------------------
def test_the_block_hash_loader_refuses_json_python_cannot_hold(tmp_path):
    big = _jsonl(tmp_path / "big.jsonl", ['{"input_length": ' + "9" * 5000 + ', "output_length": 1, "hash_ids": [1]}'])
    one_line_error(_load(big, "mooncake", tmp_path / "o.parquet"), f"{big}: line 1: not usable JSON", "4300")
    deep = _jsonl(tmp_path / "deep.jsonl", ['{"input_length": 10, "output_length": 1, "hash_ids": '
                                            + "[" * 100000 + "]" * 100000 + "}"])
    one_line_error(_load(deep, "mooncake", tmp_path / "o.parquet"), f"{deep}: line 1: not usable JSON", "recursion")
    ts = _jsonl(tmp_path / "ts.jsonl", ['{"timestamp": ' + "9" * 400 + ', "input_length": 10, "output_length": 1, '
                                        '"hash_ids": [1]}'])
    err = one_line_error(_load(ts, "mooncake", tmp_path / "o.parquet"), f"{ts}: line 1, field timestamp",
                         "is not a finite number")
    assert len(err) < 250


def test_output_from_a_jsonl_file_reads_as_the_loaders_do(tmp_path):
    src = _jsonl(tmp_path / "t.jsonl", [{"input_length": 1000, "hash_ids": [1, 2]}])
    out = tmp_path / "o.parquet"
    binary = tmp_path / "bin.jsonl"
    binary.write_bytes(b"\xff\xfe garbage\n")
    one_line_error(_load(src, "mooncake", out, "--output-from", binary), f"--output-from {binary}: not a UTF-8 text file")
    big = _jsonl(tmp_path / "big.jsonl", ['{"output_len": ' + "9" * 5000 + "}"])
    one_line_error(_load(src, "mooncake", out, "--output-from", big), f"--output-from {big}: line 1: not usable JSON")
    huge = _jsonl(tmp_path / "huge.jsonl", ['{"output_len": ' + "9" * 400 + "}"])
    one_line_error(_load(src, "mooncake", out, "--output-from", huge), f"--output-from {huge}: line 1, field "
                   "output_len", "not a finite number")
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"output_len": 5}).encode() + b"\n")
    assert _load(src, "mooncake", out, "--output-from", bom).exit_code == 0
    assert read_trace(out).output_len.tolist() == [5]
    one_line_error(_load(src, "mooncake", out, "--output-from", tmp_path), f"--output-from {tmp_path}: is a folder")


# ---- F6: BurstGPT sources do not depend on --limit --------------------------------------------------------------
def test_burstgpt_model_labels_are_the_same_with_and_without_a_limit(tmp_path):
    src = tmp_path / "b.csv"
    src.write_text("Timestamp,Model,Request tokens,Response tokens\n0,4,100,10\n1,,200,20\n2,4,300,30\n")
    whole, limited = load(src, "burstgpt"), load(src, "burstgpt", limit=100)
    assert whole.source.tolist() == limited.source.tolist() == ["burstgpt/4", "burstgpt", "burstgpt/4"]
    assert _load(src, "burstgpt", tmp_path / "a.parquet").exit_code == 0
    assert _load(src, "burstgpt", tmp_path / "b.parquet", "--limit", "100").exit_code == 0
    assert (tmp_path / "a.parquet").read_bytes() != b""
    assert read_trace(tmp_path / "a.parquet").source.tolist() == read_trace(tmp_path / "b.parquet").source.tolist()


# ---- F7: lengths over MAX_TOKENS named by the file's line and field ---------------------------------------------
@pytest.mark.parametrize("field", ["input_length", "output_length"])
def test_a_block_hash_length_over_max_tokens_names_the_files_line_and_field(tmp_path, field):
    row = {**HL, "hash_ids": [2]}
    row[field] = 20_000_000
    if field == "input_length":
        row["hash_ids"] = list(range(-(-20_000_000 // 512)))
    src = _jsonl(tmp_path / "t.jsonl", [HL, "", "", "", row])
    one_line_error(_load(src, "mooncake", tmp_path / "o.parquet"), f"{src}: line 5, field {field}: 20000000 exceeds "
                   "10,000,000 tokens (MAX_TOKENS")


# ---- F8: a key given twice in a block-hash line -----------------------------------------------------------------
def test_a_block_hash_line_naming_a_key_twice_is_refused(tmp_path):
    src = _jsonl(tmp_path / "t.jsonl", [HL, '{"input_length": 10, "input_length" : 600, "output_length": 1, '
                                            '"hash_ids": [2]}'])
    one_line_error(_load(src, "mooncake", tmp_path / "o.parquet"), f"{src}: line 2: not usable JSON",
                   "key 'input_length' appears twice in one object")
    nested = _jsonl(tmp_path / "n.jsonl", [{**HL, "extra": {"k": 1}}, '{"input_length": 10, "output_length": 1, '
                                           '"hash_ids": [2], "extra": {"k": 1, "k": 2}}'])
    one_line_error(_load(nested, "mooncake", tmp_path / "o.parquet"), "line 2: not usable JSON", "'k' appears twice")
    # colons in strings or nested objects (the strict parse runs, and finds nothing wrong)
    ok = _jsonl(tmp_path / "ok.jsonl", [{**HL, "request_id": "a:b", "extra": {"x": "1:2"}}])
    assert load(ok, "mooncake").ids.tolist() == ["a:b"]


# ---- F9: distinct blocks counted per prefix, as the tree counts them --------------------------------------------
def test_distinct_blocks_are_counted_per_prefix(tmp_path):
    src = _jsonl(tmp_path / "t.jsonl", [{"input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
                                        {"input_length": 1024, "output_length": 1, "hash_ids": [3, 2]},
                                        {"input_length": 1100, "output_length": 1, "hash_ids": [1, 2, 9]}])
    t = load(src, "mooncake")
    h = t.meta["hashed"]
    assert h["blocks"] == 7 and h["unique_blocks"] == 5 and h["unique_block_tokens"] == 4 * 512 + 76
    assert PrefixTree(t).optimal_sharing_ratio() == pytest.approx(1 - h["unique_block_tokens"] / 3148)
    r = _load(src, "mooncake", tmp_path / "o.parquet")
    assert r.exit_code == 0 and "7 (5)" in r.output


# ---- F11: messages that misled ------------------------------------------------------------------------------------
def test_csv_row_numbers_skip_blank_lines_for_every_error(tmp_path):
    utf = tmp_path / "u.csv"
    utf.write_bytes((HEADER + "\n\n0,10,5\n1,20,").encode() + b"\xff\n")
    one_line_error(_load(utf, "burstgpt", tmp_path / "o.parquet"), f"{utf}: data row 2: not UTF-8 text")
    wide = tmp_path / "w.csv"
    wide.write_text(HEADER + "\n\n0,10,5,\n1,20,6,\n")
    one_line_error(_load(wide, "burstgpt", tmp_path / "o.parquet", "--limit", "1"),
                   f"{wide}: data row 1 has 4 fields (a trailing comma?)")


def test_a_jsonl_default_id_clash_does_not_claim_the_line_has_an_id(tmp_path):
    src = _jsonl(tmp_path / "t.jsonl", [{**JL, "id": 1}, JL])
    err = one_line_error(_load(src, "jsonl", tmp_path / "o.parquet"), f"{src}: line 2: has no id field",
                         "by default ('1'", "line 1's", "give every line an id, or none")
    assert "field id:" not in err
    src = _jsonl(tmp_path / "u.jsonl", [JL, {**JL, "id": 0}])
    one_line_error(_load(src, "jsonl", tmp_path / "o.parquet"), "line 2, field id: '0' is the id line 1 gets by default")


def test_the_fixes_keep_loads_byte_identical(tmp_path):
    rows = [{"timestamp": 10 * i, "input_length": 600 + i, "output_length": 3, "hash_ids": [0, 100 + i]}
            for i in range(20)]
    src = _jsonl(tmp_path / "m.jsonl", rows)
    outs = []
    for name in ("a", "b"):
        assert _load(src, "mooncake", tmp_path / f"{name}.parquet").exit_code == 0
        outs.append((tmp_path / f"{name}.parquet").read_bytes())
    assert outs[0] == outs[1]
    assert np.all(read_trace(tmp_path / "a.parquet").input_len == [r["input_length"] for r in rows])


def test_the_api_tells_a_compressed_file_s_format_by_its_inner_name(tmp_path):
    import gzip

    import blendsim

    f = tmp_path / "t.jsonl.gz"
    with gzip.open(f, "wt") as fh:
        fh.write('{"prompt_token_ids": [1, 2, 3], "output_len": 4}\n{"prompt_token_ids": [1, 2], "output_len": 2}\n')
    t = blendsim.load_trace(f)
    assert t.n == 2 and t.input_len.tolist() == [3, 2]
