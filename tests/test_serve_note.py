"""``serve=1`` on an engine whose profile prices no API server work says so (it used to change nothing silently)."""

from __future__ import annotations

import numpy as np
import pytest

from blendsim.api import cost
from blendsim.runner import RunConfig, inert_serve, run_simulation
from blendsim.sim.engines import PROFILES, get_profile, versions_of
from tests.helpers import random_trace


def _keys():
    for name in sorted(PROFILES):
        for v in versions_of(name) or [None]:
            yield f"{name}@{v}" if v else name


@pytest.mark.parametrize("key", list(_keys()))
def test_the_note_is_given_exactly_where_serve_changes_nothing(key):
    """Priced or not is decided from the profile; the run's makespan must agree with the note."""
    trace = random_trace(np.random.default_rng(0), n=60)
    runs = [run_simulation(trace, RunConfig(policy="fcfs", model="llama-3-8b", hardware="h100-80gb",
                                            engine=f"{key}:serve={s}", offline=True)) for s in (0, 1)]
    same = runs[0].summary["makespan_s"] == runs[1].summary["makespan_s"]
    noted = [n for n in runs[1].notes if "serve=1 changes nothing" in n]
    assert bool(noted) == same, (key, runs[0].summary["makespan_s"], runs[1].summary["makespan_s"], noted)
    assert not [n for n in runs[0].notes if "serve=1 changes nothing" in n]  # offline: nothing to say


def test_cost_says_it_too_and_a_priced_server_is_not_noted():
    out = cost("llama-3-8b", "h100-80gb", engine="nanoflow:serve=1", decode_seqs=8, context=100)
    assert any("nanoflow:serve=1: serve=1 changes nothing" in n for n in out["notes"])
    assert inert_serve(get_profile("vllm@0.8:serve=1")) == []  # a server stage beside the engine
    assert inert_serve(get_profile("vllm@0.5:serve=1")) == []  # a server in the engine's process
    assert inert_serve(get_profile("sglang@0.4")) == []  # offline
