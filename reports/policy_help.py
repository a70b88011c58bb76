"""Where each policy option's default comes from, for ``blendsim policies NAME``.

The options themselves (default and meaning) are declared by each policy (``Policy.options``); this
table adds the source of the default: a paper section, a public implementation's code (as read for
/work/shared/POLICY_NOTES.md; no code copied) or "ours" where the paper leaves the choice open.
``test_terminal_output`` checks that every declared option has a source here, so the two cannot drift.
"""

from __future__ import annotations

PAPERS = {
    "blendserve": "BlendServe (ASPLOS'26)",
    "batchllm": "BatchLLM (Zheng et al., 2024)",
    "e2": "Preble (ICLR'25), E2 scheduler",
    "accelgen": "AccelGen (2025)",
    "dfs": "SGLang's dfs-weight schedule",
    "vllm": "vLLM v1 scheduler defaults",
    "sarathi": "Sarathi-Serve (OSDI'24)",
    "fcfs": "arrival order",
    "random": "NanoFlow-Balance baseline of BlendServe",
}

OURS = "ours (the paper leaves it open)"
EXT = "extension (not in the paper)"

SOURCES: dict[str, dict[str, str]] = {
    "dfs": {"heavier_first": "SGLang code (dfs-weight); off = plain DFS"},
    "blendserve": {
        "sample": "paper sec. 5.1",
        "warmup": "paper sec. 5.1 (barrier); none is ours",
        "default_output": OURS,
        "keep_sharing": "paper sec. 5.2 (keep 99% of sharing)",
        "split": "paper Alg. 2 (subtree); leaf is ours",
        "split_threshold": OURS,
        "split_divide": "paper Alg. 2, literal reading (off: ours)",
        "max_rounds": OURS,
        "merge_cap": OURS,
        "fill": OURS,
        "relocate": "paper sec. 5.4 ('severely'); factor ours",
        "footprint": "paper Alg. 3 (mean)",
        "guard": OURS,
        "balance": EXT,
        "mem_cap": EXT + "; kv = paper Alg. 3",
        "degenerate": OURS,
        "tiers": OURS,
    },
    "batchllm": {
        "order": "paper Eq. 4 (r_group); tree = public code",
        "batching": "paper Alg. 2 (memory); count = public code",
        "kv_threshold": "ours (paper Alg. 2 gives no value)",
        "share": "paper sec. 4.3 (group); cache = public code",
        "enlarge": "paper Alg. 1",
        "shared_attention": "paper sec. 4.4",
    },
    "e2": {
        "window_s": "paper (3-minute window)",
        "cost": "paper Alg. 2 (lmp); lm = Preble code",
        "load": "paper; code = Preble code",
        "eviction_cost": "paper (M term)",
        "pd_balance": "paper and Preble code",
        "pd_threshold": "Preble code (paper gives none)",
        "rebalance": "paper and Preble code",
        "th_bal": "Preble code (paper gives none)",
        "autoscale": "paper; code = Preble code",
        "overload_signal": "paper (queue); ttft = Preble code",
        "exploit": "paper Alg. 1; code = Preble code",
        "route_map": "paper (evict); window = Preble code",
        "groups": "Preble code (paper gives none)",
        "quota_unit": "paper's example (1); 10 = Preble code",
        "tiers": OURS,
    },
    "accelgen": {
        "pivot_tol": OURS,
        "default_tbt": "paper (reading speed)",
        "gamma": "paper sec. 6.1 (Alg. 2's window)",
        "urgent_factor": "paper Alg. 1",
        "long_prompt": OURS,
        "era": "paper sec. 4.2 (ERA); ending it with the prefill is ours",
        "era_urgent": "paper sec. 4.2 (no exception stated)",
        "max_window": OURS,
        "tmax_window": OURS,
        "lc_alpha": OURS,
        "jct_budget": EXT,
        "jct_output": "paper (output hint)",
        "budget_model": "paper sec. 4.2, Eq. 4 + Eq. 6 (eq4); cost is an extension",
        "distance": "paper Alg. 2 (tokens)",
        "best_effort_slack": OURS,
        "preempt_limit": "extension (progress guarantee, not in the paper; issue 14)",
        "urgent_preempt": "paper Alg. 1",
        "order": "paper sec. 4.3 (slack); fcfs = sec. 6.3 /Order ablation",
        "select": "paper sec. 4.4, Alg. 2 (euclid); order = sec. 6.3 /Batch",
    },
}


def option_source(policy: str, option: str) -> str:
    """The source of ``option``'s default for ``policy`` ("" when none is recorded)."""
    return SOURCES.get(policy, {}).get(option, "")


__all__ = ["PAPERS", "SOURCES", "option_source"]
