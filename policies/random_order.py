"""``random``: a seeded shuffle of the requests (BlendServe's NanoFlow-Balance baseline).

Random order mixes compute- and memory-intensive requests evenly in every batch but scatters shared
prefixes, so little of them is reused while still cached.
"""

from __future__ import annotations

import numpy as np

from blendsim.policies.base import Policy, register


@register("random")
class RandomOrder(Policy):
    description = "seeded random order (resource balance, little prefix sharing)"
    paper = 'NanoFlow-Balance baseline of BlendServe'

    def rank(self) -> np.ndarray:
        rng = np.random.default_rng(self.ctx.seed)
        return rng.permutation(self.ctx.trace.n)
