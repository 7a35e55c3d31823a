"""The request's predicted output as a drafter (OpenAI Predicted Outputs): no model, no probabilities.

A client that knows most of the answer (the code it asks to edit, a document to correct) sends it as
the prediction. The drafter follows the output along the prediction and drafts what comes next there.
Where the output departs from it (an edit), it finds its place again: by the longest run of the
output's last tokens that occurs in the prediction, the nearest to where it was. A short run says
little (a newline occurs everywhere), so it must lie near that place; a long one may lie anywhere.
Without such a run, it takes the output's new tokens as inserted and drafts from where it was. Each
draft is labelled with the length of the run it continues, so the draft-length policy learns which
drafts pay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from evospec.drafters.base import ModelFreeDrafter, common_prefix_length, empty_draft, match_label, match_lengths
from evospec.errors import EvospecError
from evospec.sampling import Sampler
from evospec.types import Draft

PREDICTION = "prediction"  # the drafter's kind and name


@dataclass(frozen=True)
class PredictionConfig:
    max_match: int = 64  # runs are measured up to this many tokens (longer ones tie)
    # How far from where the output was a run of 1, 2, 3 tokens may begin to be taken (longer: anywhere).
    short_run_reach: tuple[int, ...] = (2, 8, 32)

    def __post_init__(self) -> None:
        if self.max_match < 1 or any(reach < 0 for reach in self.short_run_reach):
            raise EvospecError(f"invalid prediction drafter settings: {self}")


class PredictionDrafter(ModelFreeDrafter):
    """Drafts the continuation of the output along the request's prediction (see the module docstring)."""

    name = PREDICTION

    def __init__(self, config: PredictionConfig = PredictionConfig()) -> None:
        self.config = config
        self._prediction = np.zeros(0, dtype=np.int64)
        self._prompt_length = 0
        self._next = 0  # index in the prediction of the token the output is expected to say next
        self._run = 0  # how many of the output's last tokens equal the prediction's just before _next
        self._seen = 0  # output tokens already accounted for

    def begin(self, prompt_ids: list[int], prediction: Sequence[int]) -> bool:
        self._prediction = np.asarray(prediction, dtype=np.int64)
        self._prompt_length = len(prompt_ids)
        self._next = self._run = self._seen = 0
        return bool(self._prediction.size)

    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        if not self._prediction.size:
            return empty_draft()
        output = context[self._prompt_length :]
        self._follow(output)
        tokens = self._prediction[self._next : self._next + k]
        return Draft(torch.from_numpy(tokens.copy()), None, label=match_label(self._run))

    def _follow(self, output: list[int]) -> None:
        """Move along the prediction over the output tokens said since the last draft."""
        new = output[self._seen :]
        self._seen = len(output)
        if not new:
            return
        expected = self._prediction[self._next : self._next + len(new)].tolist()
        agreed = common_prefix_length(expected, new)
        self._next += agreed
        self._run += agreed
        if agreed == len(new):
            return
        ends = np.arange(1, self._prediction.size + 1)
        lengths = match_lengths(
            self._prediction, ends, np.asarray(output[-self.config.max_match :]), self.config.max_match
        )
        longest = int(lengths.max())
        candidates = ends[lengths == longest]
        distances = np.abs(candidates - longest - self._next)  # from where the output was to where the run begins
        nearest = int(distances.argmin())
        reach = self.config.short_run_reach
        if longest == 0 or (longest <= len(reach) and distances[nearest] > reach[longest - 1]):
            self._run = 0  # nothing that says where the output is: take its new tokens as inserted
            return
        self._next = int(candidates[nearest])
        self._run = longest
