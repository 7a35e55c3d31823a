"""The Drafter protocol."""

from __future__ import annotations

from typing import Protocol

import torch

from evospec.sampling import Sampler
from evospec.types import Draft, RoundFeedback


class Drafter(Protocol):
    """Proposes up to k tokens that may follow a context. A drafter never sees another drafter."""

    name: str
    needs_hidden_states: bool  # True: a white-box drafter; the engine sends it every round's RoundFeedback
    learnable: bool  # True: a learner may update it (evospec.learning)

    def begin(self, prompt_ids: list[int]) -> None:
        """A new request starts with these prompt token ids."""

    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        """Draft at most k tokens after context (all token ids so far, prompt included)."""

    def observe(self, feedback: RoundFeedback) -> None:
        """What the target said this round (white-box drafters only; the engine calls no other)."""


def empty_draft() -> Draft:
    """A draft of no tokens: the round is a plain decoding step."""
    return Draft(tokens=torch.empty(0, dtype=torch.long), probs=None)
