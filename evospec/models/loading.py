"""Load a causal LM and its tokenizer from a zoo alias, a local directory, a GGUF file or a hub id."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from evospec.config import DEFAULT_DTYPE, DTYPES
from evospec.errors import EvospecError
from evospec.models.quantize import quantize_int8_weights
from evospec.models.zoo import ZOO, convert_gguf, evospec_home, pull

# The dtype the weights load in; int8 then quantizes the linear layers' weights.
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "int8": torch.bfloat16}
assert set(TORCH_DTYPES) == set(DTYPES)


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for inference (eval mode, no gradients) with its tokenizer."""

    name: str  # the spec it was loaded from, as the user wrote it
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: Path | str  # the directory the weights came from, or the hub id


def load_model(spec: str, dtype: str = DEFAULT_DTYPE) -> LoadedModel:
    """Load `spec`: a zoo alias, a local Hugging Face directory, a .gguf file or a hub id "org/name".

    A zoo alias is pulled on first use and a .gguf file converted once (both cached under
    `evospec_home()`). `dtype` is one of DTYPES. Anything that cannot be found is an EvospecError.
    """
    if dtype not in TORCH_DTYPES:
        raise EvospecError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    source = resolve(spec)
    model = _from_pretrained(AutoModelForCausalLM, spec, source, dtype=TORCH_DTYPES[dtype])
    if dtype == "int8":
        quantize_int8_weights(model)
    model.eval()
    model.requires_grad_(False)
    tokenizer = _from_pretrained(AutoTokenizer, spec, source)
    return LoadedModel(spec, model, tokenizer, source)


def resolve(spec: str) -> Path | str:
    """The directory (or hub id) that `spec` loads from, pulling or converting first if needed."""
    if spec in ZOO:
        return pull(spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.is_file() and path.suffix == ".gguf":
        return _converted(path)
    if path.exists():
        raise EvospecError(f"{spec}: not a model directory or a .gguf file")
    if _looks_like_hub_id(spec):
        return spec
    raise EvospecError(f"{spec!r}: no such file or directory, and not a zoo alias ({', '.join(ZOO)})")


def _looks_like_hub_id(spec: str) -> bool:
    """Hub ids are "org/name"; anything else that does not exist is a mistyped path or alias."""
    org, _, name = spec.partition("/")
    return bool(org and name) and "/" not in name and not spec.startswith((".", "~")) and not spec.endswith(".gguf")


def _converted(gguf_file: Path) -> Path:
    """The Hugging Face directory converted from `gguf_file`, converting on first use."""
    # Keyed by path, size and mtime: hashing gigabytes on every load would cost more than it guards.
    stat = gguf_file.stat()
    key = hashlib.sha256(f"{gguf_file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    dest = evospec_home() / "converted" / key
    return dest if dest.is_dir() else convert_gguf(gguf_file, dest)


def _from_pretrained(auto_class, spec: str, source: Path | str, **kwargs):
    """`auto_class.from_pretrained(source)`, with the cache tried before the network for hub ids."""
    if isinstance(source, Path):
        try:
            return auto_class.from_pretrained(source, **kwargs)
        except (OSError, ValueError) as error:
            raise EvospecError(f"{spec}: could not load from {source} ({error})") from error
    try:
        return auto_class.from_pretrained(source, local_files_only=True, **kwargs)
    except OSError:
        pass
    try:
        return auto_class.from_pretrained(source, **kwargs)
    except OSError as error:
        raise EvospecError(
            f"could not find {spec!r} locally, as a zoo alias ({', '.join(ZOO)}) or on the Hugging Face hub"
        ) from error


def same_tokenizer(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> bool:
    """Whether two tokenizers map the same strings to the same ids (a drafter must share the target's)."""
    return a.get_vocab() == b.get_vocab()


def eos_token_ids(loaded: LoadedModel) -> frozenset[int]:
    """Every id that ends generation: the tokenizer's eos plus the generation config's (int or list)."""
    configured = loaded.model.generation_config.eos_token_id
    configured = [] if configured is None else [configured] if isinstance(configured, int) else configured
    return frozenset({loaded.tokenizer.eos_token_id, *configured} - {None})


def vocab_size(loaded: LoadedModel) -> int:
    """The width of the model's logits (config.vocab_size)."""
    return loaded.model.config.get_text_config().vocab_size


def context_length(loaded: LoadedModel) -> int:
    """The longest sequence the model was built for (config.max_position_embeddings)."""
    return loaded.model.config.get_text_config().max_position_embeddings
