"""``sarathi``: Sarathi-Serve's stall-free chunked prefill with a fixed token budget, FCFS.

Each step runs every decode plus prefill chunks up to the token budget (chunk size 512 and a batch cap
of 128 requests, the defaults of Vidur's Sarathi scheduler). Sarathi-Serve has no prefix caching.
Engine overhead: ``vllm`` (Sarathi-Serve is built on vLLM).
"""

from __future__ import annotations

from blendsim.policies.base import Policy, register


@register("sarathi")
class Sarathi(Policy):
    description = "Sarathi-Serve: FCFS, fixed 512-token chunked-prefill budget, no prefix cache"
    paper = "Sarathi-Serve (OSDI'24)"
    engine_defaults = {"token_budget": 512, "max_seqs": 128, "prefix_caching": False, "mix": "decode-first",
                       "admission": "greedy"}
