"""BlendServe's workload synthesis (App. A.3): hit a compute density rho and a sharing ratio s.

Three sources are mixed: one compute-intensive chat/API trace (BurstGPT by default), the
memory-intensive OpenVid video-generation trace, and MMLU (5-shot, high prefix sharing). Each source
gets its own shared system prompt; MMLU requests also share their subject's few-shot prefix.

rho and s are the project's definitions, measured on the finished trace:
``s = PrefixTree(trace).optimal_sharing_ratio()`` and ``rho = trace_bounds(trace, dep).density``.

How the counts are found. Every source is drawn once as a pool (seeded); a candidate mix takes the
first n requests of each pool, so a mix's totals (compute time, memory time, prompt tokens and the
tokens a DFS with unbounded cache computes) are prefix sums, and s and rho of *every* candidate are
exact, not estimates. The solver starts from a mean-based guess and then alternates exact scans:
the MMLU count for s, the OpenVid count for rho, and two extra OpenVid requests (the "tuners", picked
from a separate pool) for fine control of rho -- a single video request holds ~1/6 of the memory time
of a 2,000-request trace, so counts alone are too coarse, and a pair of tuners can fill any gap the
heavy-tailed pool leaves. The finished trace is then measured with the prefix tree and the density
module and must agree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from blendsim.sim.errors import UserError
from blendsim.workloads.recipes.base import Recipe, paths, rngs
from blendsim.workloads.sources import COMPUTE_SOURCES, MMLU, OPENVID, get_source


@dataclass(frozen=True, slots=True)
class BlendServeOptions:
    # NOTE: the defaults are the centre of BlendServe's sec. 6.5 grid (rho 0.80-1.40 x s 0.05-0.45).
    density: float = field(default=1.1, metadata={
        "help": "Target compute density rho (e.g. 0.8-1.4; 1 = balanced; default: the grid's centre)."})
    sharing: float = field(default=0.25, metadata={
        "help": "Target optimal prefix sharing ratio s (e.g. 0.05-0.45; default: the grid's centre)."})
    requests: int = field(default=400_000, metadata={"help": "Number of requests (BlendServe: at least 400,000 for its "
                                                               "Table 2 workloads, 40,000 for the App. A.3 grid)."})
    source: str = field(default="burstgpt", metadata={
        "help": f"Compute-intensive source mixed with OpenVid and MMLU: {', '.join(COMPUTE_SOURCES)}."})
    model: str = field(default="llama-3-8b", metadata={"help": "Model preset (or config.json) rho is measured for."})
    hardware: str = field(default="a100-80gb", metadata={"help": "Hardware preset rho is measured for."})
    tp: int = field(default=1, metadata={"help": "Tensor-parallel degree of the replica."})
    tolerance: float = field(default=0.02, metadata={"help": "Largest relative error allowed on rho and s."})
    seed: int = field(default=0, metadata={"help": "Random seed (same seed, same trace)."})

    def __post_init__(self) -> None:
        if not (np.isfinite(self.density) and self.density > 0):
            raise UserError(f"--density must be a positive number, got {self.density}")
        if not 0 < self.sharing < 1:
            raise UserError(f"--sharing must be in (0, 1), got {self.sharing}")
        if self.requests < 10:
            raise UserError(f"--requests must be at least 10, got {self.requests}")
        if self.source not in COMPUTE_SOURCES:
            raise UserError(f"--source must be one of {', '.join(COMPUTE_SOURCES)}, got {self.source!r}")
        if not 0 < self.tolerance < 1:
            raise UserError(f"--tolerance must be in (0, 1), got {self.tolerance}")


@dataclass(frozen=True, slots=True)
class _Pool:
    """Candidate requests of one source, in draw order, with prefix sums over them."""

    p: np.ndarray  # input_len: system prompt + (subject prefix) + own tokens
    d: np.ndarray  # output_len
    own: np.ndarray  # own prompt tokens (the request's unique segment)
    new: np.ndarray  # tokens this request adds to a DFS's computed prompt tokens (own + first-seen prefix)
    comp: np.ndarray  # Comp(r), s
    mem: np.ndarray  # Mem(r), s
    sys: int  # system prompt tokens (computed once if any request of the source is in)
    cum: dict  # "comp", "mem", "tok", "new": prefix sums, length n + 1

    @staticmethod
    def of(p, d, own, new, sys, rates) -> _Pool:
        from blendsim.sim.density import comp_time, mem_time

        comp, mem = comp_time(p, d, rates), mem_time(p, d, rates)
        cum = {k: np.concatenate([[0.0], np.cumsum(v, dtype=np.float64)])
               for k, v in (("comp", comp), ("mem", mem), ("tok", p), ("new", new))}
        return _Pool(p, d, own, new, comp, mem, sys, cum)


def _measure(pools, nc, nv, j1, j2, nm):
    """Exact (s, rho) of a mix: first nc compute, first nv video, video tuners j1 and j2, first nm MMLU."""
    c, v, t, m = pools
    comp = c.cum["comp"][nc] + v.cum["comp"][nv] + t.comp[j1] + t.comp[j2] + m.cum["comp"][nm]
    mem = c.cum["mem"][nc] + v.cum["mem"][nv] + t.mem[j1] + t.mem[j2] + m.cum["mem"][nm]
    tok = c.cum["tok"][nc] + v.cum["tok"][nv] + t.p[j1] + t.p[j2] + m.cum["tok"][nm]
    computed = (c.sys * (np.asarray(nc) > 0) + c.cum["new"][nc] + v.sys + v.cum["new"][nv] + t.new[j1]
                + t.new[j2] + m.sys * (np.asarray(nm) > 0) + m.cum["new"][nm])
    s = 1.0 - computed / tok
    with np.errstate(invalid="ignore"):
        return s, np.where(j1 != j2, (1.0 - s) * comp / mem, np.nan)


def _err(s, r, s_t, rho_t):
    return np.nan_to_num(np.maximum(np.abs(s / s_t - 1), np.abs(r / rho_t - 1)), nan=np.inf)


def _pairs(pools, n, rho_t, s_t, nv, nm, firsts, by_mem):
    """Best tuner pair for each (nv, nm, j1) of broadcastable arrays: j2 makes rho right for j1.

    Returns (err, j2) of the same shape. j2 is the tuner whose memory time is closest to what rho needs
    (compute of j2 taken at the pool median, then the three nearest are measured exactly).
    """
    t = pools[2]
    mem_sorted = t.mem[by_mem]
    nc = n - 2 - nv - nm
    s0, _ = _measure(pools, nc, nv, firsts, by_mem[0], nm)  # s barely depends on the second tuner
    c, v, _, m = pools
    comp0 = c.cum["comp"][nc] + v.cum["comp"][nv] + t.comp[firsts] + m.cum["comp"][nm] + np.median(t.comp)
    mem0 = c.cum["mem"][nc] + v.cum["mem"][nv] + t.mem[firsts] + m.cum["mem"][nm]
    need = (1.0 - s0) * comp0 / rho_t - mem0
    pos = np.searchsorted(mem_sorted, need)
    best_e, best_j = np.full(np.shape(need), np.inf), np.zeros(np.shape(need), dtype=np.int64)
    for k in (-1, 0, 1):
        j2 = by_mem[np.clip(pos + k, 0, len(by_mem) - 1)]
        e = _err(*_measure(pools, nc, nv, firsts, j2, nm), s_t, rho_t)
        better = e < best_e
        best_e, best_j = np.where(better, e, best_e), np.where(better, j2, best_j)
    return best_e, best_j


def _solve(pools, n: int, rho_t: float, s_t: float):
    """Counts (nc, nv, j1, j2, nm), nc + nv + 2 + nm = n, minimising the larger relative error.

    Alternates exact scans: the MMLU count for s; the largest video count that the two lightest
    tuners keep at or above the target rho; then the tuner pair that brings rho onto the target.
    """
    _, _, t, m = pools
    by_mem = np.argsort(t.mem, kind="stable")
    lo1, lo2 = int(by_mem[0]), int(by_mem[1])
    s_m = 1 - (m.sys + m.cum["new"][-1]) / m.cum["tok"][-1]  # mean-based start: MMLU share from s alone
    nm = int(np.clip(round(n * s_t / max(s_m, 1e-9)), 0, n - 2))
    nv, j1, j2 = 0, lo1, lo2
    best = (np.inf, nv, j1, j2, nm)
    for _ in range(40):
        prev = (nv, j1, j2, nm)
        cand = np.arange(0, n - 1 - nv)  # MMLU count for s
        s, r = _measure(pools, n - 2 - nv - cand, nv, j1, j2, cand)
        nm = int(cand[np.argmin(np.abs(s - s_t) + 1e-3 * np.nan_to_num(np.abs(r / rho_t - 1), nan=1.0))])
        cand = np.arange(0, n - 1 - nm)  # video count for rho
        s, r = _measure(pools, n - 2 - nm - cand, cand, lo1, lo2, nm)
        ok = np.flatnonzero(r >= rho_t)
        nv = int(cand[ok[-1]]) if len(ok) else 0
        e, jj = _pairs(pools, n, rho_t, s_t, nv, nm, np.arange(len(t.p)), by_mem)  # tuner pair for rho
        j1 = int(np.argmin(e))
        j2, e = int(jj[j1]), float(e[j1])
        if e < best[0]:
            best = (e, nv, j1, j2, nm)
        if e < 1e-3 or (nv, j1, j2, nm) == prev:
            break
    e, nv, j1, j2, nm = best
    for _ in range(10 if e > 5e-3 else 0):  # hill-climb in windows until the best stops moving
        nxt = _polish(pools, n, rho_t, s_t, nv, j1, nm, by_mem)
        if nxt[1:] == (nv, j1, j2, nm) or nxt[0] >= e:
            break
        e, nv, j1, j2, nm = nxt
    return n - 2 - nv - nm, nv, j1, j2, nm


def _polish(pools, n, rho_t, s_t, nv, j1, nm, by_mem, dv=4, dm=25, max_firsts=128):
    """Exhaustive search near (nv, nm) over first tuners spread across the memory-time range.

    NOTE: needed when the video count the scans settle on is one heavy request off; a window of
    counts with re-chosen tuner pairs finds the mix the alternating scans step over.
    """
    firsts = np.unique(np.r_[by_mem[np.linspace(0, len(by_mem) - 1, min(max_firsts, len(by_mem))).astype(int)], j1])
    vs, ms = np.meshgrid(np.arange(max(0, nv - dv), nv + dv + 1), np.arange(max(0, nm - dm), nm + dm + 1),
                         indexing="ij")
    keep = vs + ms <= n - 2
    vs, ms = vs[keep][:, None], ms[keep][:, None]
    e, jj = _pairs(pools, n, rho_t, s_t, vs, ms, firsts[None, :], by_mem)
    a, b = np.unravel_index(int(np.argmin(e)), e.shape)
    return float(e[a, b]), int(vs[a, 0]), int(firsts[b]), int(jj[a, b]), int(ms[a, 0])


def _pools(opts: BlendServeOptions, rates):
    src = get_source(opts.source)
    r_c, r_v, r_t, r_m, _ = rngs(opts.seed, 5)
    n = opts.requests
    pools = []
    for s, rng in ((src, r_c), (OPENVID, r_v), (OPENVID, r_t)):
        own, d = s.sample(n, rng)
        pools.append(_Pool.of(own + s.system_prompt_len, d, own, own, s.system_prompt_len, rates))
    subj = MMLU.subjects(r_m)
    sid, q, d = MMLU.sample(n, r_m, subj)
    first = np.zeros(n, dtype=bool)
    first[np.unique(sid, return_index=True)[1]] = True
    new = q + np.where(first, subj.prefix_len[sid], 0)
    pools.append(_Pool.of(q + subj.prefix_len[sid] + MMLU.system_prompt_len, d, q, new, MMLU.system_prompt_len, rates))
    return src, pools, subj, sid


def build(opts: BlendServeOptions):
    """The trace of ``opts`` (UserError when the target cannot be reached)."""
    from blendsim.sim.density import Rates, trace_bounds
    from blendsim.sim.deployment import make_deployment
    from blendsim.sim.prefix_tree import PrefixTree
    from blendsim.workloads.trace import from_segment_arrays

    dep = make_deployment(opts.model, opts.hardware, opts.tp)
    src, pools, subj, sid = _pools(opts, Rates.of(dep))
    n = opts.requests
    nc, nv, j1, j2, nm = _solve(pools, n, opts.density, opts.sharing)
    s, rho = (float(x) for x in _measure(pools, nc, nv, j1, j2, nm))
    if max(abs(s / opts.sharing - 1), abs(rho / opts.density - 1)) > opts.tolerance:
        raise UserError(_infeasible(opts, pools, src.name, dep, rho, s))
    c, v, t, m = pools
    tun = [j1, j2]
    p = np.concatenate([c.p[:nc], v.p[:nv], t.p[tun], m.p[:nm]])
    d = np.concatenate([c.d[:nc], v.d[:nv], t.d[tun], m.d[:nm]])
    ctx = dep.model.max_position_embeddings
    over = np.flatnonzero(p + d > ctx)
    if len(over):  # the model rho is measured for could not run them (simulate refuses such a trace)
        raise UserError(f"recipe blendserve: {len(over):,} of {n:,} requests need more context than {dep.model.name}'s "
                        f"{ctx:,} tokens (prompt + output, up to {int((p + d).max()):,}): the mix of {src.name}, "
                        f"openvid and mmlu is for long-context models; choose another --model")
    own = np.concatenate([c.own[:nc], v.own[:nv], t.own[tun], m.own[:nm]])
    label = np.repeat(np.array([src.name, "openvid", "mmlu"], dtype=object), [nc, nv + 2, nm])
    sys_id = np.repeat(np.array([0, 1, 2]), [nc, nv + 2, nm])
    sys_len = np.array([c.sys, v.sys, m.sys])[sys_id]
    subj_id = np.concatenate([np.full(nc + nv + 2, -1), 3 + sid[:nm]])
    subj_len = np.concatenate([np.zeros(nc + nv + 2, dtype=np.int64), subj.prefix_len[sid[:nm]]])
    # NOTE: rows are shuffled (seeded) so trace order, which FCFS follows, mixes the sources.
    order = rngs(opts.seed, 6)[5].permutation(n)
    unique_id = 3 + len(subj.prefix_len) + np.arange(n)
    offsets, seg_ids, seg_lens = paths([(sys_id[order], sys_len[order]), (subj_id[order], subj_len[order]),
                                        (unique_id, own[order])])
    # NOTE: a video's output length is fixed by its frame count and quality preset (BlendServe sec. 5.4),
    # so openvid requests carry it as output_len_hint; chat and benchmark outputs stay unknown.
    hint = np.where(label == "openvid", d, -1)
    trace = from_segment_arrays(p[order], d[order], offsets, seg_ids, seg_lens, source=label[order],
                                output_len_hint=hint[order])
    tree = PrefixTree(trace)
    b = trace_bounds(trace, dep, tree)
    if abs(b.sharing - s) > 1e-9 or abs(b.density / rho - 1) > 1e-9:  # the solver's arithmetic is exact
        raise RuntimeError(f"blendserve: solver ({rho}, {s}) and measurement ({b.density}, {b.sharing}) differ")
    trace.meta = {
        "recipe": "blendserve", "params": dataclasses.asdict(opts),
        "counts": {src.name: nc, "openvid": nv + 2, "mmlu": nm},
        "measured": {"density": b.density, "sharing": b.sharing, "t_comp_s": b.t_comp_s, "t_mem_s": b.t_mem_s},
        "deployment": {"model": dep.model.name, "hardware": dep.hardware.name, "tp": dep.tp},
    }
    return trace


def _infeasible(opts: BlendServeOptions, pools, src: str, dep, rho: float, s: float) -> str:
    n = opts.requests
    s_lo = float(_measure(pools, n - 2, 0, 0, 1, 0)[0])  # no MMLU: the compute source's own sharing
    s_hi = float(_measure(pools, 0, 0, 0, 1, n - 2)[0])  # all MMLU
    head = (f"blendserve: cannot reach density {opts.density} and sharing {opts.sharing} within "
            f"{100 * opts.tolerance:g}% with {n} requests of {src} + openvid + mmlu on {dep.model.name}/{dep.hardware.name}")
    t = pools[2]
    lo1, lo2 = (int(x) for x in np.argsort(t.mem, kind="stable")[:2])
    k = np.arange(0, n - 1)
    s_k, r_k = _measure(pools, n - 2 - k, 0, lo1, lo2, k)  # no video beyond the tuners
    nm = int(k[np.argmin(np.abs(s_k - opts.sharing))])  # the MMLU count that gives the sharing asked for
    rho_top = float(r_k[nm])
    rho_bottom = float(_measure(pools, 0, n - 2 - nm, lo1, lo2, nm)[1])  # all the rest video
    if opts.sharing < s_lo:
        why = f"{src} alone already shares {s_lo:.3f} (its system prompt); choose --sharing above that"
    elif opts.sharing > s_hi:
        why = f"mmlu can lift sharing to at most {s_hi:.3f}"
    elif opts.density > rho_top:
        why = f"at that sharing the density of {src} + mmlu with the fewest video requests is {rho_top:.3f}"
    elif opts.density < rho_bottom:
        why = f"at that sharing the density with every other request a video one is {rho_bottom:.3f}"
    else:
        why = (f"the closest mix gives density {rho:.4f} ({rho / opts.density - 1:+.1%}) and sharing {s:.4f} "
               f"({s / opts.sharing - 1:+.1%}), beyond the {100 * opts.tolerance:g}% tolerance (--tolerance); more "
               f"--requests refine the mix")
    return f"{head}: {why}"


RECIPE = Recipe("blendserve", "BlendServe App. A.3: compute + OpenVid + MMLU mixed to a target density and sharing.",
                BlendServeOptions, build)
