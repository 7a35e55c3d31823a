"""The Backend protocol: what differs between the runtimes that run a model (PyTorch, llama.cpp, ...).

Everything evospec asks of a model beyond the LanguageModel it runs on goes through its backend: how
it loads (and so what a LoadedModel says of its sizes and end-of-generation tokens), its token
matrices (white-box drafters read them), the key that its measured forward cost is cached under, the
benchmark baselines of its own generation loop and which models it can run. A new backend is one
module with one such object, registered in `models/loading.py`; a recorded target
(`models/replay.py`) is one too, whose passes cost what a profile says on a clock of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import PreTrainedTokenizerBase

from evospec.config import LoadConfig
from evospec.cost import ForwardCost, cached_forward_cost
from evospec.target import LanguageModel


class TokenMatrices(Protocol):
    """The target's token embedding and output matrix, read-only (what white-box drafters start from)."""

    vocab_size: int

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings of ids [n] -> [n, H] float32."""

    def output_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the output layer for ids [n] -> [n, H] float32, copies (never views of the target's)."""


class Backend(Protocol):
    """One runtime for models. Its methods take the backend's own weights object (LoadedModel.model)."""

    name: str  # as --backend names it (config.BACKENDS)
    dtypes: tuple[str, ...]  # the --dtype values it runs (none: it runs the file's own format)
    baselines: tuple[str, ...]  # bench methods that run this backend's own generation loop (bench.methods)

    def default_for(self, spec: str) -> bool:
        """Whether spec runs on this backend unless the user says otherwise."""

    def can_run(self, spec: str) -> bool:
        """Whether this backend can load spec at all."""

    def load(self, spec: str, config: LoadConfig) -> LoadedModel:
        """The model spec names, ready for inference; anything wrong is an EvospecError."""

    def new_lm(self, model: Any, hidden_states: bool, branches: int) -> LanguageModel:
        """A fresh KV cache over the weights; hidden_states: forward_with_hidden will be called;
        branches > 0: a BranchingLM whose forks, that many at once, decode side by side."""

    def token_matrices(self, model: Any) -> TokenMatrices:
        """Its token embedding and output matrix."""

    def weights_format(self, model: Any) -> str:
        """How its weights run, as results record it (a dtype, or the file's own format)."""

    def cost_key(self, loaded: LoadedModel) -> str:
        """What its forward cost depends on besides the machine: the weights and how they run."""

    def threads(self, model: Any) -> int:
        """The CPU threads its forwards use."""

    def forward_cost(self, loaded: LoadedModel, max_tokens: int) -> ForwardCost:
        """T(n) of the model up to max_tokens, as the draft-length policy and the rewards weigh it."""

    def clock(self, model: Any) -> Callable[[], float]:
        """The seconds the engine times its work with."""


class MeasuredBackend:
    """What a backend that really runs models shares: its forwards cost what they are measured to
    cost on this machine, and time is the wall clock."""

    def forward_cost(self, loaded: LoadedModel, max_tokens: int) -> ForwardCost:
        """Measured once on this machine and cached (cost.py)."""
        return cached_forward_cost(loaded.new_lm(), self.cost_key(loaded), max_tokens, loaded.vocab_size)

    def clock(self, model: Any) -> Callable[[], float]:
        return time.perf_counter


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for inference (eval mode, no gradients), its tokenizer and the backend that runs it."""

    name: str  # the spec it was loaded from, as the user wrote it
    model: Any  # the backend's weights: a transformers model, a LlamaCppModel, ...
    tokenizer: PreTrainedTokenizerBase
    source: Path | str  # the directory or GGUF file the weights came from, or the hub id
    backend: Backend
    vocab_size: int  # the width of its logits
    hidden_size: int  # the width of its final hidden states (what white-box drafters read)
    context_length: int  # the longest sequence it takes
    eos_token_ids: frozenset[int]  # every id that ends generation

    def new_lm(self, hidden_states: bool = False, branches: int = 0) -> LanguageModel:
        """A fresh KV cache over these weights, for a target or a small-LM drafter.

        hidden_states: the user will call forward_with_hidden (llama.cpp must know in advance);
        branches > 0: it is a BranchingLM, whose forks, that many at once, decode side by side.
        """
        return self.backend.new_lm(self.model, hidden_states, branches)

    @property
    def weights_format(self) -> str:
        return self.backend.weights_format(self.model)

    def token_matrices(self) -> TokenMatrices:
        return self.backend.token_matrices(self.model)

    def forward_cost(self, max_tokens: int) -> ForwardCost:
        """T(n) of this model up to max_tokens: measured on this machine (cached), or a replay's profile."""
        return self.backend.forward_cost(self, max_tokens)

    @property
    def clock(self) -> Callable[[], float]:
        return self.backend.clock(self.model)
