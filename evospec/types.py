"""Values passed between the engine, drafters and (later) learners and selectors."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Draft:
    """What a drafter proposes for one round."""

    tokens: torch.Tensor  # [m] int64, m <= k: drafted token ids, in order
    probs: torch.Tensor | None  # [m, V] float32: q at each drafted position; None: q is one-hot on tokens
    label: str = ""  # what kind of draft this is (e.g. an n-gram match length); acceptance is tracked per label

    @property
    def size(self) -> int:
        return int(self.tokens.numel())

    def truncated(self, size: int) -> Draft:
        """The first `size` tokens of this draft (q unchanged at each kept position)."""
        if size >= self.size:
            return self
        probs = None if self.probs is None else self.probs[:size]
        return Draft(self.tokens[:size], probs, self.label)


@dataclass(frozen=True)
class Verdict:
    """The target's judgement of one draft.

    emitted = tokens[:num_accepted] of the draft + one token from the target: the recovered token at
    the first rejection, or the bonus token after full acceptance.
    """

    num_accepted: int  # accepted draft tokens, 0..m
    emitted: list[int]  # num_accepted + 1 token ids to append to the context
    target_argmax: torch.Tensor | None = None  # [m + 1] argmax p at each position; greedy verification only


@dataclass(frozen=True)
class Attempt:
    """One drafter's turn in a round: what it was asked for and what it drafted."""

    drafter: str  # the name of the drafter the selector picked
    draft: Draft  # what will be verified (possibly cut short by the draft-length policy)
    asked: int  # tokens asked of the drafter; 0 when the policy chose a plain step
    draft_s: float  # seconds in the drafter's propose, catch-up on unseen tokens included
