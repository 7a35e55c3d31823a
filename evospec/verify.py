"""Verification: the target's verdict on a draft.

Words (used throughout evospec):
- p: the target's distribution at a position, q: the drafter's, both after the same sampling transform.
- accepted: the leading draft tokens the target keeps.
- recovered: at the first rejection the target emits its own token instead.
- bonus: after full acceptance the target's last position gives one token more.
So every round emits accepted + 1 tokens.

greedy: accept while the draft token equals argmax p; the extra token is argmax p where they differ.
sampling (Leviathan et al. 2023, arXiv 2211.17192; Chen et al. 2023, arXiv 2302.01318): accept x_j
with probability min(1, p(x_j) / q(x_j)); on rejection draw from norm(max(0, p - q)); after k
acceptances draw the bonus from p. This leaves the output distributed exactly as the target's own
samples.
"""

from __future__ import annotations

import torch

from evospec.sampling import Sampler
from evospec.types import Draft, Verdict


def verify(target_logits: torch.Tensor, draft: Draft, sampler: Sampler) -> Verdict:
    """Judge a draft. target_logits [m + 1, V]: the target's logits at the pending token and at each draft token."""
    if sampler.greedy:
        return verify_greedy(target_logits, draft.tokens)
    return verify_sampled(sampler.probs(target_logits), draft, sampler)


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> Verdict:
    """target_logits [m + 1, V], draft_tokens [m] -> accept the longest prefix equal to argmax p."""
    target_tokens = target_logits.argmax(dim=-1)  # [m + 1]
    m = draft_tokens.numel()
    matches = (target_tokens[:m] == draft_tokens).int()
    num_accepted = int(matches.cumprod(dim=0).sum()) if m else 0
    return Verdict(num_accepted, target_tokens[: num_accepted + 1].tolist(), target_tokens)


def verify_sampled(p: torch.Tensor, draft: Draft, sampler: Sampler) -> Verdict:
    """p [m + 1, V] -> rejection sampling of the draft against p; q from the draft (one-hot when it has none)."""
    m = draft.size
    tokens = draft.tokens
    positions = torch.arange(m)
    p_draft = p[positions, tokens]  # [m]: p(x_j)
    q_draft = draft.probs[positions, tokens] if draft.probs is not None else torch.ones(m)  # [m]: q(x_j)
    accept = sampler.uniform(m) * q_draft < p_draft  # u < p/q without dividing by a zero q
    num_accepted = int(accept.int().cumprod(dim=0).sum()) if m else 0
    if num_accepted == m:
        extra = sampler.sample(p[m : m + 1])  # bonus
    else:
        residual = p[num_accepted].clone()
        if draft.probs is not None:
            residual = (residual - draft.probs[num_accepted]).clamp_min_(0)
        else:
            residual[tokens[num_accepted]] = 0  # p - one-hot(x), clamped at 0
        extra = sampler.sample(residual.unsqueeze(0) / residual.sum())  # recovered
    return Verdict(num_accepted, tokens[:num_accepted].tolist() + extra.tolist())
