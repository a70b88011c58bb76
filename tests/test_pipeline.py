"""Pipeline parallelism and node topology: hand-computed stage times, bubbles, per-stage KV and link pricing."""

from __future__ import annotations

import numpy as np
import pytest

from blendsim.runner import RunConfig, prepare_run, run_simulation
from blendsim.sim.batch import BatchFeatures
from blendsim.sim.cost import CostModel
from blendsim.sim.deployment import Deployment
from blendsim.sim.engine import Cluster, PipelinedReplica, Replica
from blendsim.sim.errors import UserError
from blendsim.sim.hardware import GiB, get_hardware
from blendsim.sim.kv import KVCache
from blendsim.sim.models import get_model
from blendsim.sim.seq import RequestRecords
from blendsim.sim.timers import NVLS_FACTOR
from blendsim.workloads.trace import from_columns


def _dep(model="llama-3-8b", hw="a100-80gb", tp=1, pp=2, **kw):
    return Deployment(get_model(model), get_hardware(hw), tp, pp=pp, **kw)


# ---- one batch in flight: the sum of the stages plus the hand-off ---------------------------------------
@pytest.mark.parametrize("fast_forward", [True, False])
def test_one_batch_in_flight_takes_the_sum_of_its_stages_plus_the_transfer(fast_forward):
    p, d = 300, 40
    trace = from_columns(input_len=[p], output_len=[d])
    r = run_simulation(trace, RunConfig(policy="fcfs", pp=2, token_budget=512, fast_forward=fast_forward))
    dep = _dep()
    st = [CostModel(dep.at_stage(i), "sequential") for i in range(2)]
    h, b = 4096, 2  # llama-3-8b hidden size, bf16
    lat, bw = 8e-6, 300e9  # a100-80gb NVLink: 8 us per step, 300 GB/s per direction

    def step(f):
        return st[0].cost(f).time_s + (lat + 2 * f.num_tokens * h * b / bw) + st[1].cost(f).time_s

    expect = [step(BatchFeatures.from_parts([(0, p, 0, 0)], 0, 0, 1))]
    expect += [step(BatchFeatures.decode_only(1, ctx)) for ctx in range(p, p + d - 1)]
    ve = r.steps[0] if len(r.steps[0]["dt_s"]) else r.steps[1]
    np.testing.assert_allclose(ve["dt_s"], expect, rtol=1e-12)
    assert r.summary["makespan_s"] == pytest.approx(sum(expect), rel=1e-12)
    # the stages split the model: their sum is the unsplit model's step (sequential mode, no TP)
    whole = CostModel(Deployment(get_model("llama-3-8b"), get_hardware("a100-80gb")), "sequential")
    f = BatchFeatures.decode_only(7, 7 * 500)
    assert st[0].cost(f).time_s + st[1].cost(f).time_s == pytest.approx(whole.cost(f).time_s, rel=1e-12)


# ---- a pipeline driven by fixed stage times -------------------------------------------------------------
class FixedStages:
    """A pricer whose stages take fixed times, whatever the batch."""

    def __init__(self, times, handoffs, server=0.0):
        self.stages = len(times)
        self.times, self.handoffs, self.server = list(times), list(handoffs), server

    def server_s(self, num_logits, num_decode):  # an API server's work per batch beside the engine
        return self.server

    def run(self, batch):
        return self.times, self.handoffs, 0.0, 0.0

    def run_decodes(self, D, ctx):
        n = len(ctx)
        return [np.full(n, t) for t in self.times], self.handoffs, np.zeros(n), np.zeros(n)


def _pipeline(outputs, times, handoffs, fast_forward=True, server=0.0):
    """One 2-VE pipelined replica running one request per virtual engine with these output lengths."""
    n = len(outputs)
    trace = from_columns(input_len=[16] * n, output_len=list(outputs))
    run = prepare_run(trace, RunConfig(policy="fcfs", pp=2, offline=True))
    rec = RequestRecords(trace.n)
    ves = []
    for v in range(2):
        kv = KVCache(run.tree, run.num_blocks, run.engine.block_size)
        sched = run.policy.make_scheduler(v, kv=kv, cfg=run.engine, prompt_len=trace.input_len.tolist(),
                                          output_len=trace.output_len.tolist(), records=rec)
        ves.append(Replica(v, sched, None, fast_forward=False))
    group = PipelinedReplica(0, ves, FixedStages(times, handoffs, server), fast_forward=fast_forward)
    makespan = Cluster(ves, run.policy.make_router(ves), trace.arrival_s, np.arange(n), [group]).run()
    return makespan, ves, rec.arrays()


