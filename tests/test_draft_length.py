"""Draft-length policies and forward costs: the choice follows cost and acceptance, and stays lossless."""

from __future__ import annotations

import pytest
import torch

from evospec.config import GenerationConfig
from evospec.cost import ForwardCost
from evospec.draft_length import AdaptiveDraftLength
from evospec.drafters import NgramDrafter, SmallLMDrafter
from evospec.engine import Engine
from evospec.models.hf import CachedLM
from evospec.selection import build_selector
from evospec.stats import SpecStats
from evospec.types import Attempt, Draft, Verdict

from conftest import random_prompts, reference_greedy

# T(n) / T(1) as measured for llama.cpp Q4_K on a 2-core AVX2 machine, and a flat one (bf16 with AVX512).
STEEP = ForwardCost((1.0, 1.6, 2.0, 2.5, 3.0))
FLAT = ForwardCost((1.0, 1.0, 1.02, 1.05, 1.1))


def draft(size: int, label: str = "") -> Draft:
    return Draft(torch.arange(size), None, label)


def observe(
    policy: AdaptiveDraftLength, drafter: str, proposed: Draft, verified: int, accepted: int, next_token: int = -1
) -> None:
    """One round: `verified` tokens of the proposal checked, `accepted` of them right, then the target's
    own token (next_token; -1: a token no draft proposes)."""
    emitted = [*proposed.tokens[:accepted].tolist(), next_token]
    policy.observe(
        Attempt(drafter, proposed.truncated(verified), proposed, proposed.size, 0.0), Verdict(accepted, emitted)
    )


@pytest.mark.parametrize(
    ("cost_model", "alpha", "expected"),
    [(STEEP, 0.3, 0), (STEEP, 0.75, 2), (STEEP, 0.95, 4), (FLAT, 0.3, 2), (FLAT, 0.6, 4)],
)
def test_the_best_length_weighs_acceptance_against_cost(cost_model, alpha, expected):
    assert AdaptiveDraftLength(cost_model).best_length(alpha, max_length=4) == expected


def test_a_costly_drafter_is_asked_for_fewer_tokens():
    policy = AdaptiveDraftLength(FLAT)
    assert policy.best_length(0.8, 4, seconds_per_draft_token=0.0) == 4
    assert policy.best_length(0.8, 4, seconds_per_draft_token=0.5) < 4


def test_acceptance_is_learned_per_label_so_only_good_drafts_are_verified():
    policy = AdaptiveDraftLength(STEEP)
    for _ in range(60):  # long matches are right, one-token matches wrong
        observe(policy, "ngram", draft(4, "match4"), verified=4, accepted=4)
        observe(policy, "ngram", draft(4, "match1"), verified=4, accepted=0)
    assert policy.alpha("ngram", "match4") > 0.9 > 0.3 > policy.alpha("ngram", "match1")
    assert policy.keep("ngram", draft(4, "match4")) == 4
    assert policy.keep("ngram", draft(4, "match1")) == 0
    assert policy.budget("ngram", 4, model_free=False) == 4  # the drafter is still asked: some of its drafts pay


