"""Learning shared by engine replicas: each replica serves with an engine of its own and hands what the
target told it to one learner, which learns for all of them and publishes what it learned.

A replica's engine runs a LearnerProxy in place of each of its learners and a SharedSelector around its
selector (ReplicaSharing.share builds them). They hear every round as the learners and the selector
would, and the Outbox keeps each finished request's rounds and the selector's rewards until
ReplicaSharing, on a thread of its own, hands them to the learner as a Batch. The learner
(SharedLearning) gives each request's rounds to the real learners, in arrival order, and the rewards to
a selector of its own, which so merges the statistics of every replica; it keeps all of it in the
state store and restores it when it restarts; and it answers with what it publishes: each drafter's
version and weights, and its selector's state. A replica loads new weights into its drafters between
rounds (at the next round's feedback, on the engine's own thread, so no request waits for a transfer)
and its selector takes the merged state at its next pick, with its own rewards since the last exchange
replayed on top.

Weights travel only to a replica whose (epoch, versions) differ from the learner's: an epoch is one life
of the learner, since after a restart its versions may repeat with other weights. Nothing here imports
Ray: evospec/serve/cluster.py carries these values between processes, and a test can run both sides in one.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from evospec.learning import OnlineLearner
from evospec.selection import Selector
from evospec.serve.config import ClusterConfig, ServerConfig
from evospec.serve.metrics import LearningMetrics, drafter_version
from evospec.serve.worker import DurableState, Served
from evospec.types import ArmScore, Offer, RoundFeedback

log = logging.getLogger(__name__)

Weights = dict[str, dict[str, torch.Tensor]]  # by drafter: its module's state dict
Known = tuple[str, dict[str, int]]  # (epoch, versions by drafter) of the weights a replica has


@dataclass(frozen=True)
class Pulled:
    """The reward of the arm a selector pulled (Selector.update)."""

    arm: str
    reward: float

    def apply(self, selector: Selector) -> None:
        selector.update(self.arm, self.reward)


@dataclass(frozen=True)
class Scored:
    """A full-information selector's scores of each cheap arm's draft of a round (Selector.observe)."""

    scores: dict[str, ArmScore]

    def apply(self, selector: Selector) -> None:
        selector.observe(self.scores)


@dataclass(frozen=True)
class Batch:
    """What a replica heard since its last exchange with the learner."""

    requests: int  # requests it generated for
    rounds: list[list[RoundFeedback]]  # the rounds of each finished request its learners heard, in order
    rewards: list[Pulled | Scored]  # its selector's, in order


@dataclass(frozen=True)
class Published:
    """What the learner publishes to a replica."""

    epoch: str
    versions: dict[str, int]  # by drafter: learning steps applied
    weights: Any  # the Weights of these versions, as the learner stored them; None when the replica has them
    selector: dict[str, Any] | None  # the merged selector's state_dict; None without a selector


class Outbox:
    """A replica's requests, rounds and rewards until the learner takes them: how many requests it generated
    for, the rounds of each finished request (at most `limit` requests' rounds, the oldest dropped first
    when the learner falls behind) and the selector's rewards."""

    def __init__(self, limit: int) -> None:
        self._lock = threading.Lock()
        self._heard: RoundFeedback | None = None  # the last round recorded, as the engine gave it
        self._request: list[RoundFeedback] = []  # the rounds of the request being served (the engine's thread)
        self._finished: deque[list[RoundFeedback]] = deque(maxlen=limit)
        self._rewards: list[Pulled | Scored] = []
        self._requests = 0

    def record(self, feedback: RoundFeedback) -> None:
        """A round's feedback, copied (a backend may reuse its buffers). Every learner hears the same
        round: it is kept once."""
        if feedback is not self._heard:
            self._heard = feedback
            self._request.append(feedback.copied())

    def end_request(self) -> None:
        """The request ended (every learner says so: the first files its rounds)."""
        self._heard = None
        if self._request:
            with self._lock:
                self._finished.append(self._request)
            self._request = []

    def count_request(self) -> None:
        """A request was generated for (with or without learners to hear its rounds)."""
        with self._lock:
            self._requests += 1

    def reward(self, reward: Pulled | Scored) -> None:
        with self._lock:
            self._rewards.append(reward)

    def untaken_rewards(self) -> list[Pulled | Scored]:
        """The rewards since the last take."""
        with self._lock:
            return list(self._rewards)

    def take(self) -> Batch:
        """Everything kept, which is then forgotten."""
        with self._lock:
            batch = Batch(self._requests, list(self._finished), self._rewards)
            self._finished.clear()
            self._rewards = []
            self._requests = 0
        return batch


