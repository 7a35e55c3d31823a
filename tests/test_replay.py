"""Replays of a recorded target: exactly the rounds a live run makes (hf fp32), traces that resume, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from evospec.bench.replay import projected_speed, recorded_cost
from evospec.bench.traces import collect_traces, load_traces
from evospec.config import GenerationConfig, StepConfig, method_settings
from evospec.cost import ForwardCost, profile_cost
from evospec.draft_length import AdaptiveDraftLength
from evospec.drafters import NgramDrafter, SmallLMDrafter, SuffixDrafter
from evospec.errors import EvospecError
from evospec.generation import build_engine
from evospec.learning import LearnerConfig, build_learner
from evospec.models.backend import LoadedModel
from evospec.models.hf import CachedLM
from evospec.models.replay import Answer, Recording, replayed
from evospec.reasoning import StepSpeculator, TargetJudge
from evospec.selection import build_selector
from evospec.stats import SpecStats

from conftest import TINY_VOCAB, adapted_lm, random_prompts, run_cli, tiny_model, tiny_word_tokenizer, white_box

K = 8
COST = ForwardCost(tuple(0.01 * (1 + 0.1 * n) for n in range(K + 1)))  # one profile, live and replayed
LEARNING = LearnerConfig(every=2)


def engines(target: LoadedModel, real: LoadedModel) -> dict:
    """One engine per kind of method, built alike on a live or a replayed target (the same seeds);
    real: the live target, whose weights the small LM is a jittered copy of."""

    def eagle(learner: str | None):
        drafter = white_box("eagle", target, seed=3)
        return [drafter], [build_learner(learner, drafter, LEARNING)] if learner else []

    def small_lm():
        drafter = adapted_lm(real)
        return [drafter], [build_learner("ogd", drafter, LEARNING)]

    built = {
        "ngram": build_engine(target, [NgramDrafter()]),
        "suffix/k=auto": build_engine(target, [SuffixDrafter()], AdaptiveDraftLength(COST), forward_cost=COST),
        "eagle+ogd": build_engine(target, *_drafters_and_learners(eagle("ogd"))),
        "eagle+optimistic": build_engine(target, *_drafters_and_learners(eagle("optimistic"))),
        "eagle+ensemble": build_engine(target, *_drafters_and_learners(eagle("ensemble"))),
        "lora+ogd": build_engine(target, *_drafters_and_learners(small_lm())),
    }
    for selector in ("ucb-be", "hedge", "contextual"):
        arms = [NgramDrafter(), SuffixDrafter(), SmallLMDrafter(CachedLM(tiny_model(1, 0.3, real.model)), "lm")]
        built[f"select:{selector}"] = build_engine(
            target, arms, selector=build_selector(selector, [a.name for a in arms])
        )
    # Model-free arms only: the speed reward of a neural arm's pulls is timed, live and replayed alike.
    arms = [NgramDrafter(), SuffixDrafter()]
    selector = build_selector("contextual-speed", [a.name for a in arms])
    built["select:contextual-speed"] = build_engine(target, arms, selector=selector, forward_cost=COST)
    (drafter,), learners = eagle("ogd")  # an arm that evolves while the selector picks
    arms = [drafter, NgramDrafter(), SuffixDrafter()]
    selector = build_selector("ucb-be", [a.name for a in arms])
    built["select:ucb-be+ogd"] = build_engine(target, arms, selector=selector, learners=learners)
    return built


def _drafters_and_learners(pair):
    drafters, learners = pair
    return drafters, None, None, learners


def generate_all(engine, prompts: list[list[int]], lengths: list[int]) -> tuple[list[list[int]], list[SpecStats]]:
    outputs, stats = [], []
    for prompt, length in zip(prompts, lengths):
        stats.append(SpecStats())
        config = GenerationConfig(max_new_tokens=length, num_speculative_tokens=K)
        outputs.append(list(engine.generate(prompt, config, stats[-1])))
    return outputs, stats


def recorded_answers(target: LoadedModel, prompts: list[list[int]], max_new_tokens: int) -> list[Answer]:
    plain = build_engine(target, [])
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    return [Answer(tuple(prompt), tuple(plain.generate(prompt, config, SpecStats()))) for prompt in prompts]


# Methods whose every decision follows from the target's choices on its own path (and a drafter
# that reads tokens only): their replay equals a live run exactly. Block divergence also reads the
# target's choice after a rejected draft token, off the recorded path, which no recording holds: a
# replay reads the recorded path's choice there instead (benchmarks/README.md measures what that
# changes for ucb-bd on a real model). Learners read the target's hidden states and top-K rows,
# which hf's fp32 CPU kernels round differently in a long prefill and in the live run's passes (by
# ~1e-6: not batch-invariant), so their weights drift by ulps and may flip a near-tie draft after
# many steps (a tiny random drafter has many near-ties): their rounds must agree within
# LEARNING_TOLERANCE, and the rows they learn from within ROW_TOLERANCE of the live ones. A frozen
# white-box drafter reads them too: a near-tie in its draft may flip alike.
EXACT = ("ngram", "suffix/k=auto", "select:ucb-be", "select:hedge", "select:contextual", "select:contextual-speed")
LEARNING_TOLERANCE = 0.05
ROW_TOLERANCE = 1e-5


def test_a_replay_makes_the_rounds_of_a_live_run(sharp_target):
    """Greedy hf fp32: every method's output; rounds, tau and per-position acceptance request by request
    (exactly, or within the tolerance for learners, over the stream)."""
    prompts = random_prompts(8, seed=3)
    answers = recorded_answers(sharp_target, prompts, max_new_tokens=40)
    lengths = [len(answer.answer_ids) for answer in answers]
    recording = Recording(answers, sharp_target.vocab_size, COST, sharp_target)
    recording.rows = True
    live, replay = engines(sharp_target, sharp_target), engines(replayed(sharp_target, recording), sharp_target)
    for name in live:
        live_outputs, live_stats = generate_all(live[name], prompts, lengths)
        replay_outputs, replay_stats = generate_all(replay[name], prompts, lengths)
        assert replay_outputs == live_outputs == [list(answer.answer_ids) for answer in answers], name
        assert sum(s.num_accepted_tokens for s in live_stats) > 0, f"{name} never had a draft accepted: a weak test"
        if name in EXACT:
            for request, (a, b) in enumerate(zip(live_stats, replay_stats)):
                assert (a.num_verifications, a.num_accepted_tokens_per_pos, a.num_draft_tokens) == (
                    b.num_verifications,
                    b.num_accepted_tokens_per_pos,
                    b.num_draft_tokens,
                ), f"{name}, request {request}"
        else:
            live_rounds = sum(s.num_verifications for s in live_stats)
            replay_rounds = sum(s.num_verifications for s in replay_stats)
            assert abs(replay_rounds - live_rounds) <= LEARNING_TOLERANCE * live_rounds, name
    assert recording.reordered_rows == 0


class FeedbackSpy:
    """A listener that keeps every RoundFeedback (as a learner hears it)."""

    needs_hidden_states = True
    prompt_rows = 0

    def __init__(self) -> None:
        self.heard = []

    def observe(self, feedback) -> None:
        self.heard.append(feedback)

    def end_request(self) -> None:
        pass


def test_learners_hear_from_a_replay_what_they_hear_live(sharp_target):
    """Position by position the same tokens, the same top-K ids, and probabilities and hidden states
    within rounding: a shifted or stale row would be off by far more."""
    prompts = random_prompts(4, seed=3)
    answers = recorded_answers(sharp_target, prompts, max_new_tokens=40)
    recording = Recording(answers, sharp_target.vocab_size, COST, sharp_target)
    recording.rows = True

    def heard(target):
        spy = FeedbackSpy()
        engine = build_engine(target, [NgramDrafter()], learners=[spy])
        generate_all(engine, prompts, [len(answer.answer_ids) for answer in answers])
        return spy.heard

    live, replay = heard(sharp_target), heard(replayed(sharp_target, recording))
    assert len(live) == len(replay) > len(prompts)
    for a, b in zip(live, replay):
        assert (a.request, a.position, a.num_accepted) == (b.request, b.position, b.num_accepted)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.top_ids, b.top_ids)
        assert torch.allclose(a.top_probs, b.top_probs, atol=ROW_TOLERANCE)
        assert torch.allclose(a.hidden, b.hidden, atol=ROW_TOLERANCE)


def test_replayed_passes_cost_the_profile_not_the_replay(sharp_target):
    prompts = random_prompts(2, seed=5)
    answers = recorded_answers(sharp_target, prompts, max_new_tokens=24)
    cost = ForwardCost((0.5,) * (K + 1))  # half a second a pass: far above what building a pass takes
    recording = Recording(answers, sharp_target.vocab_size, cost, sharp_target)
    engine = build_engine(replayed(sharp_target, recording), [])
    _, stats = generate_all(engine, prompts, [len(answer.answer_ids) for answer in answers])
    for request in stats:  # the prefill's pass is free; every later pass is a plain step of 0.5 s
        assert request.target_s == pytest.approx(0.5 * (request.num_verifications - 1), abs=0.05)


def test_rows_follow_the_recorded_top_k_and_put_the_answer_first(sharp_target):
    prompts = random_prompts(1, seed=7)
    answer = recorded_answers(sharp_target, prompts, max_new_tokens=12)[0]
    recording = Recording([answer], sharp_target.vocab_size, COST, sharp_target)
    recording.rows = True
    positions = list(range(len(answer.prompt_ids) - 1, len(answer.tokens) - 1))  # where the answer is verified
    logits = recording.logits(0, positions)
    assert logits.argmax(dim=-1).tolist() == list(answer.answer_ids)
    probs = logits.softmax(dim=-1)
    rows = recording.rows_of(0, hidden=False)
    assert torch.allclose(probs.gather(1, rows.top_ids[positions]), rows.top_probs[positions], atol=1e-5)
    assert torch.allclose(probs.sum(dim=-1), torch.ones(len(positions)))
    assert recording.reordered_rows == 0


def test_a_prompt_without_a_recorded_answer_is_a_clear_error(sharp_target):
    recording = Recording([Answer((1, 2, 3), (4, 5))], TINY_VOCAB, COST, sharp_target)
    engine = build_engine(replayed(sharp_target, recording), [])
    with pytest.raises(EvospecError, match="no recorded answer"):
        list(engine.generate([3, 2, 1], GenerationConfig(max_new_tokens=2), SpecStats()))


def test_named_profiles_scale_to_this_machines_step():
    cost = profile_cost("h100-bf16-roofline", 0.02, 65)
    assert cost.of(1) == pytest.approx(0.02) and cost.of(65) == pytest.approx(0.02)
    with pytest.raises(EvospecError, match="unknown cost profile"):
        profile_cost("tpu-v9", 0.02, 65)


@pytest.fixture
def sharp_model_dir(sharp_target, tmp_path: Path) -> Path:
    """The sharp tiny target saved as a model directory (loadable by name, as traces and replays load it)."""
    directory = tmp_path / "sharp"
    sharp_target.model.save_pretrained(directory)
    tiny_word_tokenizer().save_pretrained(directory)
    return directory


def prompts_file(path: Path, count: int) -> Path:
    generator = torch.Generator().manual_seed(11)
    lines = []
    for _ in range(count):
        words = [f"w{int(i)}" for i in torch.randint(0, TINY_VOCAB - 2, (6,), generator=generator)]
        lines.append(" ".join(words + words[:3]))
    path.write_text("\n".join(lines) + "\n")
    return path


def collected_traces(capsys, model_dir: Path, tmp_path: Path, count: int, max_new_tokens: int) -> Path:
    """`evospec traces collect` of count prompts from model_dir in fp32, into tmp_path / "traces"."""
    data = prompts_file(tmp_path / "prompts.txt", count)
    traces = tmp_path / "traces"
    collect = ["traces", "collect", "--target", str(model_dir), "--data", str(data), "--n", str(count)]
    status, _, _ = run_cli(
        capsys, *collect, "--max-new-tokens", str(max_new_tokens), "--out", str(traces), "--dtype", "fp32"
    )
    assert status == 0
    return traces


def test_traces_resume_and_a_cut_line_is_dropped(sharp_model_dir, tmp_path, capsys):
    data = prompts_file(tmp_path / "prompts.txt", 4)
    out = tmp_path / "traces"
    common = ["--target", str(sharp_model_dir), "--data", str(data), "--max-new-tokens", "12", "--out", str(out)]
    assert run_cli(capsys, "traces", "collect", *common, "--n", "2", "--dtype", "fp32")[0] == 0
    first = (out / "answers.jsonl").read_text()
    with (out / "answers.jsonl").open("a") as file:
        file.write('{"index": 2, "prompt_ids": [1, 2')  # a collection killed mid-write
    assert run_cli(capsys, "traces", "collect", *common, "--n", "4", "--dtype", "fp32")[0] == 0
    lines = (out / "answers.jsonl").read_text().splitlines()
    assert len(lines) == 4 and "\n".join(lines[:2]) + "\n" == first
    assert [json.loads(line)["index"] for line in lines] == [0, 1, 2, 3]
    status, _, err = run_cli(capsys, "traces", "collect", *common[:-1], str(out), "--n", "4", "--dtype", "bf16")
    assert status == 2 and "weights" in err  # another collection's directory is not overwritten
    assert len((out / "answers.jsonl").read_text().splitlines()) == 4


def test_traces_resume_from_the_exported_answers_a_commit_holds(sharp_model_dir, tmp_path, capsys):
    data = prompts_file(tmp_path / "prompts.txt", 4)
    out, exported = tmp_path / "traces", tmp_path / "exported"
    collect = ["traces", "collect", "--target", str(sharp_model_dir), "--data", str(data), "--max-new-tokens", "12"]
    assert run_cli(capsys, *collect, "--n", "2", "--out", str(out), "--export", str(exported))[0] == 0
    # A fresh clone holds only the exported answers.jsonl.gz and meta.json: the collection goes on from them.
    assert run_cli(capsys, *collect, "--n", "4", "--out", str(exported))[0] == 0
    assert run_cli(capsys, *collect, "--n", "4", "--out", str(out))[0] == 0
    resumed, whole = load_traces(exported), load_traces(out)
    assert len(resumed.answers) == 4 and resumed.answers == whole.answers


def test_replay_command_writes_the_benchmark_shape(sharp_model_dir, tmp_path, capsys):
    traces = collected_traces(capsys, sharp_model_dir, tmp_path, 6, max_new_tokens=16)
    out = tmp_path / "replay"
    status, _, err = run_cli(
        capsys,
        "replay",
        "--traces",
        f"tiny={traces}",
        "--stream",
        "tiny[0:4]+tiny[4:6]",
        "--method",
        "evospec-plain",
        "--method",
        "evospec:ngram",
        "--method",
        "select:ucb-bd",
        "--k",
        "4",
        "--block-size",
        "2",
        "--out",
        str(out),
    )
    assert status == 0, err
    results = json.loads((out / "results.json").read_text())
    assert results["replay"] is True and results["profile"] == "measured" and results["prompts"] == 6
    plain = results["methods"]["evospec-plain"]
    assert plain["tau"] == 1.0 and len(plain["per_block"]) == 3
    assert results["methods"]["evospec:ngram"]["rounds"] <= plain["rounds"]
    kept = results["methods"]["evospec:ngram"]["accepted_per_position"]  # a round keeping token j kept those before it
    assert 0 < len(kept) <= 4 and kept == sorted(kept, reverse=True) and kept[0] > 0
    assert (out / "blocks.png").is_file() and (out / "results.md").is_file()
    # Every method's passes are recorded, so any T(n) can be charged afterwards: the recorded curve
    # gives back the run's projection, and a curve twice as slow charges the target's seconds twice.
    assert list(results["forward_cost_ms"]) == ["1", "2", "3", "4", "5"]
    curve = recorded_cost(results)
    slower = ForwardCost(tuple(2 * s for s in curve.seconds), curve.sizes)
    for name, fields in results["methods"].items():
        if name == "oracle":  # the best single drafter per category: a composite, no run of its own
            continue
        assert sum(fields["target_passes"].values()) == fields["rounds"] - results["prompts"]  # prefills are free
        assert projected_speed(fields, curve) == pytest.approx(fields["projected_tokens_per_s"]["measured"], rel=1e-3)
        target_s = fields["new_tokens"] / projected_speed(fields, curve) - fields["non_target_s"]
        twice = fields["new_tokens"] / (fields["non_target_s"] + 2 * target_s)
        assert projected_speed(fields, slower) == pytest.approx(twice, rel=1e-6)


def test_a_replay_runs_the_small_lm_with_adapters_frozen_and_learning(sharp_model_dir, sharp_target, tmp_path, capsys):
    """OSD as a replay method: evospec:lora:<model> drafts what the plain small LM drafts (its adapters
    start at zero), and evospec:lora:<model>+ogd learns from the replayed rows and still emits the
    recorded answers (the replay checks every request)."""
    traces = collected_traces(capsys, sharp_model_dir, tmp_path, 6, max_new_tokens=24)
    draft = tmp_path / "draft"
    tiny_model(seed=1, noise=0.3, base=sharp_target.model).save_pretrained(draft)
    tiny_word_tokenizer().save_pretrained(draft)
    methods = [f"evospec:{draft}", f"evospec:lora:{draft}", f"evospec:lora:{draft}+ogd@schedule=request,lr=0.05"]
    out = tmp_path / "replay"
    status, _, err = run_cli(
        capsys,
        "replay",
        "--traces",
        f"tiny={traces}",
        "--draft-model",
        str(draft),
        *(option for method in methods for option in ("--method", method)),
        "--k",
        "4",
        "--out",
        str(out),
    )
    assert status == 0, err
    results = json.loads((out / "results.json").read_text())
    plain_lm, frozen, learning = (results["methods"][name] for name in methods)
    assert frozen["rounds"] == plain_lm["rounds"] and frozen["tau"] > 1.0
    (report,) = results["learners"][methods[2]]
    assert report["steps"] >= 5  # a step after each request but the last


def test_a_method_name_sets_learner_fields_optional_ones_included():
    name, learning = method_settings("evospec:eagle+adamw@lr=3e-4,epochs=2,prompt_rows=0", LearnerConfig())
    assert name == "evospec:eagle+adamw"
    assert (learning.lr, learning.epochs, learning.prompt_rows) == (3e-4, 2, 0)
    assert method_settings("evospec:eagle+ensemble@restart_each_chunk=true", learning)[1].restart_each_chunk


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--stream", "tiny[0:99]"], "holds answers"),
        (["--stream", "other"], "NAME one of tiny"),
        (["--profile", "tpu-v9"], "unknown cost profile"),
        (["--method", "llamacpp-plain"], "unknown bench method"),
        (["--method", "evospec:lora:tiny+ogd"], "unknown bench method"),  # no --draft-model
        (["--method", "evospec:ngram@every=often"], "is not a int"),
        (["--method", "evospec:ngram@rate=2"], "LearnerConfig has no setting 'rate'"),
        (["--method", "evospec:ngram@restart_each_chunk=yes"], "is not a bool (true or false)"),
        (["--method", "evospec:ngram@ensemble_base=sgd"], "ensemble base is one of ogd, adamw, got 'sgd'"),
        (["--block-size", "0"], "--block-size must be >= 1"),
        (["--live", "--profile", "h100-bf16-roofline"], "--live takes no --profile"),
    ],
)
def test_bad_replay_options_are_clear_errors(sharp_model_dir, tmp_path, capsys, options, message):
    traces = collected_traces(capsys, sharp_model_dir, tmp_path, 2, max_new_tokens=8)
    base = ["replay", "--traces", f"tiny={traces}", "--method", "evospec-plain", "--out", str(tmp_path / "o")]
    status, _, err = run_cli(capsys, *base, *options)
    assert status == 2 and message in err


def test_a_collection_keeps_the_rows_a_pass_of_the_target_makes(sharp_target, tmp_path):
    """Rows written while decoding (top-K and hidden states at every position of prompt + answer) agree
    with one pass of the target over the whole, within rounding; a replay reads them without the target."""
    data = prompts_file(tmp_path / "prompts.txt", 3)
    traces = collect_traces(sharp_target, str(data), 3, 12, tmp_path / "t", progress=False)
    recording = Recording(traces.answers, sharp_target.vocab_size, COST, sharp_target)
    for index, answer in enumerate(traces.answers):
        kept = load_file(traces.rows_path(index))
        made = recording.rows_of(index, hidden=True)
        assert kept["top_ids"].shape[0] == kept["hidden"].shape[0] == len(answer.tokens)
        assert torch.equal(kept["top_ids"], made.top_ids)
        assert torch.allclose(kept["top_probs"], made.top_probs, atol=ROW_TOLERANCE)
        assert torch.allclose(kept["hidden"], made.hidden, atol=ROW_TOLERANCE)
    paths = [traces.rows_path(index) for index in range(3)]
    offline = Recording(traces.answers, sharp_target.vocab_size, COST, real_target=None, rows_paths=paths)
    assert torch.equal(offline.rows_of(1, hidden=True).hidden, load_file(paths[1])["hidden"])


def test_collect_names_the_datasets_for_an_unknown_one(capsys, tmp_path):
    status, _, err = run_cli(capsys, "traces", "collect", "--target", "x", "--data", "gsm9k", "--n", "1")
    assert status == 2 and "gsm8k-train, gsm8k-test, humaneval, spec-bench[:CATEGORY]" in err
    status, _, err = run_cli(capsys, "traces", "collect", "--target", "x", "--data", "spec-bench:poetry", "--n", "1")
    assert status == 2 and "Spec-Bench has no category 'poetry'" in err


def test_a_missing_trace_set_is_a_clear_error(tmp_path):
    with pytest.raises(EvospecError, match="not a trace set"):
        load_traces(tmp_path / "nothing")


def test_collect_refuses_more_prompts_than_the_data_holds(sharp_target, tmp_path):
    data = prompts_file(tmp_path / "prompts.txt", 2)
    with pytest.raises(EvospecError, match="fewer than --n"):
        collect_traces(sharp_target, str(data), 3, 8, tmp_path / "t", progress=False)


def test_train_drafter_warms_up_on_a_trace_sets_answers_and_rows(sharp_model_dir, sharp_target, tmp_path, capsys):
    """OnlineSPEC's warm start on the first samples of a stream: the recorded answers, not new ones, and
    the rows the collection kept, not new passes; a missing rows file is made and kept where replay reads it."""
    traces = collected_traces(capsys, sharp_model_dir, tmp_path, 4, max_new_tokens=12)
    recorded = load_traces(traces)
    recorded.rows_path(2).unlink()
    train = ["train-drafter", "--target", str(sharp_model_dir), "--kind", "eagle", "--data", str(traces)]
    train += ["--samples", "4", "--epochs", "1", "--dtype", "fp32"]
    status, out, err = run_cli(capsys, *train, "--out", str(tmp_path / "ckpt"))
    assert status == 0, err
    assert "1 collected, 3 cached" in out
    assert (tmp_path / "ckpt" / "drafter.json").is_file() and not (tmp_path / "ckpt" / "traces").exists()
    made = load_file(recorded.rows_path(2))
    replayed_pass = Recording(recorded.answers, sharp_target.vocab_size, COST, sharp_target).rows_of(2, hidden=True)
    assert torch.equal(made["top_ids"], replayed_pass.top_ids)
    assert torch.allclose(made["hidden"], replayed_pass.hidden, atol=ROW_TOLERANCE)
    status, again, err = run_cli(capsys, *train, "--out", str(tmp_path / "ckpt-again"))
    assert status == 0 and "0 collected, 4 cached" in again
    assert again.splitlines()[2:] == out.splitlines()[2:]  # the same rows teach the same drafter
    other = ["train-drafter", "--target", "smollm2-135m-instruct", "--kind", "eagle", "--data", str(traces)]
    status, _, err = run_cli(capsys, *other, "--out", str(tmp_path / "c2"))
    assert status == 2 and "holds answers of" in err  # another target's answers, refused before it loads


class FirstWordJudge:
    """A deterministic judge for tiny models: two steps are aligned when they open with the same word."""

    name = "first-word"

    def aligned(self, drafted: str, target: str) -> bool:
        return drafted.split()[:1] == target.split()[:1]


@pytest.mark.parametrize("learner", [None, "dpo"])
def test_a_step_replay_following_the_target_judges_and_learns_as_live(sharp_target, learner):
    """Step-level speculation that follows the target stays on the target's recorded answer, so a
    replay makes every drafted step, verdict, round and preference pair of a live run."""
    prompts = random_prompts(5, seed=6)
    answers = recorded_answers(sharp_target, prompts, max_new_tokens=30)
    recording = Recording(answers, sharp_target.vocab_size, COST, sharp_target)
    steps = StepConfig(delimiter="w10", max_step_tokens=6, follow_target=True)

    def run(target: LoadedModel) -> tuple[list[list[int]], list[SpecStats], int]:
        drafter = adapted_lm(sharp_target)
        learners = [build_learner(learner, drafter, LearnerConfig(every=1))] if learner else []
        speculator = StepSpeculator(target, drafter, FirstWordJudge(), steps, learners)
        outputs, stats = generate_all(speculator, prompts, [len(answer.answer_ids) for answer in answers])
        return outputs, stats, sum(learner.pairs for learner in learners)

    live_outputs, live_stats, live_pairs = run(sharp_target)
    replay_outputs, replay_stats, replay_pairs = run(replayed(sharp_target, recording))
    assert replay_outputs == live_outputs == [list(answer.answer_ids) for answer in answers]

    def counters(stats: SpecStats) -> tuple:
        return (
            stats.num_draft_steps,
            stats.num_accepted_steps,
            stats.num_identical_steps,
            stats.num_verifications,
            stats.num_accepted_tokens_per_pos,
        )

    assert [counters(s) for s in replay_stats] == [counters(s) for s in live_stats]
    judged = sum(s.num_accepted_steps - s.num_identical_steps for s in live_stats)
    rejected = sum(s.num_draft_steps - s.num_accepted_steps for s in live_stats)
    assert judged > 0 and rejected > 0, "the judge both kept and refused different steps: a weak test otherwise"
    assert replay_pairs == live_pairs == (rejected if learner else 0)
    assert sum(s.wall_s for s in replay_stats) >= COST.of(1) * len(prompts)  # the profile's seconds were charged


def test_a_step_replay_that_would_leave_the_recorded_answer_is_refused(sharp_target):
    recording = Recording(recorded_answers(sharp_target, random_prompts(1, seed=6), 10), TINY_VOCAB, COST)
    target, drafter = replayed(sharp_target, recording), adapted_lm(sharp_target)
    with pytest.raises(EvospecError, match="while following the target"):
        StepSpeculator(target, drafter, FirstWordJudge(), StepConfig())
    with pytest.raises(EvospecError, match="no recording holds"):
        # (the tiny tokenizer has no chat template to build a working target judge with: its kind is what is refused)
        StepSpeculator(target, drafter, TargetJudge.__new__(TargetJudge), StepConfig(follow_target=True))
    with pytest.raises(EvospecError, match="cannot branch"):
        StepSpeculator(target, drafter, FirstWordJudge(), StepConfig(follow_target=True, lookahead=2))
