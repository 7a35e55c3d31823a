"""Frozen settings that several parts share (sampling, generation, loading, n-gram drafting, warm-up
training, step-level speculation); each default is defined once. A part's own settings live beside it
(e.g. SuffixConfig, AdaptiveConfig, SelectorConfig, LearnerConfig, LlamaCppConfig, ServerConfig)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TypeVar

from evospec.errors import EvospecError

Config = TypeVar("Config")

# How a setting's text becomes a value, by the field's annotation; a bool is spelled true or false.
_SETTING_PARSERS = {"int": int, "float": float, "str": str, "bool": {"true": True, "false": False}.__getitem__}


def method_settings(method: str, config: Config) -> tuple[str, Config]:
    """'NAME@field=value,...' -> (NAME, `config` with those fields replaced), for any frozen config
    dataclass whose int, float, str or bool fields a method name may set, e.g.
    evospec:eagle+ogd@schedule=chunk,every=40 over a LearnerConfig; a name without '@' keeps `config`."""
    name, _, fields = method.partition("@")
    if not fields:
        return name, config
    kinds = {item.name: str(item.type).removesuffix(" | None") for item in dataclasses.fields(config)}
    settable = {key: kind for key, kind in kinds.items() if kind in _SETTING_PARSERS}
    values = {}
    for item in fields.split(","):
        key, _, value = item.partition("=")
        if key not in settable:
            kind = type(config).__name__
            raise EvospecError(f"{method}: {kind} has no setting {key!r}; settable: {', '.join(settable)}")
        try:
            values[key] = _SETTING_PARSERS[settable[key]](value)
        except (KeyError, ValueError) as error:
            spelled = "bool (true or false)" if settable[key] == "bool" else settable[key]
            raise EvospecError(f"{method}: {key}={value!r} is not a {spelled}") from error
    return name, dataclasses.replace(config, **values)


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen; applied identically to target (p) and drafter (q)."""

    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    top_p: float = 1.0  # keep the smallest set whose mass reaches top_p; 1 keeps all
    seed: int = 0  # seeds the one generator that draws every sampled token

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise EvospecError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise EvospecError(f"top-k must be >= 0 (0 turns it off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise EvospecError(f"top-p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerationConfig:
    """One request: how much to generate, how far to speculate, when to stop."""

    max_new_tokens: int = 128
    num_speculative_tokens: int = 4  # k: tokens drafted per round
    stop: tuple[str, ...] = ()  # generation ends before the first of these strings
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    # Step-level speculation (evospec.reasoning): a judged drafter step may stand for the target's. Lossy.
    reasoning_speculation: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise EvospecError(f"max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.num_speculative_tokens < 1:
            raise EvospecError(f"k (draft length) must be >= 1, got {self.num_speculative_tokens}")
        if any(not s for s in self.stop):
            raise EvospecError("stop strings must not be empty")


# bf16: the fast dtype on CPUs with AVX512-BF16; fp32: where bit-exactness is the point;
# int8: int8 weights with bf16 activations, the fast target on CPUs without AVX512-BF16 (models/quantize.py).
DTYPES = ("bf16", "fp32", "int8")
DEFAULT_DTYPE = "bf16"
# hf: PyTorch through transformers; llamacpp: a GGUF file run by llama.cpp (models/loading.py picks).
BACKENDS = ("hf", "llamacpp")


@dataclass(frozen=True)
class LoadConfig:
    """How a model is loaded and run; each backend takes the settings that apply to it."""

    dtype: str | None = None  # one of DTYPES, for backends that run torch weights; None: DEFAULT_DTYPE
    # Verify each row as a one-token step computes it (bit-identical to plain decoding where the
    # kernels allow), for backends whose kernels are not batch-invariant; slower.
    exact_verify: bool = False

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPES:
            raise EvospecError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")


@dataclass(frozen=True)
class NgramConfig:
    """Prompt-lookup drafting: continue the earlier place whose preceding tokens match the context's end longest."""

    max_ngram: int = 64  # matches are measured up to this many tokens (longer ones tie)
    min_ngram: int = 1  # shortest match that still counts

    def __post_init__(self) -> None:
        if not (1 <= self.min_ngram <= self.max_ngram):
            raise EvospecError(f"n-gram sizes need 1 <= min <= max, got {self.min_ngram}..{self.max_ngram}")


@dataclass(frozen=True)
class DistillConfig:
    """Offline warm-up of a white-box drafter by distillation from the target (`evospec train-drafter`)."""

    data: str = "gsm8k"  # a shipped corpus (GSM8K train questions) or a .jsonl / .txt file of prompts
    samples: int = 256  # prompts the target answers; the last `holdout` share of them is kept out of training
    max_new_tokens: int = 256  # longest greedy answer of the target per prompt
    epochs: int = 3  # passes over the training traces
    lr: float = 1e-3  # Adam's step size
    batch_rows: int = 512  # trace rows per step; longer traces are cut into windows of this many
    head_vocab: int | None = None  # tokens the drafter can propose; None: the white-box drafters' default
    save_every: int = 50  # steps between checkpoints (one more at the end)
    max_steps: int | None = None  # stop after this many steps in all (--resume goes on); None: every epoch
    resume: bool = False  # go on from the run saved in the output directory
    start_from: str | None = None  # a saved drafter whose weights a new run starts from; None: random weights
    holdout: float = 0.1  # share of the samples (the last ones) kept out to measure top-1 agreement
    seed: int = 0  # the drafter's initial weights and each epoch's order
    grad_clip: float = 1.0  # gradient norm cap per step
    forward_rows: int = 256  # tokens per target pass when collecting (llama.cpp's batch holds 512)
    # eagle: draft depths each row is trained at; past the first, the head reads its own predicted
    # features, as it drafts (EAGLE-3's training-time test). Held-out agreement is measured at depth 1.
    train_depth: int = 1

    def __post_init__(self) -> None:
        for name in ("samples", "max_new_tokens", "epochs", "save_every", "forward_rows", "train_depth"):
            if getattr(self, name) < 1:
                raise EvospecError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.batch_rows < 2:
            raise EvospecError(f"batch-rows must be >= 2, got {self.batch_rows}")
        if self.head_vocab is not None and self.head_vocab < 1:
            raise EvospecError(f"head-vocab must be >= 1, got {self.head_vocab}")
        if self.max_steps is not None and self.max_steps < 1:
            raise EvospecError(f"max-steps must be >= 1, got {self.max_steps}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise EvospecError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.holdout < 1:
            raise EvospecError(f"the held-out share must be in [0, 1), got {self.holdout}")
        if not self.grad_clip > 0:
            raise EvospecError(f"grad-clip must be > 0, got {self.grad_clip}")
        if self.start_from is not None and self.head_vocab is not None:
            raise EvospecError("--head-vocab sizes a new drafter; --from keeps its checkpoint's vocabulary")


# How a drafted reasoning step is judged (evospec.reasoning.judges): by the target on a judge prompt, or
# by sentence embeddings.
JUDGE_KINDS = ("target", "embedding")


@dataclass(frozen=True)
class StepConfig:
    """How step-level speculation (evospec.reasoning) cuts and judges steps. Each default is defined here, once."""

    delimiter: str = "\n\n"  # a step ends with the token that completes this text (after its first words)
    max_step_tokens: int = 256  # a longer step ends here
    judge: str = "target"  # one of JUDGE_KINDS
    similarity: float = 0.95  # the embedding judge's cosine threshold
    # A drafted step stands only if it states the numbers the target's step states (for arithmetic,
    # where a judge may take a wrong result for the right one); off: the judge alone decides.
    same_numbers: bool = False
    # Every step emitted is the target's own, so the output is plain decoding's: the verdicts are only
    # counted and learned from (lossless learning while serving, and what a replay of recorded answers
    # can measure, since it knows the target's steps only on the target's own answer).
    follow_target: bool = False
    # Steps the drafter writes a round. Above 1, the target writes its versions of all of them side by
    # side (Lookahead Reasoning's batch: one pass over every drafted step, then one forked sequence a
    # step that parts from the target's, decoding together), greedily.
    lookahead: int = 1

    def __post_init__(self) -> None:
        if self.lookahead < 1:
            raise EvospecError(f"lookahead is the steps drafted a round, >= 1, got {self.lookahead}")
        if self.judge not in JUDGE_KINDS:
            raise EvospecError(f"unknown judge {self.judge!r}; choose one of {', '.join(JUDGE_KINDS)}")
        if not self.delimiter:
            raise EvospecError("the step delimiter must not be empty")
        if self.max_step_tokens < 1:
            raise EvospecError(f"max-step-tokens must be >= 1, got {self.max_step_tokens}")
        if not -1.0 <= self.similarity <= 1.0:
            raise EvospecError(f"the similarity threshold is a cosine in [-1, 1], got {self.similarity}")
