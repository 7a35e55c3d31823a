"""Prometheus metrics of one server, named as vLLM names them where vLLM has the metric."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from evospec.learning import OnlineLearner
from evospec.stats import SpecStats


class Metrics:
    """Counters in a registry of their own (one per app, so that several apps in one process never clash)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=self.registry)

        spec = "vllm:spec_decode_num"
        self.num_drafts = counter(f"{spec}_drafts", "Rounds that drafted at least one token.", ("drafter",))
        self.num_draft_tokens = counter(f"{spec}_draft_tokens", "Drafted tokens.", ("drafter",))
        self.num_accepted_tokens = counter(f"{spec}_accepted_tokens", "Accepted draft tokens.", ("drafter",))
        self.num_accepted_tokens_per_pos = counter(
            f"{spec}_accepted_tokens_per_pos", "Accepted draft tokens at each draft position.", ("position",)
        )
        self.requests = counter(
            "vllm:request_success", "Finished requests (abort: the client left).", ("finished_reason",)
        )
        self.errors = counter("evospec:request_errors", "Requests answered with an error.", ("status",))
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens prefilled.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self.selector_pulls = counter(
            "evospec:selector_pulls", "Rounds in which the selector picked each drafter.", ("drafter",)
        )
        self.drafter_version = Gauge(
            "evospec:drafter_version", "Learning updates applied to the drafters.", registry=self.registry
        )
        self.learn_seconds = counter(
            "evospec:learn_seconds", "Seconds spent learning (and telling learners what the target said)."
        )
        # Gauges, not counters: a restart restores the learners' counts from the saved state.
        self.learner_steps = Gauge(
            "evospec:learner_steps",
            "Learning steps of each drafter's learner: taken, "
            "skipped (a non-finite loss or gradient) and rolled back by the guard.",
            ("drafter", "outcome"),
            registry=self.registry,
        )
        self.state_sequence = Gauge(
            "evospec:state_sequence", "Number of the state last saved or loaded (0: none).", registry=self.registry
        )

    def observe(self, stats: SpecStats, finished_reason: str) -> None:
        """Count one finished (or aborted) request."""
        self.requests.labels(finished_reason).inc()
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.generation_tokens.inc(stats.new_tokens)
        self.learn_seconds.inc(stats.learn_s)
        for name, arm in stats.drafters.items():
            self.num_drafts.labels(name).inc(arm.num_drafts)
            self.num_draft_tokens.labels(name).inc(arm.num_draft_tokens)
            self.num_accepted_tokens.labels(name).inc(arm.num_accepted_tokens)
            self.selector_pulls.labels(name).inc(arm.pulls)
        for position, count in enumerate(stats.num_accepted_tokens_per_pos):
            self.num_accepted_tokens_per_pos.labels(str(position)).inc(count)

    def observe_learners(self, learners: Sequence[OnlineLearner]) -> None:
        """The learners' step counts so far."""
        for learner in learners:
            stats = learner.stats
            for outcome, count in (
                ("taken", stats.steps),
                ("skipped", stats.skipped),
                ("rolled_back", stats.rollbacks),
            ):
                self.learner_steps.labels(learner.drafter.name, outcome).set(count)

    def exposition(self) -> bytes:
        """The Prometheus text format."""
        return generate_latest(self.registry)
