"""The search space of `blendsim plan`: deployments, what makes one infeasible, and its lower bounds.

A deployment is a replica shape (GPU kind, TP x PP x EP, engine, policy, weight and KV precision) times a
replica count. A shape that cannot hold the model, or has no KV room for the trace's longest request, is
infeasible for every replica count. Every feasible deployment gets a lower bound on its makespan that the
simulator can never beat, so the search may skip it safely:

* work: T_o = max((1 - s_o) T_comp, T_mem) of the whole trace (``sim.density``) at the GPU's *datasheet*
  peaks (efficiency 1: fitted efficiencies may exceed the preset's, so the preset's T_o is not a bound for
  every engine) of all tp x pp GPUs of a replica, spread over the replicas: T_o / replicas (replicas share
  prefixes at most as well as one);
* tail: the request with the longest output needs that many steps one after another (its prefill step, then
  one decode step per further token), and every step reads the replica's active GEMM weights at most at
  peak HBM bandwidth: (d_max - 1) x active weight bytes / (tp x bandwidth) (with pipeline stages, each stage
  reads its layers' weights in turn, so the sum is the same).

The cost bound is GPUs x price x the makespan bound. tests/test_plan.py checks both against simulation.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from blendsim.policy_spec import split_policy
from blendsim.sim.errors import UserError


@dataclass(frozen=True, order=True)
class Shape:
    """One replica: everything of a deployment but the replica count."""

    hardware: str
    tp: int
    pp: int
    ep: int
    engine: str
    policy: str
    weights: str  # GEMM weight precision (the model's when not chosen)
    kv_dtype: str  # KV-cache dtype

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def policy_name(self) -> str:
        """The policy without its options (``dfs`` of ``dfs[router=contiguous]``)."""
        return split_policy(self.policy)[0]


@dataclass(frozen=True, order=True)
class Candidate:
    """One deployment: ``replicas`` copies of ``shape``."""

    shape: Shape
    replicas: int

    @property
    def gpus(self) -> int:
        return self.shape.gpus_per_replica * self.replicas

    def _name(self, engine: str, policy: str) -> str:
        s = self.shape
        return (f"{s.hardware}_tp{s.tp}_pp{s.pp}_ep{s.ep}_x{self.replicas}_{engine}_{policy}_"
                f"w-{s.weights}_kv-{s.kv_dtype}")

    @property
    def key(self) -> str:
        """A unique, readable name (the answer's ``deployment``)."""
        return self._name(self.shape.engine, self.shape.policy)

    @property
    def cell(self) -> str:
        """The deployment's file name in a plan directory: :attr:`key`, with a calibrated profile file or a policy
        file named by its own file name and content digest, so a path never leaves the directory and an edited file
        is simulated again rather than read from the cell its old content priced."""
        from blendsim.sim.engines import is_profile_file

        s = self.shape
        return self._name(_file_label(s.engine) if is_profile_file(s.engine) else s.engine, _policy_label(s.policy))

    def settings(self) -> dict:
        """The deployment's fields as the JSON answer names them."""
        s = self.shape
        return {"hardware": s.hardware, "gpus": self.gpus, "tp": s.tp, "pp": s.pp, "ep": s.ep,
                "replicas": self.replicas, "engine": s.engine, "policy": s.policy, "weights": s.weights,
                "kv_dtype": s.kv_dtype}

    def run_options(self) -> dict:
        """``blendsim.simulate``'s options for this deployment (an offline job: every request at t=0); the precisions
        where an option names them (a model's own fp32 is no option's value, and is what it runs at anyway); the
        policy's own options where its spec gives some (``dfs[router=contiguous]``)."""
        from blendsim.sim.models import KV_DTYPES, WEIGHT_PRECISIONS

        s = self.shape
        opts = split_policy(s.policy)[1]
        return {"hardware": s.hardware, "tp": s.tp, "pp": s.pp, "replicas": self.replicas, "engine": s.engine,
                **({"options": opts} if opts else {}),
                **({"weights": s.weights} if s.weights in WEIGHT_PRECISIONS else {}),
                **({"kv_dtype": s.kv_dtype} if s.kv_dtype in KV_DTYPES else {}), "ep": s.ep, "offline": True}


@dataclass(frozen=True)
class Space:
    """The choices of a search (the command's options, checked)."""

    model: str
    hardware: tuple
    engines: tuple
    policies: tuple
    weights: tuple  # () = the model's own
    kv_dtypes: tuple  # () = the model's own
    max_gpus: int = 64
    max_tp: int = 8
    max_pp: int = 1
    max_ep: int = 8


def _powers_of_two(limit: int) -> list[int]:
    out, k = [], 1
    while k <= limit:
        out.append(k)
        k *= 2
    return out


def shapes(space: Space, trace) -> tuple[list, dict]:
    """Every replica shape of ``space``: ``(feasible shapes, {reason: count of infeasible deployments})``.

    TP and PP run over the powers of two up to their limits, PP at most the model's layers; a replica's GPUs
    (tp x pp) stay within ``max_gpus``."""
    from blendsim.runner import RunConfig, run_limits
    from blendsim.sim.deployment import Deployment
    from blendsim.sim.engines import get_profile, hardware_unsupported, pipeline_unmodelled
    from blendsim.sim.hardware import get_hardware
    from blendsim.sim.models import get_model

    no_pipeline = {e for e in space.engines if pipeline_unmodelled(get_profile(e, {}))}  # see sim.engines
    longest = int((trace.input_len + trace.output_len).max())
    feasible, pruned = [], {}
    for hw_name in space.hardware:
        hw = get_hardware(hw_name)
        for w in (space.weights or (None,)):  # None: the model's own precision (fp32 too, which no option names)
            for kv in (space.kv_dtypes or (None,)):
                model = get_model(space.model, None, w, kv)
                tp_pp = [(tp, pp) for tp in _powers_of_two(min(space.max_tp, space.max_gpus))
                         for pp in _powers_of_two(min(space.max_pp, space.max_gpus // tp, model.num_layers))]
                for tp, pp in tp_pp:
                    eps = [e for e in _powers_of_two(min(space.max_ep, tp)) if tp % e == 0] if model.is_moe else [1]
                    for ep in eps:
                        for engine in space.engines:
                            if hardware_unsupported(get_profile(engine, {}), hw):
                                key = "on a GPU its engine does not run on"
                                pruned[key] = pruned.get(key, 0) + len(space.policies) * (
                                    space.max_gpus // (tp * pp))
                                continue
                            if pp > 1 and engine in no_pipeline:
                                key = "on an engine without modelled pipeline stages"
                                pruned[key] = pruned.get(key, 0) + len(space.policies) * (
                                    space.max_gpus // (tp * pp))
                                continue
                            for policy in space.policies:
                                shape = Shape(hw_name, tp, pp, ep, engine, policy, model.weights, model.kv_dtype)
                                n = space.max_gpus // shape.gpus_per_replica
                                # the scheduler settings the run will have: an engine's limits depend on the GPU
                                eng, limits = run_limits(RunConfig(policy=shape.policy_name, engine=engine,
                                                                   hardware=hw_name,
                                                                   model=space.model, tp=tp, pp=pp, weights=w,
                                                                   kv_dtype=kv))
                                try:
                                    dep = Deployment(model, hw, tp, ep=ep, pp=pp, **limits)
                                except UserError:
                                    pruned["does not fit"] = pruned.get("does not fit", 0) + n
                                    continue
                                B = eng.block_size
                                if -(-longest // B) > dep.num_blocks(B):
                                    pruned["no KV room for the longest request"] = \
                                        pruned.get("no KV room for the longest request", 0) + n
                                    continue
                                feasible.append((shape, dep))
    return feasible, pruned


@dataclass(frozen=True)
class ShapeBounds:
    """Lower bounds of one shape on one trace."""

    work_s: float  # T_o of the whole trace on one replica, at datasheet peaks
    tail_s: float  # the longest request's steps, each at least one read of the active weights
    interference: float = 1.0  # how the engine's steps combine compute and memory work (work_estimate)

    def makespan(self, replicas: int) -> float:
        return max(self.work_s / replicas, self.tail_s)


def _file_label(path: str) -> str:
    """A file as a file-name-safe label: its name and the first 12 hex digits of its SHA-256 (read once per content:
    a plan names each deployment's cell before and after simulating it)."""
    p = Path(path)
    try:
        st = p.stat()
        digest = _digest(str(p.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        digest = "unreadable"
    return f"{re.sub(r'[^A-Za-z0-9._-]', '-', p.name)}-{digest}"


@functools.lru_cache(maxsize=64)
def _digest(path: str, mtime_ns: int, size: int) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


def _policy_label(spec: str) -> str:
    """A policy as a file-name-safe label: a registered name as it is; a policy file (``path/to/file.py:Class``) by
    its file's name, class and content digest, so an edited file is simulated again."""
    from urllib.parse import quote

    spec, opts = split_policy(spec)
    # a policy's options in the name, percent-encoded (1e+1 and 1e-1 are two cells): another run, another cell
    tail = "".join(f"+{quote(k, safe='')}={quote(v, safe='')}" for k, v in sorted(opts.items()))
    path = spec.rpartition(":")[0] if ".py:" in spec else spec if spec.endswith(".py") else ""
    if not path:
        return re.sub(r"[^A-Za-z0-9._@=-]", "-", spec) + tail
    cls = spec.rpartition(":")[2] if ".py:" in spec else ""
    return _file_label(path) + (f"-{re.sub(r'[^A-Za-z0-9._-]', '-', cls)}" if cls else "") + tail


def peak_rates(dep):
    """``sim.density.Rates`` of ``dep`` at the datasheet peaks (efficiency 1, no interference)."""
    from blendsim.sim.density import Rates

    m, hw = dep.model, dep.hardware
    gpus = dep.tp * dep.pp  # every GPU of the replica at its peak (stages of a full pipe all work at once)
    flops = max(hw.flops_for(m.dtype), hw.flops_for(m.weights), hw.flops_for(m.expert_precision))
    return dataclasses.replace(Rates.of(dep, 0.0), flops=flops * gpus, bandwidth=hw.mem_bandwidth * gpus)


def work_bound(trace, dep, sharing: float, read_len=None) -> float:
    """T_o of ``trace`` (optimal sharing ``sharing``) on one replica of ``dep`` at datasheet peaks: the larger of its
    compute and memory work (:func:`work_estimate` with nothing of the smaller added)."""
    return work_estimate(trace, dep, sharing, 0.0, read_len)


def work_estimate(trace, dep, sharing: float, interference: float, read_len=None) -> float:
    """The trace's compute and memory work on one replica of ``dep`` at datasheet peaks, combined as the engine's
    steps combine them: the larger plus ``interference`` times the smaller (1: added, as a sequential engine's
    steps add their operators' times; an overlapping engine's kappa). Not a bound: what a sampled makespan is
    scaled by (the whole trace's over the sample's), which must not depend on which of the two binds on a GPU.
    ``read_len``: the prompt tokens a decode reads, where a policy reads shared prefixes once (:func:`read_lengths`)."""
    from blendsim.sim.density import bounds

    rates = dataclasses.replace(peak_rates(dep), interference=interference)
    return bounds(trace.input_len, trace.output_len, sharing, rates, read_len=read_len).t_opt_overlap_s


def split_work_estimate(trace, dep, interference: float, engine_of, pp: int = 1, once: bool = False,
                        shared=None) -> float:
    """:func:`work_estimate` of ``trace`` as a run splits it: ``engine_of[i]`` is the engine request i is routed to
    (``runner.offline_routes``; engines ``r * pp .. r * pp + pp - 1`` are replica r's pipeline's). Each engine has its
    own prefix cache, so it shares prefixes only among its own requests (optimal sharing and, where ``once``, the
    read lengths of its own requests' prefix tree); a replica's engines share its GPUs, so their compute and memory
    work add; the busiest replica's work is what a makespan is scaled by. One engine: :func:`work_estimate` of the
    whole trace with its own sharing. ``shared[e]``: the prompt tokens engine e is taken to find in its prefix cache
    (:meth:`Reuse.shared`) instead of its requests' optimal sharing."""
    import numpy as np

    from blendsim.sim.density import bounds
    from blendsim.sim.prefix_tree import PrefixTree

    rates = dataclasses.replace(peak_rates(dep), interference=interference)
    engine_of = np.asarray(engine_of, dtype=np.int64)
    order = np.argsort(engine_of, kind="stable")
    cuts = np.flatnonzero(np.diff(engine_of[order])) + 1
    n_rep = int(engine_of.max()) // pp + 1
    comp, mem = np.zeros(n_rep), np.zeros(n_rep)
    for idx in np.split(order, cuts):
        part = trace.take(idx)
        e = int(engine_of[idx[0]])
        tree = PrefixTree(part) if once or shared is None else None
        p = float(part.input_len.sum())
        sharing = (tree.optimal_sharing_ratio() if shared is None
                   else min(float(shared[e]) / p, 1.0) if p > 0 else 0.0)
        b = bounds(part.input_len, part.output_len, sharing, rates, read_len=read_lengths(part, tree) if once else None)
        r = e // pp
        comp[r] += (1.0 - b.sharing) * b.t_comp_s
        mem[r] += b.t_mem_s
    return float((np.maximum(comp, mem) + interference * np.minimum(comp, mem)).max())


def prefix_pairs(tree):
    """``(node, request, tokens)``: every node of every request's path in ``tree`` (root excluded), with the prompt
    tokens a request finds cached there when another request of its engine used the node before it: the node's own
    tokens, less the last prompt token at the request's own end node (an engine always computes it, as
    ``PrefixTree.optimal_sharing_ratio`` counts). What :class:`Reuse` is built from, once per trace."""
    import numpy as np

    parent = np.asarray(tree.parent, dtype=np.int64)
    tokens = np.asarray(tree.tokens, dtype=np.int64)
    cur = np.asarray(tree.req_node, dtype=np.int64)
    req = np.arange(len(cur), dtype=np.int64)
    nodes, reqs, toks = [], [], []
    end = True
    while True:
        keep = cur != 0
        cur, req = cur[keep], req[keep]
        if not cur.size:
            break
        nodes.append(cur)
        reqs.append(req)
        toks.append(tokens[cur] - 1 if end else tokens[cur])
        end = False
        cur = parent[cur]
    if not nodes:
        return (np.zeros(0, np.int64),) * 3
    return np.concatenate(nodes), np.concatenate(reqs), np.maximum(np.concatenate(toks), 0)


class Reuse:
    """How a run reuses its trace's shared prefixes: for every (request, node of its path) pair whose engine used the
    node before, the ``distance`` (requests that engine was handed since the node's last use, in the run's hand-over
    order) and the ``tokens`` a hit there saves. A prefix cache that keeps what about the last C requests of its engine
    used (an LRU cache of a given size) finds the pairs at distance C or less: the optimal sharing is every pair's
    tokens (C infinite), an order that keeps a prefix group together (dfs) finds them all at distance 1, a random order
    at distances that grow with the trace's groups' spread. ``pairs``: :func:`prefix_pairs` of the trace's tree;
    ``order``: the hand-over order (``runner.offline_routes(..., with_order=True)``); ``engine_of``: each request's
    engine (None: one)."""

    def __init__(self, pairs, order, engine_of=None):
        import numpy as np

        node, req, tok = pairs
        order = np.asarray(order, dtype=np.int64)
        n = len(order)
        eng = np.zeros(n, np.int64) if engine_of is None else np.asarray(engine_of, dtype=np.int64)
        self.engines = int(eng.max()) + 1 if n else 1
        # each request's place in its own engine's hand-over order
        seq = eng[order]
        by = np.argsort(seq, kind="stable")
        counts = np.bincount(seq, minlength=self.engines)
        local = np.empty(n, np.int64)
        local[order[by]] = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts)
        e, pos = eng[req], local[req]
        o = np.lexsort((pos, node, e))
        e, node, pos, tok = e[o], node[o], pos[o], tok[o]
        again = np.zeros(len(o), bool)
        again[1:] = (node[1:] == node[:-1]) & (e[1:] == e[:-1])  # the node used before on this engine
        dist = np.zeros(len(o), np.int64)
        dist[1:] = pos[1:] - pos[:-1]
        keep = again & (tok > 0)
        o = np.argsort(dist[keep], kind="stable")
        self.distance = dist[keep][o]
        self.tokens = tok[keep][o].astype(np.float64)
        self.engine = e[keep][o]
        self._cum = np.cumsum(self.tokens)

    def capacity(self, shared: float) -> float:
        """The smallest cache size C (requests) at which the pairs found, :meth:`shared`, reach ``shared`` tokens (what a
        run found in its caches); infinite where it is every pair's (the run shared optimally, or more)."""
        import numpy as np

        if shared <= 0.0:  # the run found nothing cached (no prefix cache, or every prefix evicted): no cache
            return 0.0
        # every pair's tokens, up to the rounding of ratio x prompt tokens the caller passes (277,999.99999999994 for
        # 278,000: read as short, a run that found every shared prefix was priced at the sample's largest distance)
        if not len(self._cum) or shared >= self._cum[-1] * (1.0 - 1e-9):
            return float("inf")
        return float(self.distance[int(np.searchsorted(self._cum, shared, side="left"))])

    def shared(self, capacity: float):
        """Per engine, the prompt tokens found in its cache with room for ``capacity`` requests' prefixes."""
        import numpy as np

        hit = self.distance <= capacity
        return np.bincount(self.engine[hit], weights=self.tokens[hit], minlength=self.engines)


def reads_shared_prefix_once(policy: str) -> bool:
    """Whether ``policy`` may read a shared prompt prefix's KV once per decode step for its whole group
    (``Policy.reads_shared_prefix_once`` overridden: BatchLLM's prefix-shared attention, on by default): its
    deployments' memory bound then counts each request's prompt less its shared prefix, or it would exceed the
    run (a BatchLLM microbenchmark: 19.2 s bound, 17.6 s run, pruned as unable to meet a 19 s deadline)."""
    from blendsim.policies.base import Policy, option_records
    from blendsim.policies.registry import resolve_policy

    name, opts = split_policy(policy)
    cls = resolve_policy(name).cls
    if cls.reads_shared_prefix_once is Policy.reads_shared_prefix_once:
        return False
    # where it depends on the policy's options (BatchLLM's shared_attention), ask a policy holding them
    probe = cls.__new__(cls)
    probe.opt = {k: o.coerce(k, opts.get(k, o.default)) for k, o in option_records(cls).items()}
    try:
        return bool(probe.reads_shared_prefix_once())
    except Exception:  # it reads more of the policy than its options: take it as reading prefixes once, as before
        return True


def read_lengths(trace, tree):
    """Per request, the prompt tokens a decode step must read when shared prefixes are read once per group: the
    prompt less its shared prefix (``PrefixTree.shared_prompt_tokens``)."""
    return tree.own_prompt_tokens()


def shape_bounds(trace, dep, sharing: float, engine: str | None = None, read_len=None) -> ShapeBounds:
    """The bounds of ``dep`` run by ``engine`` (an engine profile name: its per-step overhead, which the cost
    model adds to every step's kernel time, joins the tail bound); ``read_len`` as :func:`work_estimate`'s."""
    from blendsim.sim.build_cost import build_cost_model
    from blendsim.sim.engines import get_profile
    from blendsim.sim.models import WEIGHT_BYTES

    m = dep.model
    experts = m.moe_layers * m.experts_per_token * m.expert_params  # one token's routed experts, their precision
    weights = ((m.gemm_params_active - experts) * WEIGHT_BYTES[m.weights] + experts * m.expert_elem_bytes) / (
        dep.tp * dep.hardware.mem_bandwidth)
    step, interference = weights, 1.0
    if engine is not None:
        mode = get_profile(engine).mode
        cm = build_cost_model(dep, mode, engine)
        # NOTE: sequential mode adds the operator classes' times, overlap mode takes at least the larger of
        # the compute and memory groups, so at least half of their sum; the engine overhead is added to both
        step = (weights if mode == "sequential" else weights / 2) + float(cm.engine.overhead(1, 1))
        interference = 1.0 if mode == "sequential" else float(cm.kappa)
    d_max = int(trace.output_len.max())
    return ShapeBounds(work_bound(trace, dep, sharing, read_len), max(d_max - 1, 0) * step, interference)


__all__ = ["Candidate", "Reuse", "Shape", "ShapeBounds", "Space", "peak_rates", "prefix_pairs", "read_lengths",
           "reads_shared_prefix_once", "shape_bounds", "shapes", "split_work_estimate", "work_bound", "work_estimate"]
