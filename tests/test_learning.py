"""White-box drafters learning while they serve: lossless, learning for real, bounded, guarded, saved."""

from __future__ import annotations

import json
import os

import pytest
import torch
from transformers import DynamicCache

from evospec.config import GenerationConfig, SamplingConfig
from evospec.drafters import SmallLMDrafter
from evospec.drafters.adapted_lm import AdapterConfig
from evospec.drafters.registry import WHITE_BOX_KINDS, new_white_box_drafter
from evospec.engine import Engine
from evospec.errors import EvospecError
from evospec.learning import LEARNERS, FeedbackBuffer, LearnerConfig, build_learner
from evospec.models.hf import CachedLM
from evospec.sampling import Sampler
from evospec.stats import SpecStats
from evospec.types import RoundFeedback

from conftest import HIDDEN, TINY_VOCAB, adapted_lm, random_prompts, reference_greedy, tiny_model, white_box


def run(
    engine: Engine, prompts: list[list[int]], max_new_tokens: int = 32, k: int = 3
) -> tuple[list[list[int]], list[SpecStats]]:
    outputs, stats = [], []
    for prompt in prompts:
        stats.append(SpecStats())
        config = GenerationConfig(max_new_tokens=max_new_tokens, num_speculative_tokens=k)
        outputs.append(list(engine.generate(prompt, config, stats[-1])))
    return outputs, stats


@pytest.mark.parametrize("learner", [*LEARNERS, "none"])
@pytest.mark.parametrize("kind", WHITE_BOX_KINDS)
def test_greedy_output_is_plain_decoding_while_the_drafter_learns(sharp_target, kind, learner):
    drafter = white_box(kind, sharp_target)
    trainer = build_learner(learner, drafter, LearnerConfig(every=2, batch_rows=64))
    engine = Engine(CachedLM(sharp_target.model), [drafter], frozenset(), 256, learners=[trainer] if trainer else [])
    prompts = random_prompts(4, seed=3)
    outputs, stats = run(engine, prompts)
    assert outputs == [reference_greedy(sharp_target.model, prompt, 32) for prompt in prompts]
    assert sum(s.num_draft_tokens for s in stats) > 0
    if trainer:
        assert trainer.stats.steps > 0 and drafter.version == trainer.stats.steps


# The learning margins below hold for every one of seeds 0-9 with room to spare (the stream and the
# drafter's initial weights change with the seed; CPUs differ in the last bits the same way).
# EVOSPEC_LEARNING_SEEDS=10 runs them all.
SEEDS = range(int(os.environ.get("EVOSPEC_LEARNING_SEEDS", "1")))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("kind", "name", "lr", "passes", "loss_ratio", "gain"),
    [
        ("eagle", "ogd", None, 4, 0.85, 0.04),
        ("eagle", "adamw", 1e-3, 4, 0.80, 0.10),  # a random head learns at warm-up's rate
        ("lora", "ogd", None, 6, 0.92, 0.02),
    ],
)
def test_online_loss_falls_and_acceptance_rises_on_a_fixed_stream(
    sharp_target, kind, name, lr, passes, loss_ratio, gain, seed
):
    """The white-box drafter, and the small LM through its adapters (OSD's setting), over a few passes
    of the same prompts. Over seeds 0-9 the loss ratio was at most 0.76 (eagle, OGD), 0.70 (eagle,
    AdamW) and 0.87 (lora), and the gain in acceptance at least 0.056, 0.166 and 0.036."""
    torch.manual_seed(seed)
    drafter = adapted_lm(sharp_target, seed=1 + seed) if kind == "lora" else white_box(kind, sharp_target, seed)
    learner = build_learner(name, drafter, LearnerConfig(lr=lr, every=4, batch_rows=128))
    engine = Engine(CachedLM(sharp_target.model), [drafter], frozenset(), 256, learners=[learner])
    _, stats = run(engine, random_prompts(4, seed=seed) * passes, max_new_tokens=48)
    losses = learner.stats.losses
    assert sum(losses[-5:]) / 5 < loss_ratio * sum(losses[:5]) / 5
    first = sum(s.num_accepted_tokens for s in stats[:4]) / sum(s.num_draft_tokens for s in stats[:4])
    last = sum(s.num_accepted_tokens for s in stats[-4:]) / sum(s.num_draft_tokens for s in stats[-4:])
    assert last > first + gain


