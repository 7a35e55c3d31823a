"""An EAGLE-style feature drafter (Li et al. 2024, arXiv 2401.15077): one decoder layer over [token
embedding, target feature] that predicts the next feature, drafting autoregressively on its own predictions."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from evospec.drafters.whitebox import ReducedVocab, WhiteBoxConfig, WhiteBoxDrafter, load_weights
from evospec.learnable import Trace, TrainingOutputs
from evospec.models.backend import TokenMatrices
from evospec.sampling import Sampler
from evospec.types import Draft

HEAD_DIM = 128  # attention head width (the Qwen2.5 and Llama one); smaller targets get one head


class DecoderLayer(torch.nn.Module):
    """One Llama decoder layer with its rotary embedding and final norm, under LlamaModel's parameter
    names. Called directly rather than through LlamaModel, whose per-call mask building and output
    hooks cost a one-layer draft step as much as the layer's own matmuls on a CPU."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = torch.nn.ModuleList([LlamaDecoderLayer(config, layer_idx=0)])
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        for module in self.modules():  # LlamaModel's initialisation
            if isinstance(module, torch.nn.Linear):
                torch.nn.init.normal_(module.weight, std=config.initializer_range)

    def forward(self, inputs: torch.Tensor, cache: DynamicCache | None) -> torch.Tensor:
        """inputs [1, n, width] after the cache's positions -> outputs [1, n, width]."""
        past = cache.get_seq_length() if cache is not None else 0
        count = inputs.shape[1]
        positions = torch.arange(past, past + count)[None]
        # Causal attention over the cache too. One query attends everything, and without a cache SDPA's
        # own causal mask is right.
        mask = None
        if count > 1 and past:
            mask = (torch.arange(past + count)[None, :] <= positions[0, :, None])[None, None]
        return self.attend(inputs, positions, mask, cache)

    def attend(
        self, inputs: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache: DynamicCache | None
    ) -> torch.Tensor:
        """inputs [1, n, width] at rotary positions [1, n], attending the cache's entries and their own
        where mask [1, 1, n, cached + n] says (None: causally) -> outputs [1, n, width]; the cache keeps them."""
        hidden = self.layers[0](
            inputs,
            attention_mask=mask,
            position_ids=positions,
            cache=cache,
            use_cache=cache is not None,
            position_embeddings=self.rotary_emb(inputs, positions),
        )
        return self.norm(hidden)


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
        self.layer = DecoderLayer(
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
                attn_implementation="sdpa",
            )
        )
        self.register_load_state_dict_pre_hook(_drop_legacy_embedding)

    def forward(
        self, embeddings: torch.Tensor, features: torch.Tensor, cache: DynamicCache | None = None
    ) -> torch.Tensor:
        """embeddings [n, H] of tokens x_t, features [n, H] f_{t-1} -> predicted features [n, H]."""
        inputs = self.fc(torch.cat([embeddings, features], dim=-1))
        return self.up(self.layer(inputs[None], cache)[0])

    def unrolled(self, embeddings: torch.Tensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Predicted features of `steps` draft positions at every row, as drafting makes them (EAGLE-3's
        training-time test). Row i holds token x_{i+1} (embeddings [n, H]) and, in step 0, the target's
        feature f_i (features [n, H]); step j > 0 reads step j-1's prediction at row i-1 instead, and
        attends the exact rows up to i-j and its own chain, as the j-th drafted token attends a draft's
        cache. -> [n - j, H] for each step j, row r predicting f of row r + j + 1."""
        cache = DynamicCache(config=self.layer.config)
        count = embeddings.shape[0]
        key_step, key_row = torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long)
        outputs, previous = [], features
        for step in range(min(steps, count)):
            rows = torch.arange(step, count)  # the rows this step predicts at
            key_step = torch.cat([key_step, torch.full_like(rows, step)])
            key_row = torch.cat([key_row, rows])
            base = rows[:, None] - step  # the last exact row each query attends
            mask = ((key_step == 0) & (key_row <= base)) | ((key_step > 0) & (key_row == base + key_step))
            inputs = self.fc(torch.cat([embeddings[step:], previous], dim=-1))
            predicted = self.up(self.layer.attend(inputs[None], rows[None], mask[None, None], cache)[0])
            outputs.append(predicted)
            previous = predicted[:-1]
        return outputs


def _drop_legacy_embedding(module, state: dict, prefix: str, *args) -> None:
    """Weights saved while the layer was a LlamaModel hold its unused one-row embedding table: drop it."""
    state.pop(f"{prefix}layer.embed_tokens.weight", None)


class EagleDrafter(WhiteBoxDrafter):
    """Drafts with an EagleModule. Its cache holds the positions from the first generated token on
    whose inputs were exact (verified tokens and the target's own features); drafted positions,
    fed with predicted features, are trimmed away before the next draft."""

    unrolls = True

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
            load_weights(module, state)
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

    def training_outputs(self, module: torch.nn.Module, trace: Trace, depth: int = 1) -> TrainingOutputs:
        """Predictions of module (this drafter's or a copy) over a trace at t >= 1: from x_t and f_{t-1},
        and at draft depths 2..depth from x_t and the module's own prediction of f_{t-1} (unrolled)."""
        predicted = module.unrolled(self.tokens.embed(trace.tokens[1:]), trace.hidden[:-1], depth)
        rows = torch.cat([torch.arange(1 + step, trace.length) for step in range(len(predicted))])
        features = torch.cat(predicted)
        return TrainingOutputs(logits=self.head_logits(features), rows=rows, features=features, feature_rows=rows)
