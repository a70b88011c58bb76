"""The README's and the docs' commands run as written (issue 28 item 7): every line of every bash block that
calls `blendsim` runs, in order, in one scratch folder per document (later lines use what earlier ones
wrote), and must exit 0.

Left out, each for a reason the test states: synopsis lines (placeholders such as TRACE, DIR or
[--option]), installation and test-suite lines (not `blendsim`), and `--device cuda` without a GPU. Sizes
are made small where the SMALL rules below say so (a 40,000-request trace becomes 300 requests, a grid one
point, the fidelity catalogue one row), and nothing else is changed; a command repeated later in the same
document runs once.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDER = re.compile(r"(^|\s)([A-Z][A-Z_]*(\.csv)?|[A-Z]\.csv)(\s|$)|\[|\.\.\.|\w\|\w")
ONE_ROW = "--only 'trtllm-0.13-llama-2-7b-a100-80gb-tp1-fp16-2048x128'"
SMALL = [  # (command prefix, pattern, replacement): sizes only
    ("blendsim", re.compile(r"--requests (\d+)"), lambda m: f"--requests {min(int(m.group(1)), 300)}"),
    ("blendsim sweep", re.compile(r"--densities \S+"), lambda m: "--densities 1.0"),
    ("blendsim sweep", re.compile(r"--sharing \S+"), lambda m: "--sharing 0.2"),
    ("blendsim fidelity", re.compile(r"--only '[^']*'"), lambda m: ONE_ROW),
]


def commands(doc: Path) -> list[tuple[str, str]]:
    """(command, why it is skipped or "") for every `blendsim` command of the document's bash blocks."""
    out = []
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", doc.read_text(), flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            for part in re.split(r"\s*(?:&&|;)\s*", line):
                if not part.startswith("blendsim"):
                    continue
                why = ""
                if PLACEHOLDER.search(part.replace("'trtllm-*'", "")):
                    why = "a synopsis with placeholders"
                elif "--device cuda" in part and not _cuda():
                    why = "needs a CUDA device"
                out.append((part, why))
    return out


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def small(cmd: str) -> str:
    for prefix, pat, rep in SMALL:
        if cmd.startswith(prefix):
            cmd = pat.sub(rep, cmd)
    if cmd.startswith("blendsim demo") and "--requests" not in cmd:
        cmd += " --requests 300"
    if cmd.startswith("blendsim fidelity") and "--only" not in cmd and "--params" not in cmd:
        cmd += " " + ONE_ROW
    return cmd


def test_the_docs_have_commands_and_most_run():
    every = [c for d in DOCS for c in commands(d)]
    assert len(every) >= 20
    assert sum(1 for _, why in every if not why) >= 0.6 * len(every)


@pytest.mark.slow
@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_command_of_the_doc_runs(doc, tmp_path):
    cmds = commands(doc)
    if not any(not why for _, why in cmds):
        pytest.skip(f"{doc.name} has no command to run")
    (tmp_path / "docs").symlink_to(ROOT / "docs")  # the docs' examples by their repository paths
    exe = str(Path(sys.executable).with_name("blendsim"))
    env = {**os.environ, "COLUMNS": "100", "BLENDSIM_PROGRESS_S": "600"}
    done = set()
    for cmd, why in cmds:
        if why or cmd in done:  # a command repeated in a later section ran already
            continue
        done.add(cmd)
        run = small(cmd)
        r = subprocess.run(exe + run[len("blendsim"):], shell=True, cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, f"{doc.name}: `{cmd}` (run as `{run}`) exited {r.returncode}:\n{r.stderr[-2000:]}"


def test_the_fidelity_pattern_of_the_readme_is_the_one_we_narrow():
    readme = [c for c, _ in commands(ROOT / "README.md") if c.startswith("blendsim fidelity --only")]
    assert readme == ["blendsim fidelity --only 'trtllm-*' --no-cv"], readme
    assert shlex.split(small(readme[0]))[3].startswith("trtllm-")
