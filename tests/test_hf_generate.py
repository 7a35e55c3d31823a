"""evospec.hf: model.generate(custom_generate=...) runs evospec's loop and says what plain generate() says (fp32)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import evospec.hf
from evospec.config import GenerationConfig, SamplingConfig
from evospec.drafters import SmallLMDrafter
from evospec.drafters.registry import DRAFTERS, NO_DRAFTER
from evospec.errors import EvospecError
from evospec.generation import build_engine
from evospec.hf import EvospecGenerateOutput, SpeculationConfig, Speculator
from evospec.learning import LEARNERS, LearnerConfig
from evospec.models.hf import CachedLM
from evospec.stats import SpecStats

from conftest import TINY_VOCAB, every_drafter_kind, random_prompts, tiny_model, word_tokenizer

MAX_NEW = 24
PROMPTS = random_prompts(4)
MODEL_OBJECT = "model object"  # a small-LM drafter given as a transformers model, not a spec


def call(model, prompt: list[int], **kwargs):
    """model.generate on one prompt, greedy unless kwargs say otherwise."""
    ids = torch.tensor([prompt])
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, pad_token_id=0, **kwargs)


@pytest.fixture(scope="module")
def model(sharp_target):
    """The user's own model (peaked next-token distributions, as a trained model's)."""
    return sharp_target.model


@pytest.fixture(scope="module")
def tokenizer(sharp_target):
    return sharp_target.tokenizer


@pytest.fixture(scope="module")
def draft_model(model):
    """A small LM close to the target, right often but not always."""
    return tiny_model(seed=1, noise=0.3, base=model)


@pytest.fixture(scope="module")
def drafters(tmp_path_factory, draft_model, tokenizer) -> dict[str, object]:
    """A drafter of every kind; small LMs by name load the draft model saved with the tokenizer."""
    directory = tmp_path_factory.mktemp("small-lm")
    draft_model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return {
        **every_drafter_kind(directory),
        MODEL_OBJECT: draft_model,
        NO_DRAFTER: NO_DRAFTER,  # plain decoding through the loop
    }


@pytest.fixture(scope="module")
def plain(model) -> dict[tuple[int, ...], torch.Tensor]:
    """Plain generate() of each prompt: prompt + new tokens [1, n + m]."""
    return {tuple(prompt): call(model, prompt) for prompt in PROMPTS}


def predicted(sequence: torch.Tensor, prompt: list[int]) -> list[int]:
    """A prediction that is mostly right: the new tokens with one of them changed."""
    new = sequence[0, len(prompt) :].tolist()
    new[len(new) // 2] = (new[len(new) // 2] + 1) % TINY_VOCAB
    return new


def test_every_drafter_kind_is_tested(drafters):
    assert set(drafters) == {*DRAFTERS, MODEL_OBJECT, NO_DRAFTER}


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("kind", [NO_DRAFTER, *DRAFTERS, MODEL_OBJECT])
def test_greedy_equals_plain_generate(model, tokenizer, drafters, plain, kind, k):
    for prompt in PROMPTS:
        expected = plain[tuple(prompt)]
        prediction = {"prediction_ids": predicted(expected, prompt)} if kind == "prediction" else {}
        output = call(
            model,
            prompt,
            custom_generate=evospec.hf.generate,
            drafters=[drafters[kind]],
            target_tokenizer=tokenizer,
            speculation=SpeculationConfig(num_speculative_tokens=k),
            **prediction,
        )
        assert output.dtype == torch.long and torch.equal(output, expected), f"prompt {prompt}"


@pytest.mark.parametrize("selector", ["ucb-bd", "thompson", "hedge", "contextual", "round-robin"])
def test_a_selector_over_several_drafters_keeps_the_output(model, tokenizer, drafters, plain, selector):
    names = ["ngram", "suffix", "eagle", MODEL_OBJECT]
    for prompt in PROMPTS:
        output = call(
            model,
            prompt,
            custom_generate=evospec.hf.generate,
            drafters=[drafters[name] for name in names],
            selector=selector,
            target_tokenizer=tokenizer,
            return_dict_in_generate=True,
        )
        assert torch.equal(output.sequences, plain[tuple(prompt)])
        assert set(output.evospec_stats.drafters) <= {"ngram", "suffix", "eagle", "model3"}


@pytest.mark.parametrize("learner", LEARNERS)
def test_learners_learn_and_keep_the_output(model, tokenizer, drafters, plain, learner):
    learning = LearnerConfig(every=2, batch_rows=8, prompt_rows=16)
    speculator = Speculator(
        model,
        tokenizer,
        [drafters["eagle"], drafters["hydra"], drafters["lora"]],
        selector="round-robin",
        learner=learner,
        config=SpeculationConfig(learning=learning),
    )
    for prompt in PROMPTS:
        assert torch.equal(call(model, prompt, custom_generate=speculator), plain[tuple(prompt)])
    assert all(each.stats.steps > 0 for each in speculator.engine.learners)


def test_a_speculator_remembers_across_calls_and_generate_does_not(model, tokenizer, plain):
    prompt = PROMPTS[0]
    speculator = Speculator(model, tokenizer, ["suffix"])
    first, again = (call(model, prompt, custom_generate=speculator, return_dict_in_generate=True) for _ in range(2))
    assert torch.equal(again.sequences, plain[tuple(prompt)])
    assert again.evospec_stats.tau > first.evospec_stats.tau  # the suffix drafter recalls the first answer
    fresh = call(
        model,
        prompt,
        custom_generate=evospec.hf.generate,
        drafters=["suffix"],
        target_tokenizer=tokenizer,
        return_dict_in_generate=True,
    )
    assert fresh.evospec_stats.tau == first.evospec_stats.tau


def test_the_stats_are_evospec_generates(model, tokenizer, plain):
    prompt = PROMPTS[1]
    output = call(
        model,
        prompt,
        custom_generate=evospec.hf.generate,
        drafters=["ngram"],
        target_tokenizer=tokenizer,
        return_dict_in_generate=True,
    )
    assert isinstance(output, EvospecGenerateOutput) and torch.equal(output.sequences, plain[tuple(prompt)])
    stats = output.evospec_stats
    assert stats.new_tokens == output.sequences.shape[1] - len(prompt) and stats.prompt_tokens == len(prompt)
    assert stats.to_dict().keys() == SpecStats().to_dict().keys()


def test_it_stops_where_plain_generate_stops(model, tokenizer, plain):
    prompt = PROMPTS[2]
    stop = plain[tuple(prompt)][0, len(prompt) + 5].item()  # the sixth new token ends generation
    expected = call(model, prompt, eos_token_id=[stop, 95])
    output = call(
        model,
        prompt,
        eos_token_id=[stop, 95],
        custom_generate=evospec.hf.generate,
        drafters=["ngram", "suffix"],
        target_tokenizer=tokenizer,
    )
    assert torch.equal(output, expected) and output.shape[1] <= len(prompt) + 6


def test_sampling_is_evospecs_rejection_sampling(sharp_target, model, tokenizer, draft_model):
    """What the engine samples with the same drafter, settings and seed; torch's seed seeds it by default."""
    prompt = PROMPTS[3]
    settings = {"do_sample": True, "temperature": 0.8, "top_k": 20, "top_p": 0.9}
    output = call(
        model,
        prompt,
        custom_generate=evospec.hf.generate,
        drafters=[draft_model],
        target_tokenizer=tokenizer,
        seed=3,
        **settings,
    )
    target = replace(sharp_target, eos_token_ids=frozenset({model.generation_config.eos_token_id}))
    engine = build_engine(target, [SmallLMDrafter(CachedLM(draft_model), "model0")])
    config = GenerationConfig(max_new_tokens=MAX_NEW, sampling=SamplingConfig(0.8, 20, 0.9, seed=3))
    assert output[0, len(prompt) :].tolist() == list(engine.generate(prompt, config, SpecStats()))
    seeded = []
    for _ in range(2):
        torch.manual_seed(7)
        seeded.append(call(model, prompt, custom_generate=evospec.hf.generate, target_tokenizer=tokenizer, **settings))
    assert torch.equal(*seeded)


