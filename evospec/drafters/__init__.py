"""Drafters: the protocol and each kind (`registry` builds them from command-line specs)."""

from evospec.drafters.base import Drafter, empty_draft
from evospec.drafters.ngram import NgramDrafter
from evospec.drafters.prediction import PredictionDrafter
from evospec.drafters.small_lm import SmallLMDrafter
from evospec.drafters.suffix import SuffixDrafter

__all__ = ["Drafter", "NgramDrafter", "PredictionDrafter", "SmallLMDrafter", "SuffixDrafter", "empty_draft"]
