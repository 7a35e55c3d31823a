"""Lossless on a real model: smollm2-135m-instruct (pulled from the zoo and cached), fp32, greedy."""

from __future__ import annotations

import pytest

from evospec.config import GenerationConfig, LoadConfig
from evospec.drafters import NgramDrafter, SmallLMDrafter
from evospec.generation import TextGenerator, build_engine, encode_prompt
from evospec.models.hf import CachedLM
from evospec.models.loading import load_model

from conftest import reference_greedy

pytestmark = pytest.mark.slow

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Summarize: The quick brown fox jumps over the lazy dog. The dog did not move. The fox ran away.",
    "What is the capital of France? Answer in one sentence.",
    "Translate to German: Good morning, how are you today?",
    "Repeat after me exactly: one two three four five six seven eight nine ten.",
]
MAX_NEW = 32


@pytest.fixture(scope="module")
def smollm():
    return load_model("smollm2-135m-instruct", "hf", LoadConfig(dtype="fp32"))


@pytest.fixture(scope="module")
def expected(smollm) -> dict[str, list[int]]:
    eos = sorted(smollm.eos_token_ids)
    return {
        prompt: reference_greedy(smollm.model, encode_prompt(smollm, prompt, chat=True), MAX_NEW, eos_token_id=eos)
        for prompt in PROMPTS
    }


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("drafter_kind", ["none", "ngram", "self"])
def test_greedy_equals_plain_decoding(smollm, expected, drafter_kind, k):
    drafter = {"none": None, "ngram": NgramDrafter(), "self": SmallLMDrafter(CachedLM(smollm.model), "self")}[
        drafter_kind
    ]
    generator = TextGenerator(smollm, build_engine(smollm, [drafter] if drafter else []))
    config = GenerationConfig(max_new_tokens=MAX_NEW, num_speculative_tokens=k)
    for prompt in PROMPTS:
        result = generator.generate(prompt, config, chat=True)
        assert result.token_ids == expected[prompt], prompt
        if drafter_kind == "self":
            assert result.stats.num_accepted_tokens == result.stats.num_draft_tokens


def test_streamed_text_is_the_decoded_ids_and_stops_before_a_stop_string(smollm):
    generator = TextGenerator(smollm, build_engine(smollm, [NgramDrafter()]))
    prompt = PROMPTS[-1]
    full = generator.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW), chat=True)
    assert full.text == smollm.tokenizer.decode(full.token_ids, skip_special_tokens=True)
    stop = full.text[10:14]
    stream = generator.stream(prompt, GenerationConfig(max_new_tokens=MAX_NEW, stop=(stop,)), chat=True)
    pieces = list(stream)
    assert "".join(pieces) == stream.text == full.text[: full.text.index(stop)]
    assert stream.finish_reason == "stop"


def test_finish_reason_length(smollm):
    result = TextGenerator(smollm, build_engine(smollm, [])).generate(
        PROMPTS[0], GenerationConfig(max_new_tokens=5), chat=True
    )
    assert result.finish_reason == "length" and len(result.token_ids) == 5
    assert result.stats.tau == 1.0 and result.stats.acceptance_rate is None
