"""Lossless: the engine's greedy output equals the target's own greedy decoding (fp32)."""

from __future__ import annotations

import pytest

from evospec.config import GenerationConfig, LoadConfig, SamplingConfig
from evospec.cost import measure_forward_cost
from evospec.drafters import NgramDrafter, SmallLMDrafter, SuffixDrafter
from evospec.drafters.registry import DRAFTERS as DRAFTER_KINDS
from evospec.drafters.registry import NO_DRAFTER, build_drafter
from evospec.engine import Engine
from evospec.errors import EvospecError
from evospec.generation import build_engine
from evospec.models.hf import CachedLM
from evospec.selection import SELECTORS, build_selector
from evospec.stats import SpecStats

from conftest import TINY_VOCAB, every_drafter_kind, random_prompts, reference_greedy, tiny_model

MAX_NEW = 24


def edited(output: list[int]) -> list[int]:
    """A prediction that is mostly right: the output with a token replaced, one dropped and two inserted
    (as far as it is long enough for them)."""
    edit = list(output)
    if len(edit) > 3:
        edit[3] = (edit[3] + 1) % TINY_VOCAB
    if len(edit) > 9:
        del edit[9]
    edit[15:15] = [7, 7]
    return edit


def run(
    engine: Engine, prompt: list[int], config: GenerationConfig, prediction: list[int] = ()
) -> tuple[list[int], SpecStats]:
    stats = SpecStats()
    return list(engine.generate(prompt, config, stats, prediction)), stats


@pytest.fixture(scope="module")
def plain_outputs(tiny_target) -> dict[tuple[int, ...], list[int]]:
    return {tuple(prompt): reference_greedy(tiny_target, prompt, MAX_NEW) for prompt in random_prompts(20)}


@pytest.fixture(scope="module")
def drafter_specs(tmp_path_factory, sharp_target) -> dict[str, str]:
    """A spec of every drafter kind for the sharp tiny target; small LMs load a jittered copy of it,
    saved with its tokenizer."""
    directory = tmp_path_factory.mktemp("small-lm")
    tiny_model(seed=1, noise=0.3, base=sharp_target.model).save_pretrained(directory)
    sharp_target.tokenizer.save_pretrained(directory)
    return every_drafter_kind(directory)


@pytest.fixture(scope="module")
def sharp_outputs(sharp_target) -> dict[tuple[int, ...], list[int]]:
    """Its own greedy decoding of each prompt, to its end-of-generation token or MAX_NEW tokens."""
    eos = sorted(sharp_target.eos_token_ids)
    return {tuple(prompt): reference_greedy(sharp_target.model, prompt, MAX_NEW, eos) for prompt in random_prompts(12)}


def test_every_drafter_kind_is_in_the_lossless_tests(drafter_specs):
    assert set(drafter_specs) == set(DRAFTER_KINDS)


@pytest.mark.parametrize("k", [1, 3, 8, 32, 64])
@pytest.mark.parametrize("drafter_kind", [NO_DRAFTER, *DRAFTER_KINDS])
def test_greedy_equals_plain_decoding(sharp_target, drafter_specs, sharp_outputs, drafter_kind, k):
    """Every drafter of the registry, as the command line builds it, with each draft length."""
    drafter = build_drafter(drafter_specs.get(drafter_kind, drafter_kind), sharp_target, LoadConfig(dtype="fp32"))
    engine = build_engine(sharp_target, [drafter] if drafter else [])
    config = GenerationConfig(max_new_tokens=MAX_NEW, num_speculative_tokens=k)
    for prompt, expected in sharp_outputs.items():
        tokens, stats = run(engine, list(prompt), config, edited(expected))
        assert tokens == expected, f"prompt {prompt}"
        assert stats.new_tokens == len(expected)
    assert drafter is None or engine.selector.arms == (drafter.name,)


def test_self_drafting_emits_k_plus_one_per_round(tiny_target):
    engine = Engine(CachedLM(tiny_target), [SmallLMDrafter(CachedLM(tiny_target), "self")], frozenset(), 256)
    _, stats = run(engine, [1, 2, 3], GenerationConfig(max_new_tokens=21, num_speculative_tokens=4))
    # The prefill's round gives the first token, then four rounds of 4 accepted + 1.
    assert stats.num_verifications == 5 and stats.num_drafts == 4 and stats.tau == 21 / 5
    assert stats.num_accepted_tokens_per_pos == [4, 4, 4, 4]


