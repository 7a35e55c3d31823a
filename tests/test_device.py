"""On a GPU: hf models run there, what they return comes back on the CPU, and greedy output equals
the target's own greedy decoding there (fp32), for a small-LM drafter, a white-box drafter learning
on line and adapters learning on line. Skipped without CUDA; on a machine with one, `pytest
tests/test_device.py` is the device check."""

from __future__ import annotations

import copy

import pytest
import torch

from evospec.config import GenerationConfig
from evospec.drafters import SmallLMDrafter
from evospec.drafters.adapted_lm import AdaptedLMDrafter
from evospec.drafters.registry import new_white_box_drafter
from evospec.drafters.whitebox import WhiteBoxConfig
from evospec.engine import Engine
from evospec.learning import LearnerConfig, build_learner
from evospec.models.backend import LoadedModel
from evospec.models.hf import CachedLM, default_device
from evospec.models.loading import BACKENDS
from evospec.stats import SpecStats

from conftest import random_prompts, reference_greedy, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def gpu_target(sharp_target) -> LoadedModel:
    return BACKENDS["hf"].wrap(
        "tiny-sharp-cuda", copy.deepcopy(sharp_target.model).cuda(), sharp_target.tokenizer, "tiny-sharp"
    )


def generate_all(engine: Engine, prompts: list[list[int]], k: int) -> list[list[int]]:
    config = GenerationConfig(max_new_tokens=32, num_speculative_tokens=k)
    return [list(engine.generate(prompt, config, SpecStats())) for prompt in prompts]


def test_hf_models_run_on_the_gpu_and_answer_on_the_cpu(gpu_target):
    assert default_device().type == "cuda"
    lm = CachedLM(gpu_target.model)
    logits, hidden = lm.forward_with_hidden([1, 2, 3])
    assert logits.device.type == hidden.device.type == "cpu" and logits.shape[0] == hidden.shape[0] == 3


@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_on_the_gpu_equals_plain_decoding_there(gpu_target, k):
    drafter_model = tiny_model(seed=1, noise=0.3, base=gpu_target.model).cuda()  # load_state_dict copies across devices
    engine = Engine(CachedLM(gpu_target.model), [SmallLMDrafter(CachedLM(drafter_model), "small")], frozenset(), 256)
    prompts = random_prompts(10, seed=7)
    assert generate_all(engine, prompts, k) == [reference_greedy(gpu_target.model, prompt, 32) for prompt in prompts]


@pytest.mark.parametrize("kind", ["eagle", "hydra", "lora"])
def test_drafters_learning_beside_a_gpu_target_leave_its_output_alone(gpu_target, kind):
    if kind == "lora":
        drafter = AdaptedLMDrafter(tiny_model(seed=1, noise=0.6, base=gpu_target.model).cuda(), "lora:tiny")
    else:
        drafter = new_white_box_drafter(
            kind, gpu_target, config=WhiteBoxConfig(kind, 64, head_vocab=80, intermediate_size=96)
        )
    learner = build_learner("ogd", drafter, LearnerConfig(every=2, batch_rows=64, lr=0.5))
    engine = Engine(CachedLM(gpu_target.model), [drafter], frozenset(), 256, learners=[learner])
    prompts = random_prompts(4, seed=3)
    assert generate_all(engine, prompts, 3) == [reference_greedy(gpu_target.model, prompt, 32) for prompt in prompts]
    assert learner.stats.steps > 0
