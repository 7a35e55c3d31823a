"""Step-level speculation for reasoning, and the judges that compare a drafted step with the target's."""

from evospec.config import StepConfig
from evospec.reasoning.judges import JUDGES, EmbeddingJudge, Judge, TargetJudge, build_judge
from evospec.reasoning.steps import StepSpeculator, build_step_speculator

__all__ = [
    "JUDGES",
    "EmbeddingJudge",
    "Judge",
    "StepConfig",
    "StepSpeculator",
    "TargetJudge",
    "build_judge",
    "build_step_speculator",
]
