"""The search of `blendsim plan`: enumerate, bound, prune, simulate (a sample, extrapolated), verify.

1. Enumerate replica shapes (``space.shapes``) and replica counts up to the GPU limit; a shape that cannot
   hold the model or the longest request is dropped for every count.
2. Bound every deployment from below (makespan and cost, ``space``) and simulate in rounds, cheapest bound
   first. Before each round a deployment is skipped when its bounds already lose: it cannot meet the
   deadline, it cannot fit the budget, or a simulated deployment that meets both is at least as fast and
   as cheap as its bounds (it can only be dominated). The front over the deployments that meet the deadline
   (and budget) is therefore the one an exhaustive run finds (tests/test_plan.py compares them).
   If none meets the deadline, the search goes on without the deadline (the same dominance rule over every
   deployment) and recommends the fastest, saying so.
3. A trace larger than ``sample`` requests is simulated as a seeded random sample (plus the request with
   the longest output, which sets the tail); a deployment's makespan is the sample's times the ratio of the
   whole trace's work to the sample's at that shape (``space.work_estimate``: compute and memory work at the GPU's
   peaks, added for a sequential engine, the larger plus kappa times the smaller for an overlapping one; the
   larger alone, T_o, made the ratio flip with whichever binds on a GPU where the sample shares less than the
   whole trace, up to -29% / +27% apart on A100 and H100). With more than one replica (or a pipeline's virtual
   engines) the trace and the sample are each split as their runs route them (``runner.offline_routes``), every
   engine sharing prefixes only among its own requests, and the busiest replica's work is compared
   (``space.split_work_estimate``): the one-cache ratio missed that a prefix group spread over R replicas is
   prefilled up to R times, in the whole trace and its thinned sample alike but not equally (dfs on a BatchLLM
   microbenchmark: -46% to +51% on 2-4 replicas, now -6% to +9%, as one replica is) -- unless the sample's
   makespan is mostly its longest request's own chain (T_critical >= CRITICAL_SHARE of it), which does not grow
   with the trace: such a deployment is simulated on the whole trace instead (``tail_dominated``). Prompt work is
   priced at the sharing the deployment's order realizes, not the optimal (``space.Reuse``): the sample's run says
   how much of its prompt it found cached, which fixes the size of an LRU prefix cache (in requests an engine was
   handed since a prefix's last use) that finds that much in the sample's hand-over order; the whole trace is priced
   at what that cache finds in its own run's order. Priced at the optimal sharing, a random order (which finds less
   of the whole trace's sharing than of its sample's, whose thinned groups are nearer together) was -16% to -47% on
   1-4 A100s or H100s, BatchLLM microbenchmarks of 8,000 requests in groups of 4 or 16 sampled to 2,000; now -1% to
   +2%; dfs, which finds every shared prefix at distance 1, is unchanged, blendserve within a point (-3% to +12%).
   The recommended deployment and the next ``verify - 1`` front points are then simulated on the whole trace: their
   figures replace the estimates and the sampled-vs-full error is reported.

Rounds are of fixed composition (``max(8, workers)`` deployments, in bound order), so the same inputs and
``--jobs`` simulate the same deployments and give the same answer; the answer holds no timings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from blendsim.sim.errors import UserError
from blendsim.sim.metrics import CRITICAL_SHARE

from .space import (
    Candidate,
    Reuse,
    prefix_pairs,
    read_lengths,
    reads_shared_prefix_once,
    shape_bounds,
    shapes,
    split_work_estimate,
    work_estimate,
)

ROUND = 8
DEADLINE = "cannot meet the deadline (lower bound)"
BUDGET = "over the budget (lower bound)"
DOMINATED = "dominated (lower bounds)"


@dataclass
class Point:
    """A simulated deployment."""

    cand: Candidate
    makespan_s: float
    cost_usd: float
    tokens: int  # input + output tokens of the whole trace
    sampled_makespan_s: float | None = None  # the sample's own makespan (sampled runs)
    estimate_s: float | None = None  # the extrapolated makespan, kept after a full run replaced it
    full: bool = True  # the figures come from a simulation of the whole trace


@dataclass
class Search:
    """Everything the answer is built from."""

    points: dict = field(default_factory=dict)  # key -> Point
    pruned: dict = field(default_factory=dict)  # reason -> count
    failures: list = field(default_factory=list)  # {"deployment": key, "error": line}
    candidates: int = 0
    meets_any: bool = False
    checks: list = field(default_factory=list)  # sampled-vs-full comparisons
    sample_requests: int | None = None
    tail_dominated: int = 0  # deployments simulated whole because their sample's makespan was its longest request's
    margin: dict = field(default_factory=dict)  # deployment key -> share of its makespan held back (plan --margin)
    near_misses: int = 0  # of the checks, deployments re-run because their estimate missed by less than its error

    def grown(self, cand: Candidate, makespan_s: float) -> float:
        """``makespan_s`` grown by ``cand``'s margin: what must fit before the deadline."""
        return makespan_s * (1 + self.margin.get(cand.key, 0.0))

    def meets(self, p: Point, deadline_s: float, budget: float | None = None) -> bool:
        """Whether ``p``, its makespan grown by its margin, meets the deadline (and the budget)."""
        return self.grown(p.cand, p.makespan_s) <= deadline_s and (budget is None or p.cost_usd <= budget)


