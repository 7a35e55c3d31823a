"""Offline warm-up (evospec train-drafter): distillation teaches the drafter, the checkpoint loads and
drafts, a resumed run ends where an uninterrupted one does, bad input is one clear line."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from evospec.config import DistillConfig, GenerationConfig
from evospec.distill import collect, distill, read_corpus
from evospec.drafters.registry import WHITE_BOX_KINDS, new_white_box_drafter
from evospec.engine import Engine
from evospec.errors import EvospecError
from evospec.models.hf import CachedLM
from evospec.stats import SpecStats

from conftest import TINY_VOCAB, run_cli

SAMPLES = 40  # a quarter held out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """SAMPLES prompts of random words, one a line."""
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("corpus") / "prompts.txt"
    lines = [" ".join(f"w{rng.randrange(TINY_VOCAB - 2)}" for _ in range(rng.randrange(3, 12))) for _ in range(SAMPLES)]
    path.write_text("\n".join(lines) + "\n")
    return path


def settings(corpus: Path, **overrides) -> DistillConfig:
    values = dict(
        data=str(corpus),
        samples=SAMPLES,
        max_new_tokens=24,
        epochs=4,
        lr=1e-2,
        batch_rows=96,
        head_vocab=64,
        holdout=0.25,
    )
    return DistillConfig(**{**values, **overrides})


@pytest.fixture(scope="module")
def traces(tmp_path_factory, sharp_target, corpus) -> Path:
    """The target's answers, collected once: each run below starts with a copy (its trace cache)."""
    directory = tmp_path_factory.mktemp("collected") / "traces"
    collection = collect(sharp_target, read_corpus(str(corpus)), directory, settings(corpus), progress=False)
    assert collection.collected == SAMPLES and collection.reused == 0
    return directory


def with_traces(out: Path, traces: Path) -> Path:
    shutil.copytree(traces, out / "traces")
    return out


@pytest.fixture(scope="module", params=WHITE_BOX_KINDS)
def trained(request, tmp_path_factory, sharp_target, corpus, traces):
    out = with_traces(tmp_path_factory.mktemp(request.param) / "drafter", traces)
    return request.param, out, distill(sharp_target, request.param, out, settings(corpus), progress=False)


