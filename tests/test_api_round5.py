"""The Python API as a researcher uses it (a review of 30 Nov 2026): plan checks its arguments as every other function
does and takes policy classes and the CLI's --max-tp names, a user's progress callback failing is one line and hears
the end of the run, an engine release beyond every modelled major version says which profile priced it, a policy
class cannot take a built-in's name, and a run can be priced in dollars."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import blendsim
from blendsim.sim.errors import UserError
from tests.helpers import random_trace

TINY = {"model": "tiny", "hardware": "cpu"}


@pytest.fixture(scope="module")
def trace():
    return random_trace(np.random.default_rng(7), n=30)


def _err(fn) -> str:
    with pytest.raises(UserError) as e:
        fn()
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


@pytest.mark.parametrize("kwargs, says", [
    ({"max_gpu": 1}, "unexpected keyword argument 'max_gpu'"),
    ({"budget": "100"}, "--budget must be a finite number > 0, got '100' (str)"),
    ({"jobs": "2"}, "--jobs must be a whole number >= 1, got '2' (str)"),
    ({"max_gpus": "2"}, "--max-gpus must be a whole number"),
    ({"tp": None, "max_tp": 0}, "--max-tp must be >= 1, got 0"),
    ({"tp": 2, "max_tp": 2}, "give max_tp or its older name tp, not both"),
    ({"progress": 3}, "plan: progress must be a function"),
    ({"billing_hour": "no"}, "--billing-hour must be True or False"),
])
def test_plan_checks_its_arguments_in_one_line(trace, kwargs, says):
    assert says in _err(lambda: blendsim.plan(trace, "llama-3-8b", "1h", **kwargs))


def test_plan_takes_max_tp_and_a_policy_class_from_a_file(tmp_path, trace):
    (tmp_path / "mine.py").write_text("import blendsim\n\nclass LongFirst(blendsim.Policy):\n"
                                      "    def rank(self):\n        return -self.ctx.trace.input_len\n")
    import importlib.util

    spec = importlib.util.spec_from_file_location("mine_policy_r5", tmp_path / "mine.py")
    mod = importlib.util.module_from_spec(spec)
    import sys

    sys.modules[spec.name] = mod  # as an import of the file would
    spec.loader.exec_module(mod)
    kw = dict(hardware="a100-80gb", max_gpus=2, engines="vllm", jobs=1, fidelity=False, sample=100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = blendsim.plan(trace, "llama-3-8b", "1h", policies=[mod.LongFirst], max_tp=1, **kw)
        old = blendsim.plan(trace, "llama-3-8b", "1h", policies="dfs", tp=1, **kw)
    assert a["recommended"]["policy"].endswith("mine.py:LongFirst")
    assert all(c["tp"] == 1 for c in a["pareto"]) and all(c["tp"] == 1 for c in old["pareto"])
    assert old["recommended"]["policy"] == "dfs"


def test_cost_checks_pp_and_names_the_profile_that_priced_it():
    assert "--pp must be a whole number" in _err(lambda: blendsim.cost(prefill_tokens=100, pp="2"))
    c = blendsim.cost(prefill_tokens=100, engine="vllm@0.7.3")
    assert (c["engine"], c["engine_profile"], c["notes"]) == ("vllm@0.7.3", "vllm@0.6", [])


@pytest.mark.parametrize("engine, noted", [("vllm@9", "priced as vllm@0.8"), ("trtllm@2.0", "priced as trtllm@1.0"),
                                           ("sglang@1", "priced as sglang@0.5"), ("vllm@0.11", None),
                                           ("trtllm@1.2", None), ("vllm", None)])
def test_a_major_release_beyond_the_modelled_ones_is_noted(trace, engine, noted):
    notes = blendsim.cost(prefill_tokens=64, engine=engine)["notes"]
    beyond = [n for n in notes if "major release beyond" in n]
    assert (beyond[0] if beyond else None) is None if noted is None else noted in beyond[0]
    if noted:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r = blendsim.simulate(trace, "fcfs", engine=engine, **TINY)
        assert any(noted in n for n in r.notes)


def test_make_trace_refuses_a_meta_that_is_not_json_and_a_negative_segment():
    assert "meta: expected a dict" in _err(lambda: blendsim.make_trace(input_len=[3], output_len=[1], meta="x"))
    assert "every value must be JSON" in _err(lambda: blendsim.make_trace(input_len=[3], output_len=[1],
                                                                          meta={"a": object()}))
    assert blendsim.make_trace(input_len=[3], output_len=[1], meta={"how": "mine"}).meta == {"how": "mine"}
    msg = _err(lambda: blendsim.make_trace(input_len=[3], output_len=[1], prompts=[[(-1, 3)]]))
    assert "prompts[0]: segment id -1 is not in 0.." in msg


def test_a_failing_progress_callback_is_one_line_naming_its_file(trace):
    for cb, what in ((lambda: None, "TypeError"), (lambda n: 1 / 0, "ZeroDivisionError")):
        msg = _err(lambda cb=cb: blendsim.simulate(trace, "fcfs", progress=cb, **TINY))
        assert msg.startswith(f"simulate: progress() raised {what}") and "test_api_round5.py, line" in msg


def test_progress_hears_every_request_finished(trace):
    seen: list[int] = []
    blendsim.simulate(trace, "fcfs", progress=seen.append, **TINY)
    assert seen and seen[-1] == trace.n


def test_a_policy_class_may_not_take_a_built_in_name(trace):
    class Mine(blendsim.Policy):
        name = "fcfs"

    assert "its name 'fcfs' is a registered policy's" in _err(lambda: blendsim.simulate(trace, Mine, **TINY))
    from blendsim.policies.registry import get_policy

    assert blendsim.simulate(trace, get_policy("fcfs"), **TINY).summary["policy"] == "fcfs"


def test_load_trace_reads_a_blendsim_trace_under_another_name(tmp_path, trace):
    blendsim.write_trace(trace, tmp_path / "t.parquet")
    (tmp_path / "t.parquet").rename(tmp_path / "t.data")
    assert blendsim.load_trace(tmp_path / "t.data").n == trace.n
    (tmp_path / "x.data").write_text("a,b\n")
    assert "cannot tell the trace format" in _err(lambda: blendsim.load_trace(tmp_path / "x.data"))


def test_a_run_is_priced_in_dollars_as_plan_prices_a_deployment(trace):
    from blendsim.plan.prices import read_prices

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = blendsim.simulate(trace, "fcfs", model="llama-3-8b", hardware="a100-80gb", tp=2, replicas=2)
    s = r.summary
    hourly = read_prices().price_of("a100-80gb").usd_per_gpu_hour
    assert r.cost_usd() == pytest.approx(4 * hourly * s["makespan_s"] / 3600)
    assert r.cost_usd(3.0) == pytest.approx(4 * 3.0 * s["makespan_s"] / 3600)
    assert r.cost_usd(3.0, billing_hour=True) == pytest.approx(12.0)
    assert "usd_per_gpu_hour must be a finite number >= 0" in _err(lambda: r.cost_usd("3"))
    assert "not both" in _err(lambda: r.cost_usd(3.0, prices="p.csv"))
    # a GPU without a price: the run's hardware and the API's way out, not plan's search and --hardware
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        h20 = blendsim.simulate(trace, "fcfs", model="llama-3-8b", hardware="h20")
    said = _err(lambda: h20.cost_usd())
    assert "no price for h20 (the run's hardware)" in said and "cost_usd(usd_per_gpu_hour=...)" in said, said
    assert "--hardware" not in said and "--prices" not in said and "cost_usd(prices=FILE)" in said


def test_a_partly_failed_sweep_hands_back_the_cells_that_ran(tmp_path):
    with pytest.raises(UserError) as e:
        blendsim.sweep(tmp_path / "sw", hardware="h100-80gb", densities=[0.9, 1.3], sharing=[0.05], requests=400,
                       policies="dfs", jobs=1)
    res = e.value.result
    assert res.outcome.ran == 1 and len(res.results) == 1


def test_a_trace_objects_run_does_not_silently_replace_a_trace_files_run(tmp_path, trace):
    f = blendsim.write_trace(trace, tmp_path / "t.parquet")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        blendsim.simulate(f, "fcfs", **TINY).write(tmp_path / "run")
        mine = blendsim.simulate(trace, "fcfs", **TINY)
    assert "holds a run of a trace file" in _err(lambda: mine.write(tmp_path / "run"))
    mine.write(tmp_path / "run", force=True)
    mine.write(tmp_path / "run")  # its own earlier run: replaced as before
