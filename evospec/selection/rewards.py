"""Rewards of a round for the selector (MetaSD, arXiv 2604.05417), from the draft and the target's verdict.

- block efficiency BE = accepted / k: what the round achieved.
- block divergence BD = (1/k) * sum_j sum_x min(p_j(x), q_j(x)) = (1/k) * sum_j (1 - TV(p_j, q_j)):
  how close the drafter's distributions were to the target's at every drafted position, accepted or
  not; richer and of lower variance than BE. q is one-hot on the drafted token for drafters without
  probabilities, and under greedy decoding p is one-hot on argmax p, so BD is then the share of
  drafted positions whose token is the target's choice.
- round speed = s / (1 + s), where s = (accepted + 1) * T(1) / (draft_s + verify_s) is the round's
  speedup over plain decoding, from its measured seconds and the target's measured one-token step.
  BD and BE measure agreement. Where drafting or verifying is not nearly free (a small LM or a
  llama.cpp target on a CPU), the drafter that agrees most is not the fastest one, and this reward
  sees the difference. A round whose drafter had nothing to propose is a plain step (s ~ 1).
BD and BE are computed under the sampling transform of the verification and are 0 for an empty draft.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from evospec.sampling import Sampler
from evospec.types import Draft, RoundTime, Verdict


def block_efficiency(
    target_logits: torch.Tensor, draft: Draft, verdict: Verdict, sampler: Sampler, k: int, time: RoundTime
) -> float:
    """accepted / k (k: the draft length asked for; an empty draft scores 0)."""
    return verdict.num_accepted / k if k else 0.0


def block_divergence(
    target_logits: torch.Tensor, draft: Draft, verdict: Verdict, sampler: Sampler, k: int, time: RoundTime
) -> float:
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


def round_speed(
    target_logits: torch.Tensor, draft: Draft, verdict: Verdict, sampler: Sampler, k: int, time: RoundTime
) -> float:
    """s / (1 + s) in [0, 1), s = (accepted + 1) * step_s / (draft_s + verify_s): speedup over plain decoding."""
    speedup = (verdict.num_accepted + 1) * time.step_s / (time.draft_s + time.verify_s)
    return speedup / (1 + speedup)


# A selector's reward_kind -> the reward of a round: f(target_logits, draft, verdict, sampler, k asked, time).
REWARDS: dict[str, Callable[[torch.Tensor, Draft, Verdict, Sampler, int, RoundTime], float]] = {
    "bd": block_divergence,
    "be": block_efficiency,
    "speed": round_speed,
}
