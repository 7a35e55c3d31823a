"""Losses of a drafter against what the target said on the verified positions."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evospec.learnable import Trace, TrainingOutputs


@dataclass(frozen=True)
class LossConfig:
    """How the terms add up. Each default is defined here, once."""

    kl: float = 1.0  # forward KL to the target's distribution on every verified position (OnlineSPEC)
    rejected_ce: float = 0.0  # cross-entropy on the target's token where a draft was rejected (OSD)
    feature: float = 0.1  # smooth-L1 between predicted and target features (EAGLE's regression term)


def drafter_loss(outputs: TrainingOutputs, trace: Trace, row_of: torch.Tensor, config: LossConfig) -> torch.Tensor:
    """The weighted loss of one trace; row_of maps target ids to the drafter's vocabulary rows (-1: not in it)."""
    log_q = outputs.logits.log_softmax(dim=-1)  # [S, N]
    top_rows = row_of[trace.top_ids[outputs.rows]]  # [S, K]
    kept = top_rows >= 0  # tokens the drafter cannot propose carry no gradient
    p = trace.top_probs[outputs.rows] * kept
    p = p / p.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    # Forward KL(p || q) = sum p log p - sum p log q; the first term does not depend on the drafter.
    loss = config.kl * -(p * log_q.gather(1, top_rows.clamp_min(0))).sum(dim=-1).mean()
    if config.rejected_ce:
        rejected = trace.rejected[outputs.rows] & kept[:, 0]
        if rejected.any():
            target = top_rows[rejected, 0]  # the target's own choice there (its argmax)
            loss = loss + config.rejected_ce * -log_q[rejected].gather(1, target[:, None]).mean()
    if config.feature and outputs.features is not None:
        loss = loss + config.feature * torch.nn.functional.smooth_l1_loss(
            outputs.features, trace.hidden[outputs.feature_rows]
        )
    return loss
