"""One validation session on a device: load the model, measure peaks, replay every schedule, summarise.

Built by ``blendsim.validate.run_validation`` once the simulations are done and the memory plan
fits. Rows are collected as steps run; a fault (out of memory, a schedule contradicting itself, Ctrl-C)
ends the replay and the rows so far are written with ``status: stopped`` (see ``blendsim.real_backend.results``).
"""

from __future__ import annotations

import time

import numpy as np

from blendsim.real_backend import compare, results
from blendsim.real_backend.paged_kv import KVExhausted, ScheduleMismatch

SCHEMA_VERSION = 1


def _is_oom(e: BaseException) -> bool:
    import torch

    if isinstance(e, getattr(torch, "OutOfMemoryError", ())) or isinstance(e, MemoryError):
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()


class Session:
    """Replays the planned schedules on ``dev`` and writes ``out``."""

    def __init__(self, cfg, dev, spec, trace, tree, sims, plans, hardware, out, progress=None):
        self.cfg, self.dev, self.spec, self.trace, self.tree = cfg, dev, spec, trace, tree
        self.sims, self.plans, self.hardware, self.out = sims, plans, hardware, out
        self.progress = progress or (lambda text: None)
        self.steps = results.Rows(results.STEP_COLUMNS)
        self.ops = results.Rows(results.OP_COLUMNS)
        self.info: dict = {}
        self._last_ckpt = time.monotonic()

    # ---- the run --------------------------------------------------------------------------
    def run(self) -> dict:
        import torch

        threads, tf32 = torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32
        sampler, status, reason = None, "complete", ""
        try:
            rt, repeats = self._start()
            sampler = self._sampler()
            for policy, (bs, reps) in self.plans.items():
                for rep, events, peak in reps:
                    self._replay(rt, policy, rep, events, bs, peak, repeats)
        except (ScheduleMismatch, KVExhausted) as e:
            status, reason = "stopped", f"schedule replay failed: {e}"
        except KeyboardInterrupt:
            status, reason = "stopped", "interrupted"
        except Exception as e:
            if not _is_oom(e):
                raise
            status, reason = "stopped", f"out of memory: {str(e).splitlines()[0]}"
        finally:
            nvml = sampler.stop() if sampler is not None else None
            if sampler is not None:
                self.info["nvml_summary"] = sampler.summary()
            torch.set_num_threads(threads)
            torch.backends.cuda.matmul.allow_tf32 = tf32
        tables = {"steps": self.steps, "ops": self.ops}
        if nvml:
            rows = results.Rows(tuple(nvml))
            rows.cols = {k: list(v) for k, v in nvml.items()}
            tables["nvml"] = rows
        summary = self.summary(status, reason)
        # a stopped run never replaces a complete validation the folder already holds: it goes beside it
        out = self.out if status == "complete" else results.stopped_dir(self.out)
        results.write_results(out, summary, tables, {p: s[0] for p, s in self.sims.items()})
        if status != "complete":
            where = f"after {len(self.steps)} steps" if len(self.steps) else "before any step"
            kept = f" ({self.out} keeps its complete validation)" if out != self.out else ""
            raise results.ValidationStopped(f"validation stopped {where}: {reason}; partial results in {out}{kept}")
        return summary

    def _start(self):
        """Put the device in the calibration's conditions, load the model, measure peaks, warm up."""
        import torch

        from blendsim.real_backend.executor import DeviceRuntime
        from blendsim.real_backend.hwmon import device_info, measure_peaks
        from blendsim.real_backend.timing import pin_threads, steady_cpu
        from blendsim.sim.profile import load_profile

        cfg = self.cfg
        prof = load_profile(cfg.profile) if cfg.profile else None
        software = prof.software if prof else {}
        run_env = {}
        if self.dev.type == "cpu":
            # the calibration's conditions: its thread count (1 by default) and a heap that keeps freed memory
            run_env["threads"] = pin_threads(cfg.threads or (prof.device.get("threads") if prof else None) or 1)
            run_env["allocator_keeps_freed_memory"] = steady_cpu()
        elif "tf32_matmul" in software:
            torch.backends.cuda.matmul.allow_tf32 = run_env["tf32_matmul"] = bool(software["tf32_matmul"])
        self.info = {"device": device_info(self.dev), "run_env": run_env,
                     "profile": {"path": cfg.profile, "device": prof.device, "software": software} if prof else None}
        rt = DeviceRuntime(self.spec, str(self.dev), cfg.seed, software.get("attention_backend"))
        repeats = cfg.repeats or (3 if self.dev.type == "cpu" else 1)
        self.info.update(repeats=repeats, clock=rt.clock.name, peaks=measure_peaks(rt.clock, rt.model.dtype))
        rt.warmup(self.trace, self.tree, next(iter(self.plans.values()))[0])
        return rt, repeats

    def _sampler(self):
        from blendsim.real_backend.hwmon import start_sampler

        sampler, why = start_sampler(self.dev)
        self.info["nvml"] = why or "sampling"
        return sampler

    def _replay(self, rt, policy, rep, events, block_size, peak, repeats) -> None:
        from blendsim.real_backend.executor import TorchExecutor
        from blendsim.real_backend.replay import replay

        res, cm, dep = self.sims[policy]
        st = res.steps[rep]
        layers = self.spec.num_layers
        ex = TorchExecutor(rt, self.trace, self.tree, block_size, max(peak, 1), repeats=repeats,
                           op_every=self.cfg.op_every)
        self.info.setdefault("attention_backend", ex.attn.name)
        self.info.setdefault("attention_passed_over", ex.attn_passed_over)
        kernels = getattr(ex.attn, "kernel_report", dict)()  # torch_sdpa on CUDA: which SDPA kernel each call gets
        if kernels:
            self.info["sdpa_kernel_by_call"] = kernels
        shapes = cm.timer.shapes

        def on_step(batch, rec):
            i = batch.step
            f = batch.features()
            if (st["num_tokens"][i], st["num_prefill_tokens"][i], st["num_decode"][i], st["num_prefill_seqs"][i]) != \
                    (f.num_tokens, f.num_prefill_tokens, f.num_decode, f.num_prefill_seqs):
                raise ScheduleMismatch(f"{policy} replica {rep} step {i}: replayed batch differs from the simulated one")
            flops, nbytes = compare.work(shapes, layers, f)
            pred = st["dt_s"][i]
            self.steps.add(policy=policy, replica=rep, step=i, kind=str(compare.step_kind(f.num_prefill_tokens, f.num_decode)),
                           num_tokens=f.num_tokens, num_prefill_tokens=f.num_prefill_tokens,
                           num_prefill_seqs=f.num_prefill_seqs, num_decode=f.num_decode,
                           decode_ctx_sum=f.decode_ctx_sum, attn_pairs=f.attn_pairs, num_logits=f.num_logits,
                           predicted_s=pred, pred_compute_s=st["compute_s"][i], pred_memory_s=st["memory_s"][i],
                           measured_s=rec.measured_s, host_s=rec.host_s, prep_s=rec.prep_s,
                           rel_err=(pred - rec.measured_s) / rec.measured_s, flops=float(flops), bytes=float(nbytes),
                           kv_blocks_used=ex.blocks.num_used, checksum=rec.checksum)
            if rec.ops:
                for r in cm.breakdown(f):
                    if r["op"] in rec.ops or r["time_s"] > 0:
                        mult = layers if r["scope"] == "layer" else 1
                        self.ops.add(policy=policy, replica=rep, step=i, op=r["op"], op_class=compare.op_class(r["op"]),
                                     predicted_s=r["time_s"] * mult, measured_s=rec.ops.get(r["op"], 0.0))
            if i % 64 == 0:
                self.progress(f"{policy} replica {rep}: step {i + 1}/{len(st['dt_s'])}")
            if time.monotonic() - self._last_ckpt > self.cfg.checkpoint_s:
                self._last_ckpt = time.monotonic()
                results.write_results(self.out, self.summary("running", "checkpoint"),
                                      {"steps": self.steps, "ops": self.ops}, {})

        replay(ex, events, self.cfg.max_steps, on_step)

    # ---- the summary ----------------------------------------------------------------------
    def summary(self, status: str, reason: str) -> dict:
        from dataclasses import asdict

        cfg = self.cfg
        s = self.steps.arrays() if len(self.steps) else {}
        o = self.ops.arrays() if len(self.ops) else {}
        per = {}
        for p in cfg.policies:
            res = self.sims[p][0]
            if not s or not (s["policy"] == p).any():
                per[p] = {"steps": 0, "sim_steps": int(res.summary["steps"])}
                continue
            m = s["policy"] == p
            complete = int(m.sum()) == int(res.summary["steps"])
            tokens = float(res.summary["input_tokens"] + res.summary["output_tokens"]) if complete \
                else float(s["num_tokens"][m].sum())
            per[p] = {"steps": int(m.sum()), "sim_steps": int(res.summary["steps"]), "complete": complete,
                      "step_error": compare.step_errors(s["predicted_s"][m], s["measured_s"][m], s["kind"][m]),
                      "end_to_end": compare.end_to_end(s["replica"][m], s["predicted_s"][m], s["measured_s"][m],
                                                       tokens, res.summary["makespan_s"] if complete else None),
                      "efficiency": compare.efficiency(s["flops"][m], s["bytes"][m], s["measured_s"][m],
                                                       s["num_prefill_tokens"][m], s["num_tokens"][m],
                                                       self.info["peaks"]) if "peaks" in self.info else {},
                      "notes": list(res.notes)}
            if self.dev.type == "cuda":
                # NOTE: steps whose host issue time nearly equals their GPU time were launch-bound (Python
                # dispatch, no CUDA graphs): their measured time says more about the host than the kernels
                per[p]["host_bound_fraction"] = float(np.mean(s["host_s"][m] >= 0.9 * s["measured_s"][m]))
            if o and (o["policy"] == p).any():
                q = o["policy"] == p
                sid = np.char.add(o["replica"][q].astype(str), np.char.add("/", o["step"][q].astype(str)))
                per[p]["op_class_error"] = compare.op_class_errors(sid, o["op"][q], o["predicted_s"][q],
                                                                   o["measured_s"][q])
        out = {"kind": results.KIND, "schema_version": SCHEMA_VERSION, "status": status, "reason": reason,
               "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(cfg).items()},
               "model": self.spec.name, "dtype": self.spec.dtype, "hardware": self.hardware, **self.info,
               "policies": per}
        done = [p for p in cfg.policies if per[p].get("steps")]
        if len(done) >= 2:
            whole = all(per[p]["complete"] for p in done)
            # one token count for every policy: the whole trace's where every replay is complete, else each
            # replay's computed tokens over its replayed steps (a complete and a cut replay would mix the two)
            e2e = {p: per[p]["end_to_end"] if whole else
                   compare.end_to_end(*(s[k][m] for k in ("replica", "predicted_s", "measured_s")),
                                      float(s["num_tokens"][m].sum()))
                   for p in done for m in [s["policy"] == p]}
            out["speedup"] = {p: {**compare.speedup(e2e[done[0]], e2e[p]),
                                  "over": "the whole trace" if whole else
                                  "computed tokens a second over each replay's steps, a replay being cut at "
                                  "--max-steps (the error is the same on any token count)"} for p in done[1:]}
            out["speedup_base"] = done[0]
        return out


__all__ = ["Session"]
