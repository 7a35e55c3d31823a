"""The benchmark scripts' own logic, without models: settings are read right or refused in one line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from evospec.learning import LearnerConfig

SCRIPTS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_replay_setting_names_a_learner_and_its_config():
    replay = load_script("learning_replay")
    assert replay.parse_setting("none") == ("none", LearnerConfig())
    assert replay.parse_setting("ogd:schedule=request,batch_rows=128,lr=0.01") == (
        "ogd", LearnerConfig(schedule="request", batch_rows=128, lr=0.01)
    )


@pytest.mark.parametrize(("setting", "message"), [
    ("adam", "unknown learner"),
    ("ogd:speed=2", "no field 'speed'"),
    ("ogd:lr=fast", "could not convert"),
    ("ogd:lr=-1", "learning rate must be > 0"),
    ("ogd:schedule=hourly", "unknown learning schedule"),
])
def test_a_bad_replay_setting_exits_with_one_line(setting, message):
    replay = load_script("learning_replay")
    with pytest.raises(SystemExit, match=message):
        replay.parse_setting(setting)


def test_a_negative_context_window_exits_before_loading_anything(monkeypatch, tmp_path):
    replay = load_script("learning_replay")
    argv = ["learning_replay.py", "--small-lm", "no-such-model", "--traces", str(tmp_path), "--setting", "none",
            "--context-tokens", "-1", "--out", str(tmp_path)]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(SystemExit, match="invalid adapter settings"):
        replay.main()
