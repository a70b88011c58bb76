"""``vllm``: vLLM v1's default scheduling as it runs an offline job on an A100-class GPU.

FCFS admission while fewer than ``max_num_seqs`` (256) requests run; always-on chunked prefill with
running requests first under ``max_num_batched_tokens`` (8,192 for the offline ``LLM`` class on A100 and
smaller GPUs; 16,384 and 1,024 sequences on larger non-A100 GPUs — pass --token-budget/--max-seqs);
automatic prefix caching on full 16-token blocks with LRU eviction; when a decode cannot get a block,
the newest running request is preempted and recomputed later. These are the ``vllm`` engine profile's
scheduler settings (``blendsim.sim.engines``), declared over whatever engine prices the run; with
``--engine vllm`` the policy is FCFS on vLLM. The ``vllm`` engine itself applies the larger limits on larger
GPUs (``EngineProfile.scheduler_for``); this policy keeps the A100-class ones it declares (the run's notes say
so), so ``--policy fcfs --engine vllm`` is vLLM as it runs on any GPU.
"""

from __future__ import annotations

from blendsim.policies.base import Policy, register
from blendsim.sim.engines import PROFILES


@register("vllm")
class VLLM(Policy):
    description = "vLLM v1 defaults: FCFS, 256 seqs, 8192-token chunked prefill, block prefix cache"
    paper = 'vLLM v1 scheduler defaults'
    engine_defaults = dict(PROFILES["vllm"].scheduler)