def test_stops_at_eos_and_yields_it(tiny_target, tiny_drafter):
    prompt = random_prompts(1, seed=3)[0]
    plain = reference_greedy(tiny_target, prompt, MAX_NEW)
    eos = plain[5]
    expected = plain[: plain.index(eos) + 1]
    for drafter in (None, SmallLMDrafter(CachedLM(tiny_drafter), "noisy"), NgramDrafter()):
        engine = Engine(CachedLM(tiny_target), [drafter] if drafter else [], frozenset({eos}), 256)
        tokens, stats = run(engine, prompt, GenerationConfig(max_new_tokens=MAX_NEW, num_speculative_tokens=4))
        assert tokens == expected
        assert stats.new_tokens == len(expected)


def test_a_one_token_prompt(tiny_target, tiny_drafter):
    engine = Engine(CachedLM(tiny_target), [SmallLMDrafter(CachedLM(tiny_drafter), "noisy")], frozenset(), 256)
    tokens, _ = run(engine, [7], GenerationConfig(max_new_tokens=MAX_NEW))
    assert tokens == reference_greedy(tiny_target, [7], MAX_NEW)


def test_stops_when_the_context_is_full(tiny_target):
    engine = Engine(CachedLM(tiny_target), [NgramDrafter()], frozenset(), context_length=20)
    tokens, _ = run(engine, list(range(15)), GenerationConfig(max_new_tokens=50, num_speculative_tokens=8))
    assert tokens == reference_greedy(tiny_target, list(range(15)), 5)


def test_early_close_leaves_a_consistent_cache(tiny_target, tiny_drafter):
    target = CachedLM(tiny_target)
    engine = Engine(target, [SmallLMDrafter(CachedLM(tiny_drafter), "noisy")], frozenset(), 256)
    prompt = [5, 6, 7, 8]
    tokens = engine.generate(prompt, GenerationConfig(max_new_tokens=30), SpecStats())
    taken = [next(tokens) for _ in range(7)]
    tokens.close()
    assert target.length == len(prompt) + len(taken) - 1
    # and the next request is unaffected
    again, _ = run(engine, prompt, GenerationConfig(max_new_tokens=MAX_NEW))
    assert again == reference_greedy(tiny_target, prompt, MAX_NEW)


def test_sampling_is_seeded(tiny_target, tiny_drafter):
    engine = Engine(CachedLM(tiny_target), [SmallLMDrafter(CachedLM(tiny_drafter), "noisy")], frozenset(), 256)
    config = GenerationConfig(max_new_tokens=20, sampling=SamplingConfig(temperature=0.8, top_p=0.9, seed=7))
    first, stats = run(engine, [1, 2, 3], config)
    second, _ = run(engine, [1, 2, 3], config)
    assert first == second and len(first) == 20
    assert stats.num_draft_tokens > 0


@pytest.mark.parametrize(
    "prompt, message",
    [([], "empty"), (list(range(300)), "context")],
)
def test_bad_prompts_are_clear_errors(tiny_target, prompt, message):
    engine = Engine(CachedLM(tiny_target), [], frozenset(), context_length=256)
    with pytest.raises(EvospecError, match=message):
        run(engine, prompt, GenerationConfig())


@pytest.mark.parametrize("selector", [*(name for name in SELECTORS if name != "fixed"), "fixed:noisy"])
def test_switching_drafters_is_lossless(tiny_target, tiny_drafter, plain_outputs, selector):
    """round-robin switches every round, over all 20 prompts; the other selectors on 5 of them."""
    drafters = [
        SmallLMDrafter(CachedLM(tiny_drafter), "noisy"),
        NgramDrafter(),
        SuffixDrafter(),
        SmallLMDrafter(CachedLM(tiny_target), "self"),
    ]
    cost = measure_forward_cost(CachedLM(tiny_target), 4, TINY_VOCAB)  # for ucb-speed's reward
    engine = Engine(
        CachedLM(tiny_target),
        drafters,
        frozenset(),
        256,
        selector=build_selector(selector, [d.name for d in drafters]),
        forward_cost=cost,
    )
    config = GenerationConfig(max_new_tokens=MAX_NEW, num_speculative_tokens=3)
    total = SpecStats()
    prompts = list(plain_outputs.items())[: None if selector == "round-robin" else 5]
    for prompt, expected in prompts:
        tokens, stats = run(engine, list(prompt), config)
        assert tokens == expected, f"prompt {prompt}"
        total.merge(stats)
    pulled = {name for name, arm in total.drafters.items() if arm.pulls}
    expected = {d.name for d in drafters}
    if selector == "fixed:noisy":
        expected = {"noisy"}
    elif selector.startswith("contextual"):  # it scores the cheap arms every round unpulled; self-drafting beats them
        expected = {"noisy", "self"}
    assert pulled == expected
    assert sum(arm.pulls for arm in total.drafters.values()) == total.num_verifications - len(prompts)


