"""``accelgen``: AccelGen (Shen and Sen), heterogeneous-SLO high-throughput serving.

Three methods on a vLLM-style chunked-prefill engine (the paper's sec. 4):

* SLO-guaranteed dynamic chunking (4.2): the token budget S_b = S_pf x SLO_min / T_pf (Eq. 6), the
  pivot forward size S_pf and its step time T_pf taken from the project's cost model in place of the
  paper's profiling (``budget.py``). By default (``budget_model=eq4``) a step is filled until its Eq. 4
  operations — with the attention term, each chunk at its own offset: c (6H + o + c) per layer in units
  of 4H, decodes 6H + L + 1 — equal those of S_b tokens at the pivot, S_b (6H + S_pf); this is Eq. 6
  where the paper's S << 6H holds and shrinks a chunk deep in a long prompt (about S_b / 2 at 6H of
  context). ``budget_model=eq6`` fills each step to exactly S_b tokens (Eq. 4 without its attention
  term, whatever the context); prompts are cut where the budget ends; exclusive request allocation
  (ERA) serves long prompts (>= 4K tokens) one at a time.
* Iteration-level SLO-based prioritisation (4.3): candidates ordered by remaining time T_r, JCT SLOs
  converted to a per-iteration wait allowance with carry-over (``slack.py``); urgent = T_r < T_max.
* Multi-resource-aware batching (4.4, Alg. 1-2): urgent requests first, preempting the largest T_r;
  then the candidate nearest to (free compute, free KV) in Euclidean distance (``scheduler.py``,
  ``batching.py``).

Engine: ``vllm`` — AccelGen is implemented on vLLM's source (sec. 5), so it is priced like the
``vllm`` and ``sarathi`` policies; vLLM's 256-sequence cap and 16-token blocks, greedy admission with
recompute preemption (sec. 5: vLLM handles KV overflow and preemption). The engine's token budget is
only a hard cap on S_b (8,192, vLLM's), never the budget itself.

Choices the paper leaves open (options in brackets):
* S_pf: the smallest forward size (multiples of 16) whose prefill throughput is within ``pivot_tol``
  (1%) of the sweep's best: 896 tokens (67 ms) for llama-3-8b on an A100-80GB; 640 for OPT-13B, whose
  pivot the paper measured at 768 on a real A100 (sec. 3.1) — the cost model saturates a bit sooner.
* SLO_min: the tightest iteration-level SLO among the running requests, the queue's head and each
  request being added (adding a tighter one shrinks the step's budget); with none, S_b = S_pf (the
  paper's default budget).
  JCT-only requests do not bound S_b unless ``jct_budget`` (then by SLO_JCT / (N_ck + S_g)).
* T_max: the largest step time over the last ``tmax_window`` (64) steps (T_pf before the first);
  L_c: exponential average (``lc_alpha`` 1/8) of the chunks that cut a prompt, S_pf at first;
  P and P_max measured online; S_g: the trace's output hint, else the replica's mean finished output
  (``jct_output=oracle``: the true length).
* Urgent: T_r < ``urgent_factor`` (1) x T_max. Long prompts: >= ``long_prompt`` (4,096) tokens.
  ERA holds until the long prompt's prefill ends (``era=request``: until it finishes; ``off``), for
  urgent long prompts too (``era_urgent=false`` exempts them: Alg. 1 admits every urgent request,
  sec. 4.2 states ERA without exception).
* Alg. 2's window holds at most ``max_window`` (64) candidates ("several requests"); gamma = 0.75 s
  (sec. 6.1). Partly prefilled prompts are chunkable like long ones. Distances in tokens as the paper
  writes them (``distance=normalized``: each axis over its capacity).
* Ablations of sec. 6.3: ``order=fcfs`` (/Order), ``select=order`` (/Batch); ``urgent_preempt=false``.
* Progress (issue 14; the paper is silent): an iteration-level SLO that no step can meet — below the
  cost model's one-token step ``t_min`` or Eq. 6's T_pf / S_pf — bounds no S_b (it is lost whatever
  the step holds; bounding S_b by it cut preempted requests' recomputation to one token per step);
  an urgent request whose T_r < 0 (its SLO already lost) preempts no one; compute preemption (Alg. 1
  lines 2-4) keeps the last decoder and stops when the tightest request alone overruns the budget;
  the policy preempts one request at most ``preempt_limit`` (4) times (the engine's memory
  preemptions go on, of such a request only when no one else can go: the newest). When partial
  prefills fill the KV and none can grow, the newest is freed (vLLM's rule; Alg. 1's largest T_r is
  the prompt nearest its end, and they took turns for ever) and no one is admitted until a prefill
  or a request ends. Alg. 2 offers a partly prefilled prompt its next chunk when no block is free
  but its last block has room (testing free blocks alone livelocked such a prompt).
* Requests without SLOs are best effort (after all SLO requests, FCFS); ``best_effort_slack`` gives
  them a deadline of arrival + slack instead. Online requests without a TBT SLO get 0.1875 s
  (``default_tbt``), the paper's default reading speed.

NOTE (benchmarks/bench_accelgen.py, llama-3-8b on a100-80gb, 1,000 requests, rates 0.25/0.5/1):
``budget_model=eq6`` prices a step by its token count alone; ~37% of this mix's prompt tokens lie
beyond 6H (24,576), where its 1,900-3,100-token chunks take 0.33-1.18 s against 0.14-0.23 s TBT
SLOs, KV fills and urgent long prompts preempt long decoders: 432 preemptions and 48% of prompt
tokens recomputed at 0.5 req/s, SLO attainment 0.285/0.011/0.000. ``eq4`` (default) removes that:
32 preemptions, 6% recomputed, attainment 0.310/0.090/0.022. Its steps still run over SLO_min
(before the progress rules below: 7% of steps at 0.25, median 1.07x; 39% at 0.5, median 1.19x) because Eq. 4 counts operations: the
cost model runs attention at 0.55 of peak against 0.70 for GEMMs (a lone eq4 chunk at 4 x 6H takes
~1.08x SLO_min) and decode attention is bound by KV reads (~250K tokens of decode context in the
over-SLO steps at 0.5). ``budget_model=cost`` (an extension: the cost model sizes the chunk to meet
SLO_min) removes the rest: TBT attainment >= 0.995 at every rate.
"""

