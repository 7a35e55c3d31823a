"""The Drafter protocol."""

from __future__ import annotations

from typing import Protocol

import torch

from evospec.sampling import Sampler
from evospec.types import Draft


class Drafter(Protocol):
    """Proposes up to k tokens that may follow a context. A drafter never sees another drafter."""

    name: str

    def begin(self, prompt_ids: list[int]) -> None:
        """A new request starts with these prompt token ids."""

    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        """Draft at most k tokens after context (all token ids so far, prompt included)."""


def empty_draft() -> Draft:
    """A draft of no tokens: the round is a plain decoding step."""
    return Draft(tokens=torch.empty(0, dtype=torch.long), probs=None)
