"""Seeded length models of the public traces the recipes mix: (input_len, output_len) per request.

The installed tool never reads a data file: every source is a parametric distribution (log-normal
mixtures on token counts, clipped to the range the real data shows). Each number says where it comes
from: "fit" means fitted by EM on the log lengths of the sample named in ``../shared/data/SOURCES.md``
(the tests compare these samplers with those samples); otherwise a paper or dataset card is cited, and
"choice" marks a value the sources leave open.

``Source.sample`` returns the request's *own* prompt tokens; the recipes prepend the source's shared
system prompt (``system_prompt_len``), as BlendServe App. A.3 does for every trace it mixes.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from blendsim.sim.errors import UserError


@dataclass(frozen=True, slots=True)
class LogNormalMix:
    """A mixture of log-normals over token counts, rounded and clipped to ``[lo, hi]``."""

    weights: tuple[float, ...]
    mu: tuple[float, ...]  # mean of log(tokens) per component
    sigma: tuple[float, ...]  # sd of log(tokens) per component
    lo: int = 1
    hi: int = 1 << 20

    @staticmethod
    def with_mean(mean: float, sigma: float, lo: int = 1, hi: int = 1 << 20) -> LogNormalMix:
        """One log-normal whose (unclipped) mean is ``mean``."""
        return LogNormalMix((1.0,), (float(np.log(mean) - sigma**2 / 2),), (sigma,), lo, hi)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        comp = rng.choice(len(self.weights), size=n, p=np.asarray(self.weights) / sum(self.weights))
        x = np.exp(rng.normal(np.asarray(self.mu)[comp], np.asarray(self.sigma)[comp]))
        return np.clip(np.rint(x), self.lo, self.hi).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Frames:
    """Video-generation outputs: a frame count times tokens per frame (BlendServe App. A.3)."""

    frames: LogNormalMix
    tokens_per_frame: int = 256

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.frames.sample(rng, n) * self.tokens_per_frame


@dataclass(frozen=True, slots=True)
class Source:
    """One trace's request lengths and the system prompt BlendServe gives it."""

    name: str
    prompt: LogNormalMix
    output: LogNormalMix | Frames
    system_prompt_len: int  # tokens of this source's shared system prompt
    reference: str

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` requests: (own prompt tokens, output tokens), int64 arrays."""
        return self.prompt.sample(rng, n), self.output.sample(rng, n)


def _sys_len(sharing: float, mean_prompt: float) -> int:
    """System prompt giving a source alone the sharing ratio BlendServe's Table 4 reports for it.

    NOTE: App. A.3 prepends one system prompt per trace without giving its length; with k requests
    sharing it, s = sys / (sys + mean prompt), so sys = s / (1 - s) x mean prompt (at least 1 token).
    """
    return max(1, int(round(sharing / (1.0 - sharing) * mean_prompt)))


# ---- BurstGPT -----------------------------------------------------------------------------
# No sample ships here. Mean request + response = 762.7 tokens: BurstGPT_without_fails_1.csv has
# 1,363,384 distinct rows holding 1,039,937,954 tokens (a public data-quality audit of the release).
# The split (0.68 request / 0.32 response) and the log-sds (1.47, 0.89) are fitted to the 38
# successful rows the BurstGPT_1.csv dataset viewer shows; clip maxima 29,665 / 7,315 are the release's.
# NOTE: alone this model has compute density ~3.3 (llama-3-8b / A100), where BlendServe's Table 4 gives BurstGPT
# 17.78: the paper's trace had longer prompts or shorter outputs than these public statistics say. Not refitted to
# Table 4 (one density cannot fix two length distributions); the README says what it does to the blendserve mix.
BURSTGPT_PROMPT_MEAN, BURSTGPT_OUTPUT_MEAN = 519.0, 244.0
BURSTGPT = Source(
    "burstgpt",
    LogNormalMix.with_mean(BURSTGPT_PROMPT_MEAN, 1.47, 1, 29665),
    LogNormalMix.with_mean(BURSTGPT_OUTPUT_MEAN, 0.89, 1, 7315),
    _sys_len(0.02, BURSTGPT_PROMPT_MEAN),  # Table 4: BurstGPT s = 0.02
    "BurstGPT (Wang et al. 2024) release v1.1; see comments in workloads/sources.py",
)

# ---- Azure LLM inference trace 2023 (Splitwise) ------------------------------------------------
# fit: azure_llm_inference_2023_conv.csv (19,366 rows): prompt mean 1,155, output mean 211.
AZURE_CONV = Source(
    "azure-conv",
    LogNormalMix((0.014, 0.986), (2.993, 6.685), (0.697, 0.888), 2, 14050),
    LogNormalMix((0.722, 0.278), (4.639, 6.007), (0.708, 0.050), 7, 1000),
    _sys_len(0.01, 1155.0),  # Table 4: Azure-Trace s = 0.01 (its density, 33.2, is the code trace's: this one's ~4.1)
    "Azure LLM inference trace 2023, conversation (Patel et al. 2024)",
)
# fit: azure_llm_inference_2023_code.csv (8,819 rows): prompt mean 2,048, output mean 28.
AZURE_CODE = Source(
    "azure-code",
    LogNormalMix((0.305, 0.695), (5.518, 7.650), (1.307, 0.724), 3, 7437),
    LogNormalMix((0.659, 0.341), (2.365, 3.605), (0.383, 0.899), 6, 1899),
    _sys_len(0.01, 2048.0),
    "Azure LLM inference trace 2023, code (Patel et al. 2024)",
)

# ---- ShareGPT (first turns) -------------------------------------------------------------------
# fit: nanoflow_sharegpt_first_turn_lengths_llama2tok.csv (58,787 rows), clipped at its 99.9th
# percentiles (7,887 / 1,153): prompt mean 299 (median 36), output mean 324.
SHAREGPT_PROMPT = LogNormalMix((0.706, 0.294), (3.121, 6.145), (0.938, 1.203), 1, 7887)
SHAREGPT_OUTPUT = LogNormalMix((0.279, 0.721), (4.065, 5.841), (1.255, 0.572), 1, 1153)
SHAREGPT = Source("sharegpt", SHAREGPT_PROMPT, SHAREGPT_OUTPUT, _sys_len(0.02, 299.0),
                  "ShareGPT first turns as used by NanoFlow (Llama-2 tokenizer)")

# ---- WildChat -----------------------------------------------------------------------------
# No sample ships here. WildChat paper (Zhao et al. 2024, Table 1): user turns 295.6 tokens on average,
# assistant turns 441.3 +- 410.9. Prompt tail: ShareGPT's log-sd 1.72 (choice: both are chat logs).
# Outputs keep WildChat's coefficient of variation (410.9/441.3 -> log-sd 0.77) and are scaled to a
# mean of 256, as BlendServe App. A.3 normalises them.
WILDCHAT = Source(
    "wildchat",
    LogNormalMix.with_mean(295.6, 1.72, 1, 16384),
    LogNormalMix.with_mean(256.0, float(np.sqrt(np.log1p((410.9 / 441.3) ** 2))), 1, 4096),
    _sys_len(0.19, 295.6),  # Table 4: WildChat s = 0.19 (stands in for its repeated prompts)
    "WildChat (Zhao et al. 2024); outputs normalised to mean 256 per BlendServe App. A.3",
)

# ---- OpenVid (video generation) ------------------------------------------------------------
# BlendServe App. A.3: output = frames x 256 tokens, mean normalised from 45K to 16K tokens, i.e. a
# normalised mean of 64 frames (16,384 / 256). Frame-count log-sd 0.5 and the caption (prompt) length
# (mean 130 tokens, log-sd 0.4) are choices: OpenVid-1M gives multi-sentence captions of clips of a
# few seconds; no length statistics ship here.
OPENVID_MEAN_OUTPUT = 16384
OPENVID = Source(
    "openvid",
    LogNormalMix.with_mean(130.0, 0.4, 8, 1024),
    Frames(LogNormalMix.with_mean(OPENVID_MEAN_OUTPUT / 256, 0.5, 1, 512)),
    1,  # Table 4: OpenVid s = 0.00; one token is the smallest shared system prompt
    "OpenVid-1M (Nan et al. 2024) as synthesised by BlendServe App. A.3",
)

# ---- AccelGen's mix (sec. 3.1): Alpaca, ShareGPT, BookCorpus -------------------------------------
# Alpaca prompts reach 500 tokens and ShareGPT's 2K (AccelGen sec. 3.1); outputs are capped at 2,048.
# Alpaca medians (prompt 50 = template + instruction, output 40) are choices; BookCorpus prompts are
# log-uniform over 4K-100K tokens ("4K-100K tokens for ... electronic books", AccelGen sec. 1), and
# its outputs (unreported) reuse ShareGPT's output model.
ALPACA = Source("alpaca", LogNormalMix((1.0,), (float(np.log(50)),), (0.5,), 8, 500),
                LogNormalMix((1.0,), (float(np.log(40)),), (0.9,), 1, 2048), 1, "Stanford Alpaca")
SHAREGPT_2K = Source("sharegpt-2k", LogNormalMix(SHAREGPT_PROMPT.weights, SHAREGPT_PROMPT.mu,
                                                 SHAREGPT_PROMPT.sigma, 1, 2048),
                     SHAREGPT_OUTPUT, 1, "ShareGPT, prompts up to 2K (AccelGen sec. 3.1)")
BOOKCORPUS = Source("bookcorpus",
                    LogNormalMix((1.0,), (float((np.log(4096) + np.log(100_000)) / 2),),
                                 (float((np.log(100_000) - np.log(4096)) / np.sqrt(12)),), 4096, 100_000),
                    SHAREGPT_OUTPUT, 1, "BookCorpus, 4K-100K-token prompts (AccelGen sec. 1, 3.1)")
# NOTE: the BookCorpus prompt is a log-normal with the mean and sd of log-uniform(4K, 100K) in log
# space, clipped to that range: close to log-uniform and one distribution family for all sources.

SOURCES: tuple[Source, ...] = (BURSTGPT, AZURE_CONV, AZURE_CODE, SHAREGPT, WILDCHAT, OPENVID, ALPACA,
                               SHAREGPT_2K, BOOKCORPUS)
COMPUTE_SOURCES = ("burstgpt", "azure-conv", "azure-code", "sharegpt", "wildchat")


def get_source(name: str) -> Source:
    for s in SOURCES:
        if s.name == name:
            return s
    raise UserError(f"unknown source {name!r}; choose one of {', '.join(s.name for s in SOURCES)}")


# ---- MMLU (5-shot, per-subject prefix) --------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MMLUSubjects:
    """The subjects of one seeded MMLU draw: a few-shot prefix per subject and its popularity."""

    prefix_len: np.ndarray  # int64 per subject: header + 5 worked examples
    weight: np.ndarray  # float per subject, sums to 1
    log_mu: np.ndarray  # per subject: mean log length of a question body


@dataclass(frozen=True, slots=True)
class MMLUModel:
    """MMLU as BlendServe mixes it: 5-shot prompts whose few-shot part is shared per subject.

    A request is ``[system prompt][subject prefix][question]``: the subject prefix is the subject's
    header line plus ``shots`` worked examples; the question is a body (question + choices) plus the
    answer-cue formatting. The answer is one token.

    NOTE: the zero-shot sample in ../shared/data gives about 0.2 sharing; BlendServe's Table 4 reports
    0.8646, which the standard 5-shot format (shared per subject) explains. Fit on
    mmlu_test_lengths_llama3tok.csv (14,042 rows, 57 subjects): question bodies have mean 92.0 tokens,
    subject means of log length spread with sd 0.565, questions within a subject with log-sd 0.437,
    subject sizes with log-sd 0.618; the zero-shot prompt adds 27 tokens to the body, of which the
    header line is about 16 and the choice letters plus "Answer:" 11. A worked example adds the answer
    letter and a blank line (2 tokens). The system prompt (134 tokens, the mean over 30 seeds of the
    length that gives a 14,042-request MMLU-only trace Table 4's 0.8646) lifts such a trace to 0.86.
    """

    num_subjects: int = 57
    shots: int = 5
    body_mean: float = 92.0
    between_sd: float = 0.565
    within_sd: float = 0.437
    size_sd: float = 0.618
    header_len: int = 16
    cue_len: int = 11
    example_extra: int = 2
    body_lo: int = 5
    body_hi: int = 1000
    system_prompt_len: int = 134
    name: str = "mmlu"

    def subjects(self, rng: np.random.Generator) -> MMLUSubjects:
        """Draw the subjects: stratified normal quantiles (shuffled) so every seed has the fitted spread."""
        k = self.num_subjects
        z = np.array([NormalDist().inv_cdf((i + 0.5) / k) for i in range(k)])
        mu0 = np.log(self.body_mean) - (self.between_sd**2 + self.within_sd**2) / 2
        log_mu = mu0 + self.between_sd * rng.permutation(z)
        weight = np.exp(self.size_sd * rng.permutation(z))
        shots = self._bodies(rng, np.repeat(log_mu, self.shots)).reshape(k, self.shots)
        prefix = self.header_len + (shots + self.cue_len + self.example_extra).sum(axis=1)
        return MMLUSubjects(prefix.astype(np.int64), weight / weight.sum(), log_mu)

    def sample(self, n: int, rng: np.random.Generator, subj: MMLUSubjects):
        """``n`` requests: (subject index, question tokens incl. the answer cue, output tokens)."""
        s = rng.choice(len(subj.weight), size=n, p=subj.weight)
        q = self._bodies(rng, subj.log_mu[s]) + self.cue_len
        return s.astype(np.int64), q, np.ones(n, dtype=np.int64)

    def _bodies(self, rng, log_mu):
        return np.clip(np.rint(np.exp(rng.normal(log_mu, self.within_sd))), self.body_lo, self.body_hi).astype(np.int64)


MMLU = MMLUModel()

__all__ = ["COMPUTE_SOURCES", "Frames", "LogNormalMix", "MMLU", "MMLUModel", "MMLUSubjects", "SOURCES", "Source",
           "get_source"]
