from __future__ import annotations

import torch

from evospec.target import CachedLM, top_next_tokens


def test_forward_then_trim_matches_a_fresh_forward(tiny_target):
    lm = CachedLM(tiny_target)
    lm.forward([1, 2, 3, 4, 5])
    lm.trim(3)  # forget 4, 5
    assert lm.length == 3
    continued = lm.forward([7, 8])
    fresh = CachedLM(tiny_target).forward([1, 2, 3, 7, 8])
    torch.testing.assert_close(continued, fresh[3:])


def test_hidden_states_are_the_features_under_the_head(tiny_target):
    lm = CachedLM(tiny_target)
    logits, hidden = lm.forward_with_hidden([3, 1, 4, 1, 5])
    assert hidden.shape == (5, tiny_target.config.hidden_size)
    torch.testing.assert_close(logits, tiny_target.lm_head(hidden))


def test_num_logits_keeps_the_last_rows(tiny_target):
    logits = CachedLM(tiny_target).forward([3, 1, 4, 1, 5], num_logits=1)
    assert logits.shape == (1, tiny_target.config.vocab_size)


def test_a_prompt_pass_scores_every_prompt_token_and_keeps_the_prefills_logits(tiny_target):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    passed = CachedLM(tiny_target).forward_prompt(prompt, top_k=4, rows=100)
    logits, hidden = CachedLM(tiny_target).forward_with_hidden(prompt)
    assert torch.equal(passed.logits, CachedLM(tiny_target).forward(prompt, num_logits=1))
    torch.testing.assert_close(passed.hidden, hidden)
    top_ids, top_probs = top_next_tokens(logits, 4)
    assert torch.equal(passed.top_ids, top_ids)
    torch.testing.assert_close(passed.top_probs, top_probs)
    torch.testing.assert_close(top_probs, torch.softmax(logits, dim=-1).topk(4).values)
    last_three = CachedLM(tiny_target).forward_prompt(prompt, top_k=4, rows=3)  # only the rows learners take
    assert torch.equal(last_three.logits, passed.logits) and torch.equal(last_three.top_ids, top_ids[-3:])
    torch.testing.assert_close(last_three.hidden, hidden[-3:])
