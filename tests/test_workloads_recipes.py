"""Source length models against the real samples and the papers; the four recipes' statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from blendsim.sim.density import trace_bounds
from blendsim.sim.deployment import make_deployment
from blendsim.sim.errors import UserError
from blendsim.sim.prefix_tree import PrefixTree
from blendsim.workloads.recipes import get_recipe, paths, recipe_names, synthesize
from blendsim.workloads.sources import (
    AZURE_CODE,
    AZURE_CONV,
    BURSTGPT,
    MMLU,
    OPENVID,
    SHAREGPT,
    WILDCHAT,
    get_source,
)
from blendsim.workloads.trace import from_segment_arrays, write_trace

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"real trace samples not found at {DATA}")
DEP = make_deployment("llama-3-8b", "a100-80gb", 1)
RHOS = np.round(np.arange(0.80, 1.4001, 0.05), 2)
SHARES = np.round(np.arange(0.05, 0.4501, 0.10), 2)


def _draw(source, n=200_000, seed=1):
    return source.sample(n, np.random.default_rng(seed))


def _csv(name):
    import pandas as pd

    return pd.read_csv(DATA / name)


# ---- source models vs the real samples (fitted; tolerances stated) ---------------------------
@needs_data
@pytest.mark.parametrize(("source", "name", "cols"), [
    (AZURE_CONV, "azure_llm_inference_2023_conv.csv", ("ContextTokens", "GeneratedTokens")),
    (AZURE_CODE, "azure_llm_inference_2023_code.csv", ("ContextTokens", "GeneratedTokens")),
    (SHAREGPT, "nanoflow_sharegpt_first_turn_lengths_llama2tok.csv", ("prompt_tokens", "output_tokens")),
])
def test_fitted_sources_match_their_samples(source, name, cols):
    df = _csv(name)
    p, d = _draw(source)
    for model, real in ((p, df[cols[0]].to_numpy()), (d, df[cols[1]].to_numpy())):
        assert model.mean() == pytest.approx(real.mean(), rel=0.06)  # means within 6%
        assert np.median(model) == pytest.approx(np.median(real), rel=0.25)  # medians within 25%
        assert model.min() >= 1 and model.max() <= real.max()


@needs_data
def test_mmlu_question_lengths_match_the_zero_shot_sample():
    df = _csv("mmlu_test_lengths_llama3tok.csv")
    rng = np.random.default_rng(3)
    subj = MMLU.subjects(rng)
    _, q, d = MMLU.sample(100_000, rng, subj)
    body = q - MMLU.cue_len  # question + choices
    real = (df.question_tokens + df.choices_tokens).to_numpy()
    assert body.mean() == pytest.approx(real.mean(), rel=0.10)
    zero_shot = MMLU.header_len + q  # the sample's zero-shot prompt = header + body + answer cue
    assert zero_shot.mean() == pytest.approx(df.zero_shot_prompt_tokens.mean(), rel=0.10)
    assert len(subj.prefix_len) == df.subject.nunique() and np.all(d == df.answer_tokens.max())


def _single_source_trace(source, n, seed):
    own, d = _draw(source, n, seed)
    off, ids, lens = paths([(np.zeros(n, dtype=np.int64), np.full(n, source.system_prompt_len)),
                            (1 + np.arange(n), own)])
    return from_segment_arrays(own + source.system_prompt_len, d, off, ids, lens)


def _mmlu_trace(n, seed):
    rng = np.random.default_rng(seed)
    subj = MMLU.subjects(rng)
    sid, q, d = MMLU.sample(n, rng, subj)
    off, ids, lens = paths([(np.zeros(n, dtype=np.int64), np.full(n, MMLU.system_prompt_len)),
                            (1 + sid, subj.prefix_len[sid]), (100 + np.arange(n), q)])
    return from_segment_arrays(MMLU.system_prompt_len + subj.prefix_len[sid] + q, d, off, ids, lens)


@pytest.mark.parametrize(("source", "table4"), [(BURSTGPT, 0.02), (AZURE_CONV, 0.01), (AZURE_CODE, 0.01),
                                                (SHAREGPT, 0.02), (WILDCHAT, 0.19), (OPENVID, 0.00)])
def test_single_sources_have_blendserve_table4_sharing(source, table4):
    s = PrefixTree(_single_source_trace(source, 20_000, 5)).optimal_sharing_ratio()
    assert s == pytest.approx(table4, abs=0.008)


def test_mmlu_five_shot_has_table4_sharing():
    """Table 4: MMLU shares 86.46% (the full 14,042-question test split); +-0.02 over seeds."""
    for seed in range(3):
        assert PrefixTree(_mmlu_trace(14_042, seed)).optimal_sharing_ratio() == pytest.approx(0.8646, abs=0.02)


def test_paper_facts_of_sources_without_samples():
    p, d = _draw(BURSTGPT)
    assert (p + d).mean() == pytest.approx(762.7, rel=0.05)  # BurstGPT release: 762.7 tokens per request
    _, v = _draw(OPENVID)
    assert v.mean() == pytest.approx(16384, rel=0.03) and np.all(v % 256 == 0)  # App. A.3: frames x 256, 16K
    _, w = _draw(WILDCHAT)
    assert w.mean() == pytest.approx(256, rel=0.03)  # App. A.3: WildChat normalised to 256
    with pytest.raises(UserError, match="unknown source"):
        get_source("nope")


# ---- blendserve -------------------------------------------------------------------------------
def _check(trace, rho, s, tol=0.02):
    tree = PrefixTree(trace)  # measured here, independently of the recipe's own bookkeeping
    b = trace_bounds(trace, DEP, tree)
    assert tree.optimal_sharing_ratio() == pytest.approx(s, rel=tol)
    assert b.density == pytest.approx(rho, rel=tol)
    assert trace.meta["measured"]["density"] == pytest.approx(b.density, rel=1e-9)


@pytest.mark.parametrize("n", [2000, 5000])
def test_blendserve_hits_the_whole_grid(n):
    for rho in RHOS:
        for s in SHARES:
            _check(synthesize("blendserve", density=float(rho), sharing=float(s), requests=n, seed=7), rho, s)


@pytest.mark.parametrize("source", ["azure-conv", "azure-code", "sharegpt"])
def test_blendserve_grid_with_other_compute_sources(source):
    for rho in RHOS:
        for s in SHARES:
            _check(synthesize("blendserve", density=float(rho), sharing=float(s), requests=3000, source=source), rho, s)


def test_blendserve_wildchat_and_its_sharing_floor():
    for rho in RHOS[::3]:
        for s in (0.25, 0.35, 0.45):
            _check(synthesize("blendserve", density=float(rho), sharing=s, requests=3000, source="wildchat"), rho, s)
    with pytest.raises(UserError, match="wildchat alone already shares 0.19"):
        synthesize("blendserve", density=1.0, sharing=0.05, requests=3000, source="wildchat")


def test_blendserve_default_size_trace1():
    """Table 2's Trace#1 (1.4, 35%) at the paper's 400,000 requests."""
    t = synthesize("blendserve", density=1.4, sharing=0.35, requests=400_000)  # timed by benchmarks/bench_workloads.py
    assert t.n == 400_000
    _check(t, 1.4, 0.35)
    assert set(t.meta["counts"]) == {"burstgpt", "openvid", "mmlu"} and sum(t.meta["counts"].values()) == t.n


def test_blendserve_infeasible_requests_say_why():
    with pytest.raises(UserError, match="mmlu can lift sharing to at most"):
        synthesize("blendserve", density=1.0, sharing=0.95, requests=2000)
    with pytest.raises(UserError, match="with the fewest video requests is"):
        synthesize("blendserve", density=9.0, sharing=0.05, requests=2000)
    for bad, msg in ((dict(density=-1, sharing=0.1), "--density"), (dict(density=1, sharing=1.2), "--sharing"),
                     (dict(density=1, sharing=0.1, source="openvid"), "--source"),
                     (dict(density=1, sharing=0.1, requests=5), "--requests")):
        with pytest.raises(UserError, match=msg):
            synthesize("blendserve", **bad)


# ---- determinism ------------------------------------------------------------------------------
RECIPE_ARGS = {
    "blendserve": dict(density=1.1, sharing=0.25, requests=2000),
    "batchllm": dict(prefix_len=1000, distinct_len=1000, share_degree=4, requests=256),
    "preble": dict(kind="embodied", requests=600),
    "accelgen": dict(requests=800),
}


@pytest.mark.parametrize("name", list(RECIPE_ARGS))
def test_same_seed_same_bytes(tmp_path, name):
    files = [write_trace(synthesize(name, seed=seed, **RECIPE_ARGS[name]), tmp_path / f"{i}.parquet")
             for i, seed in enumerate((3, 3, 4))]
    a, b, c = (f.read_bytes() for f in files)
    assert a == b
    if name != "batchllm":  # batchllm has no randomness
        assert a != c


def test_registry():
    assert recipe_names() == ["blendserve", "batchllm", "preble", "accelgen"]
    with pytest.raises(UserError, match="unknown recipe"):
        get_recipe("vidur")
    with pytest.raises(UserError, match="unknown option"):
        synthesize("batchllm", prefix_len=1, distinct_len=1, share_degree=1, colour="red")
    with pytest.raises(UserError, match="missing option.*--share-degree"):
        synthesize("batchllm", prefix_len=1, distinct_len=1)


# ---- batchllm ---------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [4, 16])
@pytest.mark.parametrize(("p", "d"), [(2000, 200), (1000, 1000), (200, 2000)])
def test_batchllm_microbenchmarks_share_as_the_formula_says(p, d, k):
    t = synthesize("batchllm", prefix_len=p, distinct_len=d, share_degree=k, requests=64 * k)
    assert PrefixTree(t).optimal_sharing_ratio() == pytest.approx((k - 1) * p / (k * (p + d)), rel=1e-12)
    assert np.all(t.input_len == p + d) and np.all(t.output_len == 100) and not t.has_arrivals
    first = [t.prompt_repr(i)[0] for i in range(2 * k)]
    assert len({f for f in first[:k]}) == 1 and first[k] != first[0]  # groups of K share one prefix
    ragged = synthesize("batchllm", prefix_len=p, distinct_len=d, share_degree=k, requests=64 * k + 1)
    assert ragged.meta["groups"] == 65


# ---- preble -----------------------------------------------------------------------------------
TABLE1 = {"toolbench": (1835, 43), "embodied": (2285, 26), "programming": (3871, None), "loogle": (23474, 16)}


def _shared_fraction(trace):
    """Table 1's 'shared prefix in prompt': tokens of a prompt that at least one other request shares."""
    tree = PrefixTree(trace)
    end = tree.start + tree.tokens
    shared = np.zeros(tree.num_nodes)
    for lvl in range(1, int(tree.level.max()) + 1):
        idx = np.flatnonzero(tree.level == lvl)
        shared[idx] = np.where(tree.requests_below[idx] >= 2, end[idx], shared[tree.parent[idx]])
    return shared[tree.req_node] / trace.input_len


