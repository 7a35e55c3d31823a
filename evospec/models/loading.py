"""Load a causal LM and its tokenizer from a zoo alias, a local directory, a GGUF file or a hub id.

Two backends run a model: `hf` (PyTorch, any Hugging Face causal LM, dense weights) and `llamacpp`
(llama.cpp, a GGUF file as it is). Both give `new_lm()` objects with the same forward/trim interface.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from evospec.config import BACKENDS, DEFAULT_DTYPE, DTYPES
from evospec.errors import EvospecError
from evospec.models.llamacpp import LlamaCppConfig, LlamaCppLM, LlamaCppModel
from evospec.models.quantize import quantize_int8_weights
from evospec.models.zoo import ZOO, convert_gguf, convert_tokenizer, converted, evospec_home, pull, tokenizer_dir
from evospec.target import CachedLM

# The dtype the weights load in; int8 then quantizes the linear layers' weights.
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "int8": torch.bfloat16}
assert set(TORCH_DTYPES) == set(DTYPES)


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for inference (eval mode, no gradients) with its tokenizer."""

    name: str  # the spec it was loaded from, as the user wrote it
    model: PreTrainedModel | LlamaCppModel
    tokenizer: PreTrainedTokenizerBase
    source: Path | str  # the directory or GGUF file the weights came from, or the hub id
    backend: str = "hf"  # one of BACKENDS

    def new_lm(self, hidden_states: bool = False) -> CachedLM | LlamaCppLM:
        """A fresh KV cache over these weights, for a target or a small-LM drafter.

        hidden_states: the drafter will call forward_with_hidden (llama.cpp must know in advance).
        """
        if isinstance(self.model, LlamaCppModel):
            return self.model.new_lm(hidden_states)
        return CachedLM(self.model)


def load_model(spec: str, dtype: str | None = None, backend: str | None = None,
               llamacpp: LlamaCppConfig = LlamaCppConfig()) -> LoadedModel:
    """Load `spec`: a zoo alias, a local Hugging Face directory, a .gguf file or a hub id "org/name".

    backend: one of BACKENDS; None picks `default_backend(spec)`. dtype (one of DTYPES, None for
    DEFAULT_DTYPE) applies to the hf backend, whose models run on `default_device()`; llama.cpp runs
    the GGUF file's own quantization on the CPU, with the llamacpp settings (e.g. exact_verify).
    A zoo alias is pulled on first use and, for hf, a GGUF file converted once (all cached under
    `evospec_home()`). Anything that cannot be found is an EvospecError.
    """
    backend = backend or default_backend(spec)
    if backend not in BACKENDS:
        raise EvospecError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "llamacpp":
        if dtype is not None:
            raise EvospecError("--dtype applies to the hf backend; llama.cpp runs the GGUF file's own quantization")
        return _load_llamacpp(spec, llamacpp)
    if llamacpp != LlamaCppConfig():
        raise EvospecError("--exact-verify applies to the llama.cpp backend; hf in fp32 verifies bit-exactly already")
    dtype = dtype or DEFAULT_DTYPE
    if dtype not in TORCH_DTYPES:
        raise EvospecError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    device = default_device()
    if dtype == "int8" and device.type != "cpu":
        raise EvospecError("--dtype int8 is for CPUs without AVX512-BF16; on a GPU use bf16")
    source = resolve(spec)
    model = _from_pretrained(AutoModelForCausalLM, spec, source, dtype=TORCH_DTYPES[dtype])
    if dtype == "int8":
        quantize_int8_weights(model)
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    tokenizer = _from_pretrained(AutoTokenizer, spec, source)
    return LoadedModel(spec, model, tokenizer, source)


