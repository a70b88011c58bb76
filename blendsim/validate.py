"""``blendsim validate``: simulate a trace, replay the simulator's schedule on a device, compare step times.

For each policy: simulate with ``record_schedule=True`` (offline: every request at t=0), refuse before
anything runs if the schedule's peak KV (a device-free dry run of its events) plus the weights and
activations do not fit the device, then replay every replica's schedule step by step on a
:class:`TorchExecutor` — the simulator's Batches, exactly — and measure each step's forward. Operators
are timed on every ``op_every``-th step. Faults stop the run cleanly: a CUDA out-of-memory error, a
schedule that contradicts itself, or Ctrl-C write what was measured (status ``stopped``) and exit 1;
results are also checkpointed every ``checkpoint_s`` seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from blendsim.real_backend import results
from blendsim.real_backend.results import ValidationStopped
from blendsim.sim.errors import UserError

GIB = 2**30


@dataclass(frozen=True)
class ValidateConfig:
    """Options of a validation run (CLI flags of ``blendsim validate``)."""

    policies: tuple = ("fcfs",)
    model: str = "tiny"
    hardware: str | None = None  # None: "cpu" on CPU, guessed from the GPU's name on CUDA
    device: str = "cpu"
    profile: str | None = None
    dtype: str | None = None
    engine: str = "ideal"  # the measured forward excludes engine overhead, so the default adds none
    mode: str | None = None  # None: the engine's
    replicas: int = 1
    max_steps: int | None = None  # per replica
    repeats: int | None = None  # forwards per step, median taken; None: 3 on CPU, 1 on CUDA
    op_every: int = 8  # time operators on every n-th step (0: never)
    threads: int | None = None  # CPU threads (None: the profile's, else torch's default)
    seed: int = 0
    token_budget: int | None = None
    max_seqs: int | None = None
    block_size: int | None = None
    gpu_memory_utilization: float | None = None
    kv_capacity_override: int = 0
    device_memory_bytes: int = 0  # the device's free memory to plan with; 0 = ask the device
    checkpoint_s: float = 60.0

    def __post_init__(self) -> None:
        if not self.policies or len(set(self.policies)) != len(self.policies):
            raise UserError("--policies: give one or more distinct policy names")
        from blendsim.sim.rundir import check_distinct_run_dirs

        check_distinct_run_dirs(self.policies)  # sim/<policy>/ holds each one's simulated run
        if self.max_steps is not None and self.max_steps < 1:
            raise UserError(f"--max-steps must be >= 1, got {self.max_steps}")
        if self.repeats is not None and self.repeats < 1:
            raise UserError(f"--repeats must be >= 1, got {self.repeats}")
        if self.op_every < 0:
            raise UserError(f"--op-every must be >= 0, got {self.op_every}")
        if self.threads is not None and self.threads < 1:
            raise UserError(f"--threads must be at least 1, got {self.threads}")
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise UserError(f"--device must be cpu or cuda, got {self.device!r}")


def resolve_device(name: str):
    """The torch device, or a UserError when CUDA is asked for and absent."""
    import torch

    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            why = "this torch has no CUDA support" if torch.version.cuda is None else "no GPU is visible"
            raise UserError(f"--device {name}: no CUDA device is available ({why}); use --device cpu")
        dev = torch.device(name)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UserError(f"--device {name}: only {torch.cuda.device_count()} GPU(s) visible")
        return dev
    return torch.device("cpu")


def guess_hardware(dev) -> str:
    """The hardware preset matching the device (``cpu`` for CPUs)."""
    if dev.type != "cuda":
        return "cpu"
    import torch

    from blendsim.sim.hardware import preset_for_device

    name = torch.cuda.get_device_name(dev)
    preset = preset_for_device(name, torch.cuda.get_device_properties(dev).total_memory)
    if preset is not None:
        return preset
    raise UserError(f"no hardware preset for {name!r}; pass --hardware (see `blendsim hardware`)")


def simulate(trace, cfg: ValidateConfig, policy: str, hardware: str):
    """The recorded simulation of one policy and its cost model."""
    from blendsim.runner import RunConfig, run_simulation
    from blendsim.sim.build_cost import build_cost_model
    from blendsim.sim.deployment import Deployment
    from blendsim.sim.engines import DEFAULT_ENGINE
    from blendsim.sim.hardware import get_hardware
    from blendsim.sim.models import get_model

    rc = RunConfig(policy=policy, model=cfg.model, hardware=hardware, replicas=cfg.replicas, mode=cfg.mode,
                   engine=cfg.engine, profile=cfg.profile, dtype=cfg.dtype, token_budget=cfg.token_budget,
                   max_seqs=cfg.max_seqs, block_size=cfg.block_size,
                   gpu_memory_utilization=cfg.gpu_memory_utilization, offline=True, seed=cfg.seed,
                   record_schedule=True, kv_capacity_override=cfg.kv_capacity_override)
    res = run_simulation(trace, rc)
    dep = Deployment(get_model(cfg.model, cfg.dtype), get_hardware(hardware), 1)
    return res, build_cost_model(dep, cfg.mode, cfg.engine or DEFAULT_ENGINE, cfg.profile), dep


def _size(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB / 10 else f"{nbytes / 2**20:.1f} MiB"


def need_bytes(spec, peak_blocks: int, block_size: int, max_tokens: int, max_logits: int, cuda: bool) -> int:
    """Device memory a replay needs: weights, peak KV, the largest step's activations and logits."""
    kv = peak_blocks * block_size * spec.kv_layer_bytes * spec.num_layers  # the replay's paged KV holds every layer
    per_token = (spec.mlp_in_out + spec.intermediate_size + 3 * spec.hidden_size + spec.qkv_out) * spec.dtype_bytes
    act = max_tokens * per_token + max_logits * spec.vocab_size * 4
    return int(spec.weight_bytes + kv + act + (512 if cuda else 128) * 2**20)


