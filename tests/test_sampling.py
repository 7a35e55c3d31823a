from __future__ import annotations

import pytest
import torch

from evospec.config import GenerationConfig, SamplingConfig
from evospec.errors import EvospecError
from evospec.sampling import Sampler


def test_top_k_keeps_the_k_most_likely():
    probs = Sampler(SamplingConfig(temperature=1.0, top_k=2)).probs(torch.tensor([[1.0, 3.0, 2.0, 0.0]]))
    assert (probs[0] > 0).tolist() == [False, True, True, False]


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept = Sampler(SamplingConfig(temperature=1.0, top_p=0.7)).probs(logits)[0] > 0
    assert kept.tolist() == [True, True, False, False]
    kept = Sampler(SamplingConfig(temperature=1.0, top_p=0.5)).probs(logits)[0] > 0
    assert kept.tolist() == [True, False, False, False]


def test_temperature_sharpens():
    logits = torch.tensor([[1.0, 2.0]])
    cold = Sampler(SamplingConfig(temperature=0.5)).probs(logits)[0, 1]
    warm = Sampler(SamplingConfig(temperature=2.0)).probs(logits)[0, 1]
    assert cold > warm > 0.5


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: SamplingConfig(temperature=-0.1), "temperature"),
        (lambda: SamplingConfig(top_p=0.0), "top-p"),
        (lambda: SamplingConfig(top_p=1.5), "top-p"),
        (lambda: SamplingConfig(top_k=-1), "top-k"),
        (lambda: GenerationConfig(num_speculative_tokens=0), "k"),
        (lambda: GenerationConfig(max_new_tokens=0), "max-new-tokens"),
        (lambda: GenerationConfig(stop=("",)), "stop"),
    ],
)
def test_bad_settings_are_clear_errors(make, message):
    with pytest.raises(EvospecError, match=message):
        make()