def pareto(points: list) -> list:
    """The points no other point beats on both makespan and cost (ties: the first by key), fastest first."""
    out, best = [], math.inf
    for p in sorted(points, key=lambda p: (p.makespan_s, p.cost_usd, p.cand.key)):
        if p.cost_usd < best:
            out.append(p)
            best = p.cost_usd
    return out


def run_search(trace, space, deadline_s: float, prices, *, budget: float | None = None, billing_hour: bool = False,
               sample: int = 20_000, verify: int = 2, seed: int = 0, backend=None, store=None, prune: bool = True,
               progress=None, trace_path=None, margin=None) -> Search:
    """Search ``space`` for ``trace`` (offline: every request at t=0). ``backend``: a sweep backend
    (``blendsim.sweep.backends``); ``store``: a :class:`PlanStore` (resumable) or None; ``prune=False``
    simulates every feasible deployment (the exhaustive reference the tests compare with); ``margin(candidate)``:
    the share of its makespan a deployment must have to spare before the deadline (None: none)."""
    from blendsim.sim.prefix_tree import PrefixTree
    from blendsim.sweep.backends import InlineBackend

    from .tasks import simulate_task

    backend = backend or InlineBackend()
    trace = trace.offline()
    for hw in space.hardware:
        prices.price_of(hw)
    feasible, infeasible = shapes(space, trace)
    out = Search(pruned=dict(infeasible))
    tree = PrefixTree(trace)
    s_full = tree.optimal_sharing_ratio()
    sampled = trace.n > sample
    sub = _sample(trace, sample, seed) if sampled else trace
    if sampled:
        out.sample_requests = sub.n
        tree_sub = PrefixTree(sub)
        s_sub = tree_sub.optimal_sharing_ratio()
    # the prompt tokens a decode reads under a policy that reads shared prefixes once (None: the prompt)
    once = {p for p in {sh.policy for sh, _dep in feasible} if reads_shared_prefix_once(p)}
    read_full = read_lengths(trace, tree) if once else None
    read_sub = (read_lengths(sub, tree_sub) if sampled else read_full) if once else None
    # every request's path through the prefix tree, for the sharing a run's order realizes (``Reuse``)
    pairs = (prefix_pairs(tree), prefix_pairs(tree_sub)) if sampled and s_full > 0 else None
    del tree
    tokens = int(trace.input_len.sum() + trace.output_len.sum())
    files = (store.trace_files(trace, sub if sampled else None, trace_path) if store
             else _TempFiles(trace, sub if sampled else None, trace_path))
    full_arg = backend.trace_arg(files.full)
    sub_arg = backend.trace_arg(files.sample) if sampled else full_arg

    bounds, cands, split_args = {}, [], {}
    for shape, dep in feasible:
        sb = shape_bounds(trace, dep, s_full, shape.engine, read_full if shape.policy in once else None)
        split_args[shape] = (dep, sb.interference, shape.policy in once)
        most = space.max_gpus // shape.gpus_per_replica
        if most > trace.n:  # a replica beyond one per request idles: never faster, always dearer
            out.pruned[IDLE] = out.pruned.get(IDLE, 0) + most - trace.n
        for r in range(1, min(most, trace.n) + 1):
            c = Candidate(shape, r)
            lb_m = sb.makespan(r)
            bounds[c] = (lb_m, prices.cost(shape.hardware, c.gpus, lb_m, billing_hour))
            cands.append(c)
            if margin is not None:
                out.margin[c.key] = float(margin(c))
    out.candidates = len(cands) + sum(infeasible.values()) + out.pruned.get(IDLE, 0)
    done = [0]
    report = _progress_call(progress, len(cands))

    split_scale = {}

    def scale_of(c, res):
        """The whole trace's work over the sample's for ``c``, whose sample run gave ``res``. The prompt work is priced
        at the sharing the run's order realizes, not the optimal: the sample's run found ``prefix_sharing_ratio`` of
        its prompt tokens cached; ``space.Reuse`` finds the cache size (in requests an engine was handed since a
        prefix's last use) at which the sample, in its run's order, finds that much, and the whole trace, in its own
        run's order, is priced at what the same cache finds there. An order that keeps the optimal sharing (dfs) finds
        every shared prefix at distance 1 in both: the optimal sharing, as before; a random order loses more of the
        whole trace's sharing than of its sample's, whose thinned groups are nearer together. With more than one
        engine (replicas, or a pipeline's virtual engines) each engine shares prefixes only among the requests routed
        to it: both are split as the runs split them (``runner.offline_routes``) and the busiest replica's work is
        compared (``space.split_work_estimate``); the one-replica ratio counted the trace's sharing as one cache's,
        which a split run loses (a prefix group over R replicas is prefilled up to R times) differently from its
        sample. A trace without shared prefixes has nothing to realize or split: the one-replica ratio."""
        if s_full == 0.0:  # the whole trace's work over the sample's, combined as this engine's steps combine them
            if c.shape not in split_scale:
                dep, interference, once_ = split_args[c.shape]
                rf, rs = (read_full, read_sub) if once_ else (None, None)
                split_scale[c.shape] = (work_estimate(trace, dep, s_full, interference, rf)
                                        / work_estimate(sub, dep, s_sub, interference, rs))
            return split_scale[c.shape]
        if c not in split_scale:
            from blendsim.runner import RunConfig, offline_routes

            cfg = RunConfig(policy=c.shape.policy_name, model=space.model, seed=seed, **c.run_options())
            dep, interference, once_ = split_args[c.shape]
            routes = [offline_routes(t, cfg, with_order=True) for t in (trace, sub)]
            reuse = [Reuse(p, order, eng) for p, (eng, _pp, order) in zip(pairs, routes)]
            cap = reuse[1].capacity(float(res["prefix_sharing_ratio"]) * float(sub.input_len.sum()))
            shared = [r.shared(cap) for r in reuse]
            if c.replicas * c.shape.pp == 1:
                rf, rs = (read_full, read_sub) if c.shape.policy in once else (None, None)
                w = [work_estimate(t, dep, float(h.sum()) / float(t.input_len.sum()), interference, rl)
                     for t, h, rl in ((trace, shared[0], rf), (sub, shared[1], rs))]
            else:
                w = [split_work_estimate(t, dep, interference, eng, pp, once=once_, shared=h)
                     for t, (eng, pp, _order), h in zip((trace, sub), routes, shared)]
            split_scale[c] = w[0] / w[1]
        return split_scale[c]

    def cost(c, m):
        return prices.cost(c.shape.hardware, c.gpus, m, billing_hour)

    def evaluate(batch, whole: bool):
        arg = full_arg if whole or not sampled else sub_arg
        kind = "full" if whole or not sampled else "sample"
        results, handles = {}, {}
        for c in batch:
            cached = store.get(c.cell, kind) if store else None
            if cached is not None and kind == "sample" and "prefix_sharing_ratio" not in cached:
                cached = None  # a sample run kept before the planner read its realized sharing: run again
            if cached is not None:
                results[c] = cached
            else:
                handles[backend.submit(simulate_task, space.model, c.shape.policy_name, c.run_options(), seed,
                                       arg)] = c
        while handles:
            for h, res in backend.wait():
                c = handles.pop(h)
                if res["ok"] and store:
                    store.put(c.cell, kind, res["value"])
                results[c] = res["value"] if res["ok"] else {"error": res["error"]}
                done[0] += 1
                if report:
                    report(done[0], c.key)
        whole_now = []
        for c in batch:
            res = results[c]
            if "error" in res:
                out.failures.append({"deployment": c.key, "error": res["error"]})
                continue
            m = float(res["makespan_s"])
            crit = float(res.get("t_critical_s") or 0.0)
            if not whole and sampled and crit >= CRITICAL_SHARE * m:
                # the sample's makespan is mostly its longest request's own chain, which does not grow with the
                # trace: scaled up, it would be far off (either way); the whole trace says what it is
                whole_now.append(c)
                continue
            if whole or not sampled:
                p = out.points.get(c.key)
                if p is not None and not p.full:  # a check of an estimate
                    out.checks.append({"deployment": c.key, "sampled_estimate_s": p.makespan_s, "full_s": m,
                                       "error": p.makespan_s / m - 1.0})
                    p.estimate_s = p.makespan_s
                out.points[c.key] = Point(c, m, cost(c, m), tokens, p.sampled_makespan_s if p else None,
                                          p.estimate_s if p else None, True)
            else:
                try:
                    k = scale_of(c, res)
                except UserError as e:  # the whole trace cannot be prepared as this deployment runs it
                    out.failures.append({"deployment": c.key, "error": str(e)})
                    continue
                est = max(m * k, bounds[c][0])
                out.points[c.key] = Point(c, est, cost(c, est), tokens, m, None, False)
        if whole_now:
            out.tail_dominated += len(whole_now)
            evaluate(whole_now, whole=True)

    def ok(p):
        return out.meets(p, deadline_s, budget)

    def search(order, reason_of, rivals):
        """Simulate ``order`` in rounds, skipping before each round what ``reason_of(c, front)`` names a reason for;
        ``front``: the Pareto front of ``rivals()``, the simulated points a deployment's bounds must beat. Nothing is
        simulated between a round's checks, so the front is made once a round (not once per deployment: with every
        check building it again, a re-run of 1,440 deployments spent 80 s here)."""
        todo = list(order)
        width = max(ROUND, getattr(backend, "capacity", 1))
        while todo:
            keep = []
            ref = pareto(rivals()) if prune else None
            for c in todo:
                why = reason_of(c, ref) if prune else None
                if why:
                    out.pruned[why] = out.pruned.get(why, 0) + 1
                else:
                    keep.append(c)
            if not keep:
                return
            evaluate(keep[:width], whole=False)
            todo = keep[width:]

    def dominated(c, ref):
        lm, lc = bounds[c]
        return any(p.makespan_s <= lm and p.cost_usd <= lc and (p.makespan_s < lm or p.cost_usd < lc) for p in ref)

    def lost(c):
        """What a deployment's own bounds rule out (the deadline, the budget): the same in every round."""
        lm, lc = bounds[c]
        if out.grown(c, lm) > deadline_s:
            return DEADLINE
        if budget is not None and lc > budget:
            return BUDGET
        return None

    own = {}  # candidate -> lost(c), worked out once: its bounds do not change between rounds

    def phase1(c, ref):
        if c not in own:
            own[c] = lost(c)
        return own[c] or (DOMINATED if dominated(c, ref) else None)

    by_cost = sorted(cands, key=lambda c: (bounds[c][1], bounds[c][0], c.key))
    counted = dict(out.pruned)
    search(by_cost, phase1, lambda: [p for p in out.points.values() if ok(p)])
    out.meets_any = any(ok(p) for p in out.points.values())
    if not out.meets_any:  # nothing meets the deadline: the whole front, and the fastest on it
        out.pruned = counted
        failed = {f["deployment"] for f in out.failures}  # run once already: not again
        rest = [c for c in by_cost if c.key not in out.points and c.key not in failed]
        search(rest, lambda c, ref: DOMINATED if dominated(c, ref) else None, lambda: list(out.points.values()))
    if sampled:
        _verify(out, evaluate, deadline_s, budget, verify)
    return out


