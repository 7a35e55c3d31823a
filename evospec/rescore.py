"""Re-scoring: an independent check that a greedy output is the target's own choice.

Where kernels are not batch-invariant (llama.cpp on a CPU), a verification of many rows may round
differently from one-token steps, so a speculative output need not equal plain decoding bit for bit.
What must hold is that every emitted token is the target's argmax, up to that rounding: teacher-force
the output through one-token steps and measure, at each position, how far the emitted token's logit
falls below the best one. A verifier that accepts a token the target did not choose leaves gaps far
larger than rounding can explain.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from evospec.target import LanguageModel


def greedy_gaps(lm: LanguageModel, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> torch.Tensor:
    """[n] float32: at each output position, max logit minus the emitted token's logit when the output
    is fed one token a step after the prompt (0 where the emitted token is the argmax). Leaves lm empty."""
    lm.reset()
    logits = lm.forward(list(prompt_ids), num_logits=1)[-1]
    gaps = []
    for i, token in enumerate(output_ids):
        gaps.append(float(logits.max() - logits[token]))
        if i + 1 < len(output_ids):
            logits = lm.forward([token])[-1]
    lm.reset()
    return torch.tensor(gaps, dtype=torch.float32)
