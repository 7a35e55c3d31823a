"""The LanguageModel protocol's shared helper: the target's most likely next tokens, with their probabilities."""

from __future__ import annotations

import torch

from evospec.target import top_next_tokens


def test_the_top_tokens_come_with_their_softmax_probabilities():
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0], [3.0, 3.0, 0.0, 0.0]])
    ids, probs = top_next_tokens(logits, 2)
    assert ids[0].tolist() == [1, 2] and set(ids[1].tolist()) == {0, 1}
    torch.testing.assert_close(probs, logits.softmax(dim=-1).topk(2).values)
    assert probs.dtype == torch.float32 and top_next_tokens(logits.bfloat16(), 1)[1].dtype == torch.float32
