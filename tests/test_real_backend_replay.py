"""Replay executes exactly the simulator's Batches: same chunks, decodes, contexts and sampling rows."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from blendsim.real_backend.executor import TorchExecutor
from blendsim.real_backend.paged_kv import ScheduleMismatch
from blendsim.real_backend.replay import load_schedule, peak_blocks, replay
from blendsim.runner import RunConfig, run_simulation, write_run
from blendsim.sim import engine
from blendsim.sim.prefix_tree import PrefixTree
from tests.helpers import random_trace, tiny_capacity_bytes
from tests.test_real_backend_kv import _capacity, _check_mirror, make_micro


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    return make_micro(tmp_path_factory)


@pytest.fixture
def sim_batches(monkeypatch):
    """The Batches the simulator priced: one list per SimExecutor, in creation (= replica) order."""
    seen: list = []
    init, run = engine.SimExecutor.__init__, engine.SimExecutor.run

    def spy_init(self, cm):
        init(self, cm)
        self._seen = []
        seen.append(self._seen)

    def spy_run(self, batch):
        self._seen.append(copy.deepcopy(batch))
        return run(self, batch)

    monkeypatch.setattr(engine.SimExecutor, "__init__", spy_init)
    monkeypatch.setattr(engine.SimExecutor, "run", spy_run)
    return seen


def _replay_all(runtime, trace, result, monkeypatch):
    """Replay every replica; returns {replica: [executed Batch]}."""
    executed: dict = {}
    execute = TorchExecutor.execute

    def spy(self, batch, time_ops=None):
        executed.setdefault(self._replica, []).append(copy.deepcopy(batch))
        return execute(self, batch, time_ops)

    monkeypatch.setattr(TorchExecutor, "execute", spy)
    sch = load_schedule(result.schedule)
    tree = PrefixTree(trace)
    for rep, ev in sch.events.items():
        peak = peak_blocks(ev, trace, tree, sch.block_size, sch.capacity_blocks)
        ex = TorchExecutor(runtime, trace, tree, sch.block_size, peak)
        ex._replica = rep
        n = replay(ex, ev)
        assert n == len(result.steps[rep]["dt_s"])
        assert ex.blocks.num_used == ex.blocks.num_blocks - ex.blocks.num_free
        assert not ex.blocks.tables  # every request finished and released its KV
    return executed


CASES = [  # seed, policy, block size, token budget, extra KV tokens, replicas, admission
    (11, "dfs", 4, 64, 3000, 2, "reserve"),
    (12, "fcfs", 16, 32, 3000, 1, "reserve"),
    (13, "vllm", 1, 512, 3000, 1, "reserve"),
]


@pytest.mark.parametrize("case", CASES)
def test_replay_executes_the_simulated_batches(micro, sim_batches, monkeypatch, case):
    seed, policy, B, budget, extra, replicas, admission = case
    model, runtime = micro
    trace = random_trace(np.random.default_rng(seed), n=12, max_out=24)
    cfg = RunConfig(policy=policy, model=model, hardware="cpu", block_size=B, token_budget=budget,
                    kv_capacity_override=_capacity(trace, extra, runtime), replicas=replicas,
                    admission=admission, record_schedule=True)
    result = run_simulation(trace, cfg)
    executed = _replay_all(runtime, trace, result, monkeypatch)
    assert [executed[r] for r in sorted(executed)] == sim_batches  # Batch equality: every field
    simulated = sim_batches
    assert sum(len(b.prefill) for bs in simulated for b in bs) > 0


def test_replay_with_preemption_and_eviction(micro, sim_batches, monkeypatch):
    """Tight KV: requests are preempted, recomputed and evicted; the replay still matches exactly."""
    model, runtime = micro
    preempted = 0
    for seed in (21, 22, 23):
        trace = random_trace(np.random.default_rng(seed), n=14, max_out=40)
        cfg = RunConfig(policy="dfs", model=model, hardware="cpu", block_size=4, token_budget=64,
                        kv_capacity_override=_capacity(trace, 40, runtime), admission="greedy",
                        record_schedule=True)
        sim_batches.clear()
        result = run_simulation(trace, cfg)
        preempted += result.summary["preemptions"]
        executed = _replay_all(runtime, trace, result, monkeypatch)
        assert executed[0] == sim_batches[0]
    assert preempted > 0


def test_live_run_with_preemption_mirrors_the_simulated_cache(micro):
    from blendsim.real_backend.live import run_live
    from blendsim.runner import prepare_run

    model, runtime = micro
    trace = random_trace(np.random.default_rng(24), n=14, max_out=40)
    cfg = RunConfig(policy="fcfs", model=model, hardware="cpu", block_size=4, token_budget=64,
                    kv_capacity_override=_capacity(trace, 40, runtime), admission="greedy")
    run = run_live(prepare_run(trace, cfg), cfg.replicas, runtime, on_step=_check_mirror)
    rec = run.replicas[0].scheduler.rec
    assert sum(rec.preemptions) > 0 and rec.n_finished == trace.n


def test_preempted_request_keeps_its_generated_tokens():
    """Regression (found by the replay): a preempted request whose re-admission was refused once used
    to restart from 0 generated tokens, so it decoded before its recomputed output was in KV."""
    for seed in (21, 22, 23):
        trace = random_trace(np.random.default_rng(seed), n=14, max_out=40)
        cfg = RunConfig(policy="dfs", model="tiny", hardware="cpu", block_size=4, token_budget=64,
                        kv_capacity_override=tiny_capacity_bytes(trace, 40, 4), admission="greedy",
                        record_schedule=True)
        result = run_simulation(trace, cfg)
        assert result.summary["preemptions"] > 0
        sch = load_schedule(result.schedule)
        peak_blocks(sch.events[0], trace, PrefixTree(trace), 4, sch.capacity_blocks)  # no ScheduleMismatch


def test_schedule_parquet_round_trip_and_corruption(tmp_path):
    trace = random_trace(np.random.default_rng(31), n=8, max_out=10)
    cfg = RunConfig(policy="fcfs", model="tiny", hardware="cpu", block_size=4, token_budget=64,
                    kv_capacity_override=tiny_capacity_bytes(trace, 500, 4), record_schedule=True)
    result = run_simulation(trace, cfg)
    d = write_run(result, tmp_path / "run")
    from_file, in_memory = load_schedule(d), load_schedule(result.schedule)
    assert from_file.events == in_memory.events
    assert from_file.meta == in_memory.meta
    # a schedule whose decode skips a token contradicts the KV it implies
    ev = list(in_memory.events[0])
    i = next(k for k, e in enumerate(ev) if e[1] == "decode")
    ev[i] = ev[i][:3] + (ev[i][3] + 1,) + ev[i][4:]
    with pytest.raises(ScheduleMismatch, match="decode after"):
        peak_blocks(ev, trace, PrefixTree(trace), 4, in_memory.capacity_blocks)


def _policies():
    from blendsim.policies.registry import policy_names

    return policy_names()


@pytest.mark.parametrize("policy", _policies())
def test_every_policys_schedule_replays_consistently(policy):
    """Device-free: each policy's recorded events (with preemption and eviction under tight KV) drive the
    block manager without contradiction, and never hold more blocks than the simulated capacity."""
    for seed in range(4):
        rng = np.random.default_rng(seed)
        trace = random_trace(rng, n=16, max_out=40)
        B = int(rng.choice([1, 4, 16]))
        cfg = RunConfig(policy=policy, model="tiny", hardware="cpu", block_size=B,
                        token_budget=int(rng.choice([32, 128, 512])), replicas=int(rng.integers(1, 3)),
                        kv_capacity_override=tiny_capacity_bytes(trace, int(rng.integers(20, 400)), B),
                        record_schedule=True)
        result = run_simulation(trace, cfg)
        sch = load_schedule(result.schedule)
        for ev in sch.events.values():
            assert peak_blocks(ev, trace, PrefixTree(trace), B, sch.capacity_blocks) <= sch.capacity_blocks
