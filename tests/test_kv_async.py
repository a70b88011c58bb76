"""Asynchronous KV loads (``kv_load`` "async", vLLM V1's KV connectors): a request whose prefix comes back from a
host/disk tier holds its blocks but waits out of the steps until the load has arrived, while the other requests run
on (vLLM v0.9.2 vllm/v1/core/sched/scheduler.py: load_kv_async, WAITING_FOR_REMOTE_KVS)."""

from __future__ import annotations

import numpy as np
import pytest

from blendsim.policies.registry import policy_names
from blendsim.runner import RunConfig, run_simulation
from blendsim.sim.engines import get_profile
from blendsim.workloads.trace import from_columns
from tests.helpers import stdout_on_both_step_paths
from tests.test_kv_tiers import _cfg, _interleaved_prefixes, gb

LINK_GBPS = 0.001  # 1 MB/s: P's four 64 KB blocks take 0.26 s against microsecond steps of the tiny model


def _rehit_beside_a_decoder():
    """A: prefix P alone; X: a long prompt that evicts P to host; C: P + 32 tokens (reloads P); D: an unrelated
    short prompt with 200 output tokens, admitted beside C."""
    prompts = [[(1, 64)], [(2, 420)], [(1, 64), (3, 32)], [(4, 16)]]
    return from_columns(input_len=[64, 420, 96, 16], output_len=[1, 1, 2, 200], prompts=prompts)


def _run(mode: str, **kw):
    return run_simulation(_rehit_beside_a_decoder(), _cfg(host_kv_gb=gb(16), kv_load=mode, max_seqs=2,
                                                          host_link_gbps=LINK_GBPS, admission="greedy", **kw))


def test_the_loading_request_waits_out_of_the_steps_and_the_others_run_on():
    stall, asyn = _run("stall"), _run("async")
    for r in (stall, asyn):
        assert r.summary["prefix_hit_tokens"]["host"] == 64  # C reloads P either way
    load_end = stall.requests["first_token_s"][2]  # under stall C's first step ends after the load
    assert load_end > 0.25
    # stall: the step with C's chunk (and D's) waits for the load; D's tokens come after it
    assert np.max(stall.steps[0]["dt_s"]) > 0.25 and stall.requests["first_token_s"][3] >= load_end
    # async: no step waits; D decodes all its tokens while C's prefix is on its way, C starts once it has arrived
    s = asyn.summary
    assert s["kv_load_stall_s"] == 0.0 and np.max(asyn.steps[0]["dt_s"]) < 0.01
    assert asyn.requests["admit_s"][2] == asyn.requests["admit_s"][3]  # both admitted at once, C loading
    assert asyn.requests["finish_s"][3] < 0.1 < load_end - 0.1
    assert asyn.requests["first_token_s"][2] >= load_end - 0.01  # the same load, the same links
    assert s["makespan_s"] < stall.summary["makespan_s"]
    # an idle replica waits for the load (no step runs, nothing is stuck)
    ends = np.asarray(asyn.steps[0]["t_end_s"])
    assert np.max(np.diff(ends)) > 0.25


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_runs_async_loads_with_no_stall_where_it_admits_through_the_engine(policy):
    trace = _interleaved_prefixes()
    cfg = dict(policy=policy, model="tiny", hardware="a100-80gb", block_size=16, kv_capacity_override=1200 * 4096,
               offline=True, engine="ideal", host_kv_gb=1.0, kv_load="async", host_link_gbps=0.05)
    r = run_simulation(trace, RunConfig(**cfg))
    s = r.summary
    assert int(np.sum(r.requests["generated_tokens"])) == int(trace.output_len.sum())
    if policy in ("accelgen", "batchllm", "blendserve"):  # ASYNC_LOADS False: loads priced as overlap
        assert s["kv_load_bytes"] == 0 or s["kv_load_stall_s"] > 0
    else:
        assert s["kv_load_stall_s"] == 0.0


def test_pipelined_replicas_wait_for_async_loads_too():
    trace = _interleaved_prefixes()
    base = dict(policy="fcfs", model="tiny", hardware="a100-80gb", block_size=16, kv_capacity_override=1200 * 4096,
                offline=True, engine="ideal", host_kv_gb=1.0, host_link_gbps=0.05, pp=2)
    a = run_simulation(trace, RunConfig(**base, kv_load="async")).summary
    s = run_simulation(trace, RunConfig(**base, kv_load="stall")).summary
    assert a["kv_load_bytes"] > 0 and a["kv_load_stall_s"] == 0.0 < s["kv_load_stall_s"]
    assert a["n_requests"] == s["n_requests"] and a["makespan_s"] < s["makespan_s"]


