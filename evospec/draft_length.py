"""How many drafted tokens to verify each round.

`FixedDraftLength` always verifies up to k. `AdaptiveDraftLength` chooses the length that maximises
the expected tokens per second of the round, from the measured forward cost T(n) of the target and
an online estimate of the per-position acceptance alpha:

    E[emitted | m drafted] = 1 + alpha + ... + alpha^m,    time(m) = T(m + 1) + draft cost

m = 0 (a plain step) is always a candidate, so a drafter that does not pay stops being verified; the
other candidates are the lengths whose forward T(n) was measured (on a CPU some sizes, such as
multiples of 16, run much faster than their neighbours). alpha is tracked per drafter and per draft
label (e.g. the length of the match a model-free draft continues), with discounted counts so that it
follows a shifting stream, and read optimistically (a Hoeffding bonus) so that a length ruled out
early is tried again now and then. A model-free drafter is asked for a whole draft every round,
since drafting costs it next to nothing, and the first drafted token that no verification covered is
checked against the token the target emitted in its place: its acceptance is learned for free, even
in rounds that verify nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from evospec.cost import ForwardCost
from evospec.errors import EvospecError
from evospec.types import Attempt, Draft, Verdict


class DraftLength(Protocol):
    """Decides the draft length of each round and learns from the verdicts."""

    def budget(self, drafter: str, k: int, model_free: bool) -> int:
        """Tokens to ask `drafter` for (before drafting), at most k; model_free: drafting costs it next to nothing."""

    def keep(self, drafter: str, draft: Draft) -> int:
        """Leading tokens of a proposed draft to verify (after drafting)."""

    def observe(self, attempt: Attempt, verdict: Verdict) -> None:
        """What the verification of a round's attempt showed, and what drafting it cost."""


class FixedDraftLength:
    """Always the configured k, every draft token verified."""

    def budget(self, drafter: str, k: int, model_free: bool) -> int:
        return k

    def keep(self, drafter: str, draft: Draft) -> int:
        return draft.size

    def observe(self, attempt: Attempt, verdict: Verdict) -> None:
        """Nothing to learn."""


