"""Prompt-lookup drafting: no model, no probabilities (q is one-hot)."""

from __future__ import annotations

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from evospec.config import NgramConfig
from evospec.drafters.base import empty_draft
from evospec.sampling import Sampler
from evospec.types import Draft


class NgramDrafter:
    """Finds the latest earlier occurrence of the context's last n tokens (longest n first) and
    proposes the tokens that followed it. Pays off where output copies input: summaries, RAG, edits."""

    name = "ngram"

    needs_hidden_states = False
    learnable = False

    def __init__(self, config: NgramConfig = NgramConfig()) -> None:
        self.config = config

    def begin(self, prompt_ids: list[int]) -> None:
        """Nothing to prepare: the context is searched afresh each round."""

    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        tokens = np.asarray(context, dtype=np.int64)
        for n in range(min(self.config.max_ngram, len(tokens) - 1), self.config.min_ngram - 1, -1):
            # Windows that start before the suffix itself, so that a continuation exists.
            windows = sliding_window_view(tokens[:-1], n)  # [L - n, n]
            hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
            if hits.size:
                start = hits[-1] + n
                return Draft(tokens=torch.from_numpy(tokens[start : start + k].copy()), probs=None, label=f"match{n}")
        return empty_draft()
