"""Prompt-lookup drafting: no model, no probabilities (q is one-hot)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from evospec.config import NgramConfig
from evospec.drafters.base import ModelFreeDrafter, empty_draft, match_label, match_lengths
from evospec.sampling import Sampler
from evospec.types import Draft


class NgramDrafter(ModelFreeDrafter):
    """Finds the earlier place in the context whose preceding tokens match the context's end longest
    (the latest among equals) and proposes up to k of the tokens that followed it. Pays off where
    output copies input: summaries, RAG, edits."""

    name = "ngram"

    def __init__(self, config: NgramConfig = NgramConfig()) -> None:
        self.config = config

    def begin(self, prompt_ids: list[int], prediction: Sequence[int]) -> bool:
        """Nothing to prepare: the context is searched afresh each round."""
        return True

    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        tokens = np.asarray(context, dtype=np.int64)
        ends = np.arange(1, len(tokens))  # a continuation starts at each earlier position
        lengths = match_lengths(tokens, ends, tokens, self.config.max_ngram)
        longest = int(lengths.max(initial=0))
        if longest < self.config.min_ngram:
            return empty_draft()
        start = int(ends[lengths == longest][-1])
        return Draft(tokens=torch.from_numpy(tokens[start : start + k].copy()), probs=None, label=match_label(longest))
