"""How many drafted tokens to verify each round.

`FixedDraftLength` always verifies up to k. `AdaptiveDraftLength` chooses the length that maximises
the expected tokens per second of the round, from the measured forward cost T(n) of the target and
an online estimate of the per-position acceptance alpha:

    E[emitted | m drafted] = 1 + alpha + ... + alpha^m,    time(m) = T(m + 1) + draft cost

m = 0 (a plain step) is always a candidate, so a drafter that does not pay stops being verified.
alpha is tracked per drafter and per draft label (e.g. the n-gram drafter's match length), with
discounted counts so that it follows a shifting stream, and read optimistically (a Hoeffding bonus)
so that a length ruled out early is tried again now and then.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from evospec.cost import ForwardCost, model_forward_cost
from evospec.errors import EvospecError
from evospec.models.loading import LoadedModel
from evospec.selection import Selector
from evospec.types import Draft


class DraftLength(Protocol):
    """Decides the draft length of each round and learns from the verdicts."""

    def budget(self, drafter: str, k: int) -> int:
        """Tokens to ask `drafter` for (before drafting), at most k."""

    def keep(self, drafter: str, draft: Draft) -> int:
        """Leading tokens of a proposed draft to verify (after drafting)."""

    def observe(self, drafter: str, draft: Draft, num_accepted: int, draft_seconds: float) -> None:
        """What the verification of a (kept) draft showed, and what drafting it cost."""


class FixedDraftLength:
    """Always the configured k, every draft token verified."""

    def budget(self, drafter: str, k: int) -> int:
        return k

    def keep(self, drafter: str, draft: Draft) -> int:
        return draft.size

    def observe(self, drafter: str, draft: Draft, num_accepted: int, draft_seconds: float) -> None:
        """Nothing to learn."""


@dataclass(frozen=True)
class AdaptiveConfig:
    """Chosen with benchmarks/policy_replay.py on llama.cpp with unpacked weights, where a verified draft
    token cost 0.5-0.7 of a decode step: the earlier discount 0.98 and exploration 0.5 re-explored
    drafts that do not pay so often that the n-gram drafter lost 7-13% on the streams where it rarely
    matches. A prior of 0.5 stays, so that a new drafter drafts at once and its cost is learned
    (benchmarks/README.md). At 0.8-0.9 of a step (repacked weights) the policy rarely drafts at all."""

    prior_acceptance: float = 0.5  # alpha before any verdict, worth prior_weight trials
    prior_weight: float = 2.0
    discount: float = 0.995  # per round: the weight of the past halves in about 140 rounds
    exploration: float = 0.2  # scales the optimism bonus sqrt(log(rounds) / trials)

    def __post_init__(self) -> None:
        if not (0 <= self.prior_acceptance < 1 and self.prior_weight > 0 and 0 < self.discount <= 1):
            raise EvospecError(f"invalid adaptive draft-length settings: {self}")


@dataclass
class _Acceptance:
    """Discounted counts of per-position acceptance."""

    trials: float = 0.0
    successes: float = 0.0

    def decay(self, discount: float) -> None:
        self.trials *= discount
        self.successes *= discount


class AdaptiveDraftLength:
    """Chooses the draft length from T(n) and per-drafter acceptance (see the module docstring)."""

    def __init__(self, cost: ForwardCost, config: AdaptiveConfig = AdaptiveConfig()) -> None:
        self.cost = cost
        self.config = config
        self._acceptance: dict[tuple[str, str], _Acceptance] = {}
        self._draft_seconds_per_token: dict[str, float] = {}
        self._rounds = 0

    def alpha(self, drafter: str, label: str = "") -> float:
        """The optimistic acceptance estimate for a drafter's drafts under a label."""
        counts = self._acceptance.get((drafter, label))
        c = self.config
        trials = (counts.trials if counts else 0.0) + c.prior_weight
        successes = (counts.successes if counts else 0.0) + c.prior_weight * c.prior_acceptance
        bonus = c.exploration * math.sqrt(math.log(self._rounds + 2) / trials)
        return min(successes / trials + bonus, 0.999)

    def best_length(self, alpha: float, max_length: int, seconds_per_draft_token: float = 0.0) -> int:
        """argmax over m in 0..max_length of E[emitted | m] / time(m)."""
        max_length = min(max_length, self.cost.max_tokens - 1)
        rates = [
            sum(alpha**i for i in range(m + 1)) / (self.cost.of(m + 1) + m * seconds_per_draft_token)
            for m in range(max_length + 1)
        ]
        return max(range(len(rates)), key=rates.__getitem__)

    def budget(self, drafter: str, k: int) -> int:
        # The best label's acceptance: a drafter whose drafts pay only sometimes (long n-gram
        # matches) must still be asked, and keep() then drops the drafts that do not pay.
        labels = [label for name, label in self._acceptance if name == drafter] or [""]
        alpha = max(self.alpha(drafter, label) for label in labels)
        return self.best_length(alpha, k, self._draft_seconds_per_token.get(drafter, 0.0))

    def keep(self, drafter: str, draft: Draft) -> int:
        return self.best_length(self.alpha(drafter, draft.label), draft.size)  # drafting is paid already

    def observe(self, drafter: str, draft: Draft, num_accepted: int, draft_seconds: float) -> None:
        self._rounds += 1
        # Every round ages the evidence, verified or not, so a drafter left out is tried again.
        for (name, _), counts in self._acceptance.items():
            if name == drafter:
                counts.decay(self.config.discount)
        if draft.size:
            trials = min(num_accepted + 1, draft.size)  # positions reached: every accepted one, plus the first miss
            for label in {"", draft.label}:  # the drafter as a whole, and this kind of draft
                counts = self._acceptance.setdefault((drafter, label), _Acceptance())
                counts.trials += trials
                counts.successes += num_accepted
            seconds_per_token = draft_seconds / draft.size
            previous = self._draft_seconds_per_token.get(drafter, seconds_per_token)
            self._draft_seconds_per_token[drafter] = 0.9 * previous + 0.1 * seconds_per_token


def timing(target: LoadedModel, max_k: int, adaptive: bool, selector: Selector | None) -> tuple[ForwardCost | None, AdaptiveDraftLength | None]:
    """The target's forward cost on this machine (measured once, cached) where a policy weighs time, the
    adaptive draft length or a selector rewarding speed, and the adaptive policy when asked for."""
    timed = adaptive or (selector is not None and selector.reward_kind == "speed")
    cost = model_forward_cost(target, max_k + 1) if timed else None
    return cost, AdaptiveDraftLength(cost) if adaptive else None
