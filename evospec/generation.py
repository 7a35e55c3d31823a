"""Engines on a loaded target, and text in, text out: prompts, chat templates, streaming
detokenization and stop strings."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from evospec.config import GenerationConfig
from evospec.cost import ForwardCost
from evospec.draft_length import AdaptiveDraftLength, DraftLength
from evospec.drafters import Drafter
from evospec.drafters.prediction import PREDICTION
from evospec.engine import Engine, reads_hidden_states
from evospec.errors import EvospecError
from evospec.learning import NO_LEARNER, LearnerConfig, OnlineLearner, build_learner
from evospec.learning.registry import learner_kind
from evospec.models.backend import LoadedModel
from evospec.selection import DEFAULT_SELECTOR, Selector, build_selector
from evospec.stats import SpecStats

if TYPE_CHECKING:
    from evospec.reasoning import StepSpeculator

# Text, or chat messages ({"role": ..., "content": ...}) in order.
Prompt = str | Sequence[Mapping[str, str]]
# What an engine runs in place of the selector and learners it was built with: those of a server's
# replica, which share what they learn with the other replicas (evospec.serve.sharing).
Share = Callable[[Selector | None, list[OnlineLearner]], tuple[Selector | None, Sequence[OnlineLearner]]]


def build_engine(
    target: LoadedModel,
    drafters: Sequence[Drafter],
    draft_length: DraftLength | None = None,
    selector: Selector | None = None,
    learners: Sequence[OnlineLearner] = (),
    forward_cost: ForwardCost | None = None,
) -> Engine:
    """An engine on a new session of target; the target returns hidden states only when a drafter or
    a learner reads them, since they cost a copy per verified position."""
    return Engine(
        target.new_lm(hidden_states=reads_hidden_states(drafters, learners)),
        drafters,
        target.eos_token_ids,
        target.context_length,
        draft_length,
        selector,
        learners,
        forward_cost,
        clock=target.clock,
    )


def build_engine_from_names(
    target: LoadedModel,
    drafters: Sequence[Drafter],
    selector: str | None,
    learner: str,
    learning: LearnerConfig,
    max_k: int,
    adaptive_k: bool,
    share: Share | None = None,
) -> Engine:
    """build_engine with the selector and learner named as --selector and --learner name them: the
    selector (default DEFAULT_SELECTOR) picks among several drafters, the learner trains every learnable
    drafter, and the draft length adapts (at most max_k) when adaptive_k. share: what the engine runs
    in their place is what it makes of them."""
    if selector and len(drafters) < 2:
        raise EvospecError(f"selector {selector!r} picks among several drafters, and there are {len(drafters)}")
    if learner != NO_LEARNER:
        learner_kind(learner)  # an unknown name fails before anything is built
    names = [drafter.name for drafter in drafters]
    chosen = build_selector(selector or DEFAULT_SELECTOR, names) if len(drafters) > 1 else None
    cost, draft_length = timing(target, max_k, adaptive_k, chosen)
    learners = []
    if learner != NO_LEARNER:
        learners = [build_learner(learner, drafter, learning) for drafter in drafters if drafter.learnable]
        if not learners:
            raise EvospecError(f"learner {learner!r} trains eagle, hydra or lora:MODEL drafters; none was given")
    if share is not None:
        chosen, learners = share(chosen, learners)
    return build_engine(target, drafters, draft_length, chosen, learners, cost)


def timing(
    target: LoadedModel, max_k: int, adaptive: bool, selector: Selector | None
) -> tuple[ForwardCost | None, AdaptiveDraftLength | None]:
    """The target's forward cost on this machine (measured once, cached) where a policy weighs time, the
    adaptive draft length or a selector rewarding speed, and the adaptive policy when asked for."""
    timed = adaptive or (selector is not None and selector.reward_kind == "speed")
    cost = target.forward_cost(max_k + 1) if timed else None
    return cost, AdaptiveDraftLength(cost) if adaptive else None


class TextStream:
    """One generation as an iterator of text pieces. Once iterated to the end, `text`, `token_ids`,
    `finish_reason` ("stop": EOS or a stop string; "length": max_new_tokens or the context) and
    `stats` describe the whole of it. A stop string ends the text and is not part of it."""

    def __init__(
        self, generator: TextGenerator, prompt_ids: list[int], config: GenerationConfig, prediction_ids: list[int]
    ) -> None:
        self._generator = generator
        self.prompt_ids = prompt_ids
        self.prediction_ids = prediction_ids  # the predicted output, for the prediction drafter
        self._config = config
        self.text = ""
        self.token_ids: list[int] = []  # generated ids, EOS included when generation ended on it
        self.finish_reason = "length"
        self.stats = SpecStats()

    def __iter__(self) -> Iterator[str]:
        generator = self._generator
        engine = generator.steps if self._config.reasoning_speculation else generator.engine
        decode = generator.tokenizer.decode
        stops = self._config.stop
        hold = max((len(s) for s in stops), default=1) - 1  # a stop string may still be forming
        tokens = engine.generate(self.prompt_ids, self._config, self.stats, self.prediction_ids)
        try:
            for token in tokens:
                self.token_ids.append(token)
                text = decode(self.token_ids, skip_special_tokens=True)
                cut = _first_stop(text, stops)
                if cut is not None:
                    self.finish_reason = "stop"
                    yield from self._advance(text[:cut])
                    return
                if token in engine.eos_token_ids:
                    self.finish_reason = "stop"
                # A trailing U+FFFD is half a multi-byte character: wait for the rest.
                yield from self._advance(text[: len(text.rstrip("\ufffd")) - hold])
            yield from self._advance(decode(self.token_ids, skip_special_tokens=True))
        finally:
            tokens.close()

    def _advance(self, text: str) -> Iterator[str]:
        """Yield what text adds to what was yielded so far."""
        if len(text) > len(self.text):
            piece = text[len(self.text) :]
            self.text = text
            yield piece


class TextGenerator:
    """A loaded target and an engine on it (build_engine) behind a text interface; with steps, a
    step-level speculator for the requests that ask for it (reasoning_speculation)."""

    def __init__(self, target: LoadedModel, engine: Engine, steps: StepSpeculator | None = None) -> None:
        self.target = target
        self.tokenizer = target.tokenizer
        self.engine = engine
        self.steps = steps

    def stream(
        self, prompt: Prompt, config: GenerationConfig, chat: bool = False, prediction: str | None = None
    ) -> TextStream:
        """Start a generation (the prompt as encode_prompt takes it); iterate the result for text pieces.

        prediction: text the output is expected to repeat much of (OpenAI Predicted Outputs), drafted
        by the prediction drafter, which the engine must have."""
        if config.reasoning_speculation and self.steps is None:
            raise EvospecError(
                "step-level speculation (reasoning_speculation) needs a generator started with "
                "--reasoning-speculation and a small-LM drafter"
            )
        if prediction and config.reasoning_speculation:
            raise EvospecError("step-level speculation drafts with the drafter's steps; it takes no prediction")
        if prediction and PREDICTION not in self.engine.drafters:
            raise EvospecError(
                f"a prediction is drafted by the '{PREDICTION}' drafter, and this generator has "
                f"{sorted(self.engine.drafters) or 'none'}: add --drafter {PREDICTION}"
            )
        return TextStream(
            self, encode_prompt(self.target, prompt, chat), config, encode_prediction(self.target, prediction)
        )

    def generate(
        self, prompt: Prompt, config: GenerationConfig, chat: bool = False, prediction: str | None = None
    ) -> TextStream:
        """Generate to the end; the returned stream holds text, token ids, finish reason and stats."""
        stream = self.stream(prompt, config, chat, prediction)
        for _ in stream:
            pass
        return stream


def encode_prompt(model: LoadedModel, prompt: Prompt, chat: bool = False) -> list[int]:
    """Prompt -> token ids. Text is encoded as it is, or with chat as one user message; a list of chat
    messages ({"role", "content"}) is a conversation. Messages go through the model's chat template,
    ending where the assistant's reply begins."""
    tokenizer = model.tokenizer
    if isinstance(prompt, str):
        if not prompt.strip():
            raise EvospecError("the prompt is empty")
        if not chat:
            return tokenizer.encode(prompt)
        prompt = [{"role": "user", "content": prompt}]
    if not prompt:
        raise EvospecError("the conversation has no messages")
    if not tokenizer.chat_template:
        raise EvospecError(f"model '{model.name}' has no chat template; prompt it with plain text (no --chat)")
    text = tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def encode_prediction(model: LoadedModel, prediction: str | None) -> list[int]:
    """A predicted output (OpenAI Predicted Outputs) -> token ids, as the output would spell it; none: []."""
    return model.tokenizer.encode(prediction, add_special_tokens=False) if prediction else []


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    """Index where the earliest stop string begins in text, or None."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None