@pytest.mark.parametrize("fast_forward", [True, False])
def test_two_batches_in_flight_take_the_slower_stage_per_step(fast_forward):
    a, x, b = 0.003, 0.001, 0.005  # stage 0, hand-off, stage 1
    makespan, ves, _ = _pipeline([50, 50], (a, b), (x,), fast_forward)
    ends = np.sort(np.concatenate([np.asarray(v.log.cols["t_end_s"]) for v in ves]))
    assert len(ends) == 100  # 50 steps each: the prefill (first token) and 49 decodes
    # VE0's batch: stage 0 [0, 3], stage 1 [4, 9] ms; VE1's waits for stage 1: [9, 14]; then one every 5 ms
    assert ends[0] == pytest.approx(a + x + b)
    np.testing.assert_allclose(np.diff(ends), b, rtol=1e-9)
    assert makespan == pytest.approx(a + x + b + 99 * b)
    # each virtual engine sees a step every two slow stages
    np.testing.assert_allclose(ves[0].log.cols["dt_s"][1:], 2 * b, rtol=1e-9)


@pytest.mark.parametrize("fast_forward", [True, False])
def test_the_drain_at_the_end_of_a_job_shows_the_bubble(fast_forward):
    a, x, b = 0.003, 0.001, 0.005
    full = a + x + b
    makespan, ves, rec = _pipeline([60, 20], (a, b), (x,), fast_forward)
    ends = np.sort(np.concatenate([np.asarray(v.log.cols["t_end_s"]) for v in ves]))
    # while both virtual engines have work a batch leaves every b (40 batches, VE1's 20th last, at 9 + 39 x 5 ms);
    # VE0's 21st entered behind it and leaves one b later; then VE0 is alone and every step pays both stages and
    # the hand-off: the bubble
    both = full + 39 * b
    np.testing.assert_allclose(np.diff(ends[:41]), b, rtol=1e-9)
    np.testing.assert_allclose(np.diff(ends[40:]), full, rtol=1e-9)
    assert makespan == pytest.approx(both + b + 39 * full, rel=1e-12)
    assert rec.finish_s.max() == pytest.approx(makespan)


@pytest.mark.parametrize("fast_forward", [True, False])
def test_an_api_server_beside_the_engine_paces_the_pipe_without_joining_its_stages(fast_forward):
    # a server whose work per batch (7 ms) exceeds the slowest stage (5 ms) but not a batch's cycle (9 ms): a batch
    # enters no sooner than the server has done the previous one's work, so with two virtual engines a batch leaves
    # every 7 ms, and alone (the drain) every 9 ms, as without a server -- the server is beside the stages, not in
    # series with them (with it in stage 0 the cycle would be 7 + 1 + 5 = 13 ms)
    a, x, b, srv = 0.003, 0.001, 0.005, 0.007
    makespan, ves, _ = _pipeline([60, 20], (a, b), (x,), fast_forward, server=srv)
    ends = np.sort(np.concatenate([np.asarray(v.log.cols["t_end_s"]) for v in ves]))
    assert ends[0] == pytest.approx(a + x + b)
    np.testing.assert_allclose(np.diff(ends[:40]), srv, rtol=1e-9)
    np.testing.assert_allclose(np.diff(ends[41:]), a + x + b, rtol=1e-9)


def test_two_batches_need_a_slow_stage_to_hide_the_hand_off():
    # equal stages of 4 ms and a 0.5 ms hand-off: a virtual engine's cycle (8.5 ms) exceeds two stages, so two
    # batches in flight give one step every 4.25 ms, not every 4
    makespan, ves, _ = _pipeline([30, 30], (0.004, 0.004), (0.0005,))
    ends = np.sort(np.concatenate([np.asarray(v.log.cols["t_end_s"]) for v in ves]))
    np.testing.assert_allclose(np.diff(ends), [0.004, 0.0045] * 29 + [0.004], rtol=1e-9)


