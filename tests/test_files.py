"""Atomic writes: a reader sees the old file or the new one, never half of one, and no temporary is left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from evospec.files import evospec_home, save_tensors_atomically, write_atomically


@pytest.mark.parametrize("durable", [False, True])
def test_write_atomically_replaces_the_file_and_leaves_nothing_else(tmp_path, durable):
    path = tmp_path / "state.json"
    path.write_text("old")
    write_atomically(path, "new", durable=durable)
    assert path.read_text() == "new"
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_failed_write_keeps_the_old_file_and_drops_the_temporary(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    path.write_text("old")

    def no_rename(*_):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, b"new")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["state.json"]


def test_save_tensors_atomically_round_trips_with_metadata(tmp_path):
    tensors = {"weight": torch.arange(6.0).reshape(2, 3).t(), "ids": torch.tensor([3, 1])}  # a non-contiguous view too
    save_tensors_atomically(tensors, tmp_path / "model.safetensors", {"key": "value"})
    loaded = load_file(tmp_path / "model.safetensors")
    assert all(torch.equal(loaded[name], tensor) for name, tensor in tensors.items())
    with safe_open(tmp_path / "model.safetensors", "pt") as file:
        assert file.metadata() == {"key": "value"}


def test_evospec_home_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVOSPEC_HOME", str(tmp_path))
    assert evospec_home() == tmp_path
    monkeypatch.delenv("EVOSPEC_HOME")
    assert evospec_home() == Path.home() / ".cache" / "evospec"
