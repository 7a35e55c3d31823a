"""The contract between drafters that learn and the learners that train them.

Learners (evospec/learning/) and learnable drafters (evospec/drafters/) both import this module and
nothing of each other: a Trace is what verification told about consecutive positions of a request,
TrainingOutputs what a drafter predicts over one, and a LearnableDrafter the drafter a learner may update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class Trace:
    """Consecutive context positions of one request, with what the target said at each."""

    tokens: torch.Tensor  # [T] int64 the token at each position
    prefix: torch.Tensor  # [P] int64 the request's tokens before the first position
    hidden: torch.Tensor | None  # [T, H] float32 the target's final hidden state there
    top_ids: torch.Tensor  # [T, K] int64 the target's most likely next tokens
    top_probs: torch.Tensor  # [T, K] float32 their probabilities
    rejected: torch.Tensor  # [T] bool: a drafted next token was rejected here (OSD learns from these)

    @property
    def length(self) -> int:
        return int(self.tokens.numel())

    @property
    def nbytes(self) -> int:
        tensors = (self.tokens, self.prefix, self.hidden, self.top_ids, self.top_probs, self.rejected)
        return sum(tensor.nbytes for tensor in tensors if tensor is not None)

    def window(self, start: int, end: int) -> Trace:
        """Rows start..end-1 as a trace of their own (the rows before them join its prefix)."""
        return Trace(
            tokens=self.tokens[start:end],
            prefix=torch.cat([self.prefix, self.tokens[:start]]),
            hidden=None if self.hidden is None else self.hidden[start:end],
            top_ids=self.top_ids[start:end],
            top_probs=self.top_probs[start:end],
            rejected=self.rejected[start:end],
        )


@dataclass(frozen=True)
class TrainingOutputs:
    """A drafter's teacher-forced predictions over a trace."""

    logits: torch.Tensor  # [S, N] over the drafter's reduced vocabulary
    rows: torch.Tensor  # [S] trace row whose next-token distribution each prediction is scored against
    features: torch.Tensor | None  # [F, H] predicted target features (EAGLE-style drafters)
    feature_rows: torch.Tensor | None  # [F] trace row of the target feature each one predicts


class LearnableDrafter(Protocol):
    """A drafter whose `module` a learner may update between rounds."""

    name: str
    learnable: bool  # False: not a drafter a learner can train
    needs_hidden_states: bool  # True: it reads the target's features (white-box), so its traces must carry them
    # True: its later draft positions read its own earlier outputs, which teacher forcing never shows it,
    # so training may unroll it over them (train_depth > 1)
    unrolls: bool
    module: torch.nn.Module
    version: int  # learning steps applied

    @property
    def row_of(self) -> torch.Tensor:
        """[V] the drafter's output row of each target id, -1 where it has none."""

    def training_outputs(self, module: torch.nn.Module, trace: Trace, depth: int = 1) -> TrainingOutputs:
        """Predictions of module (the drafter's own or a same-shaped copy) over a trace: teacher-forced,
        and for depth > 1 (drafters that unroll) also from its own outputs at the depth-1 positions before."""
