"""An EAGLE-style feature drafter (Li et al. 2024, arXiv 2401.15077): one decoder layer over [token
embedding, target feature] that predicts the next feature, drafting autoregressively on its own predictions."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, LlamaConfig, LlamaModel

from evospec.drafters.whitebox import ReducedVocab, WhiteBoxConfig, WhiteBoxDrafter, load_weights
from evospec.learnable import Trace, TrainingOutputs
from evospec.models.backend import TokenMatrices
from evospec.sampling import Sampler
from evospec.types import Draft

HEAD_DIM = 128  # attention head width (the Qwen2.5 and Llama one); smaller targets get one head


class EagleModule(torch.nn.Module):
    """fc([e(x_t), f_{t-1}]) -> one Llama decoder layer (its own KV cache, final norm) -> up -> predicted f_t.

    The layer runs at config.width, narrower than the target's features where that is smaller: a
    draft step reads every weight once, and on a CPU those bytes are its cost.
    """

    def __init__(self, config: WhiteBoxConfig, context_length: int) -> None:
        super().__init__()
        width = min(config.width, config.hidden_size)
        heads = max(1, width // HEAD_DIM)
        self.fc = torch.nn.Linear(2 * config.hidden_size, width)
        self.up = torch.nn.Linear(width, config.hidden_size)
        self.layer = LlamaModel(
            LlamaConfig(
                vocab_size=1,
                hidden_size=width,
                intermediate_size=config.intermediate_size,
                num_hidden_layers=1,
                num_attention_heads=heads,
                num_key_value_heads=max(1, heads // 4) if heads % 4 == 0 else heads,
                max_position_embeddings=context_length,
                bos_token_id=None,
                eos_token_id=None,
                pad_token_id=None,
            )
        )
        self.layer.embed_tokens.requires_grad_(False)  # inputs come as embeddings; this table is unused

    def forward(
        self, embeddings: torch.Tensor, features: torch.Tensor, cache: DynamicCache | None = None
    ) -> torch.Tensor:
        """embeddings [n, H] of tokens x_t, features [n, H] f_{t-1} -> predicted features [n, H]."""
        inputs = self.fc(torch.cat([embeddings, features], dim=-1))
        return self.up(
            self.layer(inputs_embeds=inputs[None], cache=cache, use_cache=cache is not None).last_hidden_state[0]
        )


class EagleDrafter(WhiteBoxDrafter):
    """Drafts with an EagleModule. Its cache holds the positions from the first generated token on
    whose inputs were exact (verified tokens and the target's own features); drafted positions,
    fed with predicted features, are trimmed away before the next draft."""

    def __init__(
        self,
        name: str,
        config: WhiteBoxConfig,
        tokens: TokenMatrices,
        vocab: ReducedVocab,
        context_length: int,
        state: dict | None = None,
    ) -> None:
        module = EagleModule(config, context_length)
        if state is not None:
            load_weights(module, state, strict=False)  # the unused embedding table is not saved
        super().__init__(name, config, module, tokens, vocab)
        self.cache = self._new_cache()
        self.origin = 0  # context position of the first cache entry
        self.exact = 0  # cache entries fed with exact inputs

    def begin(self, prompt_ids: list[int], prediction: Sequence[int]) -> bool:
        self.cache = self._new_cache()
        self.origin, self.exact = len(prompt_ids), 0
        return super().begin(prompt_ids, prediction)

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, sampler: Sampler) -> Draft:
        # Catch up on verified positions (and the pending token) with exact inputs, in one pass.
        end = len(context)
        self._trim(self.exact)
        start = self.origin + self.exact
        ids = torch.tensor(context[start:end])
        features = torch.stack([self.features[position - 1] for position in range(start, end)])
        predicted = self.module(self.tokens.embed(ids), features, self.cache)[-1:]
        self.exact = end - self.origin
        tokens, probs = [], []
        for step in range(k):
            token, q = self.pick(self.draft_logits(predicted)[0], sampler)
            tokens.append(token)
            if q is not None:
                probs.append(q)
            if step < k - 1:
                predicted = self.module(self.tokens.embed(torch.tensor([token])), predicted, self.cache)
        return self.draft(tokens, probs)

    def _new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.module.layer.config)

    def _trim(self, entries: int) -> None:
        length = self.cache.get_seq_length()
        if length > entries:
            self.cache.crop(entries - length)  # crop takes the (negative) number of entries to drop

    def training_outputs(self, module: torch.nn.Module, trace: Trace) -> TrainingOutputs:
        """Teacher-forced predictions of module (this drafter's or a copy) over a trace: at t >= 1,
        from x_t and f_{t-1}."""
        predicted = module(self.tokens.embed(trace.tokens[1:]), trace.hidden[:-1])  # [T-1, H]
        return TrainingOutputs(
            logits=self.head_logits(predicted),
            rows=torch.arange(1, trace.length),
            features=predicted,
            feature_rows=torch.arange(1, trace.length),
        )
