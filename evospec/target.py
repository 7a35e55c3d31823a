"""The LanguageModel protocol: a causal LM with a trimmable KV cache, the target and the small-LM drafter too.

Each backend (evospec/models/) has its own; the engine and the drafters see only this protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

FEEDBACK_TOP_K = 16  # the target's most likely next tokens kept per verified position for learners


@dataclass(frozen=True)
class PromptPass:
    """A prefill that says what the target thinks at every prompt token, for learners: the prompt is
    text the target has read, so its features and next-token distributions there are feedback too."""

    logits: torch.Tensor  # [1, V] at the last token, exactly as forward(num_logits=1) returns them
    hidden: torch.Tensor  # [r, H] float32 final hidden states at each of the last r tokens
    top_ids: torch.Tensor  # [r, K] int64 the most likely next tokens after each of them
    top_probs: torch.Tensor  # [r, K] float32 their probabilities (temperature 1)


def top_next_tokens(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits [n, V] -> the k most likely next tokens [n, k] and their softmax probabilities [n, k] float32."""
    logits = logits.float()
    top = logits.topk(k, dim=-1)
    return top.indices, (top.values - logits.logsumexp(dim=-1, keepdim=True)).exp()


@torch.no_grad()
def full_pass(
    lm: LanguageModel, ids: Sequence[int], top_k: int, rows_per_pass: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass of lm (from an empty cache, left empty) over ids, rows_per_pass tokens a forward ->
    what it says at every position: final hidden states [T, H] float32, the top_k next tokens [T, K]
    and their probabilities [T, K]. New tensors (not views of a backend's buffers, not inference
    tensors), so that a drafter may train on them."""
    lm.reset()
    hidden, top_ids, top_probs = [], [], []
    for start in range(0, len(ids), rows_per_pass):
        piece = ids[start : start + rows_per_pass]
        logits, states = lm.forward_with_hidden(piece, num_logits=len(piece))
        piece_ids, piece_probs = top_next_tokens(logits, top_k)
        hidden.append(states.float().clone())
        top_ids.append(piece_ids.clone())
        top_probs.append(piece_probs.clone())
    lm.reset()
    return torch.cat(hidden), torch.cat(top_ids), torch.cat(top_probs)


class LanguageModel(Protocol):
    """What the engine and the small-LM drafter need of a model, whatever runs it (hf or llama.cpp).
    Its outputs are CPU tensors wherever the model runs: the loop, verification, drafters and
    learners see one kind of tensor."""

    length: int  # tokens in the cache

    def reset(self) -> None:
        """Forget every cached token."""

    def forward(self, token_ids: Sequence[int], num_logits: int = 0) -> torch.Tensor:
        """Append token_ids [n] to the cache -> logits [n, V] (the last num_logits rows only, if > 0)."""

    def forward_with_hidden(self, token_ids: Sequence[int], num_logits: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Like forward -> (logits [r, V], final hidden states [r, H]) at the last r = num_logits rows (all if 0).

        The hidden states are the ones the output layer reads (after the final norm).
        """

    def forward_prompt(self, token_ids: Sequence[int], top_k: int, rows: int) -> PromptPass:
        """Append a prompt to the (empty) cache -> its last token's logits, and hidden states and the
        top_k next tokens at each of its last `rows` (>= 1) tokens (every token of a shorter prompt)."""

    def trim(self, length: int) -> None:
        """Keep the first `length` cached tokens."""


class BranchingLM(LanguageModel, Protocol):
    """A LanguageModel whose cache forks: branches from a common prefix that decode side by side (one
    llama.cpp call over several sequences; one forward a branch on hf). A branch is the backend's own
    handle, valid until dropped or until the cache is reset."""

    can_adopt: bool  # whether adopt() may stand in for reading the branch's tokens again, to the last bit

    def fork(self, length: int) -> Any:
        """A branch holding the first `length` (>= 1) cached tokens."""

    def forward_branches(self, branches: Sequence[Any], token_ids: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Append token_ids[i] (one or more tokens) to branches[i], side by side -> logits
        [len(token_ids[i]), V] a branch, valid until the next forward."""

    def trim_branch(self, branch: Any, length: int) -> None:
        """Keep a branch's first `length` tokens."""

    def drop(self, branch: Any) -> None:
        """Forget a branch."""

    def adopt(self, branch: Any) -> None:
        """Take a branch's cells as the cache's own, in place of what it held; the branch is gone."""