@dataclass(frozen=True)
class AdaptiveConfig:
    """The adaptive draft length's settings (chosen by replay: benchmarks/README.md)."""

    prior_acceptance: float = 0.5  # alpha before any verdict, worth prior_weight trials
    prior_weight: float = 2.0
    discount: float = 0.995  # per round: the weight of the past halves in about 140 rounds
    # For drafters checked for free every round, evidence is plentiful: the past halves in about 14 rounds,
    # so that what a stream taught (a summary quoting its article) does not carry into the next request.
    free_check_discount: float = 0.95
    # A draft is verified only where its expected tokens per second beat a plain step's by this factor:
    # acceptance estimates are noisy, and a draft that pays only on paper costs a verification.
    margin: float = 1.1
    exploration: float = 0.2  # scales the optimism bonus sqrt(log(rounds) / trials)

    def __post_init__(self) -> None:
        if not (
            0 <= self.prior_acceptance < 1
            and self.prior_weight > 0
            and 0 < self.discount <= 1
            and 0 < self.free_check_discount <= 1
            and self.margin >= 1
        ):
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
        self._checked_for_free: set[str] = set()  # model-free drafters: every round judges their drafts
        self._rounds = 0

    def alpha(self, drafter: str, label: str = "") -> float:
        """The acceptance estimate for a drafter's drafts under a label: a label's prior is what the
        drafter as a whole gets, the drafter's is prior_acceptance. It is read optimistically unless
        the drafter's drafts are checked every round for free (then nothing needs exploring)."""
        counts = self._acceptance.get((drafter, label))
        c = self.config
        prior = self._mean(drafter, "") if label else c.prior_acceptance
        trials = (counts.trials if counts else 0.0) + c.prior_weight
        mean = ((counts.successes if counts else 0.0) + c.prior_weight * prior) / trials
        bonus = (
            0.0 if drafter in self._checked_for_free else c.exploration * math.sqrt(math.log(self._rounds + 2) / trials)
        )
        return min(mean + bonus, 0.999)

    def _mean(self, drafter: str, label: str) -> float:
        """The drafter's posterior mean acceptance under a label, without optimism."""
        counts = self._acceptance.get((drafter, label)) or _Acceptance()
        c = self.config
        return (counts.successes + c.prior_weight * c.prior_acceptance) / (counts.trials + c.prior_weight)

    def best_length(self, alpha: float, max_length: int, seconds_per_draft_token: float = 0.0) -> int:
        """argmax of E[emitted | m] / time(m) over m = 0, max_length and the m <= max_length whose
        forward T(m + 1) was measured (the shortest among equals)."""
        max_length = min(max_length, self.cost.max_tokens - 1)
        lengths = sorted({size - 1 for size in self.cost.sizes if size - 1 <= max_length} | {max_length})

        def rate(m: int) -> float:
            expected = (1 - alpha ** (m + 1)) / (1 - alpha)  # 1 + alpha + ... + alpha^m (alpha < 1)
            return expected / (self.cost.of(m + 1) + m * seconds_per_draft_token)

        best = max(lengths, key=rate)
        return best if rate(best) >= self.config.margin * rate(0) else 0

    def budget(self, drafter: str, k: int, model_free: bool) -> int:
        if model_free:  # a whole draft costs nothing: keep() decides, and what it leaves out is checked for free
            self._checked_for_free.add(drafter)
            return k
        # The best label's acceptance: a drafter whose drafts pay only sometimes must still be asked,
        # and keep() then drops the drafts that do not pay.
        labels = [label for name, label in self._acceptance if name == drafter] or [""]
        alpha = max(self.alpha(drafter, label) for label in labels)
        return self.best_length(alpha, k, self._draft_seconds_per_token.get(drafter, 0.0))

    def keep(self, drafter: str, draft: Draft) -> int:
        return self.best_length(self.alpha(drafter, draft.label), draft.size)  # drafting is paid already

    def observe(self, attempt: Attempt, verdict: Verdict) -> None:
        self._rounds += 1
        # Every round ages the evidence, verified or not, so a drafter left out is tried again.
        free = attempt.drafter in self._checked_for_free
        discount = self.config.free_check_discount if free else self.config.discount
        for (name, _), counts in self._acceptance.items():
            if name == attempt.drafter:
                counts.decay(discount)
        proposed = attempt.proposed
        if not proposed.size:
            return
        known, right = _positions_judged(attempt, verdict)
        for label in {"", proposed.label}:  # the drafter as a whole, and this kind of draft
            counts = self._acceptance.setdefault((attempt.drafter, label), _Acceptance())
            counts.trials += known
            counts.successes += right
        seconds_per_token = attempt.draft_s / proposed.size
        previous = self._draft_seconds_per_token.get(attempt.drafter, seconds_per_token)
        self._draft_seconds_per_token[attempt.drafter] = 0.9 * previous + 0.1 * seconds_per_token


def _positions_judged(attempt: Attempt, verdict: Verdict) -> tuple[int, int]:
    """(positions of the proposed draft whose verdict is known, how many of them were right).

    Every accepted position was right. The first position after them is known too: rejected by the
    verification, or, when no verification reached it, right exactly when the target emitted the
    drafted token there (for a one-hot draft that happens with the probability that verifying it
    would have accepted it). Past that nothing is known.
    """
    accepted, verified, proposed = verdict.num_accepted, attempt.draft.size, attempt.proposed
    if accepted < verified:
        return accepted + 1, accepted
    if accepted < proposed.size and proposed.probs is None:
        return accepted + 1, accepted + int(int(proposed.tokens[accepted]) == verdict.emitted[accepted])
    return accepted, accepted
