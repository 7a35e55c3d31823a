"""int8 weight-only target: close to the dense layer, batch-invariant, and lossless under the engine."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from evospec.config import GenerationConfig
from evospec.drafters import NgramDrafter, SmallLMDrafter
from evospec.engine import Engine
from evospec.models.hf import CachedLM
from evospec.models.quantize import Int8WeightLinear, quantize_int8_weights
from evospec.stats import SpecStats

from conftest import random_prompts, reference_greedy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_linear_is_close_to_the_dense_one_and_batch_invariant(dtype):
    torch.manual_seed(0)
    dense = nn.Linear(64, 48).to(dtype)
    quantized = Int8WeightLinear(dense)
    x = torch.randn(5, 64, dtype=dtype)
    together = quantized(x)
    alone = torch.cat([quantized(x[i : i + 1]) for i in range(5)])
    assert torch.equal(together, alone)  # a row's result does not depend on the other rows
    error = (together.float() - dense(x).float()).abs().max() / dense(x).float().abs().max()
    assert error < 0.03


def test_quantize_replaces_every_linear(tiny_target):
    model = quantize_int8_weights(copy.deepcopy(tiny_target))
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model.lm_head, Int8WeightLinear)


@pytest.mark.parametrize("drafter_kind", ["self", "ngram"])
def test_greedy_on_the_int8_target_equals_its_plain_decoding(tiny_target, drafter_kind):
    model = quantize_int8_weights(copy.deepcopy(tiny_target))  # fp32 activations: exact comparison
    drafter = SmallLMDrafter(CachedLM(model), "self") if drafter_kind == "self" else NgramDrafter()
    engine = Engine(CachedLM(model), [drafter], frozenset(), context_length=256)
    config = GenerationConfig(max_new_tokens=16, num_speculative_tokens=3)
    for prompt in random_prompts(8, seed=4):
        stats = SpecStats()
        assert list(engine.generate(prompt, config, stats)) == reference_greedy(model, prompt, 16)
        if drafter_kind == "self":
            assert stats.num_accepted_tokens == stats.num_draft_tokens
