"""The learner registry: --learner names -> learners."""

from __future__ import annotations

from evospec.errors import EvospecError
from evospec.learnable import LearnableDrafter
from evospec.learning.learners import (
    AdamWLearner,
    EnsembleLearner,
    LearnerConfig,
    OGDLearner,
    OnlineLearner,
    OptimisticLearner,
)
from evospec.learning.preference import DPOLearner, StepCELearner

# Learners of token-level rounds: they learn from what each verification said.
LEARNERS: dict[str, type[OnlineLearner]] = {
    learner.name: learner for learner in (OGDLearner, OptimisticLearner, EnsembleLearner, AdamWLearner)
}
# Learners of judged reasoning steps (--reasoning-speculation): they learn from the judge's verdicts.
STEP_LEARNERS: dict[str, type[OnlineLearner]] = {learner.name: learner for learner in (DPOLearner, StepCELearner)}
NO_LEARNER = "none"


def learner_kind(name: str) -> type[OnlineLearner]:
    """The learner class `name` names (one of LEARNERS or STEP_LEARNERS); an unknown name is a clear error."""
    known = {**LEARNERS, **STEP_LEARNERS}
    if name not in known:
        raise EvospecError(f"unknown learner {name!r}; choose one of {', '.join([NO_LEARNER, *known])}")
    return known[name]


def build_learner(name: str, drafter: LearnableDrafter, config: LearnerConfig) -> OnlineLearner | None:
    """The learner `name` (one of LEARNERS or STEP_LEARNERS, or 'none') for a learnable drafter
    (white-box, or a small LM with adapters)."""
    if name == NO_LEARNER:
        return None
    kind = learner_kind(name)
    if not drafter.learnable:
        raise EvospecError(
            f"drafter '{drafter.name}' cannot learn on line; learners train eagle, hydra and lora:MODEL drafters"
        )
    return kind(drafter, config)
