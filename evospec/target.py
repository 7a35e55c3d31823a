"""A causal LM with a trimmable KV cache: the target, and the small-LM drafter too."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import DynamicCache, PreTrainedModel

HEAD_ROWS_PER_CALL = 256  # prompt rows per output-layer call when a prefill scores every prompt token


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


class CachedLM:
    """The hf backend's LanguageModel. Wraps any Hugging Face causal LM; the cache holds the first `length` tokens of one sequence.

    forward() appends tokens to the cache and returns their logits; trim() drops tokens from the end,
    which is how a rejected draft is forgotten.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.length = 0

    def reset(self) -> None:
        """Forget every cached token."""
        self.cache = DynamicCache(config=self.model.config)
        self.length = 0

    def forward(self, token_ids: Sequence[int], num_logits: int = 0) -> torch.Tensor:
        """Append token_ids [n] to the cache -> logits [n, V] on the CPU (the last num_logits rows only, if > 0)."""
        return self._forward(token_ids, num_logits, hidden_states=False).logits[0].cpu()

    def forward_with_hidden(self, token_ids: Sequence[int], num_logits: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Like forward, for drafters that read the model's features -> (logits [r, V], final hidden states [r, H])."""
        out = self._forward(token_ids, num_logits, hidden_states=True)
        rows = out.logits.shape[1]
        return out.logits[0].cpu(), out.hidden_states[-1][0, -rows:].cpu()

    def forward_prompt(self, token_ids: Sequence[int], top_k: int, rows: int) -> PromptPass:
        """Append a prompt -> PromptPass. The last token's logits are computed as forward(num_logits=1)
        computes them; the other rows' come from the output layer applied to the hidden states, a
        few hundred rows at a time (a prompt's full [n, V] logits would take gigabytes)."""
        out = self._forward(token_ids, 1, hidden_states=True)
        hidden = out.hidden_states[-1][0, -rows:]  # [r, H] on the model's device
        head = self.model.get_output_embeddings()
        with torch.inference_mode():
            tops = [top_next_tokens(head(hidden[start : start + HEAD_ROWS_PER_CALL]), top_k)
                    for start in range(0, hidden.shape[0], HEAD_ROWS_PER_CALL)]
        ids, probs = zip(*tops)
        return PromptPass(out.logits[0].cpu(), hidden.float().cpu(), torch.cat(ids).cpu(), torch.cat(probs).cpu())

    @torch.inference_mode()
    def _forward(self, token_ids: Sequence[int], num_logits: int, hidden_states: bool):
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.model.device)  # [1, n]
        out = self.model(
            input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=num_logits,
            output_hidden_states=hidden_states,
        )
        self.length += input_ids.shape[1]
        return out

    def trim(self, length: int) -> None:
        """Keep the first `length` cached tokens."""
        if length < self.length:
            self.cache.crop(length - self.length)  # crop takes the (negative) number of tokens to drop
            self.length = length
