"""Every registered policy on random small valid traces (issue 14): the engine's invariants hold and
every run makes progress.

Traces mix what broke policies before: prefixes shared by several requests, one-token outputs (no
KV read, infinite compute density), prompts far longer than the token budget and close to the KV
capacity, arrivals, and TTFT/TBT SLOs down to ones no step can meet. A run must finish within a step
cap relative to the trace's tokens (``blendsim.sim.engine.Replica.max_steps``), so a livelock fails here
instead of hanging CI; a per-example alarm catches a loop that never completes a step.
"""

from __future__ import annotations

import contextlib
import math
import signal

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blendsim.policies.registry import policy_names
from blendsim.runner import RunConfig, run_simulation
from blendsim.sim import engine
from blendsim.sim.models import get_model
from blendsim.workloads.trace import from_columns
from tests.test_engine_invariants import check_invariants, check_kv_every_step

MODELS = ("tiny", "mistral-7b")  # 6H of 3,072 and of 24,576 tokens (accelgen's Eq. 4 budgets differ)
STEP_CAP_PER_TOKEN = 8  # steps per prompt + output token of the trace, plus a constant


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 7))
    prefixes = draw(st.lists(st.integers(1, 120), max_size=3))
    prompts = []
    for i in range(n):
        path = []
        if prefixes and draw(st.booleans()):
            k = draw(st.integers(0, len(prefixes) - 1))
            path.append((1 + k, prefixes[k]))
        path.append((1000 + i, draw(st.one_of(st.integers(1, 40), st.integers(200, 1500)))))
        prompts.append(path)
    p = [sum(ln for _, ln in pr) for pr in prompts]
    d = [draw(st.one_of(st.just(1), st.integers(1, 80))) for _ in range(n)]
    cols = {}
    if draw(st.booleans()):
        # (no subnormals: torch, imported by other tests, may flush them to zero)
        times = draw(st.lists(st.floats(0, 3, allow_subnormal=False), min_size=n, max_size=n))
        cols["arrival_s"] = np.sort(np.asarray(times))
    if draw(st.booleans()):
        cols["ttft_slo_s"] = np.asarray(draw(st.lists(st.sampled_from([0.001, 0.05, 5.0]), min_size=n, max_size=n)))
        cols["tbt_slo_s"] = np.asarray(draw(st.lists(st.sampled_from([0.001, 0.02, 0.3, 2.0]), min_size=n,
                                                     max_size=n)))
    trace = from_columns(input_len=p, output_len=d, prompts=prompts, **cols)
    model = draw(st.sampled_from(MODELS))
    B = draw(st.sampled_from([1, 4, 16]))
    extra = draw(st.sampled_from([0, 7, 60, 400]))  # KV tokens beyond the largest request
    kv_tokens = max(a + b for a, b in zip(p, d, strict=True)) + extra + 2 * B
    cfg = dict(model=model, hardware="cpu", block_size=B,
               kv_capacity_override=kv_tokens * get_model(model).kv_bytes_per_token,
               token_budget=draw(st.sampled_from([8, 16, 64, 2048])), max_seqs=draw(st.sampled_from([0, 1, 3])),
               replicas=draw(st.integers(1, 3)))
    accelgen = {"long_prompt": str(draw(st.sampled_from([256, 4096]))),
                "budget_model": draw(st.sampled_from(["eq4", "eq6", "cost"]))}
    return trace, cfg, accelgen


@contextlib.contextmanager
def alarm(seconds: int):
    def fire(*_):
        raise TimeoutError(f"no result within {seconds} s: a loop that completes no step?")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_checked(trace, cfg: dict, policy: str, accelgen: dict):
    """Run ``policy`` with the KV checked after every step and a step cap; check the invariants. (result, cap)"""
    tokens = int(trace.input_len.sum() + trace.output_len.sum())
    cap = STEP_CAP_PER_TOKEN * tokens + 500
    options = accelgen if policy == "accelgen" else {}
    with pytest.MonkeyPatch.context() as mp, alarm(60):
        check_kv_every_step(mp)
        mp.setattr(engine.Replica, "max_steps", cap)
        r = run_simulation(trace, RunConfig(policy=policy, options=options, **cfg))
    check_invariants(trace, r)
    return r, cap


@pytest.mark.parametrize("policy", policy_names())
@settings(max_examples=25, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=scenarios())
def test_every_policy_keeps_the_invariants_and_progresses(policy, case):
    trace, cfg, accelgen = case
    r, cap = run_checked(trace, cfg, policy, accelgen)
    assert all(len(c["dt_s"]) <= cap for c in r.steps)
    s = r.summary
    assert s["compute_density"] is None or s["compute_density"] > 0  # inf allowed in memory, never NaN
    assert not math.isnan(s["makespan_s"]) and s["makespan_s"] > 0


def test_the_step_cap_stops_a_livelock(monkeypatch):
    """The engine's cap itself: a scheduler that preempts and re-admits its only request forever."""
    from blendsim import runner
    from blendsim.sim.scheduler import Scheduler

    class Livelock(Scheduler):
        def update(self, batch, now):
            super().update(batch, now)
            for s in list(self.running.values()):
                self._preempt(s, now)
                self.resume[s.req] = 0  # and forgets its tokens: it never finishes

    trace = from_columns(input_len=[40], output_len=[5])
    monkeypatch.setattr(engine.Replica, "max_steps", 1000)
    policy = runner.prepare_run(trace, RunConfig(model="tiny", hardware="cpu")).policy
    monkeypatch.setattr(type(policy), "scheduler_cls", Livelock)
    with pytest.raises(RuntimeError, match="no progress"):
        run_simulation(trace, RunConfig(model="tiny", hardware="cpu"))


def test_preempting_a_decoder_after_a_step_without_decodes_frees_only_its_blocks():
    """Found by the property test: a step whose decoders were all preempted after their decode blocks
    were reserved did not move the decode clock, so the reservation mark stayed valid into the next
    step, whose preemption of a decoder gave back a block never reserved (KV over-committed)."""
    p = [1, 1, 1, 2, 201, 1, 1, 1, 1, 200, 200, 200]
    prompts = [[(1000 + i, n)] for i, n in enumerate(p)]
    prompts[3], prompts[4] = [(1, 1), (1003, 1)], [(1, 1), (1004, 200)]
    trace = from_columns(input_len=p, output_len=[1, 1, 1, 7, 4, 1, 1, 1, 1, 1, 1, 1], prompts=prompts,
                         ttft_slo_s=[0.001] * 12, tbt_slo_s=[0.001] * 12)
    with pytest.MonkeyPatch.context() as mp:
        check_kv_every_step(mp)
        mp.setattr(engine.Replica, "max_steps", 10_000)
        r = run_simulation(trace, RunConfig(policy="accelgen", model="tiny", hardware="cpu", block_size=1,
                                            kv_capacity_override=207 * 4096, token_budget=64, max_seqs=0,
                                            options={"long_prompt": "256", "budget_model": "eq4"}))
    check_invariants(trace, r)
    assert r.summary["preemptions"] > 0
