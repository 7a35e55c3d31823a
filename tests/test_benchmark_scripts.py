"""The benchmark scripts' own logic, without real models: settings are read right or refused in one
line, and the policy replay emits what the target said while charging each pass its measured cost."""

from __future__ import annotations

import pytest

from evospec.config import GenerationConfig
from evospec.cost import ForwardCost
from evospec.draft_length import AdaptiveConfig, AdaptiveDraftLength
from evospec.drafters import SmallLMDrafter
from evospec.engine import Engine
from evospec.learning import LearnerConfig
from evospec.models.hf import CachedLM
from evospec.stats import SpecStats

from conftest import TINY_VOCAB, load_script, random_prompts, reference_greedy


def test_a_replay_setting_names_a_learner_and_its_config():
    replay = load_script("learning_replay")
    assert replay.parse_setting("none") == ("none", LearnerConfig())
    assert replay.parse_setting("ensemble:schedule=request,batch_rows=128,lr=0.01,restart_each_chunk=true") == (
        "ensemble",
        LearnerConfig(schedule="request", batch_rows=128, lr=0.01, restart_each_chunk=True),
    )
    assert not replay.parse_setting("ensemble:restart_each_chunk=false")[1].restart_each_chunk


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("adam", "unknown learner"),
        ("ogd:speed=2", "no field 'speed'"),
        ("ogd:lr=fast", "could not convert"),
        ("ogd:lr=-1", "learning rate must be > 0"),
        ("ogd:schedule=hourly", "unknown learning schedule"),
        ("ensemble:restart_each_chunk=yes", "'yes' is not true or false"),
        ("ensemble:ensemble_scales=1", "cannot be set here"),
    ],
)
def test_a_bad_replay_setting_exits_with_one_line(setting, message):
    replay = load_script("learning_replay")
    with pytest.raises(SystemExit, match=message):
        replay.parse_setting(setting)


def test_a_negative_context_window_exits_before_loading_anything(monkeypatch, tmp_path):
    replay = load_script("learning_replay")
    argv = [
        "learning_replay.py",
        "--small-lm",
        "no-such-model",
        "--traces",
        str(tmp_path),
        "--setting",
        "none",
        "--context-tokens",
        "-1",
        "--out",
        str(tmp_path),
    ]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit, match="invalid adapter settings"):
        replay.main()


def test_an_unknown_replay_category_exits_before_loading_anything(monkeypatch, tmp_path):
    replay = load_script("learning_replay")
    argv = [
        "learning_replay.py",
        "--small-lm",
        "no-such-model",
        "--traces",
        str(tmp_path),
        "--setting",
        "none",
        "--category",
        "poetry",
        "--out",
        str(tmp_path),
    ]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit, match="Spec-Bench has no category 'poetry'"):
        replay.main()


def test_a_policy_replay_method_is_a_bench_method_with_adaptive_settings():
    replay = load_script("policy_replay")
    assert replay.parse_method("evospec:ngram/k=auto@discount=0.995,exploration=0.2", "small") == (
        "evospec:ngram/k=auto",
        AdaptiveConfig(discount=0.995, exploration=0.2),
    )
    assert replay.parse_method("select:thompson-speed", "small") == ("select:thompson-speed", AdaptiveConfig())
    assert replay.parse_method("evospec:small/k=auto", "small")[0] == "evospec:small/k=auto"


@pytest.mark.parametrize(
    ("method", "message"),
    [
        ("evospec:eagle", "DRAFTER one of ngram, suffix, small"),
        ("select:fixed", "expected evospec-plain"),
        ("evospec:ngram@discount=0.9", "@settings only after"),
        ("evospec:ngram/k=auto@patience=3", "no field 'patience'"),
        ("evospec:ngram/k=auto@discount=2", "invalid adaptive draft-length settings"),
    ],
)
def test_a_bad_policy_replay_method_exits_with_one_line(method, message):
    replay = load_script("policy_replay")
    with pytest.raises(SystemExit, match=message):
        replay.parse_method(method, "small")


@pytest.mark.parametrize("adaptive", [False, True])
def test_the_replayed_target_emits_its_answers_and_charges_each_pass_its_cost(tiny_target, tiny_drafter, adaptive):
    replay = load_script("policy_replay")
    prompts = random_prompts(4, seed=11)
    answers = {tuple(prompt): prompt + reference_greedy(tiny_target, prompt, 24) for prompt in prompts}
    cost = ForwardCost((0.1, 0.11, 0.12, 0.13))  # cheap verification: the adaptive length drafts too
    clock = replay.ReplayClock()
    drafters = [SmallLMDrafter(CachedLM(tiny_drafter), "small")]
    engine = Engine(
        replay.ReplayTarget(answers, TINY_VOCAB, cost, clock),
        drafters,
        frozenset(),
        256,
        AdaptiveDraftLength(cost) if adaptive else None,
        forward_cost=cost,
        clock=clock.perf_counter,
    )
    total = SpecStats()
    for prompt in prompts:
        stats = SpecStats()
        config = GenerationConfig(max_new_tokens=24, num_speculative_tokens=3)
        assert list(engine.generate(prompt, config, stats)) == answers[tuple(prompt)][len(prompt) :]
        total.merge(stats)
    assert total.num_draft_tokens > total.num_accepted_tokens > 0  # drafts were accepted and rejected
    passes = total.num_verifications - len(prompts)  # the prefills cost nothing
    assert 0.1 * passes <= clock.modeled_s <= 0.13 * passes
    assert clock.modeled_s <= total.target_s < clock.modeled_s + 0.5  # the engine timed the passes on the clock