class LearnerProxy:
    """A learner as a replica's engine sees it: it asks for the rounds its learner learns from and hands
    them to the outbox; its drafter loads the weights the shared learner published, between rounds."""

    def __init__(self, learner: OnlineLearner, outbox: Outbox) -> None:
        self.drafter = learner.drafter
        self.needs_hidden_states = learner.needs_hidden_states
        self.prompt_rows = learner.prompt_rows
        self._outbox = outbox
        self._lock = threading.Lock()
        self._staged: tuple[int, dict[str, torch.Tensor]] | None = None

    def stage(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        """Weights for the drafter to load at its next round (from any thread)."""
        with self._lock:
            self._staged = (version, weights)

    def catch_up(self) -> None:
        """Load the staged weights, if any (on the engine's thread, between rounds)."""
        with self._lock:
            staged, self._staged = self._staged, None
        if staged is not None:
            version, weights = staged
            self.drafter.module.load_state_dict(weights)
            self.drafter.version = version  # a drafter with a cache of its own drops it on a new version

    def observe(self, feedback: RoundFeedback) -> None:
        self.catch_up()
        self._outbox.record(feedback)

    def end_request(self) -> None:
        self._outbox.end_request()


class SharedSelector:
    """A replica's selector: it picks as the selector it wraps does; its rewards also go to the outbox, for
    the learner's selector, which merges those of every replica, and the merged state comes back between
    rounds, with the rewards the learner has not had yet replayed on it."""

    def __init__(self, selector: Selector, outbox: Outbox) -> None:
        self.selector = selector
        self.arms = selector.arms
        self.reward_kind = selector.reward_kind
        self.full_information = selector.full_information
        self._outbox = outbox
        self._lock = threading.Lock()
        self._staged: dict[str, Any] | None = None

    def stage(self, state: dict[str, Any]) -> None:
        """A merged state to take at the next pick (from any thread)."""
        with self._lock:
            self._staged = state

    def catch_up(self) -> None:
        """Take the staged state, if any (on the engine's thread)."""
        with self._lock:
            staged, self._staged = self._staged, None
        if staged is not None:
            self.selector.load_state_dict(staged)
            for reward in self._outbox.untaken_rewards():
                reward.apply(self.selector)

    def select(self, offers: Mapping[str, Offer] | None = None) -> str:
        self.catch_up()
        return self.selector.select(offers)

    def update(self, arm: str, reward: float) -> None:
        self.selector.update(arm, reward)
        self._outbox.reward(Pulled(arm, reward))

    def observe(self, scores: Mapping[str, ArmScore]) -> None:
        self.selector.observe(scores)
        self._outbox.reward(Scored(dict(scores)))

    def begin_request(self, awake: Sequence[str]) -> None:
        self.selector.begin_request(awake)

    def state_dict(self) -> dict[str, Any]:
        return self.selector.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.selector.load_state_dict(state)


Exchange = Callable[[Batch, Known | None, list[Metric]], Published]


class ReplicaSharing:
    """A replica's side of the shared learning: the hook its engine is built with (share), and its
    worker's StateKeeper. It exchanges with the learner on a thread of its own, at once after each request
    and every `sync_every_s` seconds in between: it sends the outbox's batch, what it knows of the
    learner's weights and the replica's metrics (the families of registry), and stages what comes back.

    exchange: the call to the learner; fetch: the published weights from what the learner stored.
    """

    def __init__(
        self,
        exchange: Exchange,
        fetch: Callable[[Any], Weights],
        registry: CollectorRegistry,
        config: ClusterConfig,
    ) -> None:
        self._exchange = exchange
        self._fetch = fetch
        self._registry = registry
        self._every_s = config.sync_every_s
        self._outbox = Outbox(config.outbox_requests)
        self._versions = drafter_version(registry, ("drafter",))  # of the weights this replica serves
        self._learners: list[LearnerProxy] = []
        self._selector: SharedSelector | None = None
        self._known: Known | None = None
        self._due = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="evospec-sync", daemon=True)

    def share(
        self, selector: Selector | None, learners: Sequence[OnlineLearner]
    ) -> tuple[SharedSelector | None, list[LearnerProxy]]:
        """The selector and learners this replica's engine runs in place of its own."""
        self._learners = [LearnerProxy(learner, self._outbox) for learner in learners]
        self._selector = SharedSelector(selector, self._outbox) if selector is not None else None
        return self._selector, self._learners

    def begin(self, served: Served) -> None:
        """Take the learner's weights and statistics before the first request, then sync from the thread."""
        self.sync()
        for proxy in self._learners:
            proxy.catch_up()
        if self._selector is not None:
            self._selector.catch_up()
        self._thread.start()

    def after_request(self, served: Served) -> None:
        self._outbox.count_request()
        self._due.set()

    def end(self, served: Served) -> None:
        """Stop the thread, which hands what is left to the learner on its way out."""
        self._stopping = True
        self._due.set()
        self._thread.join()

    def sync(self) -> None:
        """One exchange with the learner."""
        for proxy in self._learners:
            self._versions.labels(proxy.drafter.name).set(proxy.drafter.version)
        published = self._exchange(self._outbox.take(), self._known, list(self._registry.collect()))
        if published.weights is not None:
            weights = self._fetch(published.weights)
            for proxy in self._learners:
                proxy.stage(published.versions[proxy.drafter.name], weights[proxy.drafter.name])
            self._known = (published.epoch, published.versions)
        if self._selector is not None and published.selector is not None:
            self._selector.stage(published.selector)

    def _run(self) -> None:
        while not self._stopping:
            self._due.wait(self._every_s)
            self._due.clear()
            try:
                self.sync()
            except Exception:  # the learner is gone for now: what this batch held is lost, serving goes on
                log.exception("exchanging with the learner failed")


