"""OnlineSPEC: feedback buffer, losses and online learners that keep white-box drafters learning while they serve."""

from evospec.learning.buffer import FeedbackBuffer, Trace
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
from evospec.learning.losses import LossConfig, TrainingOutputs, drafter_loss

__all__ = [
    "LEARNERS", "NO_LEARNER", "EnsembleLearner", "FeedbackBuffer", "LearnerConfig", "LossConfig", "OGDLearner",
    "OnlineLearner", "OptimisticLearner", "Trace", "TrainingOutputs", "build_learner", "drafter_loss",
]
