"""The command line: bad input is one clear line on stderr and exit status 2, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import run_cli

SMOL = "smollm2-135m-instruct"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "hi", "--target", "no-such-model"], "not a zoo alias"),
        (["generate", "hi", "--target", SMOL, "--k", "0"], "k"),
        (["generate", "hi", "--target", SMOL, "--temperature", "-1"], "temperature"),
        (["generate", "hi", "--target", SMOL, "--top-p", "0"], "top-p"),
        (["generate", "hi", "--target", SMOL, "--top-p", "1.5"], "top-p"),
        (["generate", "hi", "--target", SMOL, "--max-new-tokens", "0"], "max-new-tokens"),
        (["pull", "no-such-model"], "unknown model alias"),
        (["bench", "--per-category", "0"], "per-category"),
        (["bench", "--method", "no-such-method"], "unknown bench method"),
        (["demo", "--k", "0"], "k (draft length)"),
        (["generate", "hi", "--target", SMOL, "--prediction", "/no/such/file"], "--prediction /no/such/file"),
        (["generate", "hi", "--target", SMOL, "--prediction", "/dev/null"], "the prediction is empty"),
        (["generate", "hi", "--target", SMOL, "--prediction", "-", "--drafter", "ngram"], "--drafter prediction"),
        (["generate", "hi", "--target", SMOL, "--exact-verify", "--backend", "hf"], "--exact-verify applies"),
        (["serve", "--target", SMOL, "--max-prediction-tokens", "0"], "max-prediction-tokens"),
        (["bench", "--stream", "edit+poetry"], "unknown stream"),
        (["generate", "hi", "--target", SMOL, "--backend", "llamacpp", "--dtype", "fp32"], "--dtype applies"),
        (["generate", "hi", "--target", SMOL, "--selector", "ucb-bd"], "--selector picks among several"),
        (["bench", "--stream", "poetry"], "unknown stream"),
        (["bench", "--stream", "category:poetry"], "unknown stream"),
        (["serve", "--target", SMOL, "--port", "70000"], "port must be"),
        (["serve", "--target", SMOL, "--max-new-tokens", "5000"], "exceeds max-tokens-limit"),
        (["serve", "--target", SMOL, "--save-every", "0"], "save-every"),
        (["serve", "--target", SMOL, "--selector", "ucb-bd"], "--selector picks among several"),
        (["generate", "hi", "--target", SMOL, "--drafter", "eagle", "--learner", "ogd", "--lr", "-1"], "learning rate"),
        (["generate", "hi", "--target", SMOL, "--learn-every", "0"], "learn-every"),
        (["generate", "hi", "--target", SMOL, "--train-depth", "0"], "train depth must be >= 1"),
        (["generate", "hi", "--target", SMOL, "--buffer-rows", "1"], "buffer rows"),
        (["generate", "hi", "--target", SMOL, "--learn-prompt-rows", "-1"], "prompt rows must be >= 0"),
        (["generate", "hi", "--target", SMOL, "--learn-epochs", "0"], "need epochs >= 1 and replay rows >= 0"),
        (["serve", "--target", SMOL, "--replay-rows", "-1"], "need epochs >= 1 and replay rows >= 0"),
        (["bench", "--learn-prompt-rows", "-1"], "prompt rows must be >= 0"),
        (["bench", "--suite", "learning"], "needs a white-box drafter checkpoint"),
        (["generate", "hi", "--target", SMOL, "--learner", "dpo"], "add --reasoning-speculation"),
        (["generate", "hi", "--target", SMOL, "--reasoning-speculation", "--max-step-tokens", "0"], "max-step-tokens"),
        (["generate", "hi", "--target", SMOL, "--follow-target"], "add --reasoning-speculation"),
        (["generate", "hi", "--target", SMOL, "--lookahead", "3"], "add --reasoning-speculation"),
        (["generate", "hi", "--target", SMOL, "--reasoning-speculation", "--lookahead", "0"], "lookahead is the steps"),
        (["generate", "hi", "--target", SMOL, "--reasoning-speculation", "--similarity", "2"], "cosine"),
        (["serve", "--target", SMOL, "--reasoning-speculation", "--replicas", "2"], "not run with --replicas"),
    ],
)
def test_bad_settings_fail_before_loading_anything(capsys, argv, message):
    status, out, err = run_cli(capsys, *argv)
    assert status == 2 and message in err and "Traceback" not in err


def test_an_unknown_ensemble_base_is_refused_while_parsing(capsys):
    with pytest.raises(SystemExit) as exited:  # argparse's own choices
        run_cli(capsys, "serve", "--target", SMOL, "--ensemble-base", "sgd")
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--ensemble-base: invalid choice: 'sgd'" in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "   ", "--target", SMOL], "prompt is empty"),
        (["generate", "word " * 9000, "--target", SMOL], "context holds"),
        (["generate", "hi", "--target", SMOL, "--drafter", "no-such-drafter"], "unknown drafter"),
        (["generate", "hi", "--target", SMOL, "--drafter", "ngram:3"], "takes no argument"),
        (["generate", "hi", "--target", ".", "--backend", "llamacpp"], "needs a .gguf file"),
        (["generate", "hi", "--target", SMOL, "--drafter", "suffix:3"], "takes no argument"),
        (
            ["generate", "hi", "--target", SMOL, "--drafter", "ngram", "--drafter", "suffix", "--selector", "nope"],
            "unknown selector",
        ),
        (["generate", "hi", "--target", SMOL, "--drafter", "ngram", "--drafter", "ngram"], "must differ"),
        (["generate", "hi", "--target", SMOL, "--drafter", "ngram", "--learner", "ogd"], "trains eagle, hydra or lora"),
        (["generate", "hi", "--target", SMOL, "--drafter", "eagle:/no/such/dir"], "not a drafter checkpoint"),
        (["generate", "hi", "--target", SMOL, "--drafter", "lora:"], "needs a model"),
        (["generate", "hi", "--target", SMOL, "--reasoning-speculation"], "needs one drafter that writes steps"),
        (
            ["generate", "hi", "--target", SMOL, "--reasoning-speculation", "--drafter", "ngram"],
            "needs one drafter that writes steps",
        ),
        (
            ["generate", "hi", "--target", SMOL, "--drafter", "eagle", "--learner", "dpo", "--reasoning-speculation"],
            "trains the small LM that writes reasoning steps",
        ),
    ],
)
def test_bad_input_with_a_real_model(capsys, argv, message):
    status, out, err = run_cli(capsys, *argv)
    assert status == 2 and message in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize("steps", [[], ["--reasoning-speculation"]])
def test_drafter_with_another_tokenizer_is_refused(capsys, foreign_tokenizer_model, steps):
    argv = ["generate", "hi", "--target", SMOL, "--drafter", f"lm:{foreign_tokenizer_model}", *steps]
    status, _, err = run_cli(capsys, *argv)
    assert status == 2 and "another tokenizer" in err


@pytest.mark.slow
@pytest.mark.parametrize("backend", [["--backend", "hf", "--dtype", "fp32"], ["--backend", "llamacpp"]])
def test_generate_json_plain_and_speculative_agree(capsys, backend):
    common = [
        "generate",
        "Count from 1 to 10.",
        "--target",
        SMOL,
        "--chat",
        *backend,
        "--max-new-tokens",
        "24",
        "--json",
    ]
    status, out, _ = run_cli(capsys, *common, "--drafter", "none")
    plain = json.loads(out)
    status_ngram, out, _ = run_cli(capsys, *common, "--drafter", "ngram", "--k", "3")
    ngram = json.loads(out)
    status_eagle, out, _ = run_cli(capsys, *common, "--drafter", "eagle", "--learner", "ensemble", "--learn-every", "2")
    eagle = json.loads(out)  # a white-box drafter on the target's hidden states, learning while it drafts
    status_lora, out, _ = run_cli(
        capsys, *common, "--drafter", f"lora:{SMOL}", "--learner", "ogd", "--learn-every", "2"
    )
    lora = json.loads(out)  # the small LM (itself here) learning through its adapters while it drafts
    assert status == status_ngram == status_eagle == status_lora == 0
    assert ngram["token_ids"] == plain["token_ids"] and ngram["text"] == plain["text"]
    assert eagle["token_ids"] == plain["token_ids"] and eagle["stats"]["learn_s"] > 0
    assert lora["token_ids"] == plain["token_ids"] and lora["stats"]["learn_s"] > 0
    assert plain["stats"]["tau"] == 1.0 and ngram["stats"]["num_drafts"] > 0


def test_a_real_process_prints_no_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "evospec.cli", "generate", "hi", "--target", "no/such-model-anywhere"],
        capture_output=True,
        text=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": ""},
    )
    assert result.returncode == 2
    assert result.stderr.startswith("evospec: error:") and "Traceback" not in result.stderr


def test_a_server_whose_model_fails_to_load_stops_with_the_error(capsys):
    status, _, err = run_cli(capsys, "serve", "--target", "no-such-model", "--port", "0")
    assert status == 2 and "not a zoo alias" in err and "Traceback" not in err


def test_models_lists_every_alias_whole(capsys, monkeypatch):
    from evospec.models.zoo import ZOO

    monkeypatch.setenv("COLUMNS", "100")
    status, out, _ = run_cli(capsys, "models")
    assert status == 0 and all(alias in out for alias in ZOO)
