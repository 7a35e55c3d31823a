"""OnlineSPEC (Qian et al., "When Drafts Evolve: Speculative Decoding Meets Online Learning", arXiv 2603.12617):
the feedback buffer, the losses and the online learners that keep a drafter learning while it serves
(white-box drafters, and a small LM through its adapters), and the learners of judged reasoning steps."""

from evospec.learning.buffer import FeedbackBuffer
from evospec.learning.learners import (
    EnsembleLearner,
    LearnerConfig,
    OGDLearner,
    OnlineLearner,
    OptimisticLearner,
)
from evospec.learning.losses import LossConfig, drafter_loss
from evospec.learning.preference import DPOLearner, StepCELearner
from evospec.learning.registry import LEARNERS, NO_LEARNER, STEP_LEARNERS, build_learner

__all__ = [
    "LEARNERS",
    "NO_LEARNER",
    "STEP_LEARNERS",
    "DPOLearner",
    "EnsembleLearner",
    "FeedbackBuffer",
    "LearnerConfig",
    "LossConfig",
    "OGDLearner",
    "OnlineLearner",
    "OptimisticLearner",
    "StepCELearner",
    "build_learner",
    "drafter_loss",
]
