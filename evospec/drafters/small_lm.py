"""An independent small LM with its own KV cache."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from evospec.drafters.base import common_prefix_length
from evospec.sampling import Sampler
from evospec.target import LanguageModel
from evospec.types import Draft


class SmallLMDrafter:
    """Drafts autoregressively with a small causal LM that shares the target's tokenizer.

    Its cache holds `cached_ids`. Each round it keeps the part that agrees with the context (what was
    accepted), trims the rest (what was rejected) and catches up on the tokens it did not draft.
    """

    needs_hidden_states = False
    learnable = False
    model_free = False

    def __init__(self, lm: LanguageModel, name: str) -> None:
        self.lm = lm
        self.name = name
        self.cached_ids: list[int] = []

    def begin(self, prompt_ids: list[int], prediction: Sequence[int]) -> bool:
        self.lm.reset()
        self.cached_ids = []
        return True

    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        # Catch up: keep the agreeing prefix; always re-feed at least the last token to get its logits.
        keep = min(common_prefix_length(self.cached_ids, context), len(context) - 1)
        self.lm.trim(keep)
        logits = self.lm.forward(context[keep:], num_logits=1)  # [1, V]
        self.cached_ids = list(context)
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        for step in range(k):
            if sampler.greedy:
                token = int(logits[-1].argmax())
            else:
                q = sampler.probs(logits[-1:])  # [1, V]
                token = int(sampler.sample(q))
                probs.append(q[0])
            tokens.append(token)
            if step < k - 1:  # the last draft token is fed next round, if accepted
                logits = self.lm.forward([token])
                self.cached_ids.append(token)
        return Draft(
            tokens=torch.tensor(tokens, dtype=torch.long),
            probs=torch.stack(probs) if probs else None,
        )
