"""Learners that learn from judged reasoning steps (evospec.reasoning): OnlineSPEC's Online-LR and
the token-level baseline it is compared with.

A rejected step is a preference pair: from the same prefix, the target's step (chosen) is preferred
to the drafter's (rejected), as OnlineSPEC writes {prompt, chosen, rejected} for every rejected draft
step (`LR/src/lr.py`). `dpo` learns from the pairs with the DPO loss (Rafailov et al. 2023), its
reference being the drafter as it started; `step-ce` learns from the same steps with cross-entropy on
the target's tokens only (OSD-LR: token-level feedback). Both train a small LM's adapters (lora:MODEL)
with AdamW, and keep the existing learners' schedule (rounds counted in judged steps), buffer, guard
(on step acceptance) and saved state.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass

import torch

from evospec.errors import EvospecError
from evospec.learnable import LearnableDrafter
from evospec.learning.buffer import packed
from evospec.learning.learners import AdamWLearner, LearnerConfig, tensors_under
from evospec.types import JudgedStep, RoundFeedback


@dataclass(frozen=True)
class PreferencePair:
    """A rejected step: the target's step preferred to the drafter's after prefix, with the reference
    drafter's log-likelihood of each."""

    prefix: torch.Tensor  # [P] int64
    chosen: torch.Tensor  # [c] int64 the target's step
    rejected: torch.Tensor  # [r] int64 the drafter's step
    reference_chosen: float  # log q_ref(chosen | prefix)
    reference_rejected: float  # log q_ref(rejected | prefix)

    @property
    def rows(self) -> int:
        return int(self.chosen.numel() + self.rejected.numel())

    @property
    def nbytes(self) -> int:
        return self.prefix.nbytes + self.chosen.nbytes + self.rejected.nbytes


class PairBuffer:
    """The newest preference pairs, at most `capacity` rows (step tokens) of them."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._pairs: deque[PreferencePair] = deque()
        self._rows = 0
        self.rows_added = 0  # ever, including the ones dropped since

    def __len__(self) -> int:
        return len(self._pairs)

    def add(self, pair: PreferencePair) -> None:
        self._pairs.append(pair)
        self._rows += pair.rows
        self.rows_added += pair.rows
        while self._rows > self.capacity and len(self._pairs) > 1:
            self._rows -= self._pairs.popleft().rows

    def recent(self, rows: int) -> list[PreferencePair]:
        """The newest pairs that hold at least `rows` rows (all of them if they hold fewer), oldest first."""
        taken, filled = [], 0
        for pair in reversed(self._pairs):
            if filled >= rows:
                break
            taken.append(pair)
            filled += pair.rows
        return taken[::-1]

    def nbytes(self) -> int:
        return sum(pair.nbytes for pair in self._pairs)


class StepPreferenceLearner(AdamWLearner):
    """What the step learners share: pairs from rejected steps, AdamW on a loss over them."""

    name = "step-base"
    default_lr = 1e-4  # LoRA adapters take larger steps than the full weights OnlineSPEC's DPO trains at 1e-5

    def __init__(self, drafter: LearnableDrafter, config: LearnerConfig) -> None:
        if not hasattr(drafter, "step_log_likelihood"):
            raise EvospecError(
                f"learner {self.name!r} trains the small LM that writes reasoning steps (lora:MODEL), "
                f"not '{drafter.name}'"
            )
        super().__init__(drafter, config)
        self.buffer = PairBuffer(config.buffer_rows)
        self.reference = copy.deepcopy(drafter.module).requires_grad_(False)  # the drafter as it started
        self.pairs = 0  # preference pairs made

    @property
    def prompt_rows(self) -> int:
        return 0

    def observe(self, feedback: RoundFeedback) -> None:
        """Token-level rounds teach it nothing: judged steps do (observe_step)."""

    def observe_step(self, step: JudgedStep) -> None:
        """Keep a rejected step as a preference pair; learn when the schedule says so."""
        self.guard.record(int(step.accepted), 1)
        self._rounds += 1
        if not step.accepted:
            with torch.no_grad():
                reference = [
                    float(self.drafter.step_log_likelihood(self.reference, step.prefix, side))
                    for side in (step.target, step.drafted)
                ]
            self.buffer.add(PreferencePair(step.prefix, step.target, step.drafted, *reference))
            self.pairs += 1
        if self.config.schedule == "rounds" and self._rounds >= self.config.every:
            self.learn()

    def _recent_batches(self, rows: int) -> list[list[PreferencePair]]:
        pairs = self.buffer.recent(rows)
        return packed(pairs, [pair.rows for pair in pairs], self.config.batch_rows)

    def loss(self, module: torch.nn.Module, pairs: list[PreferencePair]) -> torch.Tensor:
        return torch.stack([self.pair_loss(module, pair) for pair in pairs]).mean()

    def pair_loss(self, module: torch.nn.Module, pair: PreferencePair) -> torch.Tensor:
        raise NotImplementedError

    def state_tensors(self) -> dict[str, torch.Tensor]:
        reference = {f"reference.{key}": value for key, value in self.reference.state_dict().items()}
        return {**super().state_tensors(), **reference}

    def state_meta(self) -> dict:
        return {**super().state_meta(), "pairs": self.pairs}

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        super().load_state({k: v for k, v in tensors.items() if not k.startswith("reference.")}, meta)
        self.reference.load_state_dict(tensors_under(tensors, "reference."))
        self.pairs = int(meta.get("pairs", 0))

    def report(self) -> dict:
        return {**super().report(), "pairs": self.pairs}


class DPOLearner(StepPreferenceLearner):
    """Online-LR: -log sigmoid(beta * (log-ratio of chosen - log-ratio of rejected)), each log-ratio
    log q(step | prefix) - log q_ref(step | prefix)."""

    name = "dpo"

    def pair_loss(self, module: torch.nn.Module, pair: PreferencePair) -> torch.Tensor:
        chosen = self.drafter.step_log_likelihood(module, pair.prefix, pair.chosen) - pair.reference_chosen
        rejected = self.drafter.step_log_likelihood(module, pair.prefix, pair.rejected) - pair.reference_rejected
        return -torch.nn.functional.logsigmoid(self.config.dpo_beta * (chosen - rejected))


class StepCELearner(StepPreferenceLearner):
    """OSD-LR, the token-level baseline: cross-entropy on the target's step tokens, per token."""

    name = "step-ce"

    def pair_loss(self, module: torch.nn.Module, pair: PreferencePair) -> torch.Tensor:
        return -self.drafter.step_log_likelihood(module, pair.prefix, pair.chosen) / pair.chosen.numel()