@pytest.mark.parametrize("seed", SEEDS)
def test_the_ensemble_moves_its_weight_to_the_best_learning_rate(sharp_target, seed):
    """lr so small that the copy with 4x learns clearly fastest on this stream (its weight was at
    least 0.70 over seeds 0-7)."""
    drafter = white_box("eagle", sharp_target, seed)
    learner = build_learner("ensemble", drafter, LearnerConfig(every=4, batch_rows=128, lr=0.03))
    engine = Engine(CachedLM(sharp_target.model), [drafter], frozenset(), 256, learners=[learner])
    run(engine, random_prompts(4, seed=seed) * 2, max_new_tokens=48)
    weights = learner.weights
    assert int(weights.argmax()) == 2 and float(weights[2]) > 0.6, weights


def test_an_ensemble_of_adamw_copies_stays_lossless_and_steps_each_copy_at_its_rate(sharp_target):
    drafter = white_box("eagle", sharp_target)
    learner = build_learner("ensemble", drafter, LearnerConfig(every=2, batch_rows=64, ensemble_base="adamw"))
    engine = Engine(CachedLM(sharp_target.model), [drafter], frozenset(), 256, learners=[learner])
    prompts = random_prompts(3, seed=4)
    outputs, _ = run(engine, prompts)
    assert outputs == [reference_greedy(sharp_target.model, prompt, 32) for prompt in prompts]
    rates = [optimizer.param_groups[0]["lr"] for optimizer in learner.optimizers]
    assert rates == pytest.approx([3e-5, 6e-5, 1.2e-4])  # AdamW's default rate, times the scales
    steps = {int(state["step"]) for optimizer in learner.optimizers for state in optimizer.state.values()}
    assert steps == {learner.stats.steps} and learner.stats.steps > 0
    served = drafter.module.state_dict()
    combined = sum(w * copy.state_dict()["fc.weight"] for w, copy in zip(learner.weights.tolist(), learner.copies))
    assert torch.allclose(served["fc.weight"], combined, atol=1e-6)
    with pytest.raises(EvospecError, match="ensemble base is one of ogd, adamw"):
        LearnerConfig(ensemble_base="sgd")
    ogd = build_learner("ensemble", white_box("eagle", sharp_target), LearnerConfig())
    with pytest.raises(EvospecError, match="an ensemble of adamw copies, not ogd: run with --ensemble-base adamw"):
        ogd.load_state(learner.state_tensors(), learner.state_meta())


class NoHiddenLM(CachedLM):
    """A target session that refuses to return hidden states."""

    def forward_with_hidden(self, token_ids, num_logits=0):
        raise AssertionError("hidden states were asked for")


@pytest.mark.parametrize("learner", LEARNERS)
def test_greedy_output_is_plain_decoding_while_a_small_lm_learns(sharp_target, learner):
    """OSD's setting: the small LM's adapters learn from the target's distributions; the target is
    never asked for hidden states, since the small LM does not read them."""
    drafter = adapted_lm(sharp_target)
    trainer = build_learner(learner, drafter, LearnerConfig(every=4, batch_rows=64))
    engine = Engine(NoHiddenLM(sharp_target.model), [drafter], frozenset(), 256, learners=[trainer])
    prompts = random_prompts(3, seed=5)
    outputs, _ = run(engine, prompts)
    assert outputs == [reference_greedy(sharp_target.model, prompt, 32) for prompt in prompts]
    assert trainer.stats.steps > 0 and drafter.version == trainer.stats.steps


@pytest.mark.parametrize("settings", [{"rank": 0}, {"alpha": 0.0}, {"context_tokens": -1}])
def test_nonsense_adapter_settings_are_clear_errors(settings):
    with pytest.raises(EvospecError, match="invalid adapter settings"):
        AdapterConfig(**settings)


