"""Catalogue row ids name their engine first (issue 28 item 7): the README's `fidelity --only 'trtllm-*'`
selects every TensorRT-LLM row and nothing else."""

from __future__ import annotations

import csv
import fnmatch

from blendsim.fidelity.suite import SHIPPED_CATALOGUE


def _rows():
    with open(SHIPPED_CATALOGUE, newline="") as f:
        return list(csv.DictReader(f))


def test_every_id_starts_with_its_engine():
    rows = _rows()
    assert rows
    for r in rows:
        assert r["id"].startswith(r["engine"] + "-"), r["id"]


def test_readme_pattern_selects_the_tensorrt_llm_rows():
    rows = _rows()
    picked = {r["id"] for r in rows if fnmatch.fnmatchcase(r["id"], "trtllm-*")}
    assert picked == {r["id"] for r in rows if r["engine"] == "trtllm"}
    assert len(picked) >= 48  # 42 v0.13 rows and 6 GB200 rows (more when rows are added)