@pytest.mark.parametrize("kind", list(TABLE1))
def test_preble_lengths_follow_table1(kind):
    t = synthesize("preble", kind=kind)
    prompt, out = TABLE1[kind]
    assert t.input_len.mean() == pytest.approx(prompt, rel=0.10)
    if out is not None:
        assert t.output_len.mean() == pytest.approx(out, rel=0.12)
    assert t.n / t.arrival_s.max() == pytest.approx({"toolbench": 12, "embodied": 15, "programming": 4.5,
                                                     "loogle": 6}[kind], rel=0.15)


def test_preble_structures():
    tool = synthesize("preble", kind="toolbench")
    assert _shared_fraction(tool).mean() == pytest.approx(0.85, abs=0.03)  # Table 1: 85% shared
    prog = synthesize("preble", kind="programming")
    assert prog.output_len.max() <= 512 and _shared_fraction(prog).mean() > 0.97  # Table 1: 97%
    emb = synthesize("preble", kind="embodied")
    assert emb.meta["min_turn_gap_s"] > 1.0  # turns of an episode stay far apart
    ep = emb.unit_sym[emb.unit_offsets[:-1]]
    for e in np.unique(ep)[:5]:  # turn t's prompt is a prefix of turn t+1's
        rows = np.flatnonzero(ep == e)
        for a, b in zip(rows[:-1], rows[1:], strict=True):
            pa, pb = emb.prompt_repr(a), emb.prompt_repr(b)
            assert pb[:len(pa)] == pa and len(pb) == len(pa) + 1 and emb.arrival_s[b] > emb.arrival_s[a]
    skew = synthesize("preble", kind="toolbench", zipf=1.1)
    top = lambda t: np.unique(t.unit_sym[t.unit_offsets[:-1] + 1], return_counts=True)[1].max()  # noqa: E731
    assert top(skew) > 5 * top(tool)