IDLE = "more replicas than requests"


def front(out: Search, deadline_s: float, budget: float | None) -> list:
    pts = [p for p in out.points.values() if not out.meets_any or out.meets(p, deadline_s, budget)]
    return pareto(pts)


def recommend(out: Search, deadline_s: float, budget: float | None):
    """The cheapest deployment that meets the deadline (and budget); where only the budget fails, the cheapest that
    meets the deadline (the least over the budget); else the fastest."""
    f = front(out, deadline_s, budget)
    if not f:
        return None
    if out.meets_any:
        return _cheapest(f)
    in_time = [p for p in f if out.meets(p, deadline_s)] if budget is not None else []
    return _cheapest(in_time) if in_time else f[0]


def _cheapest(points: list) -> Point:
    return min(points, key=lambda p: (p.cost_usd, p.makespan_s, p.cand.key))


# a sampled estimate within this share of the deadline and the recommended's cost may be the true answer (at least;
# more where the full runs checked so far were further off)
NEAR_MISS = 0.10
NEAR_MISS_CAP = 0.5  # an estimate off by more (a check at +100%) would make every deployment a near miss


def _verify(out: Search, evaluate, deadline_s: float, budget: float | None, verify: int) -> None:
    """Simulate the recommended deployment and its front neighbours (by cost) on the whole trace; again
    while the recommendation moves to a deployment known only by its estimate, until it rests on a full run
    (each round runs the recommended whole, so this ends; the bound only guards against full runs that fail).
    Then the near misses, the cheapest of each GPU and engine in turn and up to ``verify`` of them: deployments whose estimate misses the deadline
    (or budget), or the recommended's cost, by less than the sampling error (the larger of :data:`NEAR_MISS` and the
    checks' largest |error|), which an over-estimate would otherwise keep from the answer for good."""
    missed = 0
    for _ in range(len(out.points) + 2 * verify + 3):
        out.meets_any = any(out.meets(p, deadline_s, budget) for p in out.points.values())
        rec = recommend(out, deadline_s, budget)
        if rec is None:
            return
        near = sorted(front(out, deadline_s, budget), key=lambda p: (abs(p.cost_usd - rec.cost_usd), p.cand.key))
        todo = [p.cand for p in near if not p.full][:max(0, verify - len(out.checks))]
        if not rec.full and rec.cand not in todo:
            todo.insert(0, rec.cand)
        if not todo and missed < verify:
            band = min(NEAR_MISS_CAP, max([NEAR_MISS] + [abs(c["error"]) for c in out.checks]))
            todo = [p.cand for p in _near_misses(out, rec, deadline_s, budget, band)][:verify - missed]
            missed += len(todo)
            out.near_misses += len(todo)
        if not todo:
            return
        evaluate(todo, whole=True)


