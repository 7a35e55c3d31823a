from __future__ import annotations

from evospec.config import NgramConfig, SamplingConfig
from evospec.drafters import NgramDrafter, PredictionDrafter
from evospec.drafters.base import common_prefix_length, match_label
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


def greedy_rounds(drafter, prompt: list[int], output: list[int], prediction: list[int], k: int) -> list[int]:
    """Rounds of greedy speculation in which the target says `output`: the accepted count of each."""
    drafter.begin(prompt, prediction)
    context, accepted_per_round = [*prompt, output[0]], []
    while len(context) < len(prompt) + len(output):
        draft = drafter.propose(context, k, GREEDY).tokens.tolist()
        expected = output[len(context) - len(prompt) :]
        accepted = common_prefix_length(draft, expected)
        accepted_per_round.append(accepted)
        context += expected[: accepted + 1]
    return accepted_per_round


def test_the_prediction_drafter_finds_its_place_after_each_edit():
    prediction = list(range(100, 160))
    output = [
        *prediction[:10],
        7,
        *prediction[11:25],
        *prediction[27:40],
        8,
        9,
        *prediction[40:],
    ]  # replace, delete, insert
    rounds = greedy_rounds(PredictionDrafter(), [1, 2, 3], output, prediction, k=64)
    # Up to the replaced token; the token after it, where the new one is taken as inserted (nothing
    # tells a replacement from an insertion yet); on, 13 to the deletion; found again past it (one
    # token 2 on), 12 to the insertion; its second token; the rest.
    assert rounds == [9, 0, 13, 12, 0, 20]
    assert greedy_rounds(PredictionDrafter(), [1, 2, 3], prediction, prediction, k=16) == [16, 16, 16, 8]


def test_a_short_run_far_from_where_the_output_was_is_no_place_to_resume():
    prediction = [5, 6, 7, 8, 9, 4, 10, 11, 12, 13]
    drafter = PredictionDrafter()
    drafter.begin([1], prediction)
    assert drafter.propose([1], 3, GREEDY).tokens.tolist() == [5, 6, 7]  # the output starts with the prediction
    # Two inserted tokens, the second of which (4) occurs 5 tokens on: taken as inserted, not a jump.
    assert drafter.propose([1, 20, 4], 3, GREEDY).tokens.tolist() == [5, 6, 7]
    assert drafter.propose([1, 20, 4, 5, 6, 7], 2, GREEDY).label == match_label(3)
    drafter.begin([1], [])
    assert drafter.propose([1, 5], 3, GREEDY).size == 0  # no prediction: nothing to draft


def test_the_ngram_drafter_continues_the_longest_match():
    drafter = NgramDrafter()
    # (4, 5) occurs twice; the first occurrence matches 3 tokens back (3, 4, 5), the later only 2.
    context = [3, 4, 5, 60, 61, 9, 4, 5, 70, 71, 3, 4, 5]
    draft = drafter.propose(context, 2, GREEDY)
    assert draft.tokens.tolist() == [60, 61] and draft.label == match_label(3)
