"""A small-LM drafter with low-rank adapters (LoRA, through peft) that the online learners train while
it serves, as OSD (Liu et al. 2024, arXiv 2310.07177) trains its draft model on what the target said.

The base weights stay frozen; the adapters start at zero (LoRA's B = 0), so an untrained adapted
drafter drafts exactly what the plain small LM would. The learners see the adapters as the drafter's
`module`: its parameters are the adapter weights inside the model, and a copy of it (the ensemble's)
holds copies of only those.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from peft import LoraConfig, inject_adapter_in_model
from torch.func import functional_call
from transformers import PreTrainedModel

from evospec.drafters.small_lm import SmallLMDrafter
from evospec.errors import EvospecError
from evospec.learnable import Trace, TrainingOutputs
from evospec.models.hf import CachedLM
from evospec.sampling import Sampler
from evospec.types import Draft


@dataclass(frozen=True)
class AdapterConfig:
    """The adapters' shape and what a training step reads. Each default is defined here, once."""

    rank: int = 8
    alpha: float = 16.0  # LoRA scales the adapters' output by alpha / rank
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")  # the attention projections, as LoRA's paper
    context_tokens: int = 256  # a training step reads at most this many tokens before a trace

    def __post_init__(self) -> None:
        if self.rank < 1 or self.alpha <= 0 or self.context_tokens < 0:
            raise EvospecError(f"invalid adapter settings: {self}")


class Adapters(torch.nn.Module):
    """The adapter weights of a model as one module; `names` are their names in the model."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        named = [(name, param) for name, param in model.named_parameters() if "lora_" in name]
        if not named:
            raise EvospecError("the model has no adapter weights")
        self.names = [name for name, _ in named]
        self.weights = torch.nn.ParameterList(param for _, param in named)


class AdaptedLMDrafter(SmallLMDrafter):
    """A small LM (hf backend) whose adapters learn on line; see the module docstring."""

    learnable = True
    unrolls = False  # it drafts from tokens alone, which teacher forcing gives it at every depth

    def __init__(self, model: PreTrainedModel, name: str, config: AdapterConfig = AdapterConfig()) -> None:
        lora = LoraConfig(
            r=config.rank, lora_alpha=config.alpha, lora_dropout=0.0, target_modules=list(config.target_modules)
        )
        try:
            inject_adapter_in_model(lora, model)
        except ValueError as error:  # peft: none of the target modules is in this model
            raise EvospecError(f"cannot add adapters to '{name}': {error}") from error
        model.requires_grad_(False)
        self.module = Adapters(model)
        self.module.requires_grad_(True)
        super().__init__(CachedLM(model), name)
        self.model = model
        self.config = config
        self.version = 0  # learning steps applied
        self._cache_version = 0  # the version whose weights computed the cached keys and values
        self.row_of = torch.arange(model.config.vocab_size)  # the drafter scores the whole vocabulary

    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        if self.version != self._cache_version:  # new weights: what the cache holds is stale
            self.cached_ids = []
            self._cache_version = self.version
        return super().propose(context, k, sampler)

    def training_outputs(self, module: torch.nn.Module, trace: Trace, depth: int = 1) -> TrainingOutputs:
        """Teacher-forced next-token logits at every trace position, with module's adapter weights, the
        last `context_tokens` tokens before the trace as context (depth is 1: nothing to unroll)."""
        prefix = trace.prefix[max(0, len(trace.prefix) - self.config.context_tokens) :]
        input_ids = torch.cat([prefix, trace.tokens])[None].to(self.model.device)
        weights = dict(zip(module.names, module.weights))
        out = functional_call(
            self.model,
            weights,
            args=(),
            kwargs={
                "input_ids": input_ids,
                "use_cache": False,
                "logits_to_keep": trace.length,
            },
        )
        logits = (
            out.logits[0].float().cpu()
        )  # the loss reads the trace's CPU tensors; gradients flow back to the device
        return TrainingOutputs(logits=logits, rows=torch.arange(trace.length), features=None, feature_rows=None)

    def step_log_likelihood(self, module: torch.nn.Module, prefix: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """log q(step | prefix), summed over the step's tokens, with module's adapter weights and the
        last `context_tokens` tokens of prefix (at least one) as context; differentiable in them."""
        context = prefix[max(0, len(prefix) - max(1, self.config.context_tokens)) :]
        input_ids = torch.cat([context, step])[None].to(self.model.device)
        weights = dict(zip(module.names, module.weights))
        out = functional_call(
            self.model,
            weights,
            args=(),
            kwargs={"input_ids": input_ids, "use_cache": False, "logits_to_keep": step.numel() + 1},
        )
        log_probs = out.logits[0, :-1].float().log_softmax(-1)  # the rows that predict each step token
        return log_probs.gather(-1, step.to(log_probs.device)[:, None]).sum()
