"""The real backend: a Llama-shaped PyTorch model with paged KV that executes the simulator's schedule.

* ``model`` — the decoder (random seeded weights), operator for operator what ``blendsim.sim.ops`` prices;
* ``paged_kv`` — block manager (tables, reference counts, the prefix-cache block map driven by the
  simulator's insert/evict events) and the paged K/V tensors;
* ``attention`` — paged attention backends (FlashAttention, FlashInfer, PyTorch SDPA);
* ``sequences`` — per-request state from schedule events, and one step's ragged inputs;
* ``executor`` — ``TorchExecutor.run(batch) -> seconds``, the engine's Executor on a device;
* ``replay`` / ``live`` — execute a recorded schedule step by step, or run a policy live;
* ``validate`` / ``session`` / ``compare`` / ``results`` / ``hwmon`` / ``timing`` — ``blendsim validate``.
"""
