"""benchmarks/bench_scale.py's inputs (its figures are the benchmark's, not a test's)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "benchmarks"
if str(BENCH) not in sys.path:  # the benchmark imports its helper modules (_proc.py) from beside it
    sys.path.insert(0, str(BENCH))
spec = importlib.util.spec_from_file_location("bench_scale", BENCH / "bench_scale.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_sizes_take_k_and_m_suffixes():
    assert bench.parse_sizes("1m,100k,10_000,100000") == [10_000, 100_000, 1_000_000]
    with pytest.raises(SystemExit, match="not a number"):
        bench.parse_sizes("lots")


def test_missing_data_folder_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as e:
        bench.main(["--data", str(tmp_path), "--workloads", "azure"])
    msg = str(e.value)
    assert "azure_llm_inference_2023_conv.csv: not found (pass --data DIR" in msg and "\n" not in msg


def test_azure_trace_repeats_the_file_lengths(tmp_path):
    import numpy as np

    from blendsim.workloads.trace import read_trace

    data = tmp_path / "data"
    data.mkdir()
    (data / bench.AZURE_FILE).write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                         "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    t = read_trace(bench.make_trace("azure", 5, data, tmp_path / "t.parquet"))
    assert t.input_len.tolist() == [374, 396, 374, 396, 374] and t.output_len.tolist() == [44, 109, 44, 109, 44]
    assert not np.any(t.arrival_s)


def test_trace_made_in_a_child_process_is_the_same(tmp_path):
    bench.make_trace_apart("blendserve", 200, tmp_path, tmp_path / "child.parquet")
    bench.make_trace("blendserve", 200, tmp_path, tmp_path / "here.parquet")
    from blendsim.workloads.trace import read_trace

    a, b = read_trace(tmp_path / "child.parquet"), read_trace(tmp_path / "here.parquet")
    assert a.ids.tolist() == b.ids.tolist() and a.input_len.tolist() == b.input_len.tolist()
    assert a.unit_sym.tolist() == b.unit_sym.tolist() and a.output_len.tolist() == b.output_len.tolist()


def test_unknown_workload_is_one_line():
    with pytest.raises(SystemExit) as e:
        bench.main(["--workloads", "nope"])
    assert "unknown workload 'nope'" in str(e.value) and "\n" not in str(e.value)