def _near_misses(out: Search, rec: Point, deadline_s: float, budget: float | None, band: float) -> list:
    """Sampled deployments that would cost less than ``rec`` and meet the deadline (and budget) were their estimates
    ``band`` too slow: the cheapest of each GPU and engine, then the next of each."""
    # where only the budget fails, the recommended is the least over it: a cheaper one still over budget may beat it
    budget_bound = budget is not None and out.meets_any
    near = sorted((p for p in out.points.values()
                   if not p.full and p is not rec and p.cost_usd * (1.0 - band) < rec.cost_usd
                   and out.grown(p.cand, p.makespan_s) * (1.0 - band) <= deadline_s
                   and (not budget_bound or p.cost_usd * (1.0 - band) <= budget)),
                  key=lambda p: (p.cost_usd, p.makespan_s, p.cand.key))
    # the cheapest of each GPU and engine first, then the next of each: a sample's error has a sign per GPU and
    # engine (review of 1 Dec 2026, second: every A100 estimate too fast, every H100 one too slow, and the near
    # misses re-run were all A100s, so the cheaper H100 deployments were never checked)
    rank: dict = {}
    order = []
    for p in near:
        g = (p.cand.shape.hardware, p.cand.shape.engine)
        rank[g] = rank.get(g, -1) + 1
        order.append((rank[g], p))
    return [p for _, p in sorted(order, key=lambda rp: (rp[0], rp[1].cost_usd, rp[1].makespan_s, rp[1].cand.key))]


