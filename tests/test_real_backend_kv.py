"""The real backend's block manager: exact block ids, prefix sharing, reference counts, and a live mirror
of the simulator's KV cache (``blendsim.sim.kv.KVCache``) step by step."""

from __future__ import annotations

import numpy as np
import pytest

from blendsim.real_backend.paged_kv import BlockManager, KVExhausted, ScheduleMismatch
from blendsim.sim.prefix_tree import PrefixTree
from blendsim.workloads.trace import from_columns


def _tree():
    """Requests 0 and 1 share a 20-token segment, then 6 and 9 tokens of their own; request 2 is alone."""
    t = from_columns(input_len=[26, 29, 10], output_len=[4, 4, 4],
                     prompts=[[(1, 20), (2, 6)], [(1, 20), (3, 9)], [(4, 10)]])
    tree = PrefixTree(t)
    return t, tree, int(tree.parent[tree.req_node[0]])  # the shared node


def test_blocks_are_handed_out_lowest_first_and_freed_on_release():
    _, tree, _ = _tree()
    bm = BlockManager(8, 4, tree)
    bm.admit(2, 0)
    bm.extend(2, 10)  # 3 blocks
    assert bm.tables[2] == [0, 1, 2] and bm.num_used == 3 and bm.peak == 3
    np.testing.assert_array_equal(bm.slots(2, 3, 6), [3, 4, 5])
    bm.extend(2, 13)
    assert bm.tables[2] == [0, 1, 2, 3]
    bm.release(2)
    assert bm.num_used == 0 and bm.peak == 4
    bm.admit(2, 0)
    bm.extend(2, 1)
    assert bm.tables[2] == [3]  # LIFO free list: the last freed block comes back first
    bm.check()


def test_prefix_blocks_are_shared_and_outlive_their_writer():
    _, tree, shared = _tree()
    bm = BlockManager(16, 4, tree)
    bm.admit(0, 0)
    bm.extend(0, 26)  # 7 blocks: 5 of the shared node (20 tokens), 2 of its own
    bm.insert(0, shared, 0, 5)
    assert [bm.block_map[(shared, i)] for i in range(5)] == bm.tables[0][:5]
    bm.release(0)  # finished: its private blocks free, the cached ones stay
    assert bm.num_used == 5
    bm.admit(1, 20)  # hits the 5 cached blocks
    bm.extend(1, 29)
    assert bm.tables[1][:5] == [bm.block_map[(shared, i)] for i in range(5)]
    assert bm.num_used == 5 + 3
    bm.evict(shared, 3, 2)  # evicted while request 1 still reads them: not freed yet
    assert bm.num_used == 8
    bm.release(1)
    assert bm.num_used == 3  # blocks 0-2 of the shared node stay cached
    bm.check()


def test_events_that_contradict_the_state_are_refused():
    _, tree, shared = _tree()
    bm = BlockManager(4, 4, tree)
    with pytest.raises(ScheduleMismatch, match="not in the cache"):
        bm.admit(0, 8)
    bm.admit(0, 0)
    with pytest.raises(ScheduleMismatch, match="still holds KV"):
        bm.admit(0, 0)
    with pytest.raises(ScheduleMismatch, match="has not allocated"):
        bm.insert(0, shared, 0, 1)
    with pytest.raises(KVExhausted):
        bm.extend(0, 17)
    with pytest.raises(ScheduleMismatch, match="not cached"):
        bm.evict(shared, 0, 1)


# ---- the live mirror ------------------------------------------------------------------------
MICRO = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "torch_dtype": "float32",
         "max_position_embeddings": 1024, "_name_or_path": "micro"}


def make_micro(tmp_path_factory):
    """A 2-layer Llama small enough that bookkeeping tests run many steps quickly: (config path, runtime)."""
    import json

    from blendsim.real_backend.executor import DeviceRuntime
    from blendsim.sim.models import get_model

    path = tmp_path_factory.mktemp("micro") / "config.json"
    path.write_text(json.dumps(MICRO))
    return str(path), DeviceRuntime(get_model(str(path)))


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    return make_micro(tmp_path_factory)


def _capacity(trace, extra_tokens: int, runtime) -> int:
    """KV bytes that fit the largest request plus ``extra_tokens``."""
    return (int((trace.input_len + trace.output_len).max()) + extra_tokens + 32) * runtime.spec.kv_bytes_per_token


def _check_mirror(rep, batch, t_end):
    """After every step: the same blocks in use and exactly the simulator's cached blocks per node."""
    ex = rep.executor
    ex.catch_up()  # this step's finishes
    kv, bm = rep.scheduler.kv, ex.blocks
    assert bm.num_used == kv.total - kv.free
    assert bm.cached_per_node() == {x: c for x, c in enumerate(kv.cached) if c}
    bm.check()
    rep.checked = getattr(rep, "checked", 0) + 1


@pytest.mark.parametrize("seed,block_size,budget,policy", [(1, 4, 64, "dfs"), (2, 16, 512, "fcfs"),
                                                           (3, 1, 32, "vllm")])
def test_live_run_mirrors_the_simulated_cache(micro, seed, block_size, budget, policy):
    from blendsim.real_backend.live import run_live
    from blendsim.runner import RunConfig, prepare_run
    from tests.helpers import random_trace

    model, runtime = micro
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, n=12, max_out=30)
    cfg = RunConfig(policy=policy, model=model, hardware="cpu", block_size=block_size, token_budget=budget,
                    kv_capacity_override=_capacity(trace, 2000, runtime), replicas=2)
    run = run_live(prepare_run(trace, cfg), cfg.replicas, runtime, on_step=_check_mirror)
    assert sum(getattr(r, "checked", 0) for r in run.replicas) == sum(len(r.log) for r in run.replicas) > 0
    # every step was measured on the device
    for r in run.replicas:
        assert all(dt > 0 for dt in r.log.cols["dt_s"])
    assert run.makespan_s > 0


def test_peak_blocks_is_the_simulators_peak(micro, monkeypatch):
    """After each step is formed, the executor holds exactly the simulator's blocks; the dry run's peak
    is the largest of those counts."""
    from blendsim.real_backend.executor import TorchExecutor
    from blendsim.real_backend.live import run_live
    from blendsim.real_backend.replay import peak_blocks
    from blendsim.runner import RunConfig, prepare_run
    from blendsim.sim.scheduler import Scheduler
    from tests.helpers import random_trace

    model, runtime = micro
    sim_held, ours = [], []
    run = TorchExecutor.run

    class SpyScheduler(Scheduler):  # a subclass, not a patch: the compiled Scheduler's type is immutable
        def schedule(self, now):
            b = super().schedule(now)
            if b is not None:
                sim_held.append(self.kv.total - self.kv.free)
            return b

    def spy_run(self, batch):
        self.catch_up()
        ours.append(self.blocks.num_used)
        return run(self, batch)

    monkeypatch.setattr(TorchExecutor, "run", spy_run)
    trace = random_trace(np.random.default_rng(5), n=12, max_out=20)
    cfg = RunConfig(policy="dfs", model=model, hardware="cpu", block_size=4, token_budget=48,
                    kv_capacity_override=_capacity(trace, 3000, runtime))
    prepared = prepare_run(trace, cfg)
    prepared.policy.scheduler_cls = SpyScheduler
    rep = run_live(prepared, cfg.replicas, runtime).replicas[0]
    assert ours == sim_held and len(ours) == len(rep.log)
    peak = peak_blocks(rep.scheduler.events, trace, PrefixTree(trace), 4, rep.scheduler.kv.total)
    assert peak == max(sim_held) == rep.executor.blocks.peak