def test_an_adaptive_draft_length_and_a_speed_reward(model, tokenizer, plain, monkeypatch, tmp_path):
    monkeypatch.setenv("EVOSPEC_HOME", str(tmp_path))  # the measured forward cost is cached here
    for prompt in PROMPTS[:2]:
        output = call(
            model,
            prompt,
            custom_generate=evospec.hf.generate,
            drafters=["ngram", "suffix"],
            selector="ucb-speed",
            target_tokenizer=tokenizer,
            speculation=SpeculationConfig(num_speculative_tokens=8, adaptive_k=True),
        )
        assert torch.equal(output, plain[tuple(prompt)])


@pytest.fixture(scope="module")
def foreign_lm(tmp_path_factory) -> str:
    """A small LM with as many logits as the target, behind another tokenizer."""
    directory = tmp_path_factory.mktemp("foreign")
    tiny_model(seed=5).save_pretrained(directory)
    word_tokenizer(["<unk>", "<eos>", *(f"v{i}" for i in range(TINY_VOCAB - 2))]).save_pretrained(directory)
    return str(directory)


def narrow_lm() -> LlamaForCausalLM:
    """A small LM with fewer logits than the target."""
    config = LlamaConfig(
        vocab_size=TINY_VOCAB // 2,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return LlamaForCausalLM(config).eval()


BAD_CALLS = [
    ({"drafters": ["nosuch"]}, "unknown drafter"),
    ({"drafters": "ngram"}, "drafters is a list"),
    ({"drafters": [object()]}, "a --drafter spec or a transformers model"),
    ({"drafters": ["FOREIGN"]}, "another tokenizer"),
    ({"drafters": ["NARROW"]}, "48 output logits"),
    ({"num_beams": 2}, "beam_search"),
    ({"do_sample": True, "num_return_sequences": 2}, "returns one sequence"),
    ({"repetition_penalty": 1.2}, "RepetitionPenaltyLogitsProcessor"),
    ({"return_dict_in_generate": True, "output_scores": True}, "drop output_scores"),
    ({"selector": "ucb-bd"}, "picks among several drafters"),
    ({"learner": "ogd"}, "trains eagle, hydra or lora"),
    ({"learner": "sgd"}, "unknown learner"),
    ({"prediction_ids": [1, 2, 3]}, "drafted by the 'prediction' drafter"),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD_CALLS)
def test_what_evospec_cannot_do_is_a_clear_error(model, tokenizer, foreign_lm, kwargs, message):
    arguments = {"drafters": ["ngram"], **kwargs}
    models = {"FOREIGN": foreign_lm, "NARROW": narrow_lm()}  # drafters built here, not at collection
    if arguments["drafters"] in (["FOREIGN"], ["NARROW"]):
        arguments["drafters"] = [models[arguments["drafters"][0]]]
    with pytest.raises(EvospecError, match=message):
        call(model, PROMPTS[0], custom_generate=evospec.hf.generate, target_tokenizer=tokenizer, **arguments)


def test_bad_inputs_are_clear_errors(model, tokenizer):
    prompt = PROMPTS[0]
    with pytest.raises(EvospecError, match="target_tokenizer=tokenizer"):  # generate() keeps tokenizer= to itself
        call(model, prompt, custom_generate=evospec.hf.generate, drafters=["ngram"], tokenizer=tokenizer)
    speculator = Speculator(model, tokenizer, ["ngram"])
    with pytest.raises(EvospecError, match="batch 1"):
        model.generate(torch.tensor([prompt, prompt]), max_new_tokens=4, pad_token_id=0, custom_generate=speculator)
    ids = torch.tensor([prompt])
    mask = torch.ones_like(ids)
    mask[0, 0] = 0
    with pytest.raises(EvospecError, match="unpadded"):
        model.generate(ids, attention_mask=mask, max_new_tokens=4, pad_token_id=0, custom_generate=speculator)
    with pytest.raises(EvospecError, match="not for another model"):
        call(tiny_model(seed=3), prompt, custom_generate=speculator)
