"""Logits -> probabilities (temperature, top-k, top-p) and seeded draws.

The same transform is applied to the target's logits (p) and the drafter's logits (q), so that
rejection sampling compares distributions of the same kind.
"""

from __future__ import annotations

import torch

from evospec.config import SamplingConfig


class Sampler:
    """Applies one SamplingConfig and draws every random number of a request from one generator."""

    def __init__(self, config: SamplingConfig) -> None:
        self.config = config
        self.generator = torch.Generator().manual_seed(config.seed)

    @property
    def greedy(self) -> bool:
        return self.config.greedy

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [n, V] (any float dtype) -> probabilities [n, V] float32 after temperature, top-k, top-p."""
        scores = logits.float() / self.config.temperature
        if self.config.top_k and self.config.top_k < scores.shape[-1]:
            kth = torch.topk(scores, self.config.top_k, dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if self.config.top_p < 1.0:
            sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
            sorted_probs = sorted_scores.softmax(dim=-1)
            # Drop a token when the mass before it already reaches top_p; the most likely one always stays.
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            drop_sorted = mass_before >= self.config.top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            scores = scores.masked_fill(drop, float("-inf"))
        return scores.softmax(dim=-1)

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        """probs [n, V] -> one token id per row [n] (int64)."""
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)

    def uniform(self, n: int) -> torch.Tensor:
        """n draws from U[0, 1) [n], for accept/reject decisions."""
        return torch.rand(n, generator=self.generator)
