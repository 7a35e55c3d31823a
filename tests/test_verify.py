"""Verification: mock logits that force chosen tokens, and a statistical test of rejection sampling."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from evospec.config import SamplingConfig
from evospec.sampling import Sampler
from evospec.types import Draft
from evospec.verify import verify, verify_greedy

VOCAB = 8
DRAWS = 20_000
ALPHA = 1e-4  # a correct sampler fails this with probability 1e-4 (the seed is fixed anyway)


def forcing_logits(tokens: list[int], vocab: int = VOCAB) -> torch.Tensor:
    """Logits [len(tokens), vocab] whose argmax is the given tokens."""
    logits = torch.zeros(len(tokens), vocab)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return logits


@pytest.mark.parametrize(
    "draft, target, accepted",
    [([1, 2, 3], [1, 2, 3, 4], 3), ([1, 2, 3], [1, 5, 3, 4], 1), ([1, 2, 3], [0, 2, 3, 4], 0), ([], [6], 0)],
)
def test_greedy_accepts_the_matching_prefix_then_the_target_token(draft, target, accepted):
    verdict = verify_greedy(forcing_logits(target), torch.tensor(draft, dtype=torch.long))
    assert verdict.num_accepted == accepted
    assert verdict.emitted == target[: accepted + 1]


def random_distribution(generator: torch.Generator, rows: int) -> torch.Tensor:
    """[rows, VOCAB] distributions with a few exact zeros, so that p - q takes every sign."""
    weights = torch.rand(rows, VOCAB, generator=generator) ** 3
    weights[:, 0] = 0.0
    return weights / weights.sum(-1, keepdim=True)


def wrong_verify(logits: torch.Tensor, draft: Draft, sampler: Sampler):
    """A classic bug: on rejection, draw from p instead of norm(max(0, p - q))."""
    p = sampler.probs(logits)
    x = int(draft.tokens[0])
    if sampler.uniform(1).item() * float(draft.probs[0, x]) < float(p[0, x]):
        return [x]
    return sampler.sample(p[:1]).tolist()


def draw_first_tokens(p, q, verifier, one_hot: bool) -> torch.Tensor:
    """DRAWS times: draft one token from q, verify it against p; counts of the first emitted token [VOCAB]."""
    sampler = Sampler(SamplingConfig(temperature=1.0, seed=1234))
    logits = p.log()  # temperature 1: the sampler turns these back into p
    drafted = torch.multinomial(q[0], DRAWS, replacement=True, generator=torch.Generator().manual_seed(99))
    counts = torch.zeros(VOCAB)
    for x in drafted.tolist():
        probs = None if one_hot else q
        token = verifier(logits, Draft(tokens=torch.tensor([x]), probs=probs), sampler)
        counts[token[0]] += 1
    return counts


def correct_verify(logits, draft, sampler):
    return verify(logits, draft, sampler).emitted


def p_value(counts: torch.Tensor, p: torch.Tensor) -> float:
    support = p > 0
    assert counts[~support].sum() == 0, "emitted a token the target gives probability 0"
    return chisquare(counts[support].numpy(), (p[support] * DRAWS).numpy()).pvalue


def test_rejection_sampling_matches_the_target_distribution():
    generator = torch.Generator().manual_seed(0)
    p, q = random_distribution(generator, 2), random_distribution(generator, 2)
    q[:, 0], q[:, 1] = 0.3, 0.0  # q puts mass where p has none and none where p has some
    q = q / q.sum(-1, keepdim=True)
    assert p_value(draw_first_tokens(p, q, correct_verify, one_hot=False), p[0]) > ALPHA


def test_rejection_sampling_with_one_hot_drafts_matches_the_target_distribution():
    generator = torch.Generator().manual_seed(1)
    p, q = random_distribution(generator, 2), random_distribution(generator, 2)
    assert p_value(draw_first_tokens(p, q, correct_verify, one_hot=True), p[0]) > ALPHA


def test_a_wrong_sampler_fails_the_same_test():
    generator = torch.Generator().manual_seed(0)
    p, q = random_distribution(generator, 2), random_distribution(generator, 2)
    assert p_value(draw_first_tokens(p, q, wrong_verify, one_hot=False), p[0]) < ALPHA


def test_full_acceptance_draws_the_bonus_from_the_last_position():
    sampler = Sampler(SamplingConfig(temperature=1.0, seed=0))
    p = torch.zeros(3, VOCAB)
    p[0, 2] = p[1, 4] = p[2, 6] = 1.0  # the target is certain at every position
    q = p[:2].clone()
    verdict = verify(p.log(), Draft(tokens=torch.tensor([2, 4]), probs=q), sampler)
    assert verdict.num_accepted == 2 and verdict.emitted == [2, 4, 6]
