"""The Drafter protocol."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from evospec.sampling import Sampler
from evospec.types import Draft, RoundFeedback


class Drafter(Protocol):
    """Proposes up to k tokens that may follow a context. A drafter never sees another drafter."""

    name: str
    needs_hidden_states: bool  # True: a white-box drafter; the engine sends it every round's RoundFeedback
    learnable: bool  # True: a learner may update it (evospec.learning)
    # True: no model runs, so a draft costs next to nothing and the draft-length policy may ask for a
    # whole one every round, learning from the part it leaves unverified.
    model_free: bool

    def begin(self, prompt_ids: list[int], prediction: Sequence[int]) -> bool:
        """A new request starts with these prompt token ids; prediction: the output the client expects
        (OpenAI Predicted Outputs), as token ids, empty when it gave none. Whether the drafter has
        anything to draft from in this request: one that has not sits it out (the selector skips it)."""

    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        """Draft at most k tokens after context (all token ids so far, prompt included)."""

    def observe(self, feedback: RoundFeedback) -> None:
        """What the target said this round (white-box drafters only; the engine calls no other)."""


class ModelFreeDrafter:
    """What the drafters that run no model share: no hidden states to read, nothing to learn, and a
    draft that costs next to nothing."""

    needs_hidden_states = False
    learnable = False
    model_free = True


def empty_draft() -> Draft:
    """A draft of no tokens: the round is a plain decoding step."""
    return Draft(tokens=torch.empty(0, dtype=torch.long), probs=None)


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of a and b."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case, compared in C
        return n
    return next(i for i in range(n) if a[i] != b[i])


def match_lengths(source: np.ndarray, ends: np.ndarray, context: np.ndarray, limit: int) -> np.ndarray:
    """[len(ends)] int64: for each end e, how many of the tokens just before source[e] equal the last
    tokens of context, in order from the last (at most limit). A draft that continues source at e
    continues a match of that length."""
    lengths = np.zeros(len(ends), dtype=np.int64)
    alive = np.ones(len(ends), dtype=bool)
    for i in range(min(limit, len(context))):
        at = ends - 1 - i
        alive &= at >= 0
        alive[alive] = source[at[alive]] == context[-1 - i]
        if not alive.any():
            break
        lengths += alive
    return lengths


def match_label(length: int) -> str:
    """A draft's label from the length of the match it continues, in powers of two (match1, match2,
    match4, ...): the draft-length policy learns how often each kind of draft is right."""
    return f"match{1 << (length.bit_length() - 1)}" if length > 0 else "match0"
