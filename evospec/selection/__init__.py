"""MetaSD (Kim et al., "Multi-Drafter Speculative Decoding with Alignment Feedback", arXiv 2604.05417):
pick one drafter per round with a bandit over the rewards of the rounds."""

from evospec.selection.rewards import REWARDS, block_divergence, block_efficiency, round_speed
from evospec.selection.selectors import DEFAULT_SELECTOR, SELECTORS, Selector, SelectorConfig, build_selector

__all__ = [
    "DEFAULT_SELECTOR",
    "REWARDS",
    "SELECTORS",
    "Selector",
    "SelectorConfig",
    "block_divergence",
    "block_efficiency",
    "build_selector",
    "round_speed",
]
