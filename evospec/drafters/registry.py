"""The drafter registry: specs on the command line -> drafters.

A drafter spec reads KIND or KIND:ARG (e.g. `ngram`, `prediction`, `lm:qwen2.5-coder-0.5b-instruct`,
`eagle:CHECKPOINT`);
a spec that names no registered kind is taken as a model for the small-LM drafter
(`qwen2.5-coder-0.5b-instruct`). `eagle` and `hydra` without a checkpoint start from random weights;
`lora:MODEL` is the small LM with adapters that the online learners train.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from evospec.config import LoadConfig
from evospec.drafters.adapted_lm import AdaptedLMDrafter
from evospec.drafters.base import Drafter
from evospec.drafters.eagle import EagleDrafter
from evospec.drafters.hydra import HydraDrafter
from evospec.drafters.ngram import NgramDrafter
from evospec.drafters.prediction import PREDICTION, PredictionDrafter
from evospec.drafters.small_lm import SmallLMDrafter
from evospec.drafters.suffix import SuffixDrafter
from evospec.drafters.whitebox import ReducedVocab, WhiteBoxConfig, WhiteBoxDrafter, read_checkpoint
from evospec.errors import EvospecError
from evospec.models.backend import Backend, LoadedModel
from evospec.models.loading import BACKENDS, load_model, names_a_model, same_tokenizer

NO_DRAFTER = "none"
ANY_MODEL_BACKEND = "hf"  # the backend that runs any model, adapters included


def _build_ngram(arg: str | None, target: LoadedModel, load: LoadConfig) -> Drafter:
    if arg:
        raise EvospecError(f"the ngram drafter takes no argument, got 'ngram:{arg}'")
    return NgramDrafter()


def _small_lm_model(arg: str | None, target: LoadedModel, load: LoadConfig, backend: Backend) -> LoadedModel:
    """The small LM `arg` names, loaded on backend (with the target's dtype where it takes one),
    checked to share the target's vocabulary."""
    if not arg:
        raise EvospecError("a small-LM drafter needs a model: lm:ALIAS (or lora:ALIAS), a path or an HF id")
    dtype = load.dtype if load.dtype in backend.dtypes else None
    drafter_model = load_model(arg, backend.name, LoadConfig(dtype=dtype))
    check_shared_vocabulary(drafter_model, target)
    return drafter_model


def check_shared_vocabulary(drafter_model: LoadedModel, target: LoadedModel) -> None:
    """A small-LM drafter must share the target's tokenizer and width of logits; a clear error if not."""
    if not same_tokenizer(drafter_model.tokenizer, target.tokenizer):
        raise EvospecError(
            f"drafter '{drafter_model.name}' uses another tokenizer than target '{target.name}'; "
            "a small-LM drafter must share the target's vocabulary"
        )
    if drafter_model.vocab_size != target.vocab_size:  # q and p must index the same rows
        raise EvospecError(
            f"drafter '{drafter_model.name}' has {drafter_model.vocab_size} output logits, "
            f"target '{target.name}' has {target.vocab_size}"
        )


def _build_small_lm(arg: str | None, target: LoadedModel, load: LoadConfig) -> Drafter:
    # The target's backend where it can run the drafter (llama.cpp runs only GGUF files and zoo aliases).
    backend = target.backend if arg is None or target.backend.can_run(arg) else BACKENDS[ANY_MODEL_BACKEND]
    drafter_model = _small_lm_model(arg, target, load, backend)
    return SmallLMDrafter(drafter_model.new_lm(), name=drafter_model.name)


def _build_adapted_lm(arg: str | None, target: LoadedModel, load: LoadConfig) -> Drafter:
    # Adapters train through PyTorch: the drafter runs on the hf backend, whatever the target's.
    drafter_model = _small_lm_model(arg, target, load, BACKENDS[ANY_MODEL_BACKEND])
    return AdaptedLMDrafter(drafter_model.model, name=f"lora:{drafter_model.name}")


def _build_suffix(arg: str | None, target: LoadedModel, load: LoadConfig) -> Drafter:
    if arg:
        raise EvospecError(f"the suffix drafter takes no argument, got 'suffix:{arg}'")
    return SuffixDrafter()


def _build_prediction(arg: str | None, target: LoadedModel, load: LoadConfig) -> Drafter:
    if arg:
        raise EvospecError(
            f"the prediction drafter takes no argument (each request brings its prediction), got '{PREDICTION}:{arg}'"
        )
    return PredictionDrafter()


WHITE_BOX_CLASSES: dict[str, type[WhiteBoxDrafter]] = {"eagle": EagleDrafter, "hydra": HydraDrafter}
WHITE_BOX_KINDS = tuple(WHITE_BOX_CLASSES)


def new_white_box_drafter(
    kind: str,
    target: LoadedModel,
    checkpoint: Path | None = None,
    config: WhiteBoxConfig | None = None,
    vocab: ReducedVocab | None = None,
) -> WhiteBoxDrafter:
    """An EAGLE- or Hydra-style drafter for target: from a checkpoint directory, or new (random) with
    config (default shape) and vocab (default: the lowest ids, end-of-generation tokens first)."""
    if kind not in WHITE_BOX_KINDS:
        raise EvospecError(f"unknown white-box drafter {kind!r}; choose one of {', '.join(WHITE_BOX_KINDS)}")
    state = None
    if checkpoint is not None:
        config, state, vocab, _ = read_checkpoint(checkpoint, kind, target)
    config = config or WhiteBoxConfig(kind, target.hidden_size)
    if config.hidden_size != target.hidden_size:
        raise EvospecError(
            f"the {kind} drafter reads {config.hidden_size}-wide features; '{target.name}' has {target.hidden_size}"
        )
    vocab = vocab or ReducedVocab.most_frequent(
        [], target.vocab_size, min(config.head_vocab, target.vocab_size), always=sorted(target.eos_token_ids)
    )
    if vocab.ids.numel() != config.head_vocab:
        config = WhiteBoxConfig(**{**config.__dict__, "head_vocab": int(vocab.ids.numel())})
    tokens = target.token_matrices()
    if kind == "eagle":
        return EagleDrafter(kind, config, tokens, vocab, target.context_length, state)
    return HydraDrafter(kind, config, tokens, vocab, state)


def _white_box_builder(kind: str) -> Callable[[str | None, LoadedModel, LoadConfig], Drafter]:
    def build(arg: str | None, target: LoadedModel, load: LoadConfig) -> Drafter:
        return new_white_box_drafter(kind, target, Path(arg).expanduser() if arg else None)

    return build


# Every drafter kind, by the name a spec starts with (the lossless tests run each).
DRAFTERS: dict[str, Callable[[str | None, LoadedModel, LoadConfig], Drafter]] = {
    "ngram": _build_ngram,
    "suffix": _build_suffix,
    PREDICTION: _build_prediction,
    "lm": _build_small_lm,
    "lora": _build_adapted_lm,
    **{kind: _white_box_builder(kind) for kind in WHITE_BOX_KINDS},
}


def build_drafter(spec: str, target: LoadedModel, load: LoadConfig = LoadConfig()) -> Drafter | None:
    """Build the drafter a spec names for this target (a small LM loaded as load says, where its
    backend takes it); None for `none` (plain decoding)."""
    spec = spec.strip()
    if not spec:
        raise EvospecError("empty drafter spec; use 'none', 'ngram' or a model (lm:MODEL)")
    if spec == NO_DRAFTER:
        return None
    kind, _, arg = spec.partition(":")
    if kind in DRAFTERS:
        return DRAFTERS[kind](arg or None, target, load)
    if not names_a_model(spec):
        kinds = ", ".join(f"{name}:..." for name in DRAFTERS)
        raise EvospecError(f"unknown drafter {spec!r}: not '{NO_DRAFTER}', {kinds}, a zoo alias or a model path")
    return _build_small_lm(spec, target, load)
