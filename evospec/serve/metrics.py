"""Prometheus metrics of a server, named as vLLM names them where vLLM has the metric.

Each group of metrics lives in a registry it is given (one per app, so that several apps in one process
never clash). A server of several replicas gathers the families of each replica and of its learner into
one exposition, each replica's samples labelled with `replica`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import Metric

from evospec.learning import OnlineLearner
from evospec.learning.preference import StepPreferenceLearner
from evospec.stats import SpecStats


def request_errors(registry: CollectorRegistry) -> Counter:
    """The app's count of requests answered with an error, by HTTP status."""
    return Counter("evospec:request_errors", "Requests answered with an error.", ("status",), registry=registry)


def drafter_version(registry: CollectorRegistry, labels: tuple[str, ...] = ()) -> Gauge:
    """Learning updates applied to the drafters: over all of them, or by the labels given (e.g. drafter)."""
    return Gauge("evospec:drafter_version", "Learning updates applied to the drafters.", labels, registry=registry)


class Metrics:
    """What one engine did: requests, tokens, drafts, selector pulls and the time its learners took."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=registry)

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
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens prefilled.")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated.")
        self.selector_pulls = counter(
            "evospec:selector_pulls", "Rounds in which the selector picked each drafter.", ("drafter",)
        )
        self.learn_seconds = counter(
            "evospec:learn_seconds", "Seconds spent learning (and telling learners what the target said)."
        )
        self.steps = counter(
            "evospec:reasoning_steps",
            "Steps the drafter wrote in step-level speculation, by what became of them.",
            ("verdict",),
        )
        self.judge_seconds = counter("evospec:judge_seconds", "Seconds the step judge took.")

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
        if stats.num_draft_steps:
            judged = stats.num_accepted_steps - stats.num_identical_steps
            self.steps.labels("identical").inc(stats.num_identical_steps)
            self.steps.labels("judged_aligned").inc(judged)
            self.steps.labels("rejected").inc(
                stats.num_draft_steps - stats.num_discarded_steps - stats.num_accepted_steps
            )
            self.steps.labels("discarded").inc(stats.num_discarded_steps)
            self.judge_seconds.inc(stats.judge_s)


class LearningMetrics:
    """What the learners learned and the state kept of it. by_drafter: the drafters' version by drafter (the
    learner of a server of replicas, beside each replica's own) instead of their total."""

    def __init__(self, registry: CollectorRegistry, by_drafter: bool = False) -> None:
        self._by_drafter = by_drafter
        self.drafter_version = drafter_version(registry, ("drafter",) if by_drafter else ())
        # Gauges, not counters: a restart restores the learners' counts from the saved state.
        self.learner_steps = Gauge(
            "evospec:learner_steps",
            "Learning steps of each drafter's learner: taken, "
            "skipped (a non-finite loss or gradient) and rolled back by the guard.",
            ("drafter", "outcome"),
            registry=registry,
        )
        self.preference_pairs = Gauge(
            "evospec:preference_pairs",
            "Preference pairs (rejected reasoning steps) the step learners made, by drafter.",
            ("drafter",),
            registry=registry,
        )
        self.state_sequence = Gauge(
            "evospec:state_sequence", "Number of the state last saved or loaded (0: none).", registry=registry
        )

    def observe_learners(self, learners: Sequence[OnlineLearner], drafter_version: int) -> None:
        """The learners' step counts so far, and the drafters' version: each learner's drafter's (by_drafter),
        or drafter_version, their total."""
        for learner in learners:
            stats = learner.stats
            for outcome, count in (
                ("taken", stats.steps),
                ("skipped", stats.skipped),
                ("rolled_back", stats.rollbacks),
            ):
                self.learner_steps.labels(learner.drafter.name, outcome).set(count)
            if isinstance(learner, StepPreferenceLearner):
                self.preference_pairs.labels(learner.drafter.name).set(learner.pairs)
            if self._by_drafter:
                self.drafter_version.labels(learner.drafter.name).set(learner.drafter.version)
        if not self._by_drafter:
            self.drafter_version.set(drafter_version)


def gathered(sources: Iterable[tuple[Mapping[str, str], Iterable[Metric]]]) -> list[Metric]:
    """The metric families of several sources as one family per name, each source's samples given its
    labels (e.g. {"replica": "0"}; {} keeps them as they are)."""
    merged: dict[str, Metric] = {}
    for labels, families in sources:
        for family in families:
            into = merged.setdefault(family.name, Metric(family.name, family.documentation, family.type))
            into.samples += [sample._replace(labels={**labels, **sample.labels}) for sample in family.samples]
    return list(merged.values())


class _Families:
    """Families already collected, as a collector."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def exposition(families: list[Metric]) -> bytes:
    """The Prometheus text format of these families."""
    return generate_latest(_Families(families))
