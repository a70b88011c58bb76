"""benchmarks/gpu_validation.py, the one command for a GPU day: its CPU path end to end at small sizes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_validation.py"


@pytest.mark.slow
def test_cpu_path_profiles_replays_three_traces_under_two_policies_and_tabulates(tmp_path):
    out = tmp_path / "validation"
    res = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--small", "--out", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (out / "profile.json").exists()
    s = json.loads((out / "summary.json").read_text())
    assert set(s["replays"]) == {"batchllm", "embodied", "toolbench"}
    for name, r in s["replays"].items():
        assert r["status"] == "complete", name
        assert set(r["per_policy"]) == {"fcfs", "blendserve"}
        for x in r["per_policy"].values():
            assert x["steps"] and x["steps"] > 0
            assert x["predicted_tok_s"] > 0 and x["measured_tok_s"] > 0
            assert x["throughput_error"] == pytest.approx(x["predicted_tok_s"] / x["measured_tok_s"] - 1, rel=1e-6)
        assert r["per_policy"]["blendserve"]["speedup_error"] is not None
    md = (out / "SUMMARY.md").read_text()
    assert md.count("| fcfs |") == 3 and md.count("| blendserve |") == 3
    assert "calibrate --device cpu --model tiny -o" in md and "--quick --holdout 0" in md
    # a second day never replaces the first
    again = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--small", "--out", str(out)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "exists" in (again.stdout + again.stderr)


def test_without_the_device_it_stops_in_one_line_before_making_a_folder(tmp_path, capsys):
    import importlib.util
    from pathlib import Path

    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_validation.py"
    spec = importlib.util.spec_from_file_location("gpu_validation_main", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--out", str(tmp_path / "gv")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no GPU available" in err and not (tmp_path / "gv").exists()


def test_the_day_script_refuses_bad_input_before_making_its_folder(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_validation.py"
    (tmp_path / "trunc.json").write_text("{")
    exe = str(Path(sys.executable).with_name("blendsim"))
    for args, says in ((["--profile", str(tmp_path / "trunc.json")], "corrupt profile"),
                       (["--max-steps", "0"], "--max-steps must be >= 1")):
        r = subprocess.run([sys.executable, str(script), "--device", "cpu", "--small", "--blendsim", exe,
                            "--out", str(tmp_path / "day"), *args], capture_output=True, text=True)
        assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not (tmp_path / "day").exists()
