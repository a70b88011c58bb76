"""A policy that draws from Python's or numpy's global generator without a seed of its own still gives the same run
every time (the run seeds both from its seed), and the caller's own random streams are left as they were."""

from __future__ import annotations

import random

import numpy as np

import blendsim


class PythonRandom(blendsim.Policy):
    name = "test-python-random"

    def rank(self):
        return np.array([random.random() for _ in range(self.ctx.trace.n)])


class NumpyRandom(blendsim.Policy):
    name = "test-numpy-random"

    def rank(self):
        return np.random.rand(self.ctx.trace.n)


def _trace():
    return blendsim.synthesize("blendserve", requests=300, density=1.1, sharing=0.3, seed=0)


def test_an_unseeded_policy_gives_the_same_run_twice_and_follows_the_seed():
    t = _trace()
    for cls in (PythonRandom, NumpyRandom):
        a, b = (blendsim.simulate(t, policy=cls, model="llama-3-8b", max_seqs=8) for _ in range(2))
        assert a.summary["makespan_s"] == b.summary["makespan_s"]
        assert a.requests["finish_s"].equals(b.requests["finish_s"])
        c = blendsim.simulate(t, policy=cls, model="llama-3-8b", max_seqs=8, seed=1)
        assert not a.requests["finish_s"].equals(c.requests["finish_s"])  # another seed, another order


def test_the_callers_random_streams_are_left_as_they_were():
    random.seed(123)
    np.random.seed(123)
    expect = (random.random(), np.random.rand())
    random.seed(123)
    np.random.seed(123)
    blendsim.simulate(_trace(), policy=NumpyRandom, model="llama-3-8b")
    blendsim.simulate(_trace(), policy=PythonRandom, model="llama-3-8b")
    assert (random.random(), np.random.rand()) == expect


def test_the_planners_replayed_routes_are_the_runs_for_such_a_policy():
    from blendsim.runner import RunConfig, offline_routes, run_simulation

    t = _trace()
    cfg = RunConfig(policy=NumpyRandom, model="llama-3-8b", replicas=2, offline=True)
    np.random.seed(7)
    before = np.random.get_state()[1].copy()
    a, b = offline_routes(t, cfg), offline_routes(t, cfg)
    assert np.array_equal(a[0], b[0]) and np.array_equal(np.random.get_state()[1], before)
    assert np.array_equal(a[0], run_simulation(t, cfg).requests["replica"])
