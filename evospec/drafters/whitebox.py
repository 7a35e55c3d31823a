"""What the white-box drafters (EAGLE-style and Hydra-style) share: a reduced vocabulary, the target's
frozen token matrices, the target's hidden states per position, and safetensors checkpoints.

A white-box drafter reads the target's final hidden state (the features its output layer reads).
After the target verified position t, the drafter knows the feature f_t; to draft after the pending
token x at position L-1 it starts from f_{L-2} and x. Its output layer is the target's own (frozen),
cut to the N most frequent target tokens: the full 151,936-row head would cost a target step's worth.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from evospec.errors import EvospecError
from evospec.files import save_tensors_atomically, write_atomically
from evospec.models.backend import LoadedModel, TokenMatrices
from evospec.sampling import Sampler
from evospec.types import Draft, RoundFeedback

CHECKPOINT_FORMAT = "evospec-drafter"
CHECKPOINT_VERSION = 1


@dataclass(frozen=True)
class WhiteBoxConfig:
    """The shape of a white-box drafter; saved with its checkpoint. Each default is defined here, once."""

    kind: str  # "eagle" or "hydra"
    hidden_size: int  # the target's
    head_vocab: int = (
        6144  # N: target tokens the drafter can propose (its output layer's rows; each costs a draft step)
    )
    # eagle: width of its decoder layer (at most the target's; a draft step must stay a small share of a target step)
    width: int = 512
    intermediate_size: int = 1024  # eagle: MLP width of its decoder layer
    num_heads: int = 4  # hydra: heads, so at most this many drafted tokens per round


class ReducedVocab:
    """The target tokens a white-box head drafts (`ids`, its rows in order) and the map back."""

    def __init__(self, ids: torch.Tensor, vocab_size: int) -> None:
        self.ids = ids.long()  # [N] target ids
        self.row_of = torch.full((vocab_size,), -1, dtype=torch.long)  # [V] head row of each target id, -1 if none
        self.row_of[self.ids] = torch.arange(self.ids.numel())

    @classmethod
    def most_frequent(
        cls, token_lists: Iterable[list[int]], vocab_size: int, size: int, always: Iterable[int] = ()
    ) -> ReducedVocab:
        """The `size` most frequent ids of token_lists, `always` first; lower ids fill any rest (BPE ids
        are roughly in merge order, so a low id is a frequent one)."""
        if not 0 < size <= vocab_size:
            raise EvospecError(f"a reduced vocabulary needs 1..{vocab_size} tokens, got {size}")
        counts = Counter(token for tokens in token_lists for token in tokens)
        chosen = list(dict.fromkeys([*always, *(token for token, _ in counts.most_common())]))[:size]
        taken = set(chosen)
        chosen += [token for token in range(vocab_size) if token not in taken][: size - len(chosen)]
        return cls(torch.tensor(chosen), vocab_size)


class WhiteBoxDrafter:
    """The part of an EAGLE- or Hydra-style drafter that is not its network: features per position,
    the reduced output layer, drafting from head logits, checkpoints. Subclasses draft and train."""

    needs_hidden_states = True
    learnable = True
    unrolls = False
    model_free = False

    def __init__(
        self, name: str, config: WhiteBoxConfig, module: torch.nn.Module, tokens: TokenMatrices, vocab: ReducedVocab
    ) -> None:
        if vocab.ids.numel() != config.head_vocab:
            raise EvospecError(
                f"the vocabulary map has {vocab.ids.numel()} tokens, the config says {config.head_vocab}"
            )
        self.name = name
        self.config = config
        self.module = module  # the weights a learner updates
        self.tokens = tokens
        self.vocab = vocab
        self.head = tokens.output_rows(
            vocab.ids
        )  # [N, H] frozen, what training reads; fp32: bf16 backward is emulated without AVX512-BF16
        self._draft_head = self.head.bfloat16()  # [N, H] what drafting reads: half the bytes, the bulk of a draft step
        self.version = 0  # learning steps applied since it was built
        self.features: dict[int, torch.Tensor] = {}  # context position -> the target's hidden state there

    def begin(self, prompt_ids: list[int], prediction: Sequence[int]) -> bool:
        self.features = {}
        return True

    def observe(self, feedback: RoundFeedback) -> None:
        """Keep the target's hidden states at the positions it just verified."""
        rows = feedback.hidden.shape[0]
        first = feedback.position + feedback.tokens.numel() - rows
        for row in range(rows):
            self.features[first + row] = feedback.hidden[row].float().clone()

    @property
    def row_of(self) -> torch.Tensor:
        """[V] the head row of each target id, -1 where it has none."""
        return self.vocab.row_of

    def head_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Features [n, H] -> logits over the reduced vocabulary [n, N], differentiable (for training)."""
        return torch.nn.functional.linear(features, self.head)

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """Features [n, H] -> logits over the reduced vocabulary [n, N] float32, through the bf16 head
        (for drafting)."""
        return torch.nn.functional.linear(features.bfloat16(), self._draft_head).float()

    def pick(self, logits: torch.Tensor, sampler: Sampler) -> tuple[int, torch.Tensor | None]:
        """One drafted target id from reduced logits [N], and q over the full vocabulary [V] when sampling."""
        if sampler.greedy:
            return int(self.vocab.ids[int(logits.argmax())]), None
        q_rows = sampler.probs(logits[None])  # [1, N]
        row = int(sampler.sample(q_rows))
        q = torch.zeros(self.tokens.vocab_size)
        q[self.vocab.ids] = q_rows[0]
        return int(self.vocab.ids[row]), q

    @staticmethod
    def draft(tokens: list[int], probs: list[torch.Tensor]) -> Draft:
        return Draft(torch.tensor(tokens, dtype=torch.long), torch.stack(probs) if probs else None)

    def save(self, directory: Path, target_name: str, extra: dict | None = None) -> None:
        """Write model.safetensors (weights and vocabulary map) and drafter.json (what it drafts for)."""
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {f"module.{key}": value.detach() for key, value in self.module.state_dict().items()}
        save_tensors_atomically({**tensors, "vocab_ids": self.vocab.ids}, directory / "model.safetensors")
        meta = {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "target": target_name,
            "target_vocab_size": self.tokens.vocab_size,
            "config": asdict(self.config),
            "drafter_version": self.version,
            **(extra or {}),
        }
        write_atomically(directory / "drafter.json", json.dumps(meta, indent=2) + "\n")


def load_weights(module: torch.nn.Module, state: dict, strict: bool = True) -> None:
    """Load a checkpoint's weights into module; weights of another shape than its config says are a clear error."""
    try:
        module.load_state_dict(state, strict=strict)
    except RuntimeError as error:
        first = str(error).strip().splitlines()[1:2] or [str(error)]
        raise EvospecError(
            f"the checkpoint's weights do not fit the shape its drafter.json describes: {first[0].strip()}"
        ) from error


