"""BatchLLM's microbenchmarks (sec. 6.1): groups of K requests sharing a P-token prefix.

Each group has one prefix of ``prefix_len`` tokens shared by ``share_degree`` requests, each with a
distinct part of its own of ``distinct_len`` tokens. The paper's settings are prefix/distinct
2000/200, 1000/1000 and 200/2000 with share degree 4 or 16. With full groups the optimal sharing
ratio is (K - 1) P / (K (P + D)).

NOTE: the paper does not state the microbenchmarks' output length; it argues (sec. 4.3.2) that
outputs of one task are concentrated and treats them as one constant. The recipe follows that: every
request generates ``output_len`` tokens (default 100, a choice; snippet-style tasks answer briefly).
When ``requests`` is not a multiple of K the last group is smaller. All requests arrive at t = 0
(offline), in group order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from blendsim.sim.errors import UserError
from blendsim.workloads.recipes.base import Recipe, paths, require_positive


@dataclass(frozen=True, slots=True)
class BatchLLMOptions:
    prefix_len: int = field(metadata={"help": "Tokens of each group's shared prefix P (paper: 2000, 1000, 200)."})
    distinct_len: int = field(metadata={"help": "Tokens of each request's distinct part D (paper: 200, 1000, 2000)."})
    share_degree: int = field(metadata={"help": "Requests per shared prefix K (paper: 4 and 16)."})
    requests: int = field(default=4096, metadata={"help": "Number of requests (the last group may be smaller)."})
    output_len: int = field(default=100, metadata={
        "help": "Output tokens of every request (the paper leaves it unstated and treats it as constant)."})
    seed: int = field(default=0, metadata={"help": "Random seed (the recipe is deterministic; kept for the sweep)."})

    def __post_init__(self) -> None:
        if self.prefix_len < 0:
            raise UserError(f"--prefix-len must be >= 0, got {self.prefix_len}")
        require_positive(distinct_len=self.distinct_len, share_degree=self.share_degree, requests=self.requests,
                         output_len=self.output_len)


def build(opts: BatchLLMOptions):
    from blendsim.workloads.trace import from_segment_arrays

    n, k = opts.requests, opts.share_degree
    group = np.arange(n) // k
    prefix = (group, np.full(n, opts.prefix_len)) if opts.prefix_len else (np.full(n, -1), np.zeros(n))
    n_groups = int(group[-1]) + 1
    offsets, ids, lens = paths([prefix, (n_groups + np.arange(n), np.full(n, opts.distinct_len))])
    trace = from_segment_arrays(np.full(n, opts.prefix_len + opts.distinct_len), np.full(n, opts.output_len),
                                offsets, ids, lens, source=np.full(n, "batchllm", dtype=object))
    full = (n // k) * k
    trace.meta = {"recipe": "batchllm", "params": dataclasses.asdict(opts), "groups": n_groups,
                  "expected_sharing_full_groups": (k - 1) * opts.prefix_len / (k * (opts.prefix_len + opts.distinct_len)),
                  "requests_in_full_groups": full}
    return trace


RECIPE = Recipe("batchllm", "BatchLLM sec. 6.1 microbenchmark: groups of K requests sharing a P-token prefix.",
                BatchLLMOptions, build)