def test_untrained_adapters_draft_what_the_plain_small_lm_drafts(sharp_target):
    plain = SmallLMDrafter(CachedLM(tiny_model(seed=1, noise=0.6, base=sharp_target.model)), "plain")
    adapted = adapted_lm(sharp_target)
    for prompt in random_prompts(3, seed=7):
        for drafter in (plain, adapted):
            drafter.begin(prompt, ())
        greedy = Sampler(SamplingConfig())
        assert torch.equal(plain.propose(prompt, 4, greedy).tokens, adapted.propose(prompt, 4, greedy).tokens)


def feedback(request: int, position: int, rows: int, hidden: float = 0.0) -> RoundFeedback:
    return RoundFeedback(
        request=request,
        drafter="eagle",
        position=position,
        tokens=torch.arange(rows) % TINY_VOCAB,
        drafted=torch.arange(rows),
        num_accepted=rows - 1,
        hidden=torch.full((rows, HIDDEN), hidden),
        top_ids=torch.zeros(rows, 16, dtype=torch.long),
        top_probs=torch.full((rows, 16), 1 / 16),
    )


def prefill(prompt_length: int) -> RoundFeedback:
    """A prefill's feedback with the target's view of every prompt token."""
    return RoundFeedback(
        request=0,
        drafter=None,
        position=0,
        tokens=torch.arange(prompt_length) % TINY_VOCAB,
        drafted=torch.empty(0, dtype=torch.long),
        num_accepted=0,
        hidden=torch.randn(prompt_length, HIDDEN),
        top_ids=torch.randint(0, 80, (prompt_length, 16)),
        top_probs=torch.full((prompt_length, 16), 1 / 16),
    )


@pytest.mark.parametrize(("prompt_rows", "steps"), [(0, 0), (40, 3), (1024, 7)])
def test_a_prefill_teaches_the_drafter_its_prompt_once_a_step_a_round(sharp_target, prompt_rows, steps):
    """The last prompt_rows rows, batch_rows a step (consecutive windows share a row): one step at the
    prefill, one each round after; only the prompt's last row stays for the scheduled steps (without
    prompt_rows all stay)."""
    drafter = white_box("eagle", sharp_target)
    learner = build_learner("ogd", drafter, LearnerConfig(batch_rows=16, prompt_rows=prompt_rows, every=1000))
    learner.observe(prefill(prompt_length=100))  # 99 rows to predict: 6 windows of 15, one of 9
    assert learner.stats.steps == min(steps, 1) and len(learner.buffer) == (1 if prompt_rows else 100)
    assert (learner.nbytes()["prompt"] > 0) == (steps > 1)  # the rows of the steps still to come
    versions = []
    for round_ in range(8):
        learner.observe(feedback(request=0, position=100 + 3 * round_, rows=3))
        versions.append(drafter.version)
    assert versions == [min(steps, round_ + 2) for round_ in range(8)] and learner.stats.steps == steps


@pytest.mark.parametrize("learner", LEARNERS)
def test_greedy_output_is_plain_decoding_while_the_drafter_learns_its_prompt_round_by_round(sharp_target, learner):
    drafter = white_box("eagle", sharp_target)
    trainer = build_learner(learner, drafter, LearnerConfig(every=3, batch_rows=8))
    engine = Engine(CachedLM(sharp_target.model), [drafter], frozenset(), 256, learners=[trainer])
    prompts = [prompt * 3 for prompt in random_prompts(3, seed=11)]  # up to 99 tokens: up to 14 prompt steps
    outputs, stats = run(engine, prompts)
    assert outputs == [reference_greedy(sharp_target.model, prompt, 32) for prompt in prompts]
    assert trainer.stats.steps > len(prompts) + 3 and drafter.version == trainer.stats.steps


def test_prompt_steps_come_before_scheduled_ones_and_end_with_their_request(sharp_target):
    drafter = white_box("eagle", sharp_target)
    learner = build_learner("ogd", drafter, LearnerConfig(batch_rows=16, every=1))  # a scheduled step every round
    learner.observe(prefill(prompt_length=100))  # 7 prompt steps
    for round_ in range(3):  # never more than one step a round
        learner.observe(feedback(request=0, position=100 + 3 * round_, rows=3))
        assert drafter.version == round_ + 2
    learner.end_request()  # 3 of the prompt's steps were never taken: they are dropped
    assert learner.nbytes()["prompt"] == 0
    learner.observe(feedback(request=1, position=0, rows=3))
    assert drafter.version == 5 and learner.stats.steps == 5  # the scheduled step, at last


