"""Terminal output at a fixed width (rich Console(width=80 | 120)): tables neither cut cells ("…") nor
overflow the width, prose wraps only between words; ``policies NAME``; the summary keys of online runs
with and without SLOs; the critical-path warning."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from blendsim.cli import get_app
from blendsim.policies.base import option_records
from blendsim.reports import terminal as TT
from blendsim.sim.metrics import CRITICAL_SHARE, critical_path_warning
from tests.helpers import random_trace

WIDTHS = (80, 120)
LATENCY_KEYS = {"latency_mean_s", "latency_p50_s", "latency_p99_s", "ttft_mean_s", "ttft_p50_s", "ttft_p99_s",
                "tbt_mean_s", "tbt_p50_s", "tbt_p99_s"}
SLO_KEYS = {"slo_attainment", "goodput_tok_s"}


def render(fn, width: int, *args, **kw) -> str:
    buf = io.StringIO()
    fn(*args, c=Console(width=width, file=buf, highlight=False, soft_wrap=False, color_system=None), **kw)
    return buf.getvalue()


def fits(text: str, width: int) -> None:
    lines = text.splitlines()
    assert lines and max(len(x.rstrip()) for x in lines) <= width, text
    assert "…" not in text, text


def flat(text: str) -> str:
    return " ".join(text.split())


def _run(trace, policy="fcfs"):
    from blendsim.runner import RunConfig, run_simulation

    return run_simulation(trace, RunConfig(policy=policy, model="tiny", hardware="cpu")).summary


@pytest.fixture(scope="module")
def summaries():
    rng = np.random.default_rng(3)
    return {"offline": _run(random_trace(rng, n=25)), "online": _run(random_trace(rng, n=25, arrivals=True)),
            "slo": _run(random_trace(rng, n=25, arrivals=True, slos=True))}


def test_online_summary_keys_follow_the_trace(summaries):
    off, on, slo = summaries["offline"], summaries["online"], summaries["slo"]
    assert off["offline"] is True and not (LATENCY_KEYS | SLO_KEYS) & set(off) and "last_arrival_s" not in off
    assert on["offline"] is False and LATENCY_KEYS <= set(on) and not SLO_KEYS & set(on)
    assert not [k for k in on if "slo" in k]  # no SLO attainment of any kind without SLOs
    assert LATENCY_KEYS | SLO_KEYS <= set(slo) and "ttft_slo_attainment" in slo
    assert on["latency_p50_s"] <= on["latency_p99_s"] and on["ttft_p50_s"] <= on["ttft_p99_s"]
    assert on["tbt_p50_s"] <= on["tbt_p99_s"]


@pytest.mark.parametrize("width", WIDTHS)
def test_run_summary_wraps_between_words(summaries, width):
    for kind, s in summaries.items():
        out = render(TT.print_run_summary, width, s)
        fits(out, width)
        for line in TT.run_summary_lines(s):
            assert flat(line) in flat(out), (kind, line)
        if kind == "offline":
            assert "of T_o" in out and "latency" not in out
        else:  # online: latency first, the offline bounds only as such
            assert flat(out).index("latency mean") < flat(out).index("throughput")
            assert "of T_o" not in out and "offline bounds, for reference only" in flat(out)
            assert ("SLO attainment" in out) == (kind == "slo")


@pytest.mark.parametrize("width", WIDTHS)
def test_policy_list_and_every_policy_fit(width):
    from blendsim.policies.registry import get_policy, policy_names

    out = render(TT.print_policies, width)
    fits(out, width)
    for n in policy_names():
        assert flat(get_policy(n).description) in flat(out)
        one = render(TT.print_policies, width, n)
        fits(one, width)
        for k, o in option_records(get_policy(n)).items():
            assert f"{k} = {TT._default(o.default)}" in one, (n, k)
            assert flat(o.meaning) in flat(one), (n, k)


def test_every_option_is_a_record_with_a_source():
    from blendsim.policies.option import Option
    from blendsim.policies.registry import get_policy, policy_names

    for n in policy_names():
        cls = get_policy(n)
        assert cls.paper, n
        for k, o in cls.options.items():
            assert isinstance(o, Option) and o.source and o.meaning, (n, k)


def test_options_validate_themselves():
    from blendsim.policies.option import Option
    from blendsim.sim.errors import UserError

    frac = Option(0.5, "a fraction", "ours", lo=0.0, hi=1.0)
    assert frac.coerce("f", "0.25") == 0.25
    with pytest.raises(UserError, match=r"option f: expected a value in \[0, 1\], got '2'"):
        frac.coerce("f", "2")
    mode = Option("a", "a or b", "ours", choices=("a", "b"))
    with pytest.raises(UserError, match="option m: expected one of a, b, got 'c'"):
        mode.coerce("m", "c")
    assert Option.of((3, "legacy pair")) == Option(3, "legacy pair")


def test_policies_name_on_the_command_line():
    r = CliRunner().invoke(get_app(), ["policies", "e2"])
    assert r.exit_code == 0, r.output
    assert "th_bal = 1.5" in r.stdout and "source: Preble code (paper gives none)" in flat(r.stdout)
    r = CliRunner().invoke(get_app(), ["policies", "nope"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "unknown policy 'nope'" in r.stderr


@pytest.mark.parametrize("width", WIDTHS)
def test_demo_table_keeps_names_and_numbers_whole(summaries, width):
    s = summaries["offline"]
    runs = {p: s for p in ("fcfs", "dfs", "random", "blendserve", "batchllm")}
    out = render(TT.print_demo_table, width, runs, "dfs", setting="simulated: tiny on cpu")
    fits(out, width)
    for p in runs:
        assert p in out
    assert f"{s['throughput_tok_s']:,.0f}" in out and "vs dfs" in out and "1.000×" in out
    assert "tok/s: throughput" in flat(out)  # the legend


def test_a_demo_reference_below_the_bound_is_no_estimate(summaries):
    """A blended reference shorter than the run's T_o left out the longest request's chain: "of ref" shows "–"
    and the legend says why, as the reports do; one above T_o shows its percentage."""
    s = summaries["offline"]
    below = {**s, "t_reference_s": 0.5 * s["t_opt_s"]}
    above = {**s, "t_reference_s": min(1.5 * s["t_opt_s"], s["makespan_s"])}
    out = flat(render(TT.print_demo_table, 200, {"dfs": above, "fcfs": below}, "dfs"))
    assert "–: below the run's T_o, so no estimate" in out
    assert f"{100 * above['t_reference_s'] / s['makespan_s']:.1f}%" in out
    assert "no estimate" not in flat(render(TT.print_demo_table, 200, {"dfs": above}, "dfs"))


@pytest.mark.parametrize("width", WIDTHS)
def test_trace_stats_are_labelled(width):
    stats = {"requests": 12345, "input_tokens": 9876543, "output_tokens": 123456, "mean_input_len": 800.1,
             "mean_output_len": 10.0, "sources": {"burstgpt": 10000, "mmlu": 2345}, "has_arrivals": True,
             "has_slos": False, "optimal_sharing_ratio": 0.35, "compute_density": None, "t_comp_s": 1.5,
             "t_mem_s": 2.25, "t_opt_s": 2.25, "model": "llama-3-8b", "hardware": "a100-80gb", "meta": {"x": 1}}
    out = render(TT.print_trace_stats, width, stats, "t.parquet")
    fits(out, width)
    assert "9,876,543" in out and "35.00%" in out and "burstgpt: 10,000, mmlu: 2,345" in out
    assert "compute density rho" in out and "no decode work" in out
    assert "{" not in out and "has_arrivals" not in out  # no raw keys, no Python dict


def test_critical_path_warning():
    s = {"t_critical_s": CRITICAL_SHARE * 100.0, "makespan_s": 100.0, "offline": True}
    assert "dominated by its critical path" in critical_path_warning(s)
    assert "50%" in critical_path_warning(s) and "T_critical" in critical_path_warning(s)
    assert critical_path_warning({**s, "t_critical_s": 49.9}) is None
    assert critical_path_warning({**s, "offline": False}) is None  # online: the arrivals set the makespan
    assert critical_path_warning({**s, "offline": np.bool_(False)}) is None
    assert critical_path_warning({"makespan_s": 1.0}) is None and critical_path_warning({**s, "makespan_s": 0}) is None
    many = TT.critical_path_lines([("a", s), ("b", {**s, "t_critical_s": 80.0}), ("c", {**s, "t_critical_s": 1.0})])
    assert many.startswith("2 of 3 runs (a, b)") and "50-80% of the makespan" in many
    assert "alone takes 50.0-80.0 s (T_critical)" in many  # a range over the runs, smallest first (not "a / b")
    same = TT.critical_path_lines([("a", s), ("b", s)])
    assert "alone takes 50.0 s (T_critical), 50% of the makespan" in same  # one figure, not "50-50%"


def test_simulate_warns_when_one_request_dominates(tmp_path):
    from blendsim.workloads.trace import from_columns, write_trace

    f = write_trace(from_columns(input_len=[8] * 20 + [8], output_len=[2] * 20 + [400]), tmp_path / "t.parquet")
    r = CliRunner().invoke(get_app(), ["simulate", str(f), "--model", "tiny", "--hardware", "cpu", "-o",
                                       str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["t_critical_s"] >= 0.5 * s["makespan_s"]
    assert "warning: the makespan is dominated by its critical path" in flat(r.stdout)
    # with --json stdout is the record alone, and the warning goes to stderr rather than nowhere
    r = CliRunner().invoke(get_app(), ["simulate", str(f), "--model", "tiny", "--hardware", "cpu", "--json", "-o",
                                       str(tmp_path / "r"), "--force"])
    assert r.exit_code == 0 and json.loads(r.stdout)["t_critical_s"] == s["t_critical_s"]
    assert "warning: the makespan is dominated by its critical path" in flat(r.stderr)


def test_sweep_warns_once_for_dominated_cells(tmp_path):
    for crit, pol in [(80.0, "dfs"), (10.0, "random"), (70.0, "blendserve")]:
        cell = tmp_path / "runs" / "m" / "h" / "d1-s0.1" / pol
        cell.mkdir(parents=True)
        label = {"workload": "d1-s0.1", "model": "m", "hardware": "h", "grid_density": 1.0, "grid_sharing": 0.1,
                 "policy": pol, "run_dir": f"runs/m/h/d1-s0.1/{pol}"}
        (cell / "cell.json").write_text(json.dumps(label))
        (cell / "summary.json").write_text(json.dumps({"throughput_tok_s": 1.0, "makespan_s": 100.0,
                                                       "t_critical_s": crit, "offline": True}))
    lines = TT.sweep_warnings(tmp_path)
    assert len(lines) == 1 and lines[0].startswith("2 of 3 runs (d1-s0.1/blendserve, d1-s0.1/dfs)")



def test_sweep_warnings_name_the_deployment_of_a_grid_of_several(tmp_path):
    """Two models on two GPUs: each cell named with its model and hardware (was: one label for four cells)."""
    for m in ("m1", "m2"):
        for h in ("h1", "h2"):
            cell = tmp_path / "runs" / m / h / "d1-s0.1" / "dfs"
            cell.mkdir(parents=True)
            label = {"workload": "d1-s0.1", "model": m, "hardware": h, "grid_density": 1.0, "grid_sharing": 0.1,
                     "policy": "dfs", "run_dir": f"runs/{m}/{h}/d1-s0.1/dfs"}
            (cell / "cell.json").write_text(json.dumps(label))
            (cell / "summary.json").write_text(json.dumps({"throughput_tok_s": 1.0, "makespan_s": 100.0,
                                                           "t_critical_s": 80.0, "offline": True, "engine": "vllm"}))
    lines = TT.sweep_warnings(tmp_path)
    assert len(lines) == 1 and lines[0].startswith(
        "4 of 4 runs (d1-s0.1/dfs on m1/h1, d1-s0.1/dfs on m1/h2, d1-s0.1/dfs on m2/h1, d1-s0.1/dfs on m2/h2)"), lines


def test_null_bounds_print_as_a_dash(summaries):
    """A summary whose density JSON could not hold (no decode work: written as null) still prints."""
    s = {**summaries["offline"], "compute_density": None, "frac_of_opt": None}
    out = render(TT.print_run_summary, 80, s)
    assert "compute density unbounded" in flat(out) and "– of T_o" in flat(out)


def test_policies_name_says_when_a_policy_brings_its_own_scheduler_or_router(tmp_path):
    """Review E, F10: a policy with its own Scheduler subclass was described as using "the engine's defaults"."""
    src = tmp_path / "mine.py"
    src.write_text("import blendsim\nfrom blendsim.sim.scheduler import Scheduler\n\n\n"
                   "class Oldest(Scheduler):\n    def pick_victim(self):\n        return next(iter(self.running.values()), None)\n\n\n"
                   "class ByAttr(blendsim.Policy):\n    scheduler_cls = Oldest\n\n\n"
                   "class ByMake(blendsim.Policy):\n    engine_defaults = {'max_seqs': 8}\n\n"
                   "    def make_scheduler(self, replica, **kw):\n"
                   "        return Oldest(queue=self.wait_queue(), replica=replica, **kw)\n\n\n"
                   "class R(blendsim.Router):\n    def route(self, req, now):\n        return 0\n\n\n"
                   "class ByRouter(blendsim.Policy):\n    def make_router(self, replicas):\n        return R(self.ctx, replicas)\n")
    line = {k: flat(render(TT.print_policies, 200, f"{src}:{k}")) for k in ("ByAttr", "ByMake", "ByRouter")}
    assert "scheduler: its own, Oldest (scheduler_cls), with the engine's defaults; router: round-robin" in line["ByAttr"]
    assert "scheduler: its own (make_scheduler), with max_seqs=8 (over the engine's); router: round-robin" in \
        line["ByMake"]
    assert "scheduler: the engine's defaults; router: its own (make_router)" in line["ByRouter"]
    accelgen = flat(render(TT.print_policies, 200, "accelgen"))
    assert "scheduler: its own, AccelGenScheduler (make_scheduler), with token_budget=" in accelgen
    assert "scheduler: the engine's defaults" in flat(render(TT.print_policies, 200, "fcfs"))