class SharedLearning:
    """The learner of a server of replicas: the learners and the selector of one engine, loaded for them
    (served), which learn from every replica's batches; their state kept as config says (DurableState).

    put: stores weights for the replicas to fetch (Ray's object store; by default they are handed over
    as they are)."""

    def __init__(
        self,
        served: Served,
        config: ServerConfig,
        metrics: LearningMetrics,
        put: Callable[[Weights], Any] = lambda weights: weights,
    ) -> None:
        self._served = served
        self._learners = served.generator.engine.learners
        self._selector = served.generator.engine.selector
        self._state = DurableState(config, metrics)
        self._state.begin(served)
        self._put = put
        self.epoch = secrets.token_hex(8)
        self._requests = 0  # requests learned from; each is numbered anew, as the learners' buffers key rows by it
        self._stored: tuple[dict[str, int], Any] | None = None  # versions and their weights, as put stored them

    def learn(self, batch: Batch) -> None:
        """Every request's rounds to every learner, the rewards to the selector; the state saved when due."""
        for rounds in batch.rounds:
            self._requests += 1
            for learner in self._learners:
                for feedback in rounds:
                    learner.observe(replace(feedback, request=self._requests))
                learner.end_request()
        if self._selector is not None:
            for reward in batch.rewards:
                reward.apply(self._selector)
        for _ in range(batch.requests):
            self._state.after_request(self._served)

    def published(self, known: Known | None) -> Published:
        """What a replica that has the weights `known` gets: the weights only if they are not those."""
        versions = self._served.drafter_versions()
        weights = None
        if known != (self.epoch, versions):
            if self._stored is None or self._stored[0] != versions:
                state = {learner.drafter.name: learner.drafter.module.state_dict() for learner in self._learners}
                self._stored = (versions, self._put(state))
            weights = self._stored[1]
        selector = self._selector.state_dict() if self._selector is not None else None
        return Published(self.epoch, versions, weights, selector)

    def save(self) -> None:
        """Save what was not saved yet (the server stops)."""
        self._state.end(self._served)
