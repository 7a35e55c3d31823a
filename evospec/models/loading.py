"""Load a causal LM and its tokenizer on a backend: from a zoo alias, a local directory, a GGUF file or a hub id.

The backends are registered here, by the names --backend takes; each is one object with everything
that differs between them (models/backend.py).
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerBase

from evospec.config import BACKENDS as BACKEND_NAMES
from evospec.config import LoadConfig
from evospec.errors import EvospecError
from evospec.models.backend import Backend, LoadedModel
from evospec.models.hf import HFBackend, looks_like_hub_id
from evospec.models.llamacpp import LlamaCppBackend
from evospec.models.zoo import ZOO

# In the order default_backend asks them; hf, last, runs whatever the others do not claim.
BACKENDS: dict[str, Backend] = {backend.name: backend for backend in (LlamaCppBackend(), HFBackend())}
assert set(BACKENDS) == set(BACKEND_NAMES)


def load_model(spec: str, backend: str | None = None, config: LoadConfig = LoadConfig()) -> LoadedModel:
    """Load `spec`: a zoo alias, a local Hugging Face directory, a .gguf file or a hub id "org/name".

    backend: a name of BACKENDS; None picks `default_backend(spec)`. A zoo alias is pulled on first
    use and, for hf, a GGUF file converted once (all cached under `evospec_home()`). Anything that
    cannot be found or run is an EvospecError.
    """
    return backend_named(backend or default_backend(spec)).load(spec, config)


def backend_named(name: str) -> Backend:
    """The backend --backend names; an unknown name is a clear error."""
    if name not in BACKENDS:
        raise EvospecError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return BACKENDS[name]


def default_backend(spec: str) -> str:
    """The first backend that claims spec: llamacpp for a GGUF file or zoo alias on a machine without
    CUDA, hf otherwise."""
    return next(name for name, backend in BACKENDS.items() if backend.default_for(spec))


def names_a_model(spec: str) -> bool:
    """Whether spec could be loaded (a zoo alias, an existing directory or .gguf file, a hub id), without loading it."""
    path = Path(spec).expanduser()
    return (
        spec in ZOO
        or path.is_dir()
        or (path.is_file() and path.suffix == ".gguf")
        or (not path.exists() and looks_like_hub_id(spec))
    )


def same_tokenizer(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase) -> bool:
    """Whether two tokenizers map the same strings to the same ids (a drafter must share the target's)."""
    return a.get_vocab() == b.get_vocab()