def run_validation(trace_path, cfg: ValidateConfig, out, progress=None) -> dict:
    """Validate and write ``out``; returns the summary. ``progress(text)`` reports as steps run."""
    from blendsim.real_backend.replay import load_schedule, peak_blocks
    from blendsim.sim.prefix_tree import PrefixTree
    from blendsim.workloads.trace import read_trace

    results.check_val_dir(out)
    dev = resolve_device(cfg.device)
    hardware = cfg.hardware or guess_hardware(dev)
    trace = read_trace(trace_path)
    sims = {p: simulate(trace, cfg, p, hardware) for p in cfg.policies}  # a foreign profile stops here
    first = sims[cfg.policies[0]][2]
    spec = first.model
    if spec.dtype == "fp8":
        raise UserError("the real backend runs fp32, bf16 and fp16 models, not fp8 (use --dtype)")
    tree = PrefixTree(trace)
    plans, need, worst = {}, 0, (0, 0)
    for p, (res, _cm, _dep) in sims.items():
        sch = load_schedule(res.schedule)
        reps = []
        for rep, ev in sch.events.items():
            peak = peak_blocks(ev, trace, tree, sch.block_size, sch.capacity_blocks, cfg.max_steps)
            reps.append((rep, ev, peak))
            tokens = max(res.steps[rep]["num_tokens"], default=0)
            b = need_bytes(spec, peak, sch.block_size, tokens, tokens, dev.type == "cuda")
            if b > need:
                need, worst = b, (peak, peak * sch.block_size * spec.kv_layer_bytes * spec.num_layers)
        plans[p] = (sch.block_size, reps)
    ctx = int((trace.input_len + trace.output_len).max())
    if ctx > spec.max_position_embeddings:
        raise UserError(f"{trace_path}: a request reaches {ctx} tokens, past {spec.name}'s "
                        f"{spec.max_position_embeddings} positions")
    from blendsim.real_backend.hwmon import free_memory_bytes

    have = cfg.device_memory_bytes or free_memory_bytes(dev)
    if need > have:
        raise UserError(f"the schedule needs {_size(need)} on {dev} at its peak ({worst[0]} KV blocks = "
                        f"{_size(worst[1])}, weights {_size(spec.weight_bytes)}, activations) but {_size(have)} "
                        f"are free; use --gpu-memory-utilization, a smaller --max-seqs or a smaller trace")
    from blendsim.real_backend.session import Session

    sess = Session(cfg, dev, spec, trace, tree, sims, plans, hardware, out, progress)
    return sess.run()


__all__ = ["ValidateConfig", "ValidationStopped", "guess_hardware", "need_bytes", "resolve_device",
           "run_validation", "simulate"]
