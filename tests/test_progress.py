"""Progress of long commands (blendsim.progress): plain lines on a pipe at most every interval, a rich bar
on a terminal, nothing with --quiet; and the commands that use it."""

from __future__ import annotations

import io
import time

from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.progress import Progress


def test_plain_lines_on_a_pipe_say_done_total_and_detail():
    buf = io.StringIO()
    with Progress("fidelity", total=4, unit="rows", stream=buf, interval=0.02) as bar:
        for i in range(4):
            bar.update(i + 1, detail=f"row-{i}")
            time.sleep(0.05)
    lines = buf.getvalue().splitlines()
    assert lines, "a pipe got no progress line"
    assert all(line.startswith("fidelity: ") and "rows (" in line and "s elapsed" in line for line in lines)
    assert "4/4 rows (100%)" in lines[-1] or any("row-" in line for line in lines)


def test_lines_are_rate_limited_to_the_interval():
    buf = io.StringIO()
    with Progress("sweep", total=1000, stream=buf, interval=0.2) as bar:
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < 0.5:
            i += 1
            bar.update(i % 1000)
    assert 1 <= len(buf.getvalue().splitlines()) <= 3  # 0.5 s at one line per 0.2 s, whatever the update rate


def test_quiet_prints_nothing_and_a_terminal_gets_no_plain_lines():
    for kw in ({"quiet": True}, {"tty": True}):
        buf = io.StringIO()
        with Progress("x", total=3, stream=buf, interval=0.01, **kw) as bar:
            for i in range(3):
                bar.update(i + 1)
                time.sleep(0.03)
        plain = [line for line in buf.getvalue().splitlines() if line.startswith("x: ")]
        assert plain == []
        if kw.get("quiet"):
            assert buf.getvalue() == ""


def test_open_ended_task_shows_its_detail():
    buf = io.StringIO()
    with Progress("validate", stream=buf, interval=0.02) as bar:
        bar.update(0, detail="fcfs replica 0: step 3/10")
        time.sleep(0.08)
    assert "validate: " in buf.getvalue() and "fcfs replica 0: step 3/10" in buf.getvalue()


def test_piped_sweep_prints_progress_and_quiet_silences_it(tmp_path, monkeypatch):
    monkeypatch.setenv("BLENDSIM_PROGRESS_S", "0.01")
    grid = ["--recipe", "blendserve", "--densities", "1.0", "--sharing", "0.2", "--policies", "dfs,fcfs",
            "--requests", "300", "--jobs", "1"]
    r = CliRunner().invoke(get_app(), ["sweep", *grid, "-o", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert "sweep: " in r.stderr and " cells (" in r.stderr
    q = CliRunner().invoke(get_app(), ["sweep", *grid, "-o", str(tmp_path / "b"), "--quiet"])
    assert q.exit_code == 0, q.output
    assert " cells (" not in q.stderr
