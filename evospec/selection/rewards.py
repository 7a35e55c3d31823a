"""Rewards of a round for the selector (MetaSD), from the draft and the target's verdict.

- block efficiency BE = accepted / k: what the round achieved.
- block divergence BD = (1/k) * sum_j sum_x min(p_j(x), q_j(x)) = (1/k) * sum_j (1 - TV(p_j, q_j)):
  how close the drafter's distributions were to the target's at every drafted position, accepted or
  not; richer and of lower variance than BE. q is one-hot on the drafted token for drafters without
  probabilities, and under greedy decoding p is one-hot on argmax p, so BD is then the share of
  drafted positions whose token is the target's choice.
- round speed = (accepted + 1) / (k + 1) * verify_s / (draft_s + verify_s): the tokens per second of
  the round, in units of the most that k drafted tokens could give for the same verification. BD and
  BE measure agreement; where drafting is not nearly free (a small LM on a CPU, its catch-up after
  other arms' rounds), the arm that agrees most is not the fastest, and this reward sees the difference.
  Arms asked for the same k pay alike for verification, so it orders them by tokens per second from
  measured seconds alone, with no model of the target's cost.
All are computed under the sampling transform of the verification and are 0 for an empty draft.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from evospec.sampling import Sampler
from evospec.types import Draft, RoundTime, Verdict


def block_efficiency(target_logits: torch.Tensor, draft: Draft, verdict: Verdict, sampler: Sampler, k: int,
                     time: RoundTime) -> float:
    """accepted / k (k: the draft length asked for; an empty draft scores 0)."""
    return verdict.num_accepted / k if k else 0.0


def block_divergence(target_logits: torch.Tensor, draft: Draft, verdict: Verdict, sampler: Sampler, k: int,
                     time: RoundTime) -> float:
    """(1/k) * sum over drafted positions j of sum_x min(p_j(x), q_j(x)). target_logits [m + 1, V]."""
    m = draft.size
    if m == 0 or k == 0:
        return 0.0
    positions = torch.arange(m)
    if sampler.greedy:  # p one-hot on argmax p (the verdict's); q one-hot on the drafted token
        overlap = (verdict.target_argmax[:m] == draft.tokens).float()
    else:
        p = sampler.probs(target_logits[:m])  # [m, V]
        if draft.probs is None:
            overlap = p[positions, draft.tokens]  # min(p, one-hot(x)) sums to p(x)
        else:
            overlap = torch.minimum(p, draft.probs).sum(dim=-1)  # [m]
    return float(overlap.sum()) / k


def round_speed(target_logits: torch.Tensor, draft: Draft, verdict: Verdict, sampler: Sampler, k: int,
                time: RoundTime) -> float:
    """(accepted + 1) / (k + 1) * verify_s / (draft_s + verify_s), in [0, 1]."""
    if draft.size == 0 or k == 0:
        return 0.0
    return (verdict.num_accepted + 1) / (k + 1) * time.verify_s / (time.draft_s + time.verify_s)


# A selector's reward_kind -> the reward of a round: f(target_logits, draft, verdict, sampler, k asked, time).
REWARDS: dict[str, Callable[[torch.Tensor, Draft, Verdict, Sampler, int, RoundTime], float]] = {
    "bd": block_divergence,
    "be": block_efficiency,
    "speed": round_speed,
}
