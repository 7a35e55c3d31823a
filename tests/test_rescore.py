"""Re-scoring: a greedy output fed one token a step must find each of its tokens at the target's argmax.

On hf in fp32 the kernels are batch-invariant, so a speculative output's gaps are exactly 0; a
verifier that lets a rejected token through leaves a gap that re-scoring sees.
"""

from __future__ import annotations

import pytest

from evospec import engine as engine_module
from evospec.config import GenerationConfig
from evospec.drafters import NgramDrafter, SmallLMDrafter
from evospec.engine import Engine
from evospec.models.hf import CachedLM
from evospec.rescore import greedy_gaps
from evospec.stats import SpecStats
from evospec.types import Verdict
from evospec.verify import verify

from conftest import random_prompts, reference_greedy


def outputs(engine: Engine, prompts: list[list[int]], k: int) -> list[list[int]]:
    config = GenerationConfig(max_new_tokens=24, num_speculative_tokens=k)
    return [list(engine.generate(prompt, config, SpecStats())) for prompt in prompts]


@pytest.mark.parametrize("k", [3, 32, 64])
def test_a_speculative_output_scores_as_the_targets_argmax_at_every_token(tiny_target, tiny_drafter, k):
    prompts = random_prompts(6, seed=4)
    for drafter in (NgramDrafter(), SmallLMDrafter(CachedLM(tiny_drafter), "noisy")):
        engine = Engine(CachedLM(tiny_target), [drafter], frozenset(), 256)
        for prompt, output in zip(prompts, outputs(engine, prompts, k)):
            assert output == reference_greedy(tiny_target, prompt, 24)
            assert float(greedy_gaps(CachedLM(tiny_target), prompt, output).max()) == 0.0


def test_a_verifier_that_accepts_a_rejected_token_leaves_a_gap(tiny_target, tiny_drafter, monkeypatch):
    def accepts_one_more(logits, draft, sampler) -> Verdict:
        verdict = verify(logits, draft, sampler)
        if verdict.num_accepted == draft.size:
            return verdict
        accepted = verdict.num_accepted + 1
        return Verdict(
            accepted, [*draft.tokens[:accepted].tolist(), int(logits[accepted].argmax())], verdict.target_argmax
        )

    monkeypatch.setattr(engine_module, "verify", accepts_one_more)
    prompts = random_prompts(6, seed=4)
    engine = Engine(CachedLM(tiny_target), [SmallLMDrafter(CachedLM(tiny_drafter), "noisy")], frozenset(), 256)
    gaps = [
        float(greedy_gaps(CachedLM(tiny_target), prompt, output).max())
        for prompt, output in zip(prompts, outputs(engine, prompts, k=4))
    ]
    assert max(gaps) > 0.0, gaps  # where kernels are batch-invariant, any gap is a defect


def test_the_gaps_follow_the_output_and_leave_the_model_empty(tiny_target):
    lm = CachedLM(tiny_target)
    prompt = [1, 2, 3]
    output = reference_greedy(tiny_target, prompt, 5)
    assert greedy_gaps(lm, prompt, output).tolist() == [0.0] * 5 and lm.length == 0
    wrong = [*output[:2], (output[2] + 1) % 96, *output[3:]]
    gaps = greedy_gaps(lm, prompt, wrong)
    assert gaps[:2].tolist() == [0.0, 0.0] and gaps[2] > 0
