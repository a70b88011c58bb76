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
the MMLU count for s, the OpenVid count for rho, and one extra OpenVid request (the "tuner", picked
from a separate pool) for fine control of rho -- a single video request holds ~1/6 of the memory time
of a 2,000-request trace, so counts alone are too coarse. The finished trace is then measured with
the prefix tree and the density module and must agree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from sim.errors import UserError
from workloads.recipes import Recipe
from workloads.recipes.common import paths, rngs
from workloads.sources import COMPUTE_SOURCES, MMLU, OPENVID, get_source


@dataclass(frozen=True, slots=True)
class BlendServeOptions:
    density: float = field(metadata={"help": "Target compute density rho (e.g. 0.8-1.4; 1 = balanced)."})
    sharing: float = field(metadata={"help": "Target optimal prefix sharing ratio s (e.g. 0.05-0.45)."})
    requests: int = field(default=400_000, metadata={"help": "Number of requests (BlendServe uses 400,000)."})
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
        from sim.density import comp_time, mem_time

        comp, mem = comp_time(p, d, rates), mem_time(p, d, rates)
        cum = {k: np.concatenate([[0.0], np.cumsum(v, dtype=np.float64)])
               for k, v in (("comp", comp), ("mem", mem), ("tok", p), ("new", new))}
        return _Pool(p, d, own, new, comp, mem, sys, cum)


def _measure(pools, nc, nv, j, nm):
    """Exact (s, rho) of the mix: first nc compute, first nv video + video tuner j, first nm MMLU."""
    c, v, t, m = pools
    comp = c.cum["comp"][nc] + v.cum["comp"][nv] + t.comp[j] + m.cum["comp"][nm]
    mem = c.cum["mem"][nc] + v.cum["mem"][nv] + t.mem[j] + m.cum["mem"][nm]
    tok = c.cum["tok"][nc] + v.cum["tok"][nv] + t.p[j] + m.cum["tok"][nm]
    computed = (c.sys * (np.asarray(nc) > 0) + c.cum["new"][nc] + v.sys + v.cum["new"][nv] + t.new[j]
                + m.sys * (np.asarray(nm) > 0) + m.cum["new"][nm])
    s = 1.0 - computed / tok
    return s, (1.0 - s) * comp / mem


def _solve(pools, n: int, rho_t: float, s_t: float):
    """Counts (nc, nv, j, nm) with nc + nv + 1 + nm = n minimising the larger relative error."""
    _, v, t, m = pools
    err = lambda s, r: np.maximum(np.abs(s / s_t - 1), np.abs(r / rho_t - 1))  # noqa: E731
    # mean-based start: MMLU share from s alone, then video count from the rho balance
    s_m = 1 - (m.sys + m.cum["new"][-1]) / m.cum["tok"][-1]
    nm = int(np.clip(round(n * s_t / max(s_m, 1e-9)), 0, n - 1))
    # NOTE: the coarse video count is the largest one that the lightest tuner keeps at or above the
    # target; the tuner then adds the memory time still missing, which it can always do.
    j_lo = int(np.argmin(t.mem))
    nv, j = 0, j_lo
    best = (np.inf, 0, 0, 0)
    for _ in range(40):
        prev = (nv, j, nm)
        cand = np.arange(0, n - nv)  # MMLU count for s
        s, r = _measure(pools, n - 1 - nv - cand, nv, j, cand)
        nm = int(cand[np.argmin(np.abs(s - s_t) + 1e-3 * np.abs(r / rho_t - 1))])
        cand = np.arange(0, n - nm)  # video count for rho
        s, r = _measure(pools, n - 1 - nm - cand, cand, j_lo, nm)
        ok = np.flatnonzero(r >= rho_t)
        nv = int(cand[ok[-1]]) if len(ok) else 0
        s, r = _measure(pools, n - 1 - nm - nv, nv, np.arange(len(t.p)), nm)  # tuner for rho
        j = int(np.argmin(err(s, r)))
        e = float(err(s[j], r[j]))
        if e < best[0]:
            best = (e, nv, j, nm)
        if e < 1e-4 or (nv, j, nm) == prev:
            break
    e, nv, j, nm = best
    if e > 1e-3:
        nv, j, nm = _polish(pools, n, rho_t, s_t, nv, j, nm)
    return n - 1 - nv - nm, nv, j, nm


