"""Draft-length policies and forward costs: the choice follows cost and acceptance, and stays lossless."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import random_prompts, reference_greedy

from evospec import cost
from evospec.config import GenerationConfig
from evospec.cost import ForwardCost, cached_forward_cost
from evospec.draft_length import AdaptiveDraftLength
from evospec.drafters import NgramDrafter, SmallLMDrafter
from evospec.engine import Engine
from evospec.errors import EvospecError
from evospec.selection import build_selector
from evospec.stats import SpecStats
from evospec.target import CachedLM
from evospec.types import Draft

# T(n) / T(1) as measured for llama.cpp Q4_K on a 2-core AVX2 machine, and a flat one (bf16 with AVX512).
STEEP = ForwardCost((1.0, 1.6, 2.0, 2.5, 3.0))
FLAT = ForwardCost((1.0, 1.0, 1.02, 1.05, 1.1))


def draft(size: int, label: str = "") -> Draft:
    return Draft(torch.arange(size), None, label)


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
        policy.observe("ngram", draft(4, "match4"), num_accepted=4, draft_seconds=0.0)
        policy.observe("ngram", draft(4, "match1"), num_accepted=0, draft_seconds=0.0)
    assert policy.alpha("ngram", "match4") > 0.9 > 0.3 > policy.alpha("ngram", "match1")
    assert policy.keep("ngram", draft(4, "match4")) == 4
    assert policy.keep("ngram", draft(4, "match1")) == 0
    assert policy.budget("ngram", 4) == 4  # the drafter is still asked: some of its drafts pay


def test_a_drafter_that_never_pays_is_dropped_and_later_tried_again():
    policy = AdaptiveDraftLength(STEEP)
    for _ in range(30):
        policy.observe("bad", draft(2), num_accepted=0, draft_seconds=0.0)
    assert policy.budget("bad", 4) == 0
    rounds = 0
    while policy.budget("bad", 4) == 0 and rounds < 5000:  # plain rounds: old evidence fades
        policy.observe("bad", draft(0), num_accepted=0, draft_seconds=0.0)
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
    engine = Engine(CachedLM(tiny_target), drafters, frozenset(), 256, AdaptiveDraftLength(STEEP),
                    build_selector("ucb-speed", ["ngram", "noisy"]), forward_cost=STEEP)
    config = GenerationConfig(max_new_tokens=24, num_speculative_tokens=4)
    total = SpecStats()
    for prompt in random_prompts(10, seed=12):
        stats = SpecStats()
        assert list(engine.generate(prompt, config, stats)) == reference_greedy(tiny_target, prompt, 24)
        total.merge(stats)
    assert all(arm.pulls for arm in total.drafters.values())  # both drafters were tried


def test_forward_cost_is_measured_once_then_read(tiny_target, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EVOSPEC_HOME", str(tmp_path))
    measured = []
    real_measure = cost.measure_forward_cost

    def counting_measure(*args):
        measured.append(1)
        return real_measure(*args)

    monkeypatch.setattr(cost, "measure_forward_cost", counting_measure)
    lm = CachedLM(tiny_target)
    first = cached_forward_cost(lm, "tiny", max_tokens=3, vocab_size=96)
    second = cached_forward_cost(lm, "tiny", max_tokens=3, vocab_size=96)
    assert first == second and first.max_tokens == 3 and measured == [1]
    assert lm.length == 0  # the measurement leaves the cache empty

    (cache_file,) = (tmp_path / "costs").iterdir()
    cache_file.write_text("{not json")
    assert cached_forward_cost(lm, "tiny", max_tokens=3, vocab_size=96).max_tokens == 3
    assert measured == [1, 1]  # a damaged entry is measured again


def test_a_forward_cost_needs_positive_timings():
    with pytest.raises(EvospecError, match="positive"):
        ForwardCost((0.1, 0.0))
