"""The suffix drafter: it drafts what earlier requests said, and what this one said before."""

from __future__ import annotations

import torch

from evospec.config import SamplingConfig
from evospec.drafters import SuffixDrafter
from evospec.drafters.base import match_label
from evospec.drafters.suffix import SuffixConfig
from evospec.sampling import Sampler

GREEDY = Sampler(SamplingConfig())


def test_an_earlier_reply_is_drafted_when_its_start_comes_again():
    drafter = SuffixDrafter()
    reply = [50, 51, 52, 53, 54, 55, 56]
    drafter.begin([1, 2, 3], ())
    drafter.propose([1, 2, 3, *reply], 4, GREEDY)  # indexes the first request, prompt and reply
    drafter.begin([9, 8], ())
    draft = drafter.propose([9, 8, 50, 51], 4, GREEDY)  # a match of 2 tokens drafts 2 (SuffixDecoding's factor 1)
    assert draft.tokens.tolist() == [52, 53] and draft.probs is None and draft.label == "match2"
    longer = drafter.propose([9, 8, 50, 51, 52, 53], 8, GREEDY)  # of 4: 4 tokens, into what came after the reply
    assert longer.tokens.tolist() == [54, 55, 56, 9] and longer.label == "match4"


def test_the_longest_suffix_wins_and_its_latest_continuation():
    drafter = SuffixDrafter(SuffixConfig(max_ngram=3, min_ngram=2))
    context = [7, 1, 2, 3, 40, 5, 1, 2, 41, 9, 1, 2, 3]
    drafter.begin(context, ())
    draft = drafter.propose(context, 2, GREEDY)
    assert draft.tokens.tolist() == [40, 5] and draft.label == match_label(3)  # (1, 2, 3) beats the later (1, 2)
    assert drafter.propose([*context, 40, 5, 1, 2], 1, GREEDY).tokens.tolist() == [41]  # (5, 1, 2) -> 41
    latest = drafter.propose([*context, 40, 5, 1, 2, 41, 6, 1, 2], 1, GREEDY)  # (6, 1, 2) unseen; (1, 2) seen 4 times
    assert latest.tokens.tolist() == [41] and latest.label == match_label(2)  # the latest (1, 2) was followed by 41


def test_no_match_is_an_empty_draft_and_a_full_corpus_forgets_its_oldest_half():
    drafter = SuffixDrafter(SuffixConfig(max_corpus_tokens=10))
    drafter.begin([1, 2, 3], ())
    assert drafter.propose([1, 2, 3], 3, GREEDY).size == 0
    drafter.propose([1, 2, 3, 4, 5, 6, 7, 8], 3, GREEDY)
    drafter.begin([20, 21, 22], ())  # 8 + 3 > 10 tokens: the oldest half goes
    assert drafter.propose([20, 21, 22, 5, 6], 2, GREEDY).tokens.tolist() == [7, 8]
    assert drafter.propose([20, 21, 22, 5, 6, 7, 8, 1, 2], 2, GREEDY).size == 0  # (1, 2) was forgotten
    assert isinstance(drafter.propose([20, 21], 1, GREEDY).tokens, torch.Tensor)
