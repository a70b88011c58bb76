"""``blendserve``: BlendServe (ASPLOS'26) — resource-aware batching for offline inference.

Offline (``prepare``, see ``plan.py``): sample ~1% of the requests for their output length and estimate
the rest from the prefix tree (``estimate.py``, sec. 5.1); give every tree node its compute density
rho = (1 - s) Comp / Mem (``restree.py``, sec. 5.1); sort every node's children by density and split
outliers under the root until the leaf densities are monotone or no split is affordable (``split.py``,
Alg. 1-2, sec. 5.2 and 5.4; ``split=subtree``, the default, moves the highest subtree whose requests are
all outliers, paying its shared prefix once, as Alg. 2 re-inserts whole nodes; ``split=leaf`` moves the
outlier requests one by one); merge the sorted tree into scan units (``merge.py``, App.
A.2); cut it into one balanced share per data-parallel replica (``partition.dp_partition``, sec. 5.5).
Online: each replica runs the dual scanner (``scanner.py``, sec. 5.3, Alg. 3), blending requests from
the compute-intensive left end and the memory-intensive right end at the root's density.

Choices the paper leaves open (each is also noted where it is made):
* Densities for Alg. 3 are occupancy densities, the paper's own Mem (p d + d^2/2), finite for one-token
  outputs; the tree is sorted and split with sim.density's rho (d - 1 decode reads), as the project
  defines it. Degenerate partitions are clipped (``partition.py``).
* t and the 99% target: a unit (subtree or, with split=leaf, request) may be split when it costs <= t
  tokens of recomputation and the total stays within (1 - keep_sharing) of the trace's shared tokens;
  t defaults to that whole budget.
* Sampling is stratified per sibling group, seeded; hinted requests are exact and never sampled;
  sampled requests run first as a warm-up (``warmup=barrier``: the scan waits for them, per replica,
  since replicas do not talk) and are then out of the scan; ``warmup=none`` keeps them in the scan with
  their (then known) lengths, as if the warm-up were free.
* Footprint of a running request for the memory shares: p + d_est/2 (Alg. 3's average); a request
  that outlives its estimate on the left is re-booked on the right as p + 2 d_est / 2.
* Engine: NanoFlow-like (BlendServe's batch scheduler follows NanoFlow, App. A.2): steps trimmed to
  multiples of 128 tokens and a dense token budget of 1,024 (NanoFlow's dense batch for 8B models,
  also the largest batch of BlendServe's Table 1); token-granular prefix cache (block_size 1), as the
  SGLang radix tree BlendServe's runtime cache is built on. Pass --token-budget 2048 for 70B (TP8).
  Pricing is the engine's (``--engine``, default ``ideal``), the same for every policy compared.
"""

from __future__ import annotations

from blendsim.policies.base import AssignedRouter, Policy, register, register_router
from blendsim.policies.blendserve.plan import Plan, build_plan
from blendsim.policies.blendserve.scanner import DualScanScheduler, own_prompt_list
from blendsim.policies.blendserve.split import SPLIT_MODES
from blendsim.policies.option import EXT, OURS, Option

WARMUP_MODES = ("barrier", "none")


@register_router("blendserve-dp")
class PartitionRouter(AssignedRouter):
    """Offline: every request goes to the replica whose subtree share holds it (sec. 5.5)."""

    def __init__(self, ctx, replicas, assign=None):
        super().__init__(ctx, replicas, () if assign is None else assign)
        self.planned = assign is not None
        self._rr = 0

    def route(self, req: int, now: float) -> int:
        if not self.planned:  # used without a plan: round-robin
            self._rr = (self._rr + 1) % len(self.replicas)
            return self._rr
        return self.assign[req]