def test_a_model_free_drafter_learns_from_drafts_that_were_never_verified():
    """The first unverified drafted token is judged by the token the target emitted in its place."""
    policy = AdaptiveDraftLength(ForwardCost((1.0, 1.9, 2.3, 2.6, 2.9)))  # one verified token costs 0.9 of a step
    assert policy.budget("suffix", 8, model_free=True) == 8  # asked for a whole draft: it costs nothing
    assert policy.keep("suffix", draft(4, "match8")) == 0  # the prior alone does not pay at this cost
    for _ in range(40):  # nothing verified, and the drafted token was what the target said next
        observe(policy, "suffix", draft(4, "match8"), verified=0, accepted=0, next_token=0)
        observe(policy, "suffix", draft(4, "match1"), verified=0, accepted=0, next_token=-1)
    assert policy.alpha("suffix", "match8") > 0.9 > 0.1 > policy.alpha("suffix", "match1")
    assert policy.keep("suffix", draft(4, "match8")) == 4 and policy.keep("suffix", draft(4, "match1")) == 0
    # Fully accepted drafts say nothing past their end; the first unverified token after them does.
    fresh = AdaptiveDraftLength(STEEP)
    observe(fresh, "suffix", draft(4), verified=4, accepted=4, next_token=-1)
    observe(fresh, "suffix", draft(4), verified=2, accepted=2, next_token=2)
    observe(fresh, "suffix", draft(4), verified=2, accepted=1, next_token=-1)
    counts = fresh._acceptance[("suffix", "")]
    assert (counts.trials, counts.successes) == pytest.approx(
        (4 * 0.995**2 + 3 * 0.995 + 2, 4 * 0.995**2 + 3 * 0.995 + 1)
    )


def test_long_drafts_are_verified_at_the_sizes_whose_cost_was_measured():
    # Forwards of 16 tokens cost less than of 12 (as llama.cpp's on a CPU): a long right draft is cut to 15.
    cost = ForwardCost((1.0, 1.8, 3.0, 5.0, 6.0, 4.5, 8.0), sizes=(1, 2, 4, 8, 12, 16, 32))
    policy = AdaptiveDraftLength(cost)
    assert policy.best_length(0.95, max_length=20) == 15
    assert policy.best_length(0.999, max_length=31) == 31
    assert policy.best_length(0.3, max_length=31) == 0
    assert policy.best_length(0.95, max_length=13) in (0, 1, 3, 7, 11, 13)


def test_a_drafter_that_never_pays_is_dropped_and_later_tried_again():
    policy = AdaptiveDraftLength(STEEP)
    for _ in range(30):
        observe(policy, "bad", draft(2), verified=2, accepted=0)
    assert policy.budget("bad", 4, model_free=False) == 0
    rounds = 0
    while policy.budget("bad", 4, model_free=False) == 0 and rounds < 5000:  # plain rounds: old evidence fades
        observe(policy, "bad", draft(0), verified=0, accepted=0)
        rounds += 1
    assert 0 < rounds < 5000


@pytest.mark.parametrize("drafter_kind", ["ngram", "noisy-lm"])
def test_adaptive_draft_length_is_lossless(tiny_target, tiny_drafter, drafter_kind):
    drafter = NgramDrafter() if drafter_kind == "ngram" else SmallLMDrafter(CachedLM(tiny_drafter), "noisy")
    engine = Engine(CachedLM(tiny_target), [drafter], frozenset(), 256, AdaptiveDraftLength(STEEP))
    config = GenerationConfig(max_new_tokens=24, num_speculative_tokens=4)
    lengths = set()
    for prompt in random_prompts(10, seed=11):
        stats = SpecStats()
        assert list(engine.generate(prompt, config, stats)) == reference_greedy(tiny_target, prompt, 24)
        lengths.add(stats.num_draft_tokens)
    assert len(lengths) > 1  # the policy did vary what it verified


def test_adaptive_draft_length_under_a_speed_bandit_is_lossless(tiny_target, tiny_drafter):
    drafters = [NgramDrafter(), SmallLMDrafter(CachedLM(tiny_drafter), "noisy")]
    engine = Engine(
        CachedLM(tiny_target),
        drafters,
        frozenset(),
        256,
        AdaptiveDraftLength(STEEP),
        build_selector("ucb-speed", ["ngram", "noisy"]),
        forward_cost=STEEP,
    )
    config = GenerationConfig(max_new_tokens=24, num_speculative_tokens=4)
    total = SpecStats()
    for prompt in random_prompts(10, seed=12):
        stats = SpecStats()
        assert list(engine.generate(prompt, config, stats)) == reference_greedy(tiny_target, prompt, 24)
        total.merge(stats)
    assert all(arm.pulls for arm in total.drafters.values())  # both drafters were tried