def _progress_call(progress, at_most: int):
    """``progress(done, key)``, with the search's size as a third argument where the callable takes one."""
    if progress is None:
        return None
    import inspect

    try:
        params = inspect.signature(progress).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: the two-argument form
        return progress
    # a third required positional parameter (not one with a default: cb(done, key, out=sys.stderr) keeps two)
    takes3 = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
                 for p in params) >= 3
    return (lambda done, key: progress(done, key, at_most)) if takes3 else progress


def _sample(trace, m: int, seed: int):
    """A seeded random sample of ``m`` requests that keeps the request with the longest output."""
    rng = np.random.default_rng(seed)
    longest = int(np.argmax(trace.output_len))
    rest = np.delete(np.arange(trace.n), longest)
    idx = np.sort(np.append(rng.choice(rest, size=m - 1, replace=False), longest))
    return trace.take(idx)


class _TempFiles:
    """The trace (and sample) as files for the workers, in a temporary folder removed at exit."""

    def __init__(self, trace, sample, path=None):
        import atexit
        import shutil
        import tempfile

        from blendsim.workloads.trace import write_trace

        self._dir = Path(tempfile.mkdtemp(prefix="blendsim-plan-"))
        atexit.register(shutil.rmtree, self._dir, True)
        from .store import worker_readable

        self.full = worker_readable(path) or write_trace(trace, self._dir / "trace.parquet")
        self.sample = write_trace(sample, self._dir / "sample.parquet") if sample is not None else None


__all__ = ["Point", "Search", "front", "pareto", "recommend", "run_search"]
