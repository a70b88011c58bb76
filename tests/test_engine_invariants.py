"""Invariants every policy must keep, on random small traces (CPU, tiny model, tight KV)."""

from __future__ import annotations

import numpy as np
import pytest

from blendsim.policies.registry import policy_names
from blendsim.runner import RunConfig, run_simulation
from blendsim.sim import engine
from tests.helpers import random_trace, tiny_capacity_bytes


def _check_after_update(sched) -> None:
    """Make ``sched.update`` recount its KV cache's counters from scratch after every step (once per scheduler)."""
    if getattr(sched, "_checked", False):
        return
    upd = sched.update

    def update(b, t):
        upd(b, t)
        sched.kv.check()

    sched.update = update
    sched._checked = True


def check_kv_every_step(monkeypatch, pipelined: bool = False) -> None:
    """Recount the KV cache's counters from scratch after every step (of the replicas built from now
    on, while ``monkeypatch`` holds); ``pipelined``: of the virtual engines a PipelinedReplica steps."""
    cls = engine.PipelinedReplica if pipelined else engine.Replica
    orig = cls.run_until

    def run_until(self, now, horizon):
        for ve in self.ves if pipelined else (self,):
            _check_after_update(ve.scheduler)
        return orig(self, now, horizon)

    monkeypatch.setattr(cls, "run_until", run_until)


@pytest.fixture
def checked_kv(monkeypatch):
    check_kv_every_step(monkeypatch)


def check_invariants(trace, r) -> None:
    """What every finished run must satisfy, whatever the policy (``r``: a RunResult of ``trace``)."""
    rq, s = r.requests, r.summary
    # every request finishes with exactly its output length
    assert np.isfinite(rq["finish_s"]).all()
    np.testing.assert_array_equal(rq["generated_tokens"], trace.output_len)
    # tokens computed = prompt tokens - cached + recomputed, per request
    np.testing.assert_array_equal(rq["prefill_computed"],
                                  trace.input_len - rq["cached_tokens"] + rq["recomputed_tokens"])
    # the steps' prefill tokens are exactly what the requests computed
    assert sum(sum(c["num_prefill_tokens"]) for c in r.steps) == int(rq["prefill_computed"].sum())
    for c in r.steps:
        t = np.asarray(c["t_end_s"])
        assert (np.diff(t) >= 0).all() and (np.asarray(c["dt_s"]) > 0).all()  # time never goes back
        assert max(c["kv_used_blocks"], default=0) <= s["kv_capacity_blocks"]  # KV within capacity
    # a request starts after it arrives and finishes after its first token
    assert (rq["admit_s"] >= trace.arrival_s - 1e-12).all()
    assert (rq["finish_s"] >= rq["first_token_s"]).all()
    assert 0.0 <= s["prefix_sharing_ratio"] <= s["optimal_sharing_ratio"] + 1e-12


def _run(trace, policy, rng, **kw):
    B = int(rng.choice([1, 4, 16]))
    cfg = RunConfig(policy=policy, model="tiny", hardware="cpu", block_size=B,
                    kv_capacity_override=tiny_capacity_bytes(trace, int(rng.integers(0, 400)), B),
                    token_budget=int(rng.choice([16, 64, 512])), max_seqs=int(rng.choice([0, 3, 256])),
                    replicas=int(rng.integers(1, 3)), **kw)
    return run_simulation(trace, cfg)


@pytest.mark.parametrize("policy", policy_names())
def test_invariants(policy, checked_kv):
    rng = np.random.default_rng(sum(map(ord, policy)))
    for trial in range(12):
        trace = random_trace(rng, arrivals=trial % 2 == 1, slos=trial % 3 == 0)
        check_invariants(trace, _run(trace, policy, rng))


@pytest.mark.parametrize("policy", policy_names())
def test_same_seed_same_summary(policy, tmp_path):
    from blendsim.runner import write_run

    rng = np.random.default_rng(7)
    trace = random_trace(rng, n=30, arrivals=True)
    outs = []
    for k in range(2):
        cfg = RunConfig(policy=policy, model="tiny", hardware="cpu", seed=3, replicas=2,
                        kv_capacity_override=tiny_capacity_bytes(trace, 300))
        d = write_run(run_simulation(trace, cfg), tmp_path / f"run{k}")
        outs.append([(d / f).read_bytes() for f in ("summary.json", "steps.parquet", "requests.parquet")])
    assert outs[0] == outs[1]


def test_every_request_gets_its_output_length(monkeypatch):
    """Counted by the scheduler itself, under heavy preemption."""
    from blendsim import runner
    from blendsim.sim import seq

    seen = {}

    class Records(seq.RequestRecords):
        def __init__(self, n):
            super().__init__(n)
            seen["rec"] = self

    monkeypatch.setattr(runner, "RequestRecords", Records)
    from blendsim.workloads.trace import from_columns

    trace = from_columns(input_len=[50] * 30, output_len=list(range(1, 31)),
                         prompts=[[(1, 30), (100 + i, 20)] for i in range(30)])
    r = run_simulation(trace, RunConfig(model="tiny", hardware="cpu", block_size=4,
                                        kv_capacity_override=300 * 4096, token_budget=64))
    assert r.summary["preemptions"] > 0 and r.summary["recomputed_tokens"] > 0
    assert list(seen["rec"].generated) == list(range(1, 31))


def test_kv_use_is_logged_before_the_step_frees_its_finished_requests():
    """A step's kv_used_blocks (and so peak_kv_blocks) is what it held: three prompt-only requests finished in one
    step held ceil(100/16) + ceil(200/16) + ceil(300/16) = 39 blocks, not the 0 left after they were freed."""
    import warnings

    import blendsim

    tr = blendsim.make_trace(input_len=[100, 200, 300], output_len=[1, 1, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = blendsim.simulate(tr, policy="fcfs")
    assert res.summary["peak_kv_blocks"] == 39 and res.summary["mean_kv_util"] > 0
    assert res.steps["kv_used_blocks"].tolist() == [39]
