"""The methods a benchmark compares. Each turns prompt ids into SpecStats for one generation.

Method names follow shared/benchmarks.md: hf-plain, hf-assisted:<drafter>, evospec-plain,
evospec:<drafter>.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch

from evospec.config import GenerationConfig
from evospec.drafters import NgramDrafter, SmallLMDrafter
from evospec.engine import Engine
from evospec.errors import EvospecError
from evospec.models.loading import LoadedModel, context_length, eos_token_ids
from evospec.stats import SpecStats
from evospec.target import CachedLM


class BenchMethod(Protocol):
    name: str

    def run(self, prompt_ids: list[int], config: GenerationConfig) -> SpecStats:
        """Generate greedily for prompt_ids and return what it took."""


class EvospecMethod:
    """evospec's engine, with or without a drafter."""

    def __init__(self, name: str, engine: Engine) -> None:
        self.name = name
        self.engine = engine

    def run(self, prompt_ids: list[int], config: GenerationConfig) -> SpecStats:
        stats = SpecStats()
        for _ in self.engine.generate(prompt_ids, config, stats):
            pass
        return stats


class HFGenerateMethod:
    """Hugging Face `generate`, plain or with `assistant_model=` (its defaults otherwise, as users run it).
    Target forwards are counted with a hook, so that tau can be reported for it too."""

    def __init__(self, name: str, target: LoadedModel, assistant: LoadedModel | None = None) -> None:
        self.name = name
        self.target = target
        self.assistant = assistant
        self.eos = sorted(eos_token_ids(target))
        self.pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else self.eos[0]

    def run(self, prompt_ids: list[int], config: GenerationConfig) -> SpecStats:
        forwards = 0

        def count(*_):
            nonlocal forwards
            forwards += 1

        hook = self.target.model.register_forward_hook(count)
        extra = {"assistant_model": self.assistant.model} if self.assistant else {}
        input_ids = torch.tensor([prompt_ids])
        start = time.perf_counter()
        try:
            output = self.target.model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                max_new_tokens=config.max_new_tokens, eos_token_id=self.eos, pad_token_id=self.pad, **extra,
            )
        finally:
            hook.remove()
        new_tokens = output.shape[1] - len(prompt_ids)
        return SpecStats(
            num_verifications=forwards - 1,  # the first forward is the prefill
            new_tokens=new_tokens, prompt_tokens=len(prompt_ids), wall_s=time.perf_counter() - start,
        )


def build_methods(names: list[str], target: LoadedModel, draft_model: LoadedModel | None) -> list[BenchMethod]:
    """Methods by name; a name with :<drafter> uses draft_model (or the n-gram drafter for :ngram)."""
    window = context_length(target)
    eos = eos_token_ids(target)

    def engine(drafter) -> Engine:
        return Engine(CachedLM(target.model), drafter, eos, window)

    builders = {
        "hf-plain": lambda: HFGenerateMethod("hf-plain", target),
        "evospec-plain": lambda: EvospecMethod("evospec-plain", engine(None)),
        "evospec:ngram": lambda: EvospecMethod("evospec:ngram", engine(NgramDrafter())),
    }
    if draft_model is not None:
        builders[f"hf-assisted:{draft_model.name}"] = lambda: HFGenerateMethod(
            f"hf-assisted:{draft_model.name}", target, draft_model
        )
        builders[f"evospec:{draft_model.name}"] = lambda: EvospecMethod(
            f"evospec:{draft_model.name}", engine(SmallLMDrafter(CachedLM(draft_model.model), draft_model.name))
        )
    check_method_names(names, list(builders))
    return [builders[name]() for name in names]


def check_method_names(names: list[str], known: list[str]) -> None:
    """Raise a clear error for any name not among the known methods."""
    unknown = [name for name in names if name not in known]
    if unknown:
        raise EvospecError(f"unknown bench method(s) {unknown}; known: {sorted(known)}")


def method_names(draft_model_name: str) -> list[str]:
    """Every method of the engine benchmark, baselines first."""
    return ["hf-plain", f"hf-assisted:{draft_model_name}", "evospec-plain", f"evospec:{draft_model_name}", "evospec:ngram"]
