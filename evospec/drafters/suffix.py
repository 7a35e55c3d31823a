"""A suffix drafter that learns from every output it has seen: no model, no training, no probabilities.

It keeps one corpus of token ids (earlier requests' prompts and outputs, then the current context)
and an index from each n-gram (n in min_ngram..max_ngram) to the corpus position that followed its
latest occurrence. A draft continues the longest suffix of the context found in the index, so a
reply that repeats an earlier one (the same question asked again, boilerplate, code that recurs) is
drafted whole. Lookups cost O(max_ngram) whatever the corpus size.

As in SuffixDecoding (Oliaro et al. 2024, arXiv 2411.04975), a draft is as long as the match it
continues allows: at most `spec_factor` tokens per matched token, so a long match (text being copied)
drafts far ahead and a two-token coincidence drafts little.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from evospec.drafters.base import ModelFreeDrafter, empty_draft, match_label
from evospec.errors import EvospecError
from evospec.sampling import Sampler
from evospec.types import Draft


@dataclass(frozen=True)
class SuffixConfig:
    max_ngram: int = 6  # longest suffix looked up first
    min_ngram: int = 2  # a single-token match says too little to draft on
    max_corpus_tokens: int = 1_000_000  # past this the oldest half is forgotten
    spec_factor: float = 1.0  # drafted tokens per matched token (SuffixDecoding's max_spec_factor)
    max_match: int = 64  # matches are measured up to this many tokens

    def __post_init__(self) -> None:
        if (
            not (1 <= self.min_ngram <= self.max_ngram <= self.max_match)
            or self.max_corpus_tokens < 2
            or not self.spec_factor > 0
        ):
            raise EvospecError(f"invalid suffix drafter settings: {self}")


class SuffixDrafter(ModelFreeDrafter):
    """Drafts the continuation of the context's longest suffix seen before, in this or earlier requests."""

    name = "suffix"

    def __init__(self, config: SuffixConfig = SuffixConfig()) -> None:
        self.config = config
        self._corpus: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}  # n-gram -> corpus position of the token after it
        self._context_start = 0  # corpus position of the current context's first token

    def begin(self, prompt_ids: list[int], prediction: Sequence[int]) -> bool:
        if len(self._corpus) + len(prompt_ids) > self.config.max_corpus_tokens:
            self._forget_oldest_half()
        self._context_start = len(self._corpus)
        return True

    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        self._index(context)
        for n in range(min(self.config.max_ngram, len(context)), self.config.min_ngram - 1, -1):
            position = self._next.get(tuple(context[-n:]))
            if position is not None:
                matched = self._match_length(context, position, n)
                size = min(k, math.ceil(self.config.spec_factor * matched))
                tokens = self._corpus[position : position + size]
                return Draft(torch.tensor(tokens, dtype=torch.long), None, label=match_label(matched))
        return empty_draft()

    def _match_length(self, context: list[int], position: int, known: int) -> int:
        """How many tokens before corpus[position] equal the context's last ones (known of them do), up to max_match."""
        matched = known
        while (
            matched < min(self.config.max_match, len(context), position)
            and self._corpus[position - 1 - matched] == context[-1 - matched]
        ):
            matched += 1
        return matched

    def _index(self, context: list[int]) -> None:
        """Append the context tokens not yet in the corpus and index the n-grams they complete."""
        for token in context[len(self._corpus) - self._context_start :]:
            end = len(self._corpus)  # the n-grams ending just before `token` are now followed by it
            for n in range(self.config.min_ngram, min(self.config.max_ngram, end) + 1):
                self._next[tuple(self._corpus[end - n : end])] = end
            self._corpus.append(token)

    def _forget_oldest_half(self) -> None:
        kept = self._corpus[len(self._corpus) // 2 :]
        self._corpus, self._next = [], {}
        self._context_start = 0
        self._index(kept)
