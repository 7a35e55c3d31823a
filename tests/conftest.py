"""Shared fixtures: tiny random models (seconds on a CPU) and the smallest real zoo model."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

TINY_VOCAB = 96
BENCHMARK_SCRIPTS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_script(name: str) -> ModuleType:
    """A script of benchmarks/ as a module (they are not part of the package)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARK_SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def tiny_model(seed: int, noise: float = 0.0, base: LlamaForCausalLM | None = None) -> LlamaForCausalLM:
    """A random 2-layer Llama in fp32; with base, a copy of it whose weights are jittered by noise."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    if base is not None:
        model.load_state_dict(base.state_dict())
        with torch.no_grad():
            for weight in model.parameters():
                weight.add_(noise * torch.randn_like(weight) * weight.std())
    return model.eval().requires_grad_(False)


HIDDEN = 64  # tiny_model's


def white_box(kind: str, target, seed: int = 0):
    """A new (random) eagle or hydra drafter of a tiny shape for target, seeded."""
    from evospec.drafters.registry import new_white_box_drafter
    from evospec.drafters.whitebox import WhiteBoxConfig

    torch.manual_seed(seed)
    return new_white_box_drafter(kind, target, config=WhiteBoxConfig(kind, HIDDEN, head_vocab=80, intermediate_size=96))


def adapted_lm(target, noise: float = 0.6, seed: int = 1):
    """A small LM with adapters: the tiny target's weights jittered (a fresh model: adapters go into it)."""
    from evospec.drafters.adapted_lm import AdaptedLMDrafter

    return AdaptedLMDrafter(tiny_model(seed=seed, noise=noise, base=target.model), "lora:tiny")


@pytest.fixture(scope="session")
def tiny_target() -> LlamaForCausalLM:
    return tiny_model(seed=0)


@pytest.fixture(scope="session")
def sharp_target():
    """The tiny random target with a sharpened output layer, behind a word tokenizer: its next-token
    distributions are peaked, as a trained model's are, so there is something for a drafter to learn."""
    from evospec.models.loading import BACKENDS

    model = tiny_model(seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    tokenizer = tiny_word_tokenizer()
    return BACKENDS["hf"].wrap("tiny-sharp", model, tokenizer, "tiny-sharp")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """evospec's main() on argv -> (exit status, stdout, stderr)."""
    from evospec.cli import main

    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture(scope="session")
def tiny_drafter(tiny_target) -> LlamaForCausalLM:
    """Close to the target, so it is right often but not always."""
    return tiny_model(seed=1, noise=0.3, base=tiny_target)


class Never:
    """A step judge that keeps no drafted step (only identical ones stand)."""

    name = "never"

    def aligned(self, drafted: str, target: str) -> bool:
        return False


def random_prompts(count: int, seed: int = 0) -> list[list[int]]:
    """Prompts of random ids, some with repeats so that prompt lookup finds something."""
    generator = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(count):
        length = int(torch.randint(2, 24, (1,), generator=generator))
        ids = torch.randint(0, TINY_VOCAB, (length,), generator=generator).tolist()
        prompts.append(ids + ids[: length // 2])
    return prompts


def reference_greedy(
    model, prompt_ids: list[int], max_new_tokens: int, eos_token_id: int | list[int] | None = None
) -> list[int]:
    """The target's own greedy decoding, by Hugging Face generate (on the model's device)."""
    output = model.generate(
        torch.tensor([prompt_ids], device=model.device),
        attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long, device=model.device),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos_token_id,
        pad_token_id=0,
    )
    return output[0, len(prompt_ids) :].tolist()


def tiny_word_tokenizer():
    """The word tokenizer over TINY_VOCAB words that the tiny models' text fixtures use."""
    return word_tokenizer(["<unk>", "<eos>", *(f"w{i}" for i in range(TINY_VOCAB - 2))])


def every_drafter_kind(small_lm_directory: Path) -> dict[str, str]:
    """A drafter spec of every kind by name; the small LMs load the model saved in small_lm_directory."""
    return {
        "ngram": "ngram",
        "suffix": "suffix",
        "prediction": "prediction",
        "lm": f"lm:{small_lm_directory}",
        "lora": f"lora:{small_lm_directory}",
        "eagle": "eagle",
        "hydra": "hydra",
    }


def word_tokenizer(words: list[str]):
    """A word-level tokenizer over words (ids in order); "<eos>" and "<unk>" must be among them."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", unk_token="<unk>")


@pytest.fixture(scope="session")
def foreign_tokenizer_model(tmp_path_factory) -> str:
    """A local model directory whose tokenizer is not any zoo model's (a tiny word-level one)."""
    directory = tmp_path_factory.mktemp("foreign")
    tiny_model(seed=5).save_pretrained(directory)
    tiny_word_tokenizer().save_pretrained(directory)
    return str(directory)


SAVED_WORDS = ["<eos>", "<unk>", "def", "return", "x", "(", ")", ":"]


@pytest.fixture
def saved_model(tmp_path: Path) -> Path:
    """A saved 2-layer random Llama with a word-level tokenizer; generation config eos = [0, 7]."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(SAVED_WORDS),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        eos_token_id=0,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = [0, 7]
    directory = tmp_path / "tiny"
    model.save_pretrained(directory)
    word_tokenizer(SAVED_WORDS).save_pretrained(directory)
    return directory