from __future__ import annotations

import dataclasses
import math

from blendsim.policies.accelgen.budget import pivot_forward_size, prefill_step_time
from blendsim.policies.accelgen.queue import SlackQueue
from blendsim.policies.accelgen.scheduler import AccelGenScheduler, Params
from blendsim.policies.accelgen.slack import SloBook
from blendsim.policies.base import Policy, register
from blendsim.policies.option import EXT, OURS, Option
from blendsim.sim.engines import PROFILES
from blendsim.sim.errors import UserError

_CHOICES = {"era": ("prefill", "request", "off"), "budget_model": ("eq4", "eq6", "cost"),
            "distance": ("tokens", "normalized"), "jct_output": ("hint", "oracle"),
            "order": ("slack", "fcfs"), "select": ("euclid", "order")}
_INTS = ("long_prompt", "max_window", "tmax_window", "preempt_limit")


@register("accelgen")
class AccelGen(Policy):
    description = ("AccelGen: Eq. 6 SLO budgets in Eq. 4 operations, T_r order, ERA, dynamic chunks, "
                   "Euclidean compute/KV batching")
    paper = 'AccelGen (2025)'
    # AccelGen is built on vLLM's scheduler; its own schedule() meets a full KV by preemption (vLLM's rule),
    # never by stalling decodes (an engine's kv_full = "stall")
    engine_defaults = {**PROFILES["vllm"].scheduler, "kv_full": "preempt"}
    reads_cost_model = True
    options = {
        "pivot_tol": Option(0.01, "pivot forward size: throughput within this fraction of the best", source=OURS),
        "default_tbt": Option(0.1875, "TBT SLO (s) of online requests that give none (the paper's reading speed)", source='paper (reading speed)'),
        "gamma": Option(0.75, "Alg. 2 window: candidates with T_r within T_r^1 + gamma seconds", source="paper sec. 6.1 (Alg. 2's window)"),
        "urgent_factor": Option(1.0, "urgent when T_r < urgent_factor x T_max", source='paper Alg. 1'),
        "long_prompt": Option(4096, "prompts of at least this many tokens are long (ERA)", source=OURS),
        "era": Option("prefill", "exclusive request allocation: prefill | request | off", source='paper sec. 4.2 (ERA); ending it with the prefill is ours'),
        "era_urgent": Option(True, "ERA also holds back urgent long prompts (false: urgent ones are exempt)", source='paper sec. 4.2 (no exception stated)'),
        "max_window": Option(64, "most candidates Alg. 2 and the fill look at per step", source=OURS),
        "tmax_window": Option(64, "steps over which T_max is the largest step time", source=OURS),
        "lc_alpha": Option(0.125, "weight of each new cut chunk in the average chunk length L_c", source=OURS),
        "jct_budget": Option(False, "JCT requests also bound S_b by SLO_JCT / iterations", source=EXT),
        "jct_output": Option("hint", "S_g for JCT conversion: hint (else replica mean) | oracle", source='paper (output hint)'),
        "budget_model": Option("eq4", "token budget: eq4 (Eq. 6's S_b in Eq. 4 operations, each chunk's context "
                                "priced) | eq6 (S_b tokens; the default on an engine that rounds steps to a token "
                                "multiple, --round-tokens: nanoflow) | cost (cost-model step time fits SLO_min)", source='paper sec. 4.2, Eq. 4 + Eq. 6 (eq4); cost is an extension'),
        "distance": Option("tokens", "Alg. 2 distance: tokens (paper) | normalized", source='paper Alg. 2 (tokens)'),
        "best_effort_slack": Option(math.inf, "requests without SLOs: deadline arrival + this (inf: lowest tier)", source=OURS),
        "urgent_preempt": Option(True, "urgent requests preempt running ones with a larger T_r (Alg. 1)", source='paper Alg. 1'),
        "order": Option("slack", "queue order: slack (T_r, sec. 4.3) | fcfs (the paper's /Order ablation)", source='paper sec. 4.3 (slack); fcfs = sec. 6.3 /Order ablation'),
        "select": Option("euclid", "batching: euclid (Alg. 2) | order (queue order, the paper's /Batch ablation)", source='paper sec. 4.4, Alg. 2 (euclid); order = sec. 6.3 /Batch'),
        "preempt_limit": Option(4, "a request preempted this often is no longer preempted for compute or for an "
                             "urgent request (memory preemptions go on)", source='extension (progress guarantee, not in the paper; issue 14)'),
    }

    def prepare(self) -> None:
        o = self.opt
        for k, allowed in _CHOICES.items():
            if o[k] not in allowed:
                raise UserError(f"option {k}: expected one of {', '.join(allowed)}, got {o[k]!r}")
        for k in ("default_tbt", "urgent_factor", "pivot_tol", "lc_alpha"):
            if not o[k] > 0:
                raise UserError(f"option {k}: must be > 0, got {o[k]}")
        for k in _INTS:
            if int(o[k]) < 1:
                raise UserError(f"option {k}: must be >= 1, got {o[k]}")
        for k in ("gamma", "best_effort_slack"):
            if not o[k] >= 0:
                raise UserError(f"option {k}: must be >= 0, got {o[k]}")
        if not o["lc_alpha"] <= 1:
            raise UserError(f"option lc_alpha: must be <= 1, got {o['lc_alpha']}")
        if not o["pivot_tol"] < 1:
            raise UserError(f"option pivot_tol: must be < 1, got {o['pivot_tol']}")
        if o["budget_model"] != "eq6" and self.ctx.engine.round_tokens:
            if "budget_model" in self.ctx.options:
                raise UserError(f"option budget_model={o['budget_model']} sizes steps by operations or time, not "
                                "by tokens: it does not take --round-tokens (use budget_model=eq6)")
            # an engine that runs steps of whole token multiples (NanoFlow's 128) takes Eq. 6's token budget, so
            # a comparison of every policy on that engine runs this one too
            o["budget_model"] = "eq6"
        if self.ctx.engine.mix != "decode-first":
            raise UserError("policy accelgen mixes decodes and prefill chunks in every step: "
                            "use --mix decode-first")
        self.s_pf, self.t_pf = pivot_forward_size(self.ctx.cost_model, float(o["pivot_tol"]))
        t_min = prefill_step_time(self.ctx.cost_model, 1)
        self.book = SloBook(self.ctx.trace, float(o["default_tbt"]), o["jct_output"])
        fields = {f.name for f in dataclasses.fields(Params)}
        kw = {k: (int(v) if k in _INTS else v) for k, v in o.items() if k in fields}
        six_h = 6 * self.ctx.deployment.model.hidden_size
        self.params = Params(s_pf=self.s_pf, t_pf=self.t_pf, six_h=six_h, t_min=t_min, **kw)
        self._scheds: list[AccelGenScheduler] = []

    def make_scheduler(self, replica: int, **kw) -> AccelGenScheduler:
        s = AccelGenScheduler(queue=SlackQueue(self.ctx.trace.n), replica=replica, params=self.params,
                              book=self.book, cost_model=self.ctx.cost_model, **kw)
        self._scheds.append(s)
        return s

    def summary_extra(self) -> dict:
        tot: dict = {}
        for s in self._scheds:
            for k, v in s.counts.items():
                tot[k] = tot.get(k, 0) + v
        steps = max(1, tot.get("steps", 0))
        return {
            "accelgen_budget_model": self.opt["budget_model"],  # eq6 by default on a token-rounding engine
            "accelgen_pivot_tokens": self.s_pf,
            "accelgen_pivot_time_s": self.t_pf,
            "accelgen_mean_budget": tot.get("budget_sum", 0) / steps,
            "accelgen_exact_budget_frac": tot.get("exact_steps", 0) / steps,
            "accelgen_short_steps_with_work": tot.get("short_steps", 0),
            "accelgen_urgent_admissions": tot.get("urgent", 0),
            "accelgen_preempt_compute": tot.get("preempt_compute", 0),
            "accelgen_preempt_urgent": tot.get("preempt_urgent", 0),
            "accelgen_era_deferred_steps": tot.get("era_deferred", 0),
        }
