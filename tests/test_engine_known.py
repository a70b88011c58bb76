"""Known-answer tests of the engine: exact times, optimal sharing, and what ordering does to sharing."""

from __future__ import annotations

import numpy as np
import pytest

from blendsim.runner import RunConfig, run_simulation
from blendsim.sim.batch import BatchFeatures
from blendsim.sim.cost import CostModel
from blendsim.sim.deployment import Deployment
from blendsim.sim.engines import get_profile
from blendsim.sim.hardware import get_hardware
from blendsim.sim.models import get_model
from blendsim.workloads.trace import from_columns


def _cm(mode="sequential", engine="ideal"):
    return CostModel(Deployment(get_model("llama-3-8b"), get_hardware("a100-80gb")), mode, get_profile(engine, {}))


@pytest.mark.parametrize("mode", ["sequential", "overlap"])
@pytest.mark.parametrize("fast_forward", [True, False])
def test_single_request_time_is_the_sum_of_its_steps(mode, fast_forward):
    p, d, budget = 1000, 300, 512
    trace = from_columns(input_len=[p], output_len=[d])
    r = run_simulation(trace, RunConfig(policy="fcfs", mode=mode, token_budget=budget, fast_forward=fast_forward))
    cm = _cm(mode)
    expect = []
    done = 0
    while done < p:  # chunked prefill: 512 + 488 tokens, the last chunk samples the first token
        n = min(budget, p - done)
        expect.append(cm.cost(BatchFeatures.from_parts([(0, n, done, 0)], 0, 0, int(done + n == p))).time_s)
        done += n
    for ctx in range(p, p + d - 1):  # d - 1 decode steps, each attending its whole context
        expect.append(cm.cost(BatchFeatures.decode_only(1, ctx)).time_s)
    assert r.summary["steps"] == len(expect)
    np.testing.assert_allclose(r.steps[0]["dt_s"], expect, rtol=1e-12)
    assert r.summary["makespan_s"] == pytest.approx(sum(expect), rel=1e-12)
    assert r.requests["first_token_s"][0] == pytest.approx(sum(expect[:2]), rel=1e-12)


def _groups_trace(groups: int, per_group: int, prefix: int, tail: int, out: int = 8, seed: int = 0):
    """``groups`` shared prefixes of ``prefix`` tokens, each followed by ``per_group`` unique tails."""
    rng = np.random.default_rng(seed)
    prompts, n = [], groups * per_group
    for i in range(n):
        prompts.append([(i % groups, prefix), (10_000 + i, tail)])
    order = rng.permutation(n)
    prompts = [prompts[i] for i in order]
    return from_columns(input_len=[prefix + tail] * n, output_len=[out] * n, prompts=prompts)


@pytest.mark.parametrize("block_size", [1, 16])
def test_dfs_reaches_the_optimal_sharing_ratio_when_prefixes_fit(block_size):
    # prefixes are whole blocks, so block-granular sharing can reach the token-level optimum
    trace = _groups_trace(groups=20, per_group=10, prefix=256, tail=40)
    r = run_simulation(trace, RunConfig(policy="dfs", block_size=block_size))
    s = r.summary
    assert s["optimal_sharing_ratio"] == pytest.approx(1 - (20 * 256 + 200 * 40) / (200 * 296))
    assert s["prefix_sharing_ratio"] == pytest.approx(s["optimal_sharing_ratio"], abs=1e-12)
    assert s["recomputed_tokens"] == 0


def test_random_order_shares_far_less_when_prefixes_do_not_fit():
    # MMLU-like: many subjects with long shared few-shot prefixes; the KV cache holds only a few of them
    trace = _groups_trace(groups=60, per_group=12, prefix=592, tail=60, out=2)
    base = dict(model="tiny", hardware="cpu", block_size=16, kv_capacity_override=8000 * 4096,
                token_budget=2048)
    dfs = run_simulation(trace, RunConfig(policy="dfs", **base)).summary
    rnd = run_simulation(trace, RunConfig(policy="random", seed=1, **base)).summary
    assert dfs["sharing_frac_of_opt"] > 0.99
    assert rnd["sharing_frac_of_opt"] < 0.5 * dfs["sharing_frac_of_opt"]


def test_without_retention_only_requests_in_memory_together_share():
    # 60 groups of 12; a cache that keeps every prefix lets random order share almost all of them, one
    # that frees a prefix with its last running user keeps sharing only where group members overlap
    trace = _groups_trace(groups=60, per_group=12, prefix=592, tail=60, out=2)
    base = dict(model="tiny", hardware="cpu", block_size=16, token_budget=2048)
    res = {(p, k): run_simulation(trace, RunConfig(policy=p, seed=1, prefix_retain=k, **base)).summary
           for p in ("dfs", "random") for k in (True, False)}
    assert res["random", True]["sharing_frac_of_opt"] > 0.99  # the default cache holds all 60 prefixes
    assert res["random", False]["sharing_frac_of_opt"] < 0.5
    assert res["dfs", False]["sharing_frac_of_opt"] > 0.99  # group members run together in DFS order


