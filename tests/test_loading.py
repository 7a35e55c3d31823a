"""Loading models by directory and GGUF file, dtypes, eos ids and tokenizer comparison (tiny random model)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from evospec.errors import EvospecError
from evospec.models import loading

from conftest import word_tokenizer

WORDS = ["<eos>", "<unk>", "def", "return", "x", "(", ")", ":"]


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A saved 2-layer random Llama with a word-level tokenizer; generation config eos = [0, 7]."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, eos_token_id=0,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = [0, 7]
    directory = tmp_path / "tiny"
    model.save_pretrained(directory)
    word_tokenizer(WORDS).save_pretrained(directory)
    return directory


@pytest.mark.parametrize(("dtype", "expected"), [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_load_a_local_directory(model_dir: Path, dtype: str, expected: torch.dtype) -> None:
    loaded = loading.load_model(str(model_dir), dtype)
    assert loaded.name == str(model_dir) and loaded.source == model_dir
    assert all(p.dtype == expected and not p.requires_grad for p in loaded.model.parameters())
    assert not loaded.model.training
    assert loaded.tokenizer.convert_tokens_to_ids("def") == 2


def test_eos_ids_context_length_and_tokenizer_identity(model_dir: Path) -> None:
    loaded = loading.load_model(str(model_dir), "fp32")
    assert loading.eos_token_ids(loaded) == {0, 7}
    assert loading.context_length(loaded) == 64
    assert loading.same_tokenizer(loaded.tokenizer, word_tokenizer(WORDS))
    assert not loading.same_tokenizer(loaded.tokenizer, word_tokenizer(WORDS[:-1]))
    assert not loading.same_tokenizer(loaded.tokenizer, word_tokenizer([*WORDS[:-2], ":", ")"]))


def test_an_invalid_dtype_is_a_user_error(model_dir: Path) -> None:
    with pytest.raises(EvospecError, match="bf16, fp32"):
        loading.load_model(str(model_dir), "fp16")


def test_models_load_on_the_default_device_and_int8_is_refused_on_a_gpu(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert loading.load_model(str(model_dir), "fp32").model.device == loading.default_device()
    monkeypatch.setattr(loading, "default_device", lambda: torch.device("cuda"))
    with pytest.raises(EvospecError, match="int8 is for CPUs"):
        loading.load_model(str(model_dir), "int8")


@pytest.mark.parametrize("spec", ["./missing", "/no/such/model", "missing.gguf", "qwen-typo", "a/b/c"])
def test_a_missing_model_is_a_user_error_naming_the_aliases(spec: str) -> None:
    with pytest.raises(EvospecError, match="smollm2-135m-instruct"):
        loading.load_model(spec, "fp32")


def test_a_file_that_is_not_a_model_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(EvospecError, match="not a model directory"):
        loading.load_model(str(tmp_path / "notes.txt"), "fp32")
    with pytest.raises(EvospecError, match="could not load"):
        loading.load_model(str(tmp_path), "fp32")


def test_a_gguf_file_is_converted_once(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVOSPEC_HOME", str(tmp_path / "home"))
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    conversions: list[Path] = []

    def convert_gguf(gguf_file: Path, dest: Path) -> Path:
        conversions.append(gguf_file)
        shutil.copytree(model_dir, dest)
        return dest

    monkeypatch.setattr(loading, "convert_gguf", convert_gguf)
    first = loading.load_model(str(gguf), "fp32", backend="hf")
    second = loading.load_model(str(gguf), "fp32", backend="hf")
    assert conversions == [gguf]
    assert first.source == second.source and first.source.parent.parent == tmp_path / "home" / "converted"


def test_a_hub_id_tries_the_cache_then_the_hub_then_names_the_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts: list[dict] = []

    class Unreachable:
        @staticmethod
        def from_pretrained(name: str, **kwargs) -> None:
            attempts.append(kwargs)
            raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(loading, "AutoModelForCausalLM", Unreachable)
    with pytest.raises(EvospecError, match="could not find 'org/model' locally, as a zoo alias .*gemma-3-270m"):
        loading.load_model("org/model", "fp32")
    assert [a.get("local_files_only", False) for a in attempts] == [True, False]
