"""OnlineSPEC (Qian et al., "When Drafts Evolve: Speculative Decoding Meets Online Learning", arXiv 2603.12617):
the feedback buffer, the losses and the online learners that keep a drafter learning while it serves
(white-box drafters, and a small LM through its adapters)."""

from evospec.learning.buffer import FeedbackBuffer
from evospec.learning.learners import (
    LEARNERS,
    NO_LEARNER,
    EnsembleLearner,
    LearnerConfig,
    OGDLearner,
    OnlineLearner,
    OptimisticLearner,
    build_learner,
)
from evospec.learning.losses import LossConfig, drafter_loss

__all__ = [
    "LEARNERS",
    "NO_LEARNER",
    "EnsembleLearner",
    "FeedbackBuffer",
    "LearnerConfig",
    "LossConfig",
    "OGDLearner",
    "OnlineLearner",
    "OptimisticLearner",
    "build_learner",
    "drafter_loss",
]
