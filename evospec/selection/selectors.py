"""Selectors: each round one drafter (arm) is picked; the round's reward (rewards.py) comes back.

All keep per-arm statistics that can be discounted (multiplied by `discount` every round, so old
rewards fade on a non-stationary stream; 1.0 keeps everything) and draw random numbers from one
seeded generator. `state_dict()` is all of that as JSON-able values (random state included), so a
restored selector goes on exactly as the saved one would have.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from evospec.errors import EvospecError
from evospec.types import ArmScore, Offer


@dataclass(frozen=True)
class SelectorConfig:
    """Settings of every selector; each default defined here once."""

    beta: float = 1.0  # UCB: weight of the exploration bonus beta * sqrt(2 ln t / n_i)
    discount: float = 1.0  # per round, on every arm's counts; < 1 forgets old rewards
    epsilon: float = 0.1  # epsilon-greedy: share of uniformly random picks
    exp3_gamma: float = 0.1  # EXP3: share of uniform exploration, also its learning rate
    per_request: bool = False  # start every request from scratch instead of keeping what was learned
    seed: int = 0

    def __post_init__(self) -> None:
        if self.beta < 0 or not 0 < self.discount <= 1 or not 0 <= self.epsilon <= 1 or not 0 < self.exp3_gamma <= 1:
            raise EvospecError(f"invalid selector settings: {self}")


class Selector(Protocol):
    """Picks an arm each round and learns from its reward in [0, 1]."""

    arms: tuple[str, ...]
    reward_kind: str  # "bd" (block divergence), "be" (block efficiency) or "speed" (round speed), see rewards.py
    # Full information: every cheap arm (model-free drafter) drafts every round, before the pick, and
    # observe() hears what each of those drafts scored, once the output covers it.
    full_information: bool

    def select(self, offers: Mapping[str, Offer] | None = None) -> str:
        """The arm to pull this round; offers: full information only, each cheap awake arm's draft of this
        round (the cheap arms with nothing to draft are left out)."""

    def update(self, arm: str, reward: float) -> None:
        """The reward of the round in which `arm` was pulled."""

    def observe(self, scores: Mapping[str, ArmScore]) -> None:
        """Full information only: what each cheap arm's draft of a round scored, the pulled arm's own
        included when it is cheap; called a few rounds after that round's update, once the output
        covers the drafts (at the latest when the request ends)."""

    def begin_request(self, awake: Sequence[str]) -> None:
        """A new request starts; only the awake arms (the drafters with something to draft for it) may
        be selected. State is dropped when the selector is configured per request."""

    def state_dict(self) -> dict[str, Any]:
        """What it has learned, as JSON-able values."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a state_dict() of a selector of the same kind over the same arms."""