@register("blendserve")
class BlendServe(Policy):
    description = "BlendServe: density-sorted prefix tree, dual scanner blending compute/memory-bound requests"
    paper = "BlendServe (ASPLOS'26)"
    needs_prefix_caching = True
    reads_cost_model = True
    engine_defaults = {"token_budget": 1024, "round_tokens": 128, "block_size": 1}
    router = "blendserve-dp"
    options = {
        "sample": Option(0.01, "fraction of requests sampled for their output length (sec. 5.1)", source='paper sec. 5.1', lo=0.0, hi=1.0),
        "warmup": Option("barrier", "barrier: sampled requests run first and the scan waits for them; none: they "
                              "stay in the scan with their known lengths", source='paper sec. 5.1 (barrier); none is ours', choices=WARMUP_MODES),
        "default_output": Option(256.0, "output-length estimate when nothing is sampled or hinted", source=OURS, lo=1.0),
        "keep_sharing": Option(0.99, "splits may cost at most (1 - this) of the trace's shared prompt tokens", source='paper sec. 5.2 (keep 99% of sharing)', lo=0.0, hi=1.0),
        "split": Option("subtree", "unit a split moves under the root: subtree (the highest node whose requests are all "
                             "outliers, its shared prefix paid once; Alg. 2) or leaf (outlier requests one by one)", source='paper Alg. 2 (subtree); leaf is ours', choices=SPLIT_MODES),
        "split_threshold": Option(-1.0, "t: most recomputed tokens one split may cost; -1 = the whole budget", source=OURS, lo=-1.0),
        "split_divide": Option(False, "Alg. 2 literally: divide t by the fan-out at every level", source='paper Alg. 2, literal reading (off: ours)'),
        "max_rounds": Option(64, "cap on sort -> split -> resort rounds (C1/C2 normally stop it first)", source=OURS, lo=0),
        "merge_cap": Option(1.0, "merged scan units hold about this many KV caches of requests (p + d/2 each)", source=OURS, lo=1e-9),
        "fill": Option("both", "after Alg. 3's per-side prompt rates, the rest of a step goes to sides with room in "
                         "their share: both, left (the right side keeps Alg. 3's pace) or none", source=OURS, choices=("both", "left", "none")),
        "relocate": Option(2.0, "online adjustment: a left request that has generated more than this many times "
                          "its estimate (severely underestimated) moves to M_R; 0 = never", source="paper sec. 5.4 ('severely'); factor ours", lo=0.0),
        "footprint": Option("mean", "how a running request is booked against its share: mean (p + d_est/2, Alg. 3) or "
                              "peak (p + d_est)", source='paper Alg. 3 (mean)', choices=("peak", "mean")),
        "guard": Option("fluid", "KV guard inside the shares: fluid (peak of the expected KV over the newcomer's life, "
                           "finishes included), horizon (the engine's reserve rule over its life) or none", source=OURS, choices=("fluid", "horizon", "none")),
        "balance": Option(0.0, "extension: while memory-intensive requests wait, cap a step's prompt tokens so its "
                         "compute time stays within this many times its memory time; 0 = off", source=EXT, lo=0.0),
        "mem_cap": Option("balanced", "M of Alg. 3's partition: balanced (the KV cache, capped at what a full token-budget "
                                "step can read within its compute time; an extension) or kv (the whole cache)", source=EXT + '; kv = paper Alg. 3', choices=("balanced", "kv")),
        "degenerate": Option("clip", "when rho(rt) is not between the two units' densities: clip (all of M to the "
                               "side nearer the target) or even (M split in half, both scanners keep moving)", source=OURS, choices=("even", "clip")),
        "tiers": Option("gpu", "split cost of a prefix when a host/disk KV tier is configured (--host-kv-gb): gpu = "
                               "its recomputation (the paper); load = its load as the tiers charge it (host link; "
                               "disk blocks also read from the drive, the later of the two), so the "
                               "keep_sharing budget and t, in recompute-time terms, pay for prefill/load times more "
                               "tokens", source=OURS, choices=("gpu", "load")),
    }

    def __init__(self, ctx):
        super().__init__(ctx)
        self.plan: Plan | None = None
        self.schedulers: list = []

    def prepare(self) -> None:
        self.plan = build_plan(self.ctx, self.opt)

    def rank(self):
        return self.plan.rank

    def make_router(self, replicas: list) -> AssignedRouter:
        return PartitionRouter(self.ctx, replicas, self.plan.replica)

    def make_scheduler(self, replica: int, **kw):
        s = DualScanScheduler(plan=self.plan, rho_rt=self.plan.rho_rt[replica], fill=self.opt["fill"],
                              relocate=self.opt["relocate"], footprint=self.opt["footprint"],
                              degenerate=self.opt["degenerate"], guard=self.opt["guard"],
                              balance=float(self.opt["balance"]), mem_cap=self.opt["mem_cap"],
                              cost_model=self.ctx.cost_model, own_prompts=self._own_prompts(),
                              replica=replica, **kw)
        self.schedulers.append(s)
        return s

    def _own_prompts(self) -> list:
        """The dual scan's booking of each prompt (``scanner.own_prompt_list``), worked out once for every replica."""
        own = getattr(self, "_own", None)
        if own is None:
            own = self._own = own_prompt_list(self.ctx.tree)
        return own

    def summary_extra(self) -> dict:
        rep = dict(self.plan.report)
        rep["relocations"] = sum(s.relocations for s in self.schedulers)
        rep["repartitions"] = sum(s.partitions for s in self.schedulers)
        rep["partition_memory_tokens"] = min((int(s.M) for s in self.schedulers), default=0)
        return {"blendserve": rep}


__all__ = ["BlendServe", "PartitionRouter"]
