"""Learning shared by engine replicas (evospec.serve.sharing), both sides in one process: the replicas'
engines hand their rounds to one SharedLearning, called directly where Ray carries the calls."""

from __future__ import annotations

import copy
import threading

import torch
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from evospec.config import GenerationConfig
from evospec.drafters.registry import build_drafter
from evospec.generation import TextGenerator, build_engine, build_engine_from_names
from evospec.learning import LearnerConfig
from evospec.serve.config import ClusterConfig, ServerConfig
from evospec.serve.metrics import LearningMetrics, exposition, gathered
from evospec.serve.sharing import Outbox, ReplicaSharing, SharedLearning
from evospec.serve.state import StateStore
from evospec.serve.worker import Served
from evospec.types import RoundFeedback

from conftest import white_box

K = 3
MAX_NEW = 24
CONFIG = GenerationConfig(max_new_tokens=MAX_NEW, num_speculative_tokens=K)
PROMPTS = ["w1 w2 w3 w4 w1 w2", "w7 w8 w9", "w10 w11 w10 w11 w12", "w5 w6 w5"]


def served(target, seed: int | None, share=None) -> Served:
    """ngram and an eagle drafter (random weights, seeded) under UCB, the eagle learning every other round;
    seed None: ngram and suffix, nothing learning."""
    if seed is None:
        drafters, learner = [build_drafter("ngram", target), build_drafter("suffix", target)], "none"
    else:
        drafters, learner = [build_drafter("ngram", target), white_box("eagle", target, seed=seed)], "ogd"
    learning = LearnerConfig(every=2, batch_rows=16)
    engine = build_engine_from_names(target, drafters, "ucb-bd", learner, learning, K, False, share)
    return Served.with_learners(TextGenerator(target, engine))


class Replica:
    """An engine whose learning goes to `learner` through a ReplicaSharing, synced when the test says."""

    def __init__(self, learner: SharedLearning, target, seed: int | None) -> None:
        lock = threading.Lock()  # the sharing's thread syncs once more at the end

        def exchange(batch, known, families):
            with lock:
                learner.learn(batch)
                return learner.published(known)

        self.sharing = ReplicaSharing(
            exchange, lambda weights: weights, CollectorRegistry(), ClusterConfig(sync_every_s=1e3)
        )
        self.served = served(target, seed, self.sharing.share)
        self.sharing.begin(self.served)

    @property
    def eagle(self):
        return self.served.generator.engine.drafters["eagle"]

    def generate(self, prompt: str):
        stream = self.served.generator.generate(prompt, CONFIG)
        self.sharing.after_request(self.served)  # as the worker says it (the sharing's thread may sync too)
        self.sharing.sync()
        return stream


def test_replicas_learn_as_one_learner_and_serve_its_weights(sharp_target, tmp_path):
    """Two replicas of other first weights than the learner's: they serve the learner's from the start,
    their answers are plain decoding's, the learner learns from both and its selector counts every
    round of both; a restarted learner goes on from its last save and sends its weights again."""
    plain = TextGenerator(sharp_target, build_engine(sharp_target, []))
    config = ServerConfig(state_dir=tmp_path, save_every=2)
    learner = SharedLearning(
        served(sharp_target, seed=0), config, LearningMetrics(CollectorRegistry(), True), put=copy.deepcopy
    )
    replicas = [Replica(learner, sharp_target, seed=1 + rank) for rank in range(2)]
    pulls = 0
    for index, prompt in enumerate(PROMPTS * 2):
        stream = replicas[index % 2].generate(prompt)
        assert stream.token_ids == plain.generate(prompt, CONFIG).token_ids
        pulls += sum(arm.pulls for arm in stream.stats.drafters.values())
    learned = learner.published(None)
    assert learned.versions["eagle"] > 0
    assert sum(learned.selector["pulls"].values()) == pulls
    for replica in replicas:
        replica.sharing.sync()  # the newest weights and statistics, learned from the other replica too
        replica.served.generator.engine.selector.catch_up()
        assert replica.served.generator.engine.selector.state_dict()["pulls"] == learned.selector["pulls"]
        replica.served.generator.generate(PROMPTS[0], CONFIG)  # loads them at its first round
        assert replica.eagle.version == learned.versions["eagle"]
        weights = learner.published(None).weights["eagle"]
        assert all(torch.equal(value, weights[key]) for key, value in replica.eagle.module.state_dict().items())

    learner.save()
    saved = StateStore(tmp_path).load({})
    restarted = SharedLearning(served(sharp_target, seed=5), config, LearningMetrics(CollectorRegistry(), True))
    resumed = restarted.published((learner.epoch, learner.published(None).versions))
    assert sum(resumed.versions.values()) == saved.drafter_version == sum(learner.published(None).versions.values())
    assert resumed.epoch != learner.epoch and resumed.weights is not None  # another life: every replica reloads
    for replica in replicas:
        replica.sharing.end(replica.served)


def test_without_learners_the_merged_selector_is_kept(sharp_target, tmp_path):
    """Model-free drafters only: each request still counts towards a save of what the selector learned."""
    config = ServerConfig(state_dir=tmp_path, save_every=2)
    learner = SharedLearning(served(sharp_target, None), config, LearningMetrics(CollectorRegistry(), True))
    replica = Replica(learner, sharp_target, None)
    for prompt in PROMPTS[:2]:
        replica.generate(prompt)
    replica.sharing.end(replica.served)
    assert StateStore(tmp_path).load({}).sequence == 1
    assert sum(learner.published(None).selector["pulls"].values()) > 0


def test_the_outbox_keeps_a_round_once_in_tensors_of_its_own():
    """Every learner hears the same round; a backend may write its next pass into the tensors it gave."""
    outbox = Outbox(limit=2)
    hidden = torch.zeros(2, 4)
    round_ = RoundFeedback(
        request=1,
        position=0,
        drafter=None,
        tokens=torch.tensor([5, 6]),
        drafted=torch.empty(0, dtype=torch.long),
        num_accepted=0,
        hidden=hidden,
        top_ids=torch.zeros(2, 3, dtype=torch.long),
        top_probs=torch.zeros(2, 3),
    )
    for _ in range(2):  # two learners
        outbox.record(round_)
    hidden.fill_(1.0)
    for _ in range(2):
        outbox.end_request()
    for _ in range(2):  # two more requests: the oldest goes
        outbox.record(round_)
        outbox.end_request()
    outbox.count_request()
    batch = outbox.take()
    assert [len(rounds) for rounds in batch.rounds] == [1, 1] and batch.requests == 1
    assert float(batch.rounds[0][0].hidden.sum()) == 8.0 and outbox.take().rounds == []


def test_gathered_metrics_are_one_family_per_name_each_sample_labelled_with_its_replica():
    def families(value: float):
        registry = CollectorRegistry()
        metrics = LearningMetrics(registry, by_drafter=True)
        metrics.state_sequence.set(value)
        return list(registry.collect())

    text = exposition(gathered([({}, families(1)), ({"replica": "0"}, families(2)), ({"replica": "1"}, families(3))]))
    (sequence,) = [
        family for family in text_string_to_metric_families(text.decode()) if family.name == "evospec:state_sequence"
    ]
    assert [(sample.labels, sample.value) for sample in sequence.samples] == [
        ({}, 1.0),
        ({"replica": "0"}, 2.0),
        ({"replica": "1"}, 3.0),
    ]
    assert text.decode().count("# TYPE evospec:state_sequence") == 1
