"""Loading on a backend: the registry, the default backend of a spec, clear errors, tokenizer identity."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from evospec.config import BACKENDS, LoadConfig
from evospec.errors import EvospecError
from evospec.models import loading

from conftest import SAVED_WORDS, word_tokenizer


def test_eos_ids_context_length_and_tokenizer_identity(saved_model: Path) -> None:
    loaded = loading.load_model(str(saved_model), "hf", LoadConfig(dtype="fp32"))
    assert loaded.eos_token_ids == {0, 7}
    assert loaded.context_length == 64
    assert loading.same_tokenizer(loaded.tokenizer, word_tokenizer(SAVED_WORDS))
    assert not loading.same_tokenizer(loaded.tokenizer, word_tokenizer(SAVED_WORDS[:-1]))
    assert not loading.same_tokenizer(loaded.tokenizer, word_tokenizer([*SAVED_WORDS[:-2], ":", ")"]))


@pytest.mark.parametrize("spec", ["./missing", "/no/such/model", "missing.gguf", "qwen-typo", "a/b/c"])
def test_a_missing_model_is_a_user_error_naming_the_aliases(spec: str) -> None:
    with pytest.raises(EvospecError, match="smollm2-135m-instruct"):
        loading.load_model(spec)


def test_every_backend_the_cli_names_is_registered_and_an_unknown_one_is_a_clear_error(saved_model: Path) -> None:
    assert set(loading.BACKENDS) == set(BACKENDS) and all(
        name == backend.name for name, backend in loading.BACKENDS.items()
    )
    with pytest.raises(EvospecError, match="unknown backend 'vllm'"):
        loading.load_model(str(saved_model), "vllm")


def test_a_directory_runs_on_hf_and_a_gguf_file_on_llamacpp_on_a_cpu(saved_model: Path, tmp_path: Path) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert loading.default_backend(str(saved_model)) == "hf" and loading.default_backend("org/model") == "hf"
    assert loading.default_backend(str(gguf)) == ("llamacpp" if not torch.cuda.is_available() else "hf")
    assert loading.load_model(str(saved_model), config=LoadConfig(dtype="fp32")).backend.name == "hf"
