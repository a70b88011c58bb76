"""A run of pure decode steps priced at once (fast-forward) changes nothing but speed: with and without it (and with
``--record-schedule``, which turns it off) a simulation takes the same steps and writes byte-identical results.

The cases are the ones where it once did not: a request arriving during the step before a run, a finish or a
finished prefill freeing what reserve admission had refused, and a refusal by the reserve rule that lifts as the
decodes' expected remaining output falls (engines with reserve admission: trtllm, sglang, nanoflow)."""

from __future__ import annotations

import numpy as np
import pytest

from blendsim.runner import RunConfig, run_simulation
from blendsim.workloads.trace import from_columns


def _trace(n: int, online: bool, seed: int = 7):
    """Prompts sharing a few long prefixes, outputs long enough for decode runs, and a queue that outgrows the KV."""
    rng = np.random.default_rng(seed)
    prompts, lengths = [], {}
    for i in range(n):
        head = int(rng.integers(0, 4))
        prompts.append([(head, lengths.setdefault(head, int(rng.integers(200, 1500)))),
                        (1000 + i, int(rng.integers(20, 600)))])
    kw = {"arrival_s": np.sort(rng.random(n) * 60.0)} if online else {}
    return from_columns(input_len=[sum(x for _, x in p) for p in prompts], output_len=rng.integers(20, 1500, n),
                        prompts=prompts, **kw)


def _run(trace, ff: bool, **cfg):
    r = run_simulation(trace, RunConfig(model="llama-3-8b", hardware="a100-40gb", fast_forward=ff, seed=3, **cfg))
    return r.summary, r.steps


# with pipeline stages (which sglang's profiles refuse: sim.engines.pipeline_unmodelled), sglang's reserve rule
# (new_token_ratio 0.7) on an engine that runs them
CASES = [(p, e, pp) for p in ("fcfs", "dfs", "blendserve") for e in ("ideal", "trtllm", "sglang") for pp in (1,)] + [
    ("fcfs", "trtllm+0.7", 2), ("dfs", "trtllm+0.7", 2), ("dfs", "trtllm", 2)]


@pytest.mark.parametrize("online", [True, False])
@pytest.mark.parametrize("policy,engine,pp", CASES)
def test_fast_forward_takes_the_same_steps_to_the_last_bit(policy, engine, pp, online):
    trace = _trace(300, online)
    engine, _, ratio = engine.partition("+")
    extra = {"admission": "reserve", "reserve_ratio": float(ratio)} if ratio else {}
    (a, sa), (b, sb) = (_run(trace, ff, policy=policy, engine=engine, pp=pp, **extra) for ff in (True, False))
    assert a["steps"] == b["steps"] and len(sa) == len(sb)
    for ra, rb in zip(sa, sb):  # every replica's (virtual engine's) step log, column by column
        assert set(ra) == set(rb)
        for k in ra:
            np.testing.assert_array_equal(np.asarray(ra[k]), np.asarray(rb[k]), err_msg=k)
    assert a == b
