"""The hf backend: its LanguageModel (a Hugging Face causal LM with a trimmable cache) and its loading."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from evospec.config import LoadConfig
from evospec.errors import EvospecError
from evospec.models import hf, loading
from evospec.models.hf import CachedLM
from evospec.target import top_next_tokens


def test_forward_then_trim_matches_a_fresh_forward(tiny_target):
    lm = CachedLM(tiny_target)
    lm.forward([1, 2, 3, 4, 5])
    lm.trim(3)  # forget 4, 5
    assert lm.length == 3
    continued = lm.forward([7, 8])
    fresh = CachedLM(tiny_target).forward([1, 2, 3, 7, 8])
    torch.testing.assert_close(continued, fresh[3:])


def test_hidden_states_are_the_features_under_the_head(tiny_target):
    lm = CachedLM(tiny_target)
    logits, hidden = lm.forward_with_hidden([3, 1, 4, 1, 5])
    assert hidden.shape == (5, tiny_target.config.hidden_size)
    torch.testing.assert_close(logits, tiny_target.lm_head(hidden))


def test_num_logits_keeps_the_last_rows(tiny_target):
    logits = CachedLM(tiny_target).forward([3, 1, 4, 1, 5], num_logits=1)
    assert logits.shape == (1, tiny_target.config.vocab_size)


def test_a_prompt_pass_scores_every_prompt_token_and_keeps_the_prefills_logits(tiny_target):
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    passed = CachedLM(tiny_target).forward_prompt(prompt, top_k=4, rows=100)
    logits, hidden = CachedLM(tiny_target).forward_with_hidden(prompt)
    assert torch.equal(passed.logits, CachedLM(tiny_target).forward(prompt, num_logits=1))
    torch.testing.assert_close(passed.hidden, hidden)
    top_ids, top_probs = top_next_tokens(logits, 4)
    assert torch.equal(passed.top_ids, top_ids)
    torch.testing.assert_close(passed.top_probs, top_probs)
    torch.testing.assert_close(top_probs, torch.softmax(logits, dim=-1).topk(4).values)
    last_three = CachedLM(tiny_target).forward_prompt(prompt, top_k=4, rows=3)  # only the rows learners take
    assert torch.equal(last_three.logits, passed.logits) and torch.equal(last_three.top_ids, top_ids[-3:])
    torch.testing.assert_close(last_three.hidden, hidden[-3:])


@pytest.mark.parametrize(("dtype", "expected"), [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_load_a_local_directory(saved_model: Path, dtype: str, expected: torch.dtype) -> None:
    loaded = loading.load_model(str(saved_model), "hf", LoadConfig(dtype=dtype))
    assert loaded.name == str(saved_model) and loaded.source == saved_model
    assert all(p.dtype == expected and not p.requires_grad for p in loaded.model.parameters())
    assert not loaded.model.training
    assert loaded.tokenizer.convert_tokens_to_ids("def") == 2


def test_an_invalid_dtype_is_a_user_error(saved_model: Path) -> None:
    with pytest.raises(EvospecError, match="bf16, fp32"):
        loading.load_model(str(saved_model), "hf", LoadConfig(dtype="fp16"))


def test_models_load_on_the_default_device_and_int8_is_refused_on_a_gpu(
    saved_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert loading.load_model(str(saved_model), "hf", LoadConfig(dtype="fp32")).model.device == hf.default_device()
    monkeypatch.setattr(hf, "default_device", lambda: torch.device("cuda"))
    with pytest.raises(EvospecError, match="int8 is for CPUs"):
        loading.load_model(str(saved_model), "hf", LoadConfig(dtype="int8"))


def test_a_file_that_is_not_a_model_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(EvospecError, match="not a model directory"):
        loading.load_model(str(tmp_path / "notes.txt"), "hf", LoadConfig(dtype="fp32"))
    with pytest.raises(EvospecError, match="could not load"):
        loading.load_model(str(tmp_path), "hf", LoadConfig(dtype="fp32"))


def test_a_gguf_file_is_converted_once(saved_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVOSPEC_HOME", str(tmp_path / "home"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    conversions: list[Path] = []

    def convert_gguf(gguf_file: Path, dest: Path) -> Path:
        conversions.append(gguf_file)
        shutil.copytree(saved_model, dest)
        return dest

    monkeypatch.setattr(hf, "convert_gguf", convert_gguf)
    first = loading.load_model(str(gguf), "hf", LoadConfig(dtype="fp32"))
    second = loading.load_model(str(gguf), "hf", LoadConfig(dtype="fp32"))
    assert conversions == [gguf]
    assert first.source == second.source and first.source.parent.parent == tmp_path / "home" / "converted"


def test_a_hub_id_tries_the_cache_then_the_hub_then_names_the_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[dict] = []

    class Unreachable:
        @staticmethod
        def from_pretrained(name: str, **kwargs) -> None:
            attempts.append(kwargs)
            raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(hf, "AutoModelForCausalLM", Unreachable)
    with pytest.raises(EvospecError, match="could not find 'org/model' locally, as a zoo alias .*gemma-3-270m"):
        loading.load_model("org/model", "hf", LoadConfig(dtype="fp32"))
    assert [a.get("local_files_only", False) for a in attempts] == [True, False]