class Logged:
    """A drafter that logs each of its drafts: (context length, tokens asked, tokens drafted)."""

    def __init__(self, drafter) -> None:
        self.drafter, self.drafts = drafter, []
        self.name, self.needs_hidden_states, self.learnable = drafter.name, False, False
        self.model_free = True

    def begin(self, prompt_ids, prediction):
        return self.drafter.begin(prompt_ids, prediction)

    def propose(self, context, k, sampler):
        draft = self.drafter.propose(context, k, sampler)
        self.drafts.append((len(context), k, draft.tokens.tolist()))
        return draft


@pytest.mark.parametrize("selector", ["hedge", "contextual"])
def test_full_information_scores_each_cheap_draft_on_the_output_it_would_have_met(tiny_target, plain_outputs, selector):
    """Every cheap arm drafts every round; each draft's score is the share of it that the target's
    greedy output confirms from where the draft starts, pulled or not, and not only up to the tokens
    the pulled draft got verified."""
    drafters = [Logged(NgramDrafter()), Logged(SuffixDrafter())]
    chosen = build_selector(selector, ["ngram", "suffix"])
    observed = []
    observe = chosen.observe
    chosen.observe = lambda scores: (observed.append(dict(scores)), observe(scores))
    engine = Engine(CachedLM(tiny_target), drafters, frozenset(), 256, selector=chosen)
    config = GenerationConfig(max_new_tokens=MAX_NEW, num_speculative_tokens=4)
    prompt, expected = next(iter(plain_outputs.items()))
    tokens, _ = run(engine, list(prompt), config)
    assert tokens == expected
    ngram, suffix = drafters[0].drafts, drafters[1].drafts
    assert len(ngram) == len(suffix) == len(observed) > 3  # both draft every round, scored once a round
    full = [*prompt, *tokens]
    beyond_verified = 0
    for (position, asked, n_tokens), (_, _, s_tokens), scores in zip(ngram, suffix, observed, strict=True):
        for name, draft in (("ngram", n_tokens), ("suffix", s_tokens)):
            truth = full[position : position + len(draft)]
            accepted = next((i for i, (a, b) in enumerate(zip(draft, truth)) if a != b), len(draft))
            assert scores[name].reward == pytest.approx(accepted / asked), (name, position)
        beyond_verified += abs(scores["ngram"].reward - scores["suffix"].reward) * asked > 1
    assert beyond_verified, "no draft scored past the tokens another draft got verified: a weak test"


def test_a_selector_keeps_sampling_seeded(tiny_target, tiny_drafter):
    drafters = [SmallLMDrafter(CachedLM(tiny_drafter), "noisy"), NgramDrafter()]
    config = GenerationConfig(max_new_tokens=20, sampling=SamplingConfig(temperature=0.8, seed=3))
    outputs = []
    for _ in range(2):
        engine = Engine(
            CachedLM(tiny_target), drafters, frozenset(), 256, selector=build_selector("thompson", ["noisy", "ngram"])
        )
        outputs.append(run(engine, [1, 2, 3, 1, 2], config)[0])
    assert outputs[0] == outputs[1] and len(outputs[0]) == 20


def test_a_speed_reward_without_the_targets_forward_cost_is_a_clear_error(tiny_target):
    drafters = [NgramDrafter(), SuffixDrafter()]
    with pytest.raises(EvospecError, match="forward cost"):
        Engine(
            CachedLM(tiny_target), drafters, frozenset(), 256, selector=build_selector("ucb-speed", ["ngram", "suffix"])
        )


def test_several_drafters_need_a_selector_over_exactly_them(tiny_target):
    with pytest.raises(EvospecError, match="need a selector"):
        Engine(CachedLM(tiny_target), [NgramDrafter(), SuffixDrafter()], frozenset(), 256)
    with pytest.raises(EvospecError, match="arms"):
        Engine(CachedLM(tiny_target), [NgramDrafter()], frozenset(), 256, selector=build_selector("ucb-bd", ["other"]))
    with pytest.raises(EvospecError, match="must differ"):
        Engine(
            CachedLM(tiny_target),
            [NgramDrafter(), NgramDrafter()],
            frozenset(),
            256,
            selector=build_selector("ucb-bd", ["ngram", "x"]),
        )