# ---- KV capacity per stage ------------------------------------------------------------------------------
def test_kv_capacity_per_stage_follows_its_layers():
    dep = _dep(pp=3)
    assert dep.stage_layers() == [11, 11, 10]  # 32 layers: 10 each, the remainder to the stages before the last
    # llama-3-8b by hand: a layer's weights, the embedding and LM head, a token's KV per layer (bf16)
    h, kvw, inter, vocab = 4096, 1024, 14336, 128256
    layer = (h * (h + 2 * kvw) + h * h + 3 * h * inter + 2 * h) * 2
    emb = vocab * h * 2
    head = (vocab * h + h) * 2
    kv_token_layer = 2 * kvw * 2
    act = 8192 * ((2 * inter + inter) + 3 * h + (h + 2 * kvw)) * 2  # largest step's live activations
    logits = 1024 * vocab * 4  # the last stage samples
    usable = 80 * GiB * 0.9
    weights = [11 * layer + emb, 11 * layer, 10 * layer + head]
    acts = [act, act, act + logits]
    expect = [int((usable - w - ac) // (kv_token_layer * L)) for w, ac, L in zip(weights, acts, [11, 11, 10])]
    assert dep.stage_kv_tokens() == expect
    assert dep.kv_capacity_tokens == min(expect)
    assert [dep.stage_weight_bytes(i) for i in range(3)] == weights
    # the run gives each of the 3 virtual engines a third of the replica's blocks
    run = prepare_run(from_columns(input_len=[10], output_len=[5]), RunConfig(pp=3))
    assert run.num_blocks == min(run.deployment.stage_kv_tokens()) // 16 // 3


def test_a_stage_that_does_not_fit_is_named_in_one_line():
    with pytest.raises(UserError) as e:
        Deployment(get_model("llama-3.1-405b"), get_hardware("h100-80gb"), 4, pp=2)
    msg = str(e.value)
    assert "\n" not in msg and "stage 0 (layers 0-62 + embedding)" in msg and "short by" in msg
    with pytest.raises(UserError, match="--pp 200"):
        _dep(pp=200)


# ---- links by topology ----------------------------------------------------------------------------------
def test_a_tp_group_across_two_nodes_is_priced_on_the_network():
    f = BatchFeatures.decode_only(64, 64 * 1000)
    h, L = 8192, 80  # llama-3-70b
    rows = {}
    for tp in (8, 16):
        dep = Deployment(get_model("llama-3-70b"), get_hardware("h100-80gb"), tp)
        rows[tp] = {r["op"]: r for r in CostModel(dep).breakdown(f)}["allreduce"]
        assert dep.tp_spans_nodes == (tp == 16)
    n_ar = 2 * L
    nbytes = 2 * 64 * h * n_ar  # bf16 activations of 64 tokens, two all-reduces a layer
    # inside a node: NVLink 450 GB/s per direction, 8 us a step; the NVSwitch reduces in the network (NVLS), so
    # the all-reduce costs NVLS_FACTOR (1.35) of its buffer instead of the ring's 2(t-1)/t (1.75)
    assert rows[8]["time_s"] == pytest.approx(n_ar * 8e-6 + NVLS_FACTOR * nbytes / 450e9, rel=1e-12)
    # across two nodes: one 400 Gb/s NIC per GPU (50 GB/s), 12 us a step
    assert rows[16]["time_s"] == pytest.approx(n_ar * 12e-6 + 2 * 15 / 16 * nbytes / 50e9, rel=1e-12)
    notes = Deployment(get_model("llama-3-70b"), get_hardware("h100-80gb"), 16).topology_notes()
    assert len(notes) == 1 and "spans nodes" in notes[0]


def test_stages_on_two_nodes_hand_off_over_the_network():
    dep = Deployment(get_model("llama-3-70b"), get_hardware("h100-80gb"), 8, pp=2)
    assert dep.nodes == 2 and not dep.tp_spans_nodes and dep.pp_crosses(0)
    assert dep.pp_link(0) == (50e9, 12e-6) and dep.tp_link() == (450e9, 8e-6)
    inside = Deployment(get_model("llama-3-70b"), get_hardware("h100-80gb"), 4, pp=2)
    assert inside.nodes == 1 and inside.pp_link(0) == (450e9, 8e-6)
    # a GB200 NVL72 rack is one NVLink domain: 16 GPUs on 4 trays still use NVLink
    rack = Deployment(get_model("llama-3-70b"), get_hardware("gb200"), 16)
    assert rack.nodes == 4 and not rack.tp_spans_nodes


def test_no_known_network_refuses_a_deployment_across_nodes():
    with pytest.raises(UserError, match="no inter-node network"):
        Deployment(get_model("llama-3-70b"), get_hardware("l40s"), 8, pp=2)


def test_pp1_summaries_have_no_pipeline_fields():
    trace = from_columns(input_len=[100, 200], output_len=[5, 9])
    s1 = run_simulation(trace, RunConfig()).summary
    assert "pp" not in s1 and "nodes" not in s1
    s2 = run_simulation(trace, RunConfig(pp=2)).summary
    assert s2["pp"] == 2 and s2["stage_layers"] == [16, 16] and s2["pp_links"] == ["scale-up"]


# ---- every policy under PP -------------------------------------------------------------------------------
def _policies():
    from blendsim.policies.registry import policy_names

    return sorted(policy_names())


@pytest.mark.parametrize("policy", _policies())
def test_every_policy_runs_under_pipeline_parallelism(policy):
    rng = np.random.default_rng(3)
    n = 120
    prompts = [[(int(i % 6), 64), (1000 + i, int(rng.integers(8, 200)))] for i in range(n)]
    trace = from_columns(input_len=[64 + p[1][1] for p in prompts], output_len=rng.integers(2, 60, n).tolist(),
                         prompts=prompts)
    r = run_simulation(trace, RunConfig(policy=policy, pp=2, replicas=2, offline=True))
    s = r.summary
    assert s["pp"] == 2 and s["n_requests"] == n
    assert not np.isnan(r.requests["finish_s"]).any()
    assert set(np.unique(r.requests["replica"])) <= {0, 1}
    assert (r.requests["generated_tokens"] == trace.output_len).all()
    assert s["makespan_s"] == pytest.approx(max(float(np.max(c["t_end_s"])) for c in r.steps if len(c["t_end_s"])))


# ---- the commands ----------------------------------------------------------------------------------------
def test_cost_prices_each_stage_and_the_pipe():
    from blendsim import api

    out = api.cost("llama-3-70b", "h100-80gb", decode_seqs=64, context=1000, tp=8, pp=2)
    st = [s["step_time_s"] for s in out["stages"]]
    assert len(st) == 2 and out["handoff_links"] == ["network"]  # 16 GPUs: one stage per node
    assert out["one_batch_in_flight_s"] == pytest.approx(sum(st) + sum(out["handoff_s"]), rel=1e-12)
    assert out["pipe_full_step_s"] == max(st)
    h = 8192  # llama-3-70b: 64 tokens' hidden states and residual, a 1/8 slice per GPU, over one 50 GB/s NIC
    assert out["handoff_s"][0] == pytest.approx(12e-6 + 2 * 64 * h * 2 / 8 / 50e9, rel=1e-12)


def test_validate_refuses_pp_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from blendsim import api
    from blendsim.cli import get_app
    from tests.helpers import one_line_error

    trace = tmp_path / "t.parquet"
    api.write_trace(from_columns(input_len=[10], output_len=[3]), trace)
    r = CliRunner().invoke(get_app(), ["validate", str(trace), "--pp", "2", "-o", str(tmp_path / "v")])
    one_line_error(r, "--pp 2", "one device")


def test_the_run_header_counts_a_replicas_gpus_and_names_its_parallelism():
    """simulate's first line: TP x PP (and EP) GPUs per replica, not TP alone."""
    from blendsim import api
    from blendsim.reports.terminal import run_summary_lines

    trace = api.make_trace(input_len=[200] * 20, output_len=[20] * 20)
    s = api.simulate(trace, policy="fcfs", model="mixtral-8x7b", hardware="h100-80gb", tp=4, ep=4, pp=2).summary
    assert run_summary_lines(s)[0].startswith("fcfs on mixtral-8x7b / h100-80gb x8 (TP4 x PP2, EP4; 1 replica(s),")
    s = api.simulate(trace, policy="fcfs", tp=2, replicas=2).summary
    assert run_summary_lines(s)[0].startswith("fcfs on llama-3-8b / a100-80gb x2 (2 replica(s),")
