from __future__ import annotations

from evospec.config import NgramConfig, SamplingConfig
from evospec.drafters import NgramDrafter
from evospec.drafters.small_lm import common_prefix_length
from evospec.sampling import Sampler

GREEDY = Sampler(SamplingConfig())


def test_ngram_continues_the_latest_longest_match():
    drafter = NgramDrafter(NgramConfig(max_ngram=3, min_ngram=1))
    context = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # suffix (5, 2, 3) never occurred; (2, 3) did, latest at index 6 -> continue with 7, 8, 5
    assert drafter.propose(context, 3, GREEDY).tokens.tolist() == [7, 8, 5]


def test_ngram_draft_stops_at_the_end_of_the_context():
    drafter = NgramDrafter()
    assert drafter.propose([4, 5, 6, 4, 5], 8, GREEDY).tokens.tolist() == [6, 4, 5]


def test_ngram_without_a_match_drafts_nothing():
    drafter = NgramDrafter()
    draft = drafter.propose([1, 2, 3, 4], 4, GREEDY)
    assert draft.size == 0 and draft.probs is None


def test_common_prefix_length():
    assert common_prefix_length([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix_length([1, 2, 5, 6], [1, 2, 3, 4]) == 2
    assert common_prefix_length([], [1]) == 0
