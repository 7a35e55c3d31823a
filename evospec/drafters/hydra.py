"""Hydra-style sequentially dependent draft heads (Ankner et al. 2024, arXiv 2402.05109): head i reads
the target's feature, the pending token and the i tokens drafted before it."""

from __future__ import annotations

import torch

from evospec.drafters.whitebox import ReducedVocab, WhiteBoxConfig, WhiteBoxDrafter, load_weights
from evospec.learnable import Trace, TrainingOutputs
from evospec.models.backend import TokenMatrices
from evospec.sampling import Sampler
from evospec.types import Draft


class HydraModule(torch.nn.Module):
    """Head i: [f, e(x), e(y_1) .. e(y_i)] -> linear -> residual SiLU block -> a feature for the shared head."""

    def __init__(self, config: WhiteBoxConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.inputs = torch.nn.ModuleList(torch.nn.Linear((i + 2) * hidden, hidden) for i in range(config.num_heads))
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(config.num_heads))

    def forward(self, head: int, features: torch.Tensor, embeddings: torch.Tensor) -> torch.Tensor:
        """features [n, H], embeddings [n, head + 1, H] of x, y_1 .. y_head -> head's features [n, H]."""
        state = self.inputs[head](torch.cat([features, embeddings.flatten(1)], dim=-1))
        return state + torch.nn.functional.silu(self.blocks[head](state))


class HydraDrafter(WhiteBoxDrafter):
    """Drafts up to num_heads tokens, one head after another, from the feature before the pending token."""

    def __init__(
        self, name: str, config: WhiteBoxConfig, tokens: TokenMatrices, vocab: ReducedVocab, state: dict | None = None
    ) -> None:
        module = HydraModule(config)
        if state is not None:
            load_weights(module, state)
        super().__init__(name, config, module, tokens, vocab)

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        feature = self.features[len(context) - 2][None]  # [1, H]
        embeddings = self.tokens.embed(torch.tensor(context[-1:]))  # [1, H]: x
        tokens, probs = [], []
        for head in range(min(k, self.config.num_heads)):
            predicted = self.module(head, feature, embeddings[None])
            token, q = self.pick(self.draft_logits(predicted)[0], sampler)
            tokens.append(token)
            if q is not None:
                probs.append(q)
            embeddings = torch.cat([embeddings, self.tokens.embed(torch.tensor([token]))])
        return self.draft(tokens, probs)

    def training_outputs(self, module: torch.nn.Module, trace: Trace, depth: int = 1) -> TrainingOutputs:
        """Teacher-forced predictions of module (this drafter's or a copy): head i at t >= 1 reads f_{t-1}
        and tokens t..t+i, and is scored at row t + i. Each head is a draft depth of its own, so there is
        nothing to unroll: depth is 1."""
        embeddings = self.tokens.embed(trace.tokens)  # [T, H]
        logits, rows = [], []
        for head in range(self.config.num_heads):
            starts = torch.arange(1, trace.length - head)
            if starts.numel() == 0:
                break
            window = embeddings[starts[:, None] + torch.arange(head + 1)]  # [n, head + 1, H]
            logits.append(self.head_logits(module(head, trace.hidden[starts - 1], window)))
            rows.append(starts + head)
        return TrainingOutputs(torch.cat(logits), torch.cat(rows), features=None, feature_rows=None)
