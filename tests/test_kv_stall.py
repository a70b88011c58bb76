"""EngineConfig.kv_full = "stall" (DeepSpeed-MII 0.1): a decode that finds no free KV block skips the step
and resumes once one is free; when nothing at all can run, every running request is flushed and recomputed.
The default ("preempt", vLLM's rule) is unchanged (the golden digests, tests/test_golden.py, cover it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from blendsim.policies.fcfs import FCFS
from blendsim.runner import RunConfig, run_simulation
from blendsim.sim.errors import UserError
from blendsim.sim.kv import KVCache
from blendsim.sim.prefix_tree import PrefixTree
from blendsim.sim.scheduler import Scheduler
from blendsim.sim.seq import EngineConfig, RequestRecords, WaitQueue
from blendsim.workloads.trace import from_columns
from tests.test_engine_invariants import check_invariants, check_kv_every_step

B = 4


def make(prompts, outputs, blocks, kv_full="stall"):
    trace = from_columns(input_len=prompts, output_len=outputs)
    kv = KVCache(PrefixTree(trace), blocks, B)
    cfg = EngineConfig(token_budget=64, block_size=B, prefix_caching=False, admission="greedy", kv_full=kv_full)
    s = Scheduler(kv=kv, cfg=cfg, prompt_len=list(prompts), output_len=list(outputs), queue=WaitQueue(),
                  records=RequestRecords(len(prompts)), record=True)
    for r in range(len(prompts)):
        s.requeue(r)
    return s


def run(s, max_steps=1000):
    """Step ``s`` to the end; per step: (requests decoding, requests stalled). Checks after every step that
    the KV holds exactly the tokens the schedule put there (never more blocks than exist) and that every
    request samples exactly its output length: no token lost or made twice."""
    P, D = s.P, s.Dlen
    length: dict = {}  # request -> tokens in its KV, from the schedule's events
    target = {r: P[r] for r in range(len(P))}
    sampled = [0] * len(P)
    per_step = []
    seen = 0
    now = 0.0
    for _ in range(max_steps):
        b = s.schedule(now)
        if b is None:
            break
        now += 0.01
        s.update(b, now)
        s.kv.check()
        for _, kind, r, a, n_or_b, c in s.events[seen:]:
            if kind == "chunk":
                n, ctx = a, n_or_b
                assert length.get(r, c) == ctx, (r, ctx, length.get(r))  # a new admission: after its cache hit
                length[r] = ctx + n
                sampled[r] += ctx + n == target[r]
            elif kind == "decode":
                assert length[r] == a >= target[r]
                length[r] = a + 1
                sampled[r] += 1
            elif kind == "preempt":
                assert a == sampled[r]  # it re-enters with the tokens it generated, to recompute
                length.pop(r, None)
                target[r] = P[r] + a
            elif kind == "finish":
                assert sampled[r] == D[r]
                length.pop(r)
        seen = len(s.events)
        used = sum(-(-n // B) for n in length.values())
        kv = s.kv  # blocks of the schedule's KV: what the cache counts as held (private, or cached and in use)
        assert used == kv.private + kv.cache_blocks - kv.evictable <= kv.total
        per_step.append((b.num_decode, [q.req for q in s.stalled]))
    assert not s.has_work() and sampled == list(D)
    assert list(s.rec.generated) == list(D)
    return per_step


def test_a_decode_without_a_block_stalls_and_resumes_first():
    # 5 blocks of 4 tokens; three 4-token prompts fill 3; at the first decode each needs a new block: only 2
    # are free, so the newest (request 2) waits while 0 and 1 run; request 0 ends after 4 decodes, and its
    # 2 blocks go first to the waiting decode, then to request 1's next block
    s = make([4, 4, 4], [5, 9, 6], blocks=5)
    steps = run(s)
    assert steps[0] == (0, [])  # the three prompts
    assert steps[1] == (2, [2]) and steps[4] == (2, [2])  # request 2 makes no token for 4 steps
    assert steps[5] == (2, [])  # request 0 finished: request 2 resumes beside request 1
    assert s.flushes == 0 and sum(s.rec.preemptions) == 0 and sum(s.rec.recomputed_tokens) == 0
    # the default rule preempts instead: the newest gives its KV back and recomputes
    p = make([4, 4, 4], [5, 9, 6], blocks=5, kv_full="preempt")
    steps = run(p)
    assert all(not st for _, st in steps) and sum(p.rec.preemptions) > 0 and sum(p.rec.recomputed_tokens) > 0


def test_nothing_can_run_flushes_every_running_request():
    # 6 blocks; three 4-token prompts, each decoding to a context of 8: at 8 every one needs a block, none is
    # free, nothing waits to be admitted: deadlock. All three are flushed (newest first) and re-queued as
    # prompt + generated tokens; they then run to the end
    s = make([4, 4, 4], [10, 10, 10], blocks=6)
    run(s)
    assert s.flushes >= 1
    flushed = [e for e in s.events if e[1] == "preempt"]
    first = [e for e in flushed if e[0] == flushed[0][0]]
    assert [e[2] for e in first] == [2, 1, 0] and all(e[3] == 5 for e in first)  # 5 tokens each so far
    assert list(s.rec.preemptions) >= [1, 1, 1]
    # the flushed KV is recomputed: prompt and generated tokens again (every token beyond the prompt)
    assert (np.asarray(s.rec.recomputed_tokens) >= 5).all()


def test_a_stall_is_not_fast_forwarded_over(monkeypatch):
    # a whole run under the engine: stalls and flushes, fast-forward on, every request its output length
    check_kv_every_step(monkeypatch)
    rng = np.random.default_rng(5)
    n = 24
    trace = from_columns(input_len=rng.integers(8, 40, n), output_len=rng.integers(20, 120, n))

    class Stall(FCFS):
        name = "fcfs-stall"
        engine_defaults = {"kv_full": "stall", "admission": "greedy", "block_size": B, "prefix_caching": False}

    class Preempt(Stall):
        name = "fcfs-preempt"
        engine_defaults = {**Stall.engine_defaults, "kv_full": "preempt"}

    cap = int((trace.input_len + trace.output_len).max() + 8 * B) * 4096 * 2
    out = {}
    for pol in (Stall, Preempt):
        r = run_simulation(trace, RunConfig(policy=pol, model="tiny", hardware="cpu", kv_capacity_override=cap,
                                            token_budget=64))
        check_invariants(trace, r)
        out[pol.name] = [r.summary[k] for k in ("preemptions", "recomputed_tokens", "makespan_s")]
    assert out["fcfs-stall"] != out["fcfs-preempt"]  # the KV runs out, and the two rules meet it differently


def test_fastgen_profile_stalls_and_other_engines_do_not():
    from blendsim.sim.engines import PROFILES, VERSIONS

    assert VERSIONS[("deepspeed-fastgen", "0.1")].scheduler["kv_full"] == "stall"
    assert EngineConfig().kv_full == "preempt"
    assert all(p.scheduler.get("kv_full", "preempt") == "preempt" for p in PROFILES.values()
               if p.name != "deepspeed-fastgen")


def test_bad_kv_full_is_one_clear_line():
    with pytest.raises(UserError) as e:
        EngineConfig(kv_full="wait")
    msg = str(e.value)
    assert "\n" not in msg and "kv_full" in msg and "preempt" in msg and "stall" in msg and "'wait'" in msg


_CASE = """
import json, sys
sys.path.insert(0, {root!r})
from tests.test_kv_stall import make, run
from blendsim.sim import _compiled
s = make([4, 4, 4, 6, 3], [10, 10, 7, 12, 9], blocks=7)
steps = run(s)
print(json.dumps([_compiled.status()["path"], steps, s.events, list(s.rec.recomputed_tokens), s.flushes]))
"""


def test_compiled_and_pure_python_stall_alike():
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    got = []
    for pure in (False, True):
        env = {k: v for k, v in os.environ.items() if k != "BLENDSIM_PURE_PYTHON"}
        if pure:
            env["BLENDSIM_PURE_PYTHON"] = "1"
        p = subprocess.run([sys.executable, "-c", _CASE.format(root=root)], env=env, capture_output=True, text=True,
                           timeout=300, cwd=root)
        assert p.returncode == 0, p.stderr[-2000:]
        got.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert got[1][0] == "pure Python"
    assert got[0][1:] == got[1][1:] and got[0][4] > 0


def test_kv_full_is_a_run_option_and_a_bad_one_is_one_line():
    from blendsim.runner import engine_config

    assert engine_config(RunConfig(engine="vllm"), FCFS).kv_full == "preempt"
    assert engine_config(RunConfig(engine="vllm", kv_full="stall"), FCFS).kv_full == "stall"
    assert engine_config(RunConfig(engine="deepspeed-fastgen"), FCFS).kv_full == "stall"  # the profile's
    assert engine_config(RunConfig(engine="deepspeed-fastgen", kv_full="preempt"), FCFS).kv_full == "preempt"
    with pytest.raises(UserError, match="kv_full must be one of preempt, stall"):
        engine_config(RunConfig(engine="vllm", kv_full="wait"), FCFS)