@pytest.mark.parametrize(("epochs", "replay_rows", "steps"), [(1, 0, 4), (3, 0, 12), (1, 32, 7)])
def test_a_chunk_update_learns_every_row_of_the_chunk(sharp_target, epochs, replay_rows, steps):
    """After `every` requests, every row they added (and replay_rows before them), a batch a step,
    `epochs` times; not just the newest batch."""
    drafter = white_box("eagle", sharp_target)
    config = LearnerConfig(schedule="chunk", every=2, batch_rows=16, epochs=epochs, replay_rows=replay_rows)
    learner = build_learner("ogd", drafter, config)
    for request in range(4):  # two chunks of 2 requests, each request one trace of 30 rows
        learner.observe(feedback(request=request, position=0, rows=30))
        learner.end_request()
        if request == 1:
            first_chunk = learner.stats.steps
    # A chunk: 2 traces of 30 rows, each 2 windows of at most 16 rows (sharing a row): 4 steps. The
    # 32 replayed rows are the first chunk's last ones: request 1's 2 windows and 2 rows of request 0.
    assert first_chunk == 4 * epochs
    assert learner.stats.steps - first_chunk == steps


def test_the_buffer_stays_bounded_on_an_endless_stream():
    buffer = FeedbackBuffer(capacity=100)
    for round_ in range(1000):
        buffer.add(feedback(request=round_ // 50, position=3 * (round_ % 50), rows=3))
    assert len(buffer) == 100 and buffer.rows_added == 3000
    assert buffer.nbytes() == 100 * (HIDDEN * 4 + 16 * 8 + 16 * 4)
    traces = buffer.recent(100)
    assert sum(trace.length for trace in traces) == 100
    assert all(trace.hidden.shape == (trace.length, HIDDEN) for trace in traces)


def test_traces_come_with_the_tokens_of_their_request_before_them():
    def round_(request: int, position: int, tokens: list[int], rows: int) -> RoundFeedback:
        return RoundFeedback(
            request=request,
            drafter=None,
            position=position,
            tokens=torch.tensor(tokens),
            drafted=torch.arange(rows - 1),
            num_accepted=rows - 1,
            hidden=None,
            top_ids=torch.zeros(rows, 16, dtype=torch.long),
            top_probs=torch.ones(rows, 16) / 16,
        )

    buffer = FeedbackBuffer(capacity=6)
    buffer.add(round_(0, 0, [5, 6, 7, 8], rows=1))  # the prefill: p at the last prompt token only
    buffer.add(round_(0, 4, [9, 10, 11], rows=3))  # the pending token and two accepted drafts
    (trace,) = buffer.recent(6)
    assert trace.prefix.tolist() == [5, 6, 7] and trace.tokens.tolist() == [8, 9, 10, 11]
    buffer.add(round_(1, 0, [1, 2], rows=1))
    buffer.add(round_(1, 2, [3, 4], rows=2))  # 7 rows: request 0's oldest goes
    old, new = buffer.recent(6)
    assert (old.prefix.tolist(), old.tokens.tolist()) == ([5, 6, 7, 8], [9, 10, 11])
    assert (new.prefix.tolist(), new.tokens.tolist()) == ([1], [2, 3, 4])
    with pytest.raises(ValueError, match="must start with its prefill"):
        buffer.add(round_(2, 5, [7, 8], rows=2))  # a request whose first 5 tokens were never seen


def test_learner_reports_its_memory(sharp_target):
    drafter = white_box("eagle", sharp_target)
    learner = build_learner("ensemble", drafter, LearnerConfig(buffer_rows=64, batch_rows=32))
    for round_ in range(100):
        learner.observe(feedback(request=0, position=3 * round_, rows=3))
    memory = learner.nbytes()
    copies = 3 * sum(p.nbytes for p in drafter.module.parameters())
    assert memory["optimizer"] == copies and memory["buffer"] == learner.buffer.nbytes() <= 64 * 1000


def test_a_non_finite_loss_skips_the_step_and_keeps_the_weights(sharp_target):
    drafter = white_box("hydra", sharp_target)
    learner = build_learner("ogd", drafter, LearnerConfig(every=1, batch_rows=8))
    before = {key: value.clone() for key, value in drafter.module.state_dict().items()}
    learner.observe(feedback(request=0, position=0, rows=4, hidden=float("nan")))
    assert learner.stats.skipped == 1 and learner.stats.steps == 0 and drafter.version == 0
    assert all(torch.equal(before[key], value) for key, value in drafter.module.state_dict().items())


@pytest.mark.parametrize("kind", ["eagle", "lora"])
@pytest.mark.parametrize("name, base", [(name, "ogd") for name in LEARNERS] + [("ensemble", "adamw")])
def test_a_restored_learner_goes_on_exactly_as_the_saved_one(sharp_target, name, base, kind):
    """Weights, optimizer state (the optimistic hint, AdamW's moments, the ensemble's copies, their
    moments and losses) and counters survive the round trip through tensors and JSON that the
    server's state store makes."""
    config = LearnerConfig(every=4, batch_rows=12, ensemble_base=base)  # each step sees only the newest 12 rows

    def rounds(learner, request: int, count: int) -> None:  # a request from its first position on
        for round_ in range(count):
            learner.observe(feedback(request=request, position=3 * round_, rows=3, hidden=0.1 * (round_ % 7)))

    def drafter(seed: int):
        torch.manual_seed(seed)
        return adapted_lm(sharp_target) if kind == "lora" else white_box(kind, sharp_target, seed)

    saved = build_learner(name, drafter(seed=0), config)
    rounds(saved, request=0, count=12)
    restored = build_learner(name, drafter(seed=1), config)
    restored.load_state(saved.state_tensors(), json.loads(json.dumps(saved.state_meta())))
    counters = ("steps", "skipped", "rollbacks", "learn_s")  # the history of losses stays with the process
    assert [getattr(restored.stats, name) for name in counters] == [getattr(saved.stats, name) for name in counters]
    assert restored.drafter.version == saved.drafter.version == 3
    for learner in (saved, restored):  # a new request, as after a restart
        rounds(learner, request=1, count=8)
    after = restored.drafter.module.state_dict()
    assert all(torch.equal(after[key], value) for key, value in saved.drafter.module.state_dict().items())


def test_the_guard_rolls_back_when_acceptance_falls(sharp_target):
    drafter = white_box("eagle", sharp_target)
    config = LearnerConfig(every=1000, rollback_window=8, rollback_margin=0.2)
    learner = build_learner("ogd", drafter, config)
    good = {key: value.clone() for key, value in drafter.module.state_dict().items()}
    for round_ in range(8):  # accepted 2 of 3 each round
        learner.observe(feedback(request=0, position=3 * round_, rows=3))
    learner.learn()  # the guard remembers these weights, then the step changes them
    assert learner.stats.steps == 1
    for position in range(24, 32):  # nothing accepted any more: one verified token per round
        learner.observe(
            RoundFeedback(
                request=0,
                drafter="eagle",
                position=position,
                tokens=torch.tensor([1]),
                drafted=torch.arange(3),
                num_accepted=0,
                hidden=torch.zeros(1, HIDDEN),
                top_ids=torch.zeros(1, 16, dtype=torch.long),
                top_probs=torch.ones(1, 16) / 16,
            )
        )
    learner.learn()
    assert learner.stats.rollbacks == 1
    assert all(torch.equal(good[key], value) for key, value in drafter.module.state_dict().items())


@pytest.mark.parametrize("kind", WHITE_BOX_KINDS)
def test_a_saved_drafter_loads_back_and_drafts_the_same(sharp_target, kind, tmp_path):
    drafter = white_box(kind, sharp_target, seed=7)
    drafter.version = 5
    drafter.save(tmp_path / kind, sharp_target.name)
    loaded = new_white_box_drafter(kind, sharp_target, tmp_path / kind)
    assert torch.equal(loaded.vocab.ids, drafter.vocab.ids) and loaded.config == drafter.config
    prompts = random_prompts(2, seed=1)
    outputs = [run(Engine(CachedLM(sharp_target.model), [d], frozenset(), 256), prompts)[1] for d in (drafter, loaded)]
    assert [s.num_accepted_tokens_per_pos for s in outputs[0]] == [s.num_accepted_tokens_per_pos for s in outputs[1]]
    other = "hydra" if kind == "eagle" else "eagle"
    with pytest.raises(EvospecError, match=f"holds a {kind} drafter"):
        new_white_box_drafter(other, sharp_target, tmp_path / kind)
    with pytest.raises(EvospecError, match="not a drafter checkpoint"):
        new_white_box_drafter(kind, sharp_target, tmp_path)


@pytest.mark.parametrize("kind", WHITE_BOX_KINDS)
def test_weights_of_another_shape_than_the_metadata_are_a_clear_error(sharp_target, kind, tmp_path):
    white_box(kind, sharp_target).save(tmp_path, sharp_target.name)
    meta = json.loads((tmp_path / "drafter.json").read_text())
    meta["config"]["intermediate_size" if kind == "eagle" else "num_heads"] += 1
    (tmp_path / "drafter.json").write_text(json.dumps(meta))
    with pytest.raises(EvospecError, match="do not fit the shape"):
        new_white_box_drafter(kind, sharp_target, tmp_path)


def test_the_unrolled_eagle_head_computes_what_drafting_computes(sharp_target):
    """Training at depth j must show the head what its j-th drafted token sees: its own predicted
    feature of the row before, attending the exact rows up to the draft's start and the draft itself."""
    module = white_box("eagle", sharp_target).module
    rows, depth = 10, 4
    torch.manual_seed(0)
    embeddings, features = torch.randn(rows, HIDDEN), torch.randn(rows, HIDDEN)
    with torch.no_grad():
        unrolled = module.unrolled(embeddings, features, depth)
        assert [len(step) for step in unrolled] == [rows - step for step in range(depth)]
        for last_exact in range(rows):  # a draft that starts after this row
            cache = DynamicCache(config=module.layer.config)
            predicted = module(embeddings[: last_exact + 1], features[: last_exact + 1], cache)[-1:]
            for step in range(min(depth, rows - last_exact)):
                row = last_exact + step
                if step:
                    predicted = module(embeddings[row : row + 1], predicted, cache)
                torch.testing.assert_close(predicted[0], unrolled[step][row - step], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["ogd", "adamw"])
def test_output_is_plain_decoding_while_the_eagle_head_learns_at_depth(sharp_target, name):
    drafter = white_box("eagle", sharp_target)
    learner = build_learner(name, drafter, LearnerConfig(every=2, batch_rows=64, train_depth=3))
    engine = Engine(CachedLM(sharp_target.model), [drafter], frozenset(), 256, learners=[learner])
    prompts = random_prompts(3, seed=4)
    outputs, _ = run(engine, prompts)
    assert outputs == [reference_greedy(sharp_target.model, prompt, 32) for prompt in prompts]
    assert learner.stats.steps > 0 and learner.stats.skipped == 0


def test_only_eagle_heads_learn_at_depth(sharp_target):
    with pytest.raises(EvospecError, match="nothing to unroll"):
        build_learner("ogd", white_box("hydra", sharp_target), LearnerConfig(train_depth=2))
    with pytest.raises(EvospecError, match="nothing to unroll"):
        build_learner("ogd", adapted_lm(sharp_target), LearnerConfig(train_depth=2))
    with pytest.raises(EvospecError, match="train depth must be >= 1"):
        LearnerConfig(train_depth=0)


def test_learners_only_train_white_box_drafters(sharp_target):
    from evospec.drafters import NgramDrafter

    with pytest.raises(EvospecError, match="cannot learn"):
        build_learner("ogd", NgramDrafter(), LearnerConfig())
    with pytest.raises(EvospecError, match="unknown learner"):
        build_learner("adam", white_box("eagle", sharp_target), LearnerConfig())
    with pytest.raises(EvospecError, match="schedule"):
        LearnerConfig(schedule="hourly")