def test_vllm_from_0_11_loads_asynchronously_and_older_releases_stall():
    assert get_profile("vllm").kv_load == "async" and get_profile("vllm@0.11").kv_load == "async"
    assert get_profile("vllm@0.10").kv_load == "stall" and get_profile("sglang@0.4").kv_load == "overlap"


_ASYNC_RUN = """
import warnings; warnings.filterwarnings("ignore")
import numpy as np, blendsim
r = np.random.default_rng(11); n = 160
prompts = [[(1 + int(r.integers(0, 6)), 300), (1000 + i, int(r.integers(1, 200)))] for i in range(n)]
p = [sum(l for _, l in x) for x in prompts]
d = r.integers(1, 300, n).tolist()
t = blendsim.make_trace(input_len=p, output_len=d, prompts=prompts)
for pol in ("fcfs", "vllm", "dfs", "e2"):
    s = blendsim.simulate(t, policy=pol, model="llama-3-8b", hardware="a100-80gb", engine="vllm", seed=3,
                          kv_capacity_override=6000 * 131072, host_kv_gb=2.0, disk_kv_gb=20.0).summary
    print(pol, repr(s["makespan_s"]), s["steps"], s["preemptions"], s["kv_load_bytes"])
"""


def test_async_loads_run_alike_compiled_and_pure():
    compiled, pure = stdout_on_both_step_paths(_ASYNC_RUN)
    assert compiled == pure
    assert all(int(line.split()[-1]) > 0 for line in compiled.splitlines())  # every run reloaded something


def test_a_request_hitting_blocks_still_on_their_way_waits_for_them():
    """E shares the prefix C is reloading: it may not read those blocks before they arrive (vLLM caches a loading
    request's blocks only once they have: delay_cache_blocks); it ran at once, before the prefix it reads."""
    prompts = [[(1, 64)], [(2, 420)], [(1, 64), (3, 32)], [(1, 64), (5, 16)]]
    trace = from_columns(input_len=[64, 420, 96, 80], output_len=[1, 1, 2, 2], prompts=prompts)
    r = run_simulation(trace, _cfg(host_kv_gb=gb(16), kv_load="async", max_seqs=4, host_link_gbps=LINK_GBPS,
                                   admission="greedy"))
    q = r.requests
    assert q["admit_s"][3] == q["admit_s"][2] < 0.01  # admitted beside C, on a GPU hit of C's loading blocks
    assert q["first_token_s"][3] >= q["first_token_s"][2] - 1e-3 > 0.25  # E's first token after the load, as C's


def test_a_request_whose_load_arrived_waits_for_a_slot_under_the_sequence_cap():
    prompts = [[(1, 64)], [(2, 420)], [(1, 64), (3, 32)], [(4, 16)]]
    trace = from_columns(input_len=[64, 420, 96, 16], output_len=[1, 1, 2, 300], prompts=prompts)
    for link in (0.001, 1.0):
        r = run_simulation(trace, _cfg(host_kv_gb=gb(16), kv_load="async", max_seqs=1, host_link_gbps=link,
                                       admission="greedy"))
        st = r.steps[0]
        seqs = np.asarray(st["num_decode"]) + np.asarray(st["num_prefill_seqs"])
        assert int(seqs.max()) == 1, link  # C, loaded, does not join D's steps
        assert int(np.sum(r.requests["generated_tokens"])) == 304


def test_a_scheduler_that_chunks_a_loading_request_stops_in_one_line(monkeypatch):
    """A policy admitting through its own path that leaves ASYNC_LOADS True would run a loading request's chunk at
    once, its load free: the run stops and says what to do."""
    from blendsim.policies.blendserve import scanner
    from blendsim.sim.errors import UserError

    monkeypatch.setattr(scanner.DualScanScheduler, "ASYNC_LOADS", True)
    cfg = dict(policy="blendserve", model="tiny", hardware="a100-80gb", block_size=16, offline=True, engine="ideal",
               kv_capacity_override=1200 * 4096, host_kv_gb=1.0, kv_load="async", host_link_gbps=0.05)
    with pytest.raises(UserError) as e:
        run_simulation(_interleaved_prefixes(), RunConfig(**cfg))
    assert "\n" not in str(e.value) and "ASYNC_LOADS = False" in str(e.value)