class _Counts:
    """Discounted pulls and reward sums per arm."""

    full_information = False

    def __init__(self, arms: Sequence[str], config: SelectorConfig) -> None:
        if not arms:
            raise EvospecError("a selector needs at least one drafter")
        if len(set(arms)) != len(arms):
            raise EvospecError(f"drafter names must differ, got {list(arms)}")
        self.arms = tuple(arms)
        self.config = config
        self.rng = random.Random(config.seed)
        self.awake = self.arms  # the arms that may be selected in this request
        self.reset()

    def reset(self) -> None:
        self.pulls = dict.fromkeys(self.arms, 0.0)
        self.rewards = dict.fromkeys(self.arms, 0.0)

    def begin_request(self, awake: Sequence[str]) -> None:
        unknown = set(awake) - set(self.arms)
        if unknown or not awake:
            raise EvospecError(f"a request's awake arms must be some of {list(self.arms)}, got {list(awake)}")
        self.awake = tuple(arm for arm in self.arms if arm in awake)
        if self.config.per_request:
            self.reset()

    def update(self, arm: str, reward: float) -> None:
        for name in self.arms:
            self.pulls[name] *= self.config.discount
            self.rewards[name] *= self.config.discount
        self.pulls[arm] += 1
        self.rewards[arm] += reward

    def mean(self, arm: str) -> float:
        return self.rewards[arm] / self.pulls[arm] if self.pulls[arm] else 0.0

    def unpulled(self) -> str | None:
        return next((arm for arm in self.awake if self.pulls[arm] == 0), None)

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {
            "kind": self._kind(),
            "arms": list(self.arms),
            "pulls": dict(self.pulls),
            "rewards": dict(self.rewards),
            "rng": [version, list(internal), gauss],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = (state.get("kind"), state.get("arms"))
        if saved != (self._kind(), list(self.arms)):
            raise EvospecError(
                f"saved selector state is for {saved[0]} over {saved[1]}, not {self._kind()} over {list(self.arms)}"
            )
        pulls = {arm: float(state["pulls"][arm]) for arm in self.arms}
        rewards = {arm: float(state["rewards"][arm]) for arm in self.arms}
        rng = random.Random()
        version, internal, gauss = state["rng"]
        rng.setstate((version, tuple(internal), gauss))
        self.pulls, self.rewards, self.rng = pulls, rewards, rng  # all or nothing

    def _kind(self) -> str:
        return f"{type(self).__name__}({self.reward_kind})"


class UCB(_Counts):
    """MetaSD-UCB: every arm once, then argmax mean_i + beta * sqrt(2 ln t / n_i)."""

    def __init__(self, arms: Sequence[str], config: SelectorConfig, reward_kind: str) -> None:
        super().__init__(arms, config)
        self.reward_kind = reward_kind

    def select(self, offers: Mapping[str, Offer] | None = None) -> str:
        first = self.unpulled()
        if first is not None:
            return first
        total = sum(self.pulls.values())
        return max(
            self.awake,
            key=lambda arm: self.mean(arm) + self.config.beta * math.sqrt(2 * math.log(total) / self.pulls[arm]),
        )


class ContextualUCB(UCB):
    """MetaSD-UCB with a context: before each pick every cheap arm drafts (as for the full-information
    selectors), and each (arm, label of its draft this round) is an arm of its own, the label being
    the length of the match the draft continues. The pick is argmax mean + beta * sqrt(2 ln t / n) over
    this round's (arm, label) pairs, each pair tried once first. Feedback stays a bandit's: only the
    pulled draft's reward is learned, so a short match of one arm can win over a long match of the
    other only once pulls have shown it. An arm without drafts of its own (a neural drafter) is one
    context, "". A cheap arm with nothing to draft this round is not picked while another arm can be."""

    full_information = True  # for the labels of the cheap arms' drafts before the pick

    def reset(self) -> None:
        super().reset()
        self.cheap: set[str] = set()  # arms seen with a draft of their own before a pick
        # arm -> label -> [pulls, reward sum] of the rounds it was pulled with a draft of that label
        self.contexts: dict[str, dict[str, list[float]]] = {arm: {} for arm in self.arms}
        self._pulled: tuple[str, str] | None = None  # (arm, label) of the last pick

    def select(self, offers: Mapping[str, Offer] | None = None) -> str:
        offers = offers or {}
        self.cheap.update(offers)
        candidates = [(arm, offers[arm].label if arm in offers else "") for arm in self.awake]
        drafting = [pair for pair in candidates if pair[0] in offers or pair[0] not in self.cheap]
        candidates = drafting or candidates
        untried = next((pair for pair in candidates if not self._pulls_of(pair)), None)
        if untried is not None:
            self._pulled = untried
            return untried[0]
        log_total = math.log(max(sum(self.pulls.values()), 1.0))
        self._pulled = max(candidates, key=lambda pair: self._index(pair, log_total))
        return self._pulled[0]

    def _pulls_of(self, pair: tuple[str, str]) -> float:
        arm, label = pair
        return self.contexts[arm].get(label, (0.0, 0.0))[0]

    def _index(self, pair: tuple[str, str], log_total: float) -> float:
        arm, label = pair
        pulls, reward = self.contexts[arm][label]
        return reward / pulls + self.config.beta * math.sqrt(2 * log_total / pulls)

    def update(self, arm: str, reward: float) -> None:
        super().update(arm, reward)
        for labels in self.contexts.values():
            for values in labels.values():
                values[0] *= self.config.discount
                values[1] *= self.config.discount
        label = self._pulled[1] if self._pulled and self._pulled[0] == arm else ""
        values = self.contexts[arm].setdefault(label, [0.0, 0.0])
        values[0] += 1
        values[1] += reward

    def observe(self, scores: Mapping[str, ArmScore]) -> None:
        """Bandit feedback: the scores of drafts that were not pulled are not learned."""

    def state_dict(self) -> dict[str, Any]:
        contexts = {arm: {label: list(v) for label, v in labels.items()} for arm, labels in self.contexts.items()}
        return {**super().state_dict(), "cheap": sorted(self.cheap), "contexts": contexts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.cheap = set(state["cheap"]) & set(self.arms)
        self.contexts = {
            arm: {label: [float(n), float(r)] for label, (n, r) in state["contexts"][arm].items()} for arm in self.arms
        }


class EXP3(_Counts):
    """Exponential weights for adversarial rewards (Auer et al. 2002), importance-weighted updates."""

    reward_kind = "bd"

    def reset(self) -> None:
        super().reset()
        self.log_weights = dict.fromkeys(self.arms, 0.0)
        self._last_probs = self.probabilities()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "log_weights": dict(self.log_weights)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.log_weights = {arm: float(state["log_weights"][arm]) for arm in self.arms}
        self._last_probs = self.probabilities()

    def probabilities(self) -> dict[str, float]:
        """The chance of each awake arm this round."""
        gamma, top = self.config.exp3_gamma, max(self.log_weights[arm] for arm in self.awake)
        weights = {arm: math.exp(self.log_weights[arm] - top) for arm in self.awake}
        total = sum(weights.values())
        return {arm: (1 - gamma) * w / total + gamma / len(self.awake) for arm, w in weights.items()}

    def select(self, offers: Mapping[str, Offer] | None = None) -> str:
        self._last_probs = self.probabilities()
        return self.rng.choices(self.awake, weights=[self._last_probs[arm] for arm in self.awake])[0]

    def update(self, arm: str, reward: float) -> None:
        super().update(arm, reward)
        for name in self.arms:  # discounting forgets in weight space too
            self.log_weights[name] *= self.config.discount
        self.log_weights[arm] += self.config.exp3_gamma * reward / (self._last_probs[arm] * len(self.awake))


class Hedge(EXP3):
    """Full-information exponential weights, as HedgeSpec (arXiv 2510.20064) runs them over drafters:
    each round every cheap (model-free) arm drafts, and its draft is scored on the target's output
    (accepted / k), so all cheap arms learn from every round at the cost of their drafting. An arm
    without a counterfactual draft (a neural drafter) learns only when pulled, importance-weighted
    as in EXP3, so that its weight is unbiased too."""

    reward_kind = "be"
    full_information = True

    def reset(self) -> None:
        super().reset()
        self.observed: set[str] = set()  # arms that observe() has scored: their weights move there

    def update(self, arm: str, reward: float) -> None:
        if arm not in self.observed:
            super().update(arm, reward)
            return
        _Counts.update(self, arm, reward)  # counts and discounting; the weight moves in observe
        for name in self.arms:
            self.log_weights[name] *= self.config.discount

    def observe(self, scores: Mapping[str, ArmScore]) -> None:
        for arm, score in scores.items():
            self.observed.add(arm)
            self.log_weights[arm] += self.config.exp3_gamma * score.reward

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "observed": sorted(self.observed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.observed = set(state["observed"]) & set(self.arms)


class Contextual(_Counts):
    """Full information with a context: before each pick every cheap arm drafts, and its draft's label
    (the length of the match an n-gram or suffix draft continues) is the context. Each (arm, label)
    keeps the mean block efficiency of every draft that arm made with that label, pulled or not (scored
    on the output, as Hedge's), and the pick is the arm whose draft of this round belongs to the best
    of them: a short match of one arm against a long match of the other. No one arm need be best on
    a whole request, so it can need fewer rounds than any single arm, which no selector of one arm per
    request can. A label not seen yet takes the arm's mean over all its labels. An arm without a draft
    of its own (a neural drafter) is estimated from its pulls alone, with UCB's bonus; a cheap arm with
    nothing to draft this round is not picked while another has."""

    reward_kind = "be"
    full_information = True

    def reset(self) -> None:
        super().reset()
        # arm -> label -> [drafts, reward sum]; the cheap arms are those observe() has scored
        self.scored: dict[str, dict[str, list[float]]] = {arm: {} for arm in self.arms}

    def select(self, offers: Mapping[str, Offer] | None = None) -> str:
        offers = offers or {}
        first = next((arm for arm in self.awake if not self.scored[arm] and self.pulls[arm] == 0), None)
        if first is not None:
            return first
        total = sum(self.pulls.values())
        return max(self.awake, key=lambda arm: self._estimate(arm, offers.get(arm), total))

    def _estimate(self, arm: str, offer: Offer | None, total: float) -> float:
        if offer is not None:  # a cheap arm: known by its scores alone, never by the rewards of its pulls
            return self._efficiency(arm, offer.label)
        if self.scored[arm]:  # a cheap arm with nothing to draft this round
            return -1.0
        return self.mean(arm) + self.config.beta * math.sqrt(2 * math.log(max(total, 1.0)) / self.pulls[arm])

    def _efficiency(self, arm: str, label: str) -> float:
        """The mean block efficiency of the arm's drafts with this label (of all its drafts for a new label;
        1, the most, before any was scored)."""
        count, reward = self.scored[arm].get(label, (0.0, 0.0))
        if not count:
            count = sum(n for n, _ in self.scored[arm].values())
            reward = sum(r for _, r in self.scored[arm].values())
        return reward / count if count else 1.0

    def update(self, arm: str, reward: float) -> None:
        super().update(arm, reward)
        if self.config.discount < 1:
            for labels in self.scored.values():
                for values in labels.values():
                    values[0] *= self.config.discount
                    values[1] *= self.config.discount

    def observe(self, scores: Mapping[str, ArmScore]) -> None:
        for arm, score in scores.items():
            values = self.scored[arm].setdefault(score.label, [0.0, 0.0])
            values[0] += 1
            values[1] += score.reward

    def state_dict(self) -> dict[str, Any]:
        scored = {arm: {label: list(values) for label, values in labels.items()} for arm, labels in self.scored.items()}
        return {**super().state_dict(), "scored": scored}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.scored = {
            arm: {label: [float(n), float(r)] for label, (n, r) in state["scored"][arm].items()} for arm in self.arms
        }


class ContextualSpeed(Contextual):
    """The contextual selector for a target whose verification grows dearer with the draft's length, as
    on a CPU: it picks the draft with the most tokens per second, not per round. A draft with label l of
    arm i is expected to have min(BE(i, l) * asked, size) tokens accepted, and its round emits those and
    one more in T(1 + size), a speedup s = (1 + accepted) / (T(1 + size) / T(1)) over a plain step. That
    is weighed as s / (1 + s), the round-speed reward (rewards.py) by which an arm without drafts of its
    own is estimated from its pulls. It needs the target's forward cost T(n) (Offer.verify_steps)."""

    reward_kind = "speed"

    def _estimate(self, arm: str, offer: Offer | None, total: float) -> float:
        if offer is None:
            return super()._estimate(arm, offer, total)
        if offer.verify_steps is None:
            raise EvospecError("the contextual-speed selector needs the target's forward cost T(n)")
        accepted = min(self._efficiency(arm, offer.label) * offer.asked, offer.size)
        speedup = (1 + accepted) / offer.verify_steps
        return speedup / (1 + speedup)


class Thompson(_Counts):
    """Thompson sampling with Beta(1 + rewards, 1 + pulls - rewards) posteriors (rewards in [0, 1])."""

    reward_kind = "bd"

    def select(self, offers: Mapping[str, Offer] | None = None) -> str:
        return max(
            self.awake,
            key=lambda arm: self.rng.betavariate(1 + self.rewards[arm], 1 + self.pulls[arm] - self.rewards[arm]),
        )


class GaussianThompson(_Counts):
    """Thompson sampling with a Gaussian posterior per arm: mean + sd * N(0, 1), where
    sd^2 = (sum of squared deviations + 1/4) / (n + 1) / n, the arm's own reward variance with one
    pseudo-observation of the widest variance a [0, 1] reward can have. Its exploration shrinks with
    the rewards' spread, not with a fixed scale: round-speed rewards of different drafters lie within
    a few hundredths of each other, where UCB's bonus keeps spreading the pulls."""

    def __init__(self, arms: Sequence[str], config: SelectorConfig, reward_kind: str) -> None:
        super().__init__(arms, config)
        self.reward_kind = reward_kind

    def reset(self) -> None:
        super().reset()
        self.squares = dict.fromkeys(self.arms, 0.0)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "squares": dict(self.squares)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.squares = {arm: float(state["squares"][arm]) for arm in self.arms}

    def update(self, arm: str, reward: float) -> None:
        super().update(arm, reward)
        for name in self.arms:
            self.squares[name] *= self.config.discount
        self.squares[arm] += reward * reward

    def sample(self, arm: str) -> float:
        n, mean = self.pulls[arm], self.mean(arm)
        deviations = max(self.squares[arm] - n * mean * mean, 0.0)
        variance = (deviations + 0.25) / (n + 1) / n
        return mean + math.sqrt(variance) * self.rng.gauss(0.0, 1.0)

    def select(self, offers: Mapping[str, Offer] | None = None) -> str:
        first = self.unpulled()
        if first is not None:
            return first
        return max(self.awake, key=self.sample)


class EpsilonGreedy(_Counts):
    """The best mean so far, or with probability epsilon a uniformly random arm (every arm once first)."""

    reward_kind = "bd"

    def select(self, offers: Mapping[str, Offer] | None = None) -> str:
        first = self.unpulled()
        if first is not None:
            return first
        if self.rng.random() < self.config.epsilon:
            return self.rng.choice(self.awake)
        return max(self.awake, key=self.mean)


class Fixed(_Counts):
    """Always the same arm (a single drafter, or a baseline), awake or not."""

    reward_kind = "bd"

    def __init__(self, arms: Sequence[str], config: SelectorConfig, arm: str) -> None:
        super().__init__(arms, config)
        if arm not in self.arms:
            raise EvospecError(f"fixed:{arm} names no drafter; the drafters are {list(self.arms)}")
        self.arm = arm

    def select(self, offers: Mapping[str, Offer] | None = None) -> str:
        return self.arm


class RoundRobin(_Counts):
    """Each awake arm in turn."""

    reward_kind = "bd"

    def reset(self) -> None:
        super().reset()
        self._turn = 0

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "turn": self._turn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._turn = int(state["turn"])

    def select(self, offers: Mapping[str, Offer] | None = None) -> str:
        arm = self.awake[self._turn % len(self.awake)]
        self._turn += 1
        return arm


SELECTORS: dict[str, Callable[[Sequence[str], SelectorConfig, str | None], Selector]] = {
    "ucb-bd": lambda arms, config, arg: UCB(arms, config, reward_kind="bd"),
    "ucb-be": lambda arms, config, arg: UCB(arms, config, reward_kind="be"),
    "ucb-speed": lambda arms, config, arg: UCB(arms, config, reward_kind="speed"),
    "ucb-bd-contextual": lambda arms, config, arg: ContextualUCB(arms, config, reward_kind="bd"),
    "ucb-be-contextual": lambda arms, config, arg: ContextualUCB(arms, config, reward_kind="be"),
    "exp3": lambda arms, config, arg: EXP3(arms, config),
    "hedge": lambda arms, config, arg: Hedge(arms, config),
    "contextual": lambda arms, config, arg: Contextual(arms, config),
    "contextual-speed": lambda arms, config, arg: ContextualSpeed(arms, config),
    "thompson": lambda arms, config, arg: Thompson(arms, config),
    "thompson-speed": lambda arms, config, arg: GaussianThompson(arms, config, reward_kind="speed"),
    "egreedy": lambda arms, config, arg: EpsilonGreedy(arms, config),
    "round-robin": lambda arms, config, arg: RoundRobin(arms, config),
    "fixed": lambda arms, config, arg: Fixed(arms, config, arg or ""),
}
DEFAULT_SELECTOR = "ucb-bd"


def build_selector(spec: str, arms: Sequence[str], config: SelectorConfig = SelectorConfig()) -> Selector:
    """A selector from its spec (a name of SELECTORS, `fixed:NAME` for a fixed arm) over these arms."""
    name, _, arg = spec.partition(":")
    if name not in SELECTORS:
        raise EvospecError(f"unknown selector {spec!r}; choose one of {', '.join(SELECTORS)} (fixed:DRAFTER)")
    if arg and name != "fixed":
        raise EvospecError(f"selector {name} takes no argument, got {spec!r}")
    if name == "fixed" and not arg:
        raise EvospecError(f"the fixed selector needs a drafter: fixed:NAME, one of {list(arms)}")
    return SELECTORS[name](arms, config, arg or None)
