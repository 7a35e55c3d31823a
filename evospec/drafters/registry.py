"""The drafter registry: specs on the command line -> drafters.

A drafter spec reads KIND or KIND:ARG (e.g. `ngram`, `lm:qwen2.5-coder-0.5b-instruct`); a spec that
names no registered kind is taken as a model for the small-LM drafter (`qwen2.5-coder-0.5b-instruct`).
"""

from __future__ import annotations

from collections.abc import Callable

from evospec.drafters.base import Drafter
from evospec.drafters.ngram import NgramDrafter
from evospec.drafters.small_lm import SmallLMDrafter
from evospec.drafters.suffix import SuffixDrafter
from evospec.errors import EvospecError
from evospec.models.loading import LoadedModel, default_backend, load_model, names_a_model, same_tokenizer, vocab_size

NO_DRAFTER = "none"


def _build_ngram(arg: str | None, target: LoadedModel, dtype: str | None) -> Drafter:
    if arg:
        raise EvospecError(f"the ngram drafter takes no argument, got 'ngram:{arg}'")
    return NgramDrafter()


def _build_small_lm(arg: str | None, target: LoadedModel, dtype: str | None) -> Drafter:
    if not arg:
        raise EvospecError("the lm drafter needs a model: lm:ALIAS, lm:PATH or lm:HF_ID")
    # The target's backend where it can run the drafter; llama.cpp runs only GGUF files and zoo aliases.
    same_backend = target.backend == "hf" or default_backend(arg) == target.backend
    drafter_model = load_model(arg, dtype if same_backend else None, target.backend if same_backend else "hf")
    if not same_tokenizer(drafter_model.tokenizer, target.tokenizer):
        raise EvospecError(
            f"drafter '{drafter_model.name}' uses another tokenizer than target '{target.name}'; "
            "a small-LM drafter must share the target's vocabulary"
        )
    if vocab_size(drafter_model) != vocab_size(target):  # q and p must index the same rows
        raise EvospecError(
            f"drafter '{drafter_model.name}' has {vocab_size(drafter_model)} output logits, "
            f"target '{target.name}' has {vocab_size(target)}"
        )
    return SmallLMDrafter(drafter_model.new_lm(), name=drafter_model.name)


def _build_suffix(arg: str | None, target: LoadedModel, dtype: str | None) -> Drafter:
    if arg:
        raise EvospecError(f"the suffix drafter takes no argument, got 'suffix:{arg}'")
    return SuffixDrafter()


DRAFTERS: dict[str, Callable[[str | None, LoadedModel, str | None], Drafter]] = {
    "ngram": _build_ngram,
    "suffix": _build_suffix,
    "lm": _build_small_lm,
}


def build_drafter(spec: str, target: LoadedModel, dtype: str | None) -> Drafter | None:
    """Build the drafter a spec names for this target; None for `none` (plain decoding)."""
    spec = spec.strip()
    if not spec:
        raise EvospecError("empty drafter spec; use 'none', 'ngram' or a model (lm:MODEL)")
    if spec == NO_DRAFTER:
        return None
    kind, _, arg = spec.partition(":")
    if kind in DRAFTERS:
        return DRAFTERS[kind](arg or None, target, dtype)
    if not names_a_model(spec):
        kinds = ", ".join(f"{name}:..." for name in DRAFTERS)
        raise EvospecError(f"unknown drafter {spec!r}: not '{NO_DRAFTER}', {kinds}, a zoo alias or a model path")
    return _build_small_lm(spec, target, dtype)