def checkpoint_kind(directory: Path) -> str:
    """The kind of drafter (eagle or hydra) a checkpoint directory holds, without loading it."""
    try:
        return json.loads((directory / "drafter.json").read_text())["config"]["kind"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise EvospecError(f"{directory}: not a readable drafter checkpoint ({error})") from error


def read_checkpoint(directory: Path, kind: str, target: LoadedModel) -> tuple[WhiteBoxConfig, dict, ReducedVocab, dict]:
    """(config, module state dict, vocabulary map, metadata) of a saved drafter, checked against the target."""
    meta_file, weights_file = directory / "drafter.json", directory / "model.safetensors"
    if not (meta_file.is_file() and weights_file.is_file()):
        raise EvospecError(f"{directory}: not a drafter checkpoint (drafter.json and model.safetensors expected)")
    try:
        meta = json.loads(meta_file.read_text())
        config = WhiteBoxConfig(**meta["config"])
    except (ValueError, KeyError, TypeError) as error:
        raise EvospecError(f"{meta_file}: unreadable drafter metadata ({error})") from error
    if meta.get("format") != CHECKPOINT_FORMAT or meta.get("version") != CHECKPOINT_VERSION:
        raise EvospecError(f"{meta_file}: not an {CHECKPOINT_FORMAT} checkpoint of version {CHECKPOINT_VERSION}")
    if config.kind != kind:
        raise EvospecError(f"{directory} holds a {config.kind} drafter, not {kind}")
    if meta["target_vocab_size"] != target.vocab_size:
        raise EvospecError(
            f"{directory} was trained for a target with {meta['target_vocab_size']} tokens "
            f"({meta['target']}); '{target.name}' has {target.vocab_size}"
        )
    tensors = load_file(weights_file)
    state = {key.removeprefix("module."): value for key, value in tensors.items() if key.startswith("module.")}
    return config, state, ReducedVocab(tensors["vocab_ids"], target.vocab_size), meta
