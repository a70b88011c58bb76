"""The Python API as a notebook uses it (review of 30 Nov 2026): numpy scalars of any width price as the numbers they
hold, a policy's engine_defaults values are checked as run options are, a rank buffer reused across runs is not
mistaken for the last run's, ctx.tree is read-only, empty traces, numpy prompts, None ids, a policy's name and
methods set after its class was made, warnings at the caller's line and plan's signature."""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest

import blendsim
from blendsim import BlendsimError

TINY = dict(model="tiny", hardware="cpu")


def test_numpy_scalars_of_any_width_price_as_their_numbers():
    base = blendsim.cost("llama-3-8b", "a100-80gb", decode_seqs=256, context=1024)["step_time_s"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning either
        for t in (np.int32, np.int16, np.uint16, np.int64):
            got = blendsim.cost("llama-3-8b", "a100-80gb", decode_seqs=t(256), context=t(1024))["step_time_s"]
            assert got == base, t
    tr = blendsim.make_trace(input_len=[50] * 30, output_len=[8] * 30)
    a = blendsim.simulate(tr, policy="fcfs", tp=1, max_seqs=16, block_size=16, round_tokens=0, **TINY).summary
    b = blendsim.simulate(tr, policy="fcfs", tp=np.int8(1), max_seqs=np.int16(16), block_size=np.uint8(16),
                          round_tokens=np.uint8(0), **TINY).summary
    assert a == b


@pytest.mark.parametrize("defaults, says", [({"prefix_caching": "no"}, "must be True or False"),
                                            ({"token_budget": 512.0}, "whole number"),
                                            ({"gpu_memory_utilization": "0.5"}, "number")])
def test_a_policy_s_engine_defaults_values_are_checked(defaults, says):
    P = type("Bad", (blendsim.Policy,), {"engine_defaults": defaults})
    with pytest.raises(BlendsimError, match=f"engine_defaults\\[{list(defaults)[0]!r}\\].*{says}"):
        blendsim.simulate(blendsim.make_trace(input_len=[5], output_len=[2]), policy=P, **TINY)


def test_a_rank_buffer_refilled_for_the_next_run_gives_that_run_s_order():
    tr = blendsim.make_trace(input_len=[20] * 40, output_len=[4] * 40)
    buf = np.empty(tr.n, dtype=np.int64)

    class Buffered(blendsim.Policy):
        options = {"reverse": (False, "reverse the order")}

        def rank(self):
            buf[:] = np.arange(self.ctx.trace.n)[::-1] if self.opt["reverse"] else np.arange(self.ctx.trace.n)
            return buf

    def first(rev):
        r = blendsim.simulate(tr, policy=Buffered, max_seqs=1, options={"reverse": rev}, **TINY)
        return r.requests.sort_values("admit_s")["id"].tolist()[0]

    assert (first(False), first(True)) == ("0", "39")


def test_a_policy_writing_to_the_prefix_tree_gets_one_line():
    class WritesTree(blendsim.Policy):
        def prepare(self):
            self.ctx.tree.tokens[:] = 0

    with pytest.raises(BlendsimError, match="prepare\\(\\) raised ValueError: assignment destination is read-only"):
        blendsim.simulate(blendsim.make_trace(input_len=[5, 6], output_len=[2, 2]), policy=WritesTree, **TINY)


def test_empty_traces_numpy_prompts_and_none_ids():
    with pytest.raises(BlendsimError, match="no requests"):
        blendsim.make_trace(input_len=[], output_len=[])
    t = blendsim.make_trace(input_len=[3, 2], output_len=[1, 1], prompts=[np.array([1, 2, 3]), np.array([1, 2])])
    assert t.n == 2 and t.prompt_repr(1) == [1, 2]
    with pytest.raises(BlendsimError, match=r"ids\[0\]: None is no id"):
        blendsim.make_trace(input_len=[5, 6], output_len=[3, 3], ids=[None, "x"])


def test_a_policy_s_name_and_a_method_set_after_its_class_was_made():
    tr = blendsim.make_trace(input_len=[5, 6], output_len=[3, 3])
    for bad in (5, None, ""):
        with pytest.raises(BlendsimError, match="name must be a non-empty string"):
            blendsim.simulate(tr, policy=type("Named", (blendsim.Policy,), {"name": bad}), **TINY)

    class Late(blendsim.Policy):
        """Its rank() is set below, after the class was made."""

    def rank(self):
        raise KeyError("late")

    Late.rank = rank
    with pytest.raises(BlendsimError, match="rank\\(\\) raised KeyError"):
        blendsim.simulate(tr, policy=Late, **TINY)


def test_warnings_point_at_the_caller_and_plan_keeps_its_signature(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        blendsim.sweep("s", densities=[1.1], sharing=[0.3], requests=300, jobs=1, policies="fcfs")
    assert caught and all(w.filename == __file__ for w in caught), [w.filename for w in caught]
    blendsim.simulate(blendsim.make_trace(input_len=[5], output_len=[2]), model="tiny").cost_usd()  # imports .plan
    assert "deadline" in inspect.signature(blendsim.plan).parameters


def test_a_result_s_summary_holds_what_summary_json_holds(tmp_path):
    """r.summary is summary.json's dict: Python numbers (no np.float64 in a notebook's repr), None for a figure the
    run lacks."""
    import json

    tr = blendsim.make_trace(input_len=[50] * 20, output_len=[1] * 20)  # one-token outputs: no compute density
    r = blendsim.simulate(tr, policy="fcfs", **TINY)
    assert not [k for k, v in r.summary.items() if isinstance(v, np.generic)]
    assert None in r.summary.values()
    assert r.summary == json.loads((r.write(tmp_path / "run") / "summary.json").read_text())