def test_distillation_lowers_the_loss_and_raises_held_out_agreement(trained):
    _, _, result = trained
    assert (result.samples, result.held_out, result.collected, result.reused) == (SAMPLES, SAMPLES // 4, 0, SAMPLES)
    (loss_before, loss_after), (agreed_before, agreed_after) = result.held_out_loss, result.agreement
    assert loss_after < 0.9 * loss_before
    assert agreed_after > agreed_before + 0.1, result.agreement
    assert "held-out top-1 agreement" in result.describe()


def test_the_checkpoint_loads_and_drafts_better_than_an_untrained_drafter(trained, sharp_target, corpus):
    kind, out, result = trained
    drafter = new_white_box_drafter(kind, sharp_target, out)
    meta = json.loads((out / "drafter.json").read_text())
    assert meta["distill"]["step"] == result.steps == meta["drafter_version"] > 0
    assert meta["distill"]["loss"] == pytest.approx(result.final_loss)
    torch.manual_seed(0)
    untrained = new_white_box_drafter(kind, sharp_target)
    prompts = [sharp_target.tokenizer.encode(line) for line in read_corpus(str(corpus))[-SAMPLES // 4 :]]  # held out
    plain = Engine(CachedLM(sharp_target.model), [], frozenset(), 256)
    accepted = {}
    for name, candidate in (("trained", drafter), ("untrained", untrained)):
        engine = Engine(CachedLM(sharp_target.model), [candidate], frozenset(), 256)
        stats = SpecStats()
        for prompt in prompts:
            config = GenerationConfig(max_new_tokens=24, num_speculative_tokens=3)
            assert list(engine.generate(prompt, config, stats)) == list(plain.generate(prompt, config, SpecStats()))
        accepted[name] = stats.num_accepted_tokens
    assert accepted["trained"] > accepted["untrained"], accepted


@pytest.mark.parametrize("stop", ["mid-epoch", "after-an-epoch"])
def test_a_resumed_run_ends_where_an_uninterrupted_one_does(sharp_target, corpus, traces, tmp_path, stop):
    whole = distill(
        sharp_target, "eagle", with_traces(tmp_path / "whole", traces), settings(corpus, epochs=2), progress=False
    )
    out = with_traces(tmp_path / "stopped", traces)
    first = (
        settings(corpus, epochs=2, max_steps=whole.steps // 2 + 1)
        if stop == "mid-epoch"
        else settings(corpus, epochs=1)
    )
    part = distill(sharp_target, "eagle", out, first, progress=False)
    assert 0 < part.steps < whole.steps
    rest = distill(sharp_target, "eagle", out, settings(corpus, epochs=2, resume=True), progress=False)
    assert rest.steps == whole.steps and (rest.collected, rest.reused) == (0, SAMPLES)  # no sample answered twice
    for name in ("model.safetensors", "optimizer.safetensors"):
        expected, got = load_file(tmp_path / "whole" / name), load_file(out / name)
        assert expected.keys() == got.keys() and all(torch.equal(expected[key], got[key]) for key in expected), name
    done = distill(sharp_target, "eagle", out, settings(corpus, epochs=2, resume=True), progress=False)
    assert done.steps == whole.steps and done.final_loss == rest.final_loss  # nothing left to do


def test_resuming_with_another_kind_target_or_data_is_refused(sharp_target, corpus, traces, tmp_path):
    out = with_traces(tmp_path / "eagle", traces)
    distill(sharp_target, "eagle", out, settings(corpus, max_steps=1), progress=False)
    before = (out / "model.safetensors").read_bytes()
    renamed = dataclasses.replace(sharp_target, name="another-target", source="x")
    with pytest.raises(EvospecError, match="holds a eagle drafter, not hydra"):
        distill(sharp_target, "hydra", out, settings(corpus, resume=True), progress=False)
    with pytest.raises(EvospecError, match="trained for target 'tiny-sharp', not 'another-target'"):
        distill(renamed, "eagle", out, settings(corpus, resume=True), progress=False)
    with pytest.raises(EvospecError, match="trained with --samples 40, not 20"):
        distill(sharp_target, "eagle", out, settings(corpus, resume=True, samples=20), progress=False)
    with pytest.raises(EvospecError, match="already holds a drafter checkpoint"):
        distill(sharp_target, "eagle", out, settings(corpus), progress=False)
    assert (out / "model.safetensors").read_bytes() == before


def test_corpora(tmp_path):
    gsm8k = read_corpus("gsm8k")
    assert len(gsm8k) == 7473 and gsm8k[0].startswith("Natalia sold clips")
    rows = [{"question": "q?"}, {"prompt": "p"}, {"text": "t", "id": 3}]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n\n")
    assert read_corpus(str(tmp_path / "rows.jsonl")) == ["q?", "p", "t"]
    (tmp_path / "lines.txt").write_text("first prompt\n\n  second  \n")
    assert read_corpus(str(tmp_path / "lines.txt")) == ["first prompt", "second"]


@pytest.mark.parametrize(
    "data, kind, message",
    [
        ("missing.txt", "eagle", "no such file"),
        ("empty.txt", "eagle", "holds no prompts"),
        ("fieldless.jsonl", "eagle", "needs a text field"),
        ("broken.jsonl", "eagle", "not a JSON object"),
        ("prompts.csv", "eagle", "expected gsm8k, a .jsonl or a .txt file"),
        ("prompts.txt", "medusa", "unknown drafter kind 'medusa'"),
        ("prompts.txt", "eagle", "already holds a drafter checkpoint"),  # in `taken`, without --resume
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(capsys, tmp_path, data, kind, message):
    (tmp_path / "empty.txt").write_text("\n  \n")
    (tmp_path / "fieldless.jsonl").write_text('{"answer": "42"}\n')
    (tmp_path / "broken.jsonl").write_text('{"question": \n')
    (tmp_path / "prompts.csv").write_text("a,b\n")
    (tmp_path / "prompts.txt").write_text("w1 w2\n")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "drafter.json").write_text("{}")
    out = tmp_path / ("taken" if "already" in message else "new")
    status, _, err = run_cli(
        capsys,
        "train-drafter",
        "--target",
        "no-such-model",
        "--kind",
        kind,
        "--out",
        str(out),
        "--data",
        str(tmp_path / data),
    )
    assert status == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err
    assert (tmp_path / "taken" / "drafter.json").read_text() == "{}"  # nothing lost


def test_train_drafter_from_the_command_line(capsys, tmp_path, corpus, foreign_tokenizer_model):
    argv = [
        "train-drafter",
        "--target",
        foreign_tokenizer_model,
        "--dtype",
        "fp32",
        "--kind",
        "hydra",
        "--out",
        str(tmp_path / "hydra"),
        "--data",
        str(corpus),
        "--samples",
        "5",
        "--max-new-tokens",
        "8",
        "--epochs",
        "1",
        "--head-vocab",
        "32",
    ]
    status, out, err = run_cli(capsys, *argv)
    assert status == 0, err
    assert "5 collected, 0 cached" in out and "held-out top-1 agreement" in out
    status, _, err = run_cli(capsys, *argv)
    assert status == 2 and "already holds a drafter checkpoint" in err
    status, out, _ = run_cli(capsys, *argv, "--resume", "--epochs", "2")
    assert status == 0 and "0 collected, 5 cached" in out
    run = json.loads((tmp_path / "hydra" / "drafter.json").read_text())["distill"]
    assert run["epoch"] == 2 and run["corpus"] == str(corpus) and run["samples"] == 5


@pytest.mark.parametrize(
    "kind, depth, message",
    [("hydra", "2", "a hydra drafter has nothing to unroll"), ("eagle", "0", "train-depth must be >= 1")],
)
def test_train_depth_is_for_drafters_that_unroll(capsys, tmp_path, kind, depth, message):
    (tmp_path / "prompts.txt").write_text("w1 w2\n")
    argv = ["train-drafter", "--target", "no-such-model", "--kind", kind, "--out", str(tmp_path / "out")]
    status, _, err = run_cli(capsys, *argv, "--data", str(tmp_path / "prompts.txt"), "--train-depth", depth)
    assert status == 2 and message in err and "Traceback" not in err