def default_device() -> torch.device:
    """Where hf models run: the GPU when there is one, as in vLLM, else the CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def default_backend(spec: str) -> str:
    """llamacpp for a GGUF file or zoo alias on a machine without CUDA, hf for everything else."""
    is_gguf = spec in ZOO or (spec.endswith(".gguf") and Path(spec).expanduser().is_file())
    return "llamacpp" if is_gguf and default_device().type == "cpu" else "hf"


def _load_llamacpp(spec: str, config: LlamaCppConfig) -> LoadedModel:
    """A GGUF file (a zoo alias pulled first) run by llama.cpp, with its extracted tokenizer."""
    if spec in ZOO:
        gguf_file, tokenizer_source = pull(spec), tokenizer_dir(spec)
    else:
        gguf_file = Path(spec).expanduser()
        if not (gguf_file.is_file() and gguf_file.suffix == ".gguf"):
            raise EvospecError(f"{spec!r}: the llama.cpp backend needs a .gguf file or a zoo alias ({', '.join(ZOO)})")
        tokenizer_source = _cache_dir(gguf_file) / "tokenizer"
        if not tokenizer_source.is_dir():
            convert_tokenizer(gguf_file, tokenizer_source)
    tokenizer = _from_pretrained(AutoTokenizer, spec, tokenizer_source)
    return LoadedModel(spec, LlamaCppModel(gguf_file, config), tokenizer, gguf_file, backend="llamacpp")


def resolve(spec: str) -> Path | str:
    """The Hugging Face directory (or hub id) that `spec` loads from, pulling or converting first if needed."""
    if spec in ZOO:
        return converted(spec)
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


def names_a_model(spec: str) -> bool:
    """Whether spec could be loaded (a zoo alias, an existing directory or .gguf file, a hub id), without loading it."""
    path = Path(spec).expanduser()
    return spec in ZOO or path.is_dir() or (path.is_file() and path.suffix == ".gguf") or (
        not path.exists() and _looks_like_hub_id(spec)
    )


def _looks_like_hub_id(spec: str) -> bool:
    """Hub ids are "org/name"; anything else that does not exist is a mistyped path or alias."""
    org, _, name = spec.partition("/")
    return bool(org and name) and "/" not in name and not spec.startswith((".", "~")) and not spec.endswith(".gguf")


def _cache_dir(gguf_file: Path) -> Path:
    """Where what is derived from a GGUF file outside the zoo is cached."""
    # Keyed by path, size and mtime: hashing gigabytes on every load would cost more than it guards.
    stat = gguf_file.stat()
    key = hashlib.sha256(f"{gguf_file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return evospec_home() / "converted" / key


def _converted(gguf_file: Path) -> Path:
    """The Hugging Face directory converted from `gguf_file`, converting on first use."""
    dest = _cache_dir(gguf_file) / "hf"
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
    """Every id that ends generation: llama.cpp's end-of-generation tokens; for hf, the tokenizer's
    eos plus the generation config's (int or list)."""
    if isinstance(loaded.model, LlamaCppModel):
        return loaded.model.eog_token_ids
    configured = loaded.model.generation_config.eos_token_id
    configured = [] if configured is None else [configured] if isinstance(configured, int) else configured
    return frozenset({loaded.tokenizer.eos_token_id, *configured} - {None})


def vocab_size(loaded: LoadedModel) -> int:
    """The width of the model's logits (config.vocab_size)."""
    if isinstance(loaded.model, LlamaCppModel):
        return loaded.model.vocab_size
    return loaded.model.config.get_text_config().vocab_size


def hidden_size(loaded: LoadedModel) -> int:
    """The width of the model's final hidden states (what white-box drafters read)."""
    if isinstance(loaded.model, LlamaCppModel):
        return loaded.model.hidden_size
    return loaded.model.config.get_text_config().hidden_size


def context_length(loaded: LoadedModel) -> int:
    """The longest sequence the model takes (config.max_position_embeddings; llama.cpp's context size)."""
    if isinstance(loaded.model, LlamaCppModel):
        return loaded.model.context_length
    return loaded.model.config.get_text_config().max_position_embeddings