@needs_data
def test_preble_videoqa_and_loogle_match_their_samples():
    nq = _csv("nextqa_val_test_lengths_llama3tok.csv")
    frames = nq.groupby("video").frame_count.first().to_numpy()
    real_video = np.minimum(frames // 30 * 256, 8192).mean()
    t = synthesize("preble", kind="videoqa", prefixes=2000, requests=20_000)
    video = t.unit_len[t.unit_offsets[:-1] + 1]
    per_video = np.unique(np.c_[t.unit_sym[t.unit_offsets[:-1] + 1], video], axis=0)[:, 1]
    assert per_video.mean() == pytest.approx(real_video, rel=0.08)
    assert t.output_len.mean() == pytest.approx(4, rel=0.1)  # Table 1: (4, 1.5)
    counts = np.unique(t.unit_sym[t.unit_offsets[:-1] + 1], return_counts=True)
    vid_len = dict(np.unique(np.c_[t.unit_sym[t.unit_offsets[:-1] + 1], video], axis=0))
    assert np.corrcoef(counts[1], [vid_len[s] for s in counts[0]])[0, 1] > 0.5  # questions follow length
    lg = _csv("loogle_github_sample_lengths_llama3tok.csv")
    t = synthesize("preble", kind="loogle", requests=5000)
    q = t.unit_len[t.unit_offsets[1:] - 1]
    assert q.mean() == pytest.approx(lg.question_tokens.mean(), rel=0.15)


# ---- accelgen ---------------------------------------------------------------------------------
def test_accelgen_mix_and_slos():
    from blendsim.workloads.recipes.accelgen import prefill_time

    t = synthesize("accelgen", requests=20_000)
    src = t.source
    assert np.mean(src == "bookcorpus") == pytest.approx(0.35, abs=0.015)  # sec. 3.1: 35% BookCorpus
    assert t.input_len[src == "alpaca"].max() <= 500 and t.input_len[src == "sharegpt"].max() <= 2048
    book = t.input_len[src == "bookcorpus"]
    assert book.min() >= 4096 and book.max() <= 100_000 and t.output_len.max() <= 2048
    assert t.n / t.arrival_s.max() == pytest.approx(8, rel=0.05)
    online = np.isfinite(t.ttft_slo_s)
    assert np.mean(~online) == pytest.approx(0.2, abs=0.015)
    assert np.all(np.isnan(t.tbt_slo_s[~online])) and np.all(np.isfinite(t.jct_slo_s[~online]))
    scale = t.tbt_slo_s[online] / 0.1875
    assert scale.min() >= 0.75 and scale.max() <= 1.25  # sec. 6.1
    dep = make_deployment("opt-13b", "a100-80gb", 1)
    pre, group = prefill_time(t.input_len, dep), t.input_len // 512
    base = np.array([pre[group == g].mean() for g in group[online]])
    ratio = t.ttft_slo_s[online] / base
    assert ratio.min() >= 0.5 and ratio.max() <= 1.5 and ratio.mean() == pytest.approx(1.0, abs=0.02)  # sec. 3.1
    # about half the TTFT SLOs are below the prompt's own isolated step, more with engine overhead
    alone = t.ttft_slo_s[online] >= pre[online]
    alone_vllm = t.ttft_slo_s[online] >= prefill_time(t.input_len[online], dep, engine="vllm")
    assert 0.45 < alone_vllm.mean() < alone.mean() < 0.6
    with pytest.raises(UserError, match="--long-share"):
        synthesize("accelgen", long_share=1.5)


@pytest.mark.parametrize("name,options,field", [
    ("preble", {"kind": "programming", "requests": 200, "rate": 1e-12}, "arrival_s"),
    ("batchllm", {"prefix_len": 9_000_000, "distinct_len": 9_000_000, "share_degree": 4, "requests": 8}, "input_len"),
])
def test_options_that_make_a_trace_beyond_the_limits_are_refused_before_writing(name, options, field):
    with pytest.raises(UserError, match=f"recipe {name} .*field {field}: .* exceeds"):
        get_recipe(name).make(**options)


def test_blendserve_refuses_a_model_whose_context_its_mix_exceeds():
    """opt-13b's 2,048-token context cannot hold BurstGPT's and OpenVid's long requests: one line (was: a trace
    written, its rho reported for opt-13b, and simulate then refusing it)."""
    with pytest.raises(UserError, match=r"recipe blendserve: [\d,]+ of 5,000 requests need more context than "
                                        r"opt-13b's 2,048 tokens"):
        synthesize("blendserve", requests=5000, model="opt-13b", density=0.8)