def _polish(pools, n, rho_t, s_t, nv, j, nm, dv=4, dm=40, max_tuners=4096):
    """Exhaustive search near (nv, nm) over tuners spread across the memory-time range.

    NOTE: needed when the tuner's memory time must land where the heavy-tailed pool is sparse; then
    one video request fewer (or more) with a different tuner fits better.
    """
    t = pools[2]
    by_mem = np.argsort(t.mem)
    tuners = np.unique(np.r_[by_mem[np.linspace(0, len(by_mem) - 1, min(max_tuners, len(by_mem))).astype(int)], j])
    vs = np.arange(max(0, nv - dv), nv + dv + 1)[:, None, None]
    ms = np.arange(max(0, nm - dm), nm + dm + 1)[None, :, None]
    vs, ms = np.broadcast_arrays(vs, ms)
    ok = vs + ms <= n - 1
    s, r = _measure(pools, np.where(ok, n - 1 - vs - ms, 0), vs, tuners[None, None, :], ms)
    e = np.where(ok, np.maximum(np.abs(s / s_t - 1), np.abs(r / rho_t - 1)), np.inf)
    a, b, c = np.unravel_index(int(np.argmin(e)), e.shape)
    return int(vs[a, b, 0]), int(tuners[c]), int(ms[a, b, 0])


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
    from sim.density import Rates, trace_bounds
    from sim.prefix_tree import PrefixTree
    from sim.run_cli import _deployment
    from workloads.trace import from_segment_arrays

    dep = _deployment(opts.model, opts.hardware, opts.tp)
    src, pools, subj, sid = _pools(opts, Rates.of(dep))
    n = opts.requests
    nc, nv, j, nm = _solve(pools, n, opts.density, opts.sharing)
    s, rho = (float(x) for x in _measure(pools, nc, nv, j, nm))
    if max(abs(s / opts.sharing - 1), abs(rho / opts.density - 1)) > opts.tolerance:
        raise UserError(
            f"blendserve: cannot reach density {opts.density} and sharing {opts.sharing} within "
            f"{opts.tolerance:.0%} with {n} requests of {src.name} + openvid + mmlu on {dep.model.name}/"
            f"{dep.hardware.name}: the closest mix gives density {rho:.3f}, sharing {s:.3f} "
            f"(mmlu alone shares at most about {_max_sharing(pools, n):.2f}; more requests refine the mix)")
    c, v, t, m = pools
    take = lambda pool, k: pool.p[:k] if isinstance(k, int) else pool.p[k]  # noqa: E731
    p = np.concatenate([take(c, nc), take(v, nv), t.p[[j]], take(m, nm)])
    d = np.concatenate([c.d[:nc], v.d[:nv], t.d[[j]], m.d[:nm]])
    own = np.concatenate([c.own[:nc], v.own[:nv], t.own[[j]], m.own[:nm]])
    label = np.repeat(np.array([src.name, "openvid", "mmlu"], dtype=object), [nc, nv + 1, nm])
    sys_id = np.repeat(np.array([0, 1, 2]), [nc, nv + 1, nm])
    sys_len = np.array([c.sys, v.sys, m.sys])[sys_id]
    subj_id = np.concatenate([np.full(nc + nv + 1, -1), 3 + sid[:nm]])
    subj_len = np.concatenate([np.zeros(nc + nv + 1, dtype=np.int64), subj.prefix_len[sid[:nm]]])
    # NOTE: rows are shuffled (seeded) so trace order, which FCFS follows, mixes the sources.
    order = rngs(opts.seed, 6)[5].permutation(n)
    unique_id = 3 + len(subj.prefix_len) + np.arange(n)
    offsets, seg_ids, seg_lens = paths([(sys_id[order], sys_len[order]), (subj_id[order], subj_len[order]),
                                        (unique_id, own[order])])
    trace = from_segment_arrays(p[order], d[order], offsets, seg_ids, seg_lens, source=label[order])
    tree = PrefixTree(trace)
    b = trace_bounds(trace, dep, tree)
    if abs(b.sharing - s) > 1e-9 or abs(b.density / rho - 1) > 1e-9:  # the solver's arithmetic is exact
        raise RuntimeError(f"blendserve: solver ({rho}, {s}) and measurement ({b.density}, {b.sharing}) differ")
    trace.meta = {
        "recipe": "blendserve", "params": dataclasses.asdict(opts),
        "counts": {src.name: nc, "openvid": nv + 1, "mmlu": nm},
        "measured": {"density": b.density, "sharing": b.sharing, "t_comp_s": b.t_comp_s, "t_mem_s": b.t_mem_s},
        "deployment": {"model": dep.model.name, "hardware": dep.hardware.name, "tp": dep.tp},
    }
    return trace


def _max_sharing(pools, n: int) -> float:
    s, _ = _measure(pools, 0, 0, 0, n - 1)
    return float(s)


RECIPE = Recipe("blendserve", "BlendServe App. A.3: compute + OpenVid + MMLU mixed to a target density and sharing.",
                BlendServeOptions, build)
