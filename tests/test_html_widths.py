"""The HTML reports never clip (issue 28 item 3): at a 1,400-px window every table fits its container and
no cell's content overflows it. Measured in headless Chromium (skipped where none is installed); the
static part (wrapping CSS, reasons on their own rows) runs everywhere."""

from __future__ import annotations

import csv
import shutil
import subprocess

import pytest
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.fidelity.suite import SHIPPED_CATALOGUE

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)

# writes one line per table or cell wider than its container into <pre id="overflow">
PROBE = """<script>addEventListener("load", () => {
  const bad = [];
  document.querySelectorAll("table").forEach((t, i) => {
    const box = t.parentElement.getBoundingClientRect().width, w = t.getBoundingClientRect().width;
    if (w > box + 1) bad.push(`table ${i}: ${w.toFixed(0)} px in ${box.toFixed(0)} px`);
    t.querySelectorAll("td, th").forEach(c => {
      if (c.scrollWidth > c.clientWidth + 1) bad.push(`table ${i} cell "${c.textContent.slice(0, 60)}"`);
    });
  });
  const pre = document.createElement("pre"); pre.id = "overflow"; pre.textContent = "RESULT[" + bad.join("|") + "]";
  document.body.appendChild(pre);
});</script>"""


@pytest.fixture(scope="module")
def fidelity_page(tmp_path_factory):
    with open(SHIPPED_CATALOGUE, newline="") as f:
        rows = list(csv.DictReader(f))
    ok = next(r for r in rows if r["id"].startswith("trtllm-0.13-llama-2-7b") and r["id"].endswith("2048x128"))
    bad = {**ok, "id": ok["id"].replace("llama-2-7b", "llama-3.1-405b") + "-no-fit", "model": "llama-3.1-405b"}
    d = tmp_path_factory.mktemp("fid")
    with open(d / "cat.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(ok))
        w.writeheader()
        w.writerows([ok, bad])
    r = CliRunner().invoke(get_app(), ["fidelity", str(d / "cat.csv"), "--no-cv", "-q", "-o", str(d / "rep")])
    assert r.exit_code == 0, r.output
    return d / "rep" / "index.html"


@pytest.fixture(scope="module")
def run_page(tmp_path_factory):
    import blendsim
    from blendsim.reports.render import write_report

    d = tmp_path_factory.mktemp("runs")
    trace = blendsim.synthesize("blendserve", requests=300, density=1.1, sharing=0.3, seed=0)
    for p in ("dfs", "fcfs", "blendserve"):
        blendsim.simulate(trace, policy=p, model="qwen3-30b-a3b", hardware="h100-80gb").write(d / "runs" / p)
    return write_report([d / "runs"], d / "rep")


def test_fidelity_html_puts_reasons_on_rows_of_their_own(fidelity_page):
    page = fidelity_page.read_text()
    assert page.count("rows predicted") == 1  # the summary once
    assert '<tr class="reason"><td colspan=' in page and "does not fit" in page
    assert "output tok/s" in page  # metrics with units
    assert "td.t{white-space:normal" in page  # text cells wrap instead of widening the table


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium installed")
@pytest.mark.parametrize("which", ["fidelity", "runs"])
def test_no_table_is_wider_than_its_container_at_1400_px(which, fidelity_page, run_page, tmp_path):
    page = fidelity_page if which == "fidelity" else run_page
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    out = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000",
                          "--virtual-time-budget=3000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    import re

    found = re.search(r'<pre id="overflow">RESULT\[(.*?)\]</pre>', out, flags=re.S)
    assert found, out[-500:]
    assert found.group(1) == "", found.group(1)