def test_fast_forward_changes_nothing_but_speed():
    rng = np.random.default_rng(4)
    n = 300
    trace = from_columns(input_len=rng.integers(10, 800, n), output_len=rng.integers(1, 2000, n))
    a = run_simulation(trace, RunConfig(policy="fcfs", fast_forward=True)).summary
    b = run_simulation(trace, RunConfig(policy="fcfs", fast_forward=False)).summary
    for k in ("makespan_s", "throughput_tok_s", "compute_time_s", "memory_time_s"):
        assert a[k] == pytest.approx(b[k], rel=1e-9), k
    for k in ("steps", "preemptions", "prefill_tokens_computed", "peak_kv_blocks"):
        assert a[k] == b[k], k


def test_online_arrivals_wait_for_their_time():
    trace = from_columns(input_len=[100, 100], output_len=[10, 10], arrival_s=[0.0, 5.0])
    r = run_simulation(trace, RunConfig(policy="fcfs"))
    assert r.requests["admit_s"][1] >= 5.0
    assert r.summary["latency_mean_s"] < 1.0  # each runs alone for ten steps
    off = run_simulation(trace, RunConfig(policy="fcfs", offline=True))
    assert off.requests["admit_s"][1] == 0.0


def test_replicas_split_the_work():
    rng = np.random.default_rng(5)
    trace = from_columns(input_len=rng.integers(100, 400, 400), output_len=rng.integers(50, 200, 400))
    one = run_simulation(trace, RunConfig(policy="fcfs")).summary
    four = run_simulation(trace, RunConfig(policy="fcfs", replicas=4)).summary
    assert four["throughput_tok_s"] > 2.5 * one["throughput_tok_s"]
    assert set(run_simulation(trace, RunConfig(policy="fcfs", replicas=4)).requests["replica"]) == {0, 1, 2, 3}


def test_request_too_big_for_a_replica_is_refused():
    from blendsim.sim.errors import UserError

    trace = from_columns(input_len=[3000], output_len=[10])
    with pytest.raises(UserError, match="more than a replica holds"):
        run_simulation(trace, RunConfig(model="tiny", hardware="cpu", kv_capacity_override=2000 * 4096))


def test_request_beyond_the_model_context_is_refused():
    from blendsim.sim.errors import UserError

    trace = from_columns(input_len=[100, 4000], output_len=[10, 200])  # tiny has a 4,096-token context
    with pytest.raises(UserError, match=r"row 2\) needs a context of 4200 tokens"):
        run_simulation(trace, RunConfig(model="tiny", hardware="cpu"))


def test_blended_reference_is_a_perfectly_blended_schedule():
    """Prompts of exactly one token budget, one token out: every step is one full prefill chunk, which is
    what the blended reference prices, so the run sits exactly at it (overlap mode); a sequential run of
    the same steps is slower than the overlapped estimate. T_o, the bound, is met closely by both."""
    trace = from_columns(input_len=[256] * 8, output_len=[1] * 8)
    for mode, frac in (("overlap", 1.0), ("sequential", None)):
        s = run_simulation(trace, RunConfig(policy="fcfs", model="tiny", hardware="cpu", mode=mode,
                                            token_budget=256, block_size=1)).summary
        assert s["steps"] == 8
        if frac is None:
            assert s["frac_of_reference"] < 1.0
        else:
            assert s["frac_of_reference"] == pytest.approx(frac, rel=1e-9)
        assert 0.9 < s["frac_of_opt"] <= 1.0 + 1e-9


def test_blended_reference_respects_the_kv_capacity_and_the_sequence_cap():
    from blendsim.sim.metrics import blended_optimum

    trace = from_columns(input_len=[2000] * 64, output_len=[500] * 64)
    cm = _cm("overlap")
    free = blended_optimum(trace, 0.0, cm, 1024)
    assert blended_optimum(trace, 0.0, cm, 1024, kv_tokens=1e12, max_seqs=0) == free
    # mean decode context 2,250 tokens: 18,000 KV tokens hold 8 decoding sequences, not the ~200 a
    # 1,024-token step would carry, so the decodes need many more (cheaper) steps
    tight = blended_optimum(trace, 0.0, cm, 1024, kv_tokens=18_000)
    capped = blended_optimum(trace, 0.0, cm, 1024, max_seqs=8)
    assert tight > 2 * free and capped == pytest.approx(tight, rel=1e-9)
