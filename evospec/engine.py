"""The speculative decoding loop."""

from __future__ import annotations

import time
from collections.abc import Iterator

from evospec.config import GenerationConfig
from evospec.draft_length import DraftLength, FixedDraftLength
from evospec.drafters import Drafter, empty_draft
from evospec.errors import EvospecError
from evospec.sampling import Sampler
from evospec.stats import SpecStats
from evospec.target import LanguageModel
from evospec.types import Draft
from evospec.verify import verify


class Engine:
    """A target, an optional drafter, and the loop that makes them speak as the target alone would."""

    def __init__(
        self,
        target: LanguageModel,
        drafter: Drafter | None,
        eos_token_ids: frozenset[int],
        context_length: int,
        draft_length: DraftLength | None = None,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.eos_token_ids = eos_token_ids
        self.context_length = context_length
        self.draft_length = draft_length or FixedDraftLength()

    def generate(self, prompt_ids: list[int], config: GenerationConfig, stats: SpecStats) -> Iterator[int]:
        """Yield new token ids until EOS (yielded too), max_new_tokens or the context is full.

        The prefill gives p for the first new token. After that the last context token is always
        "pending": the target has not seen it yet, and each round's one forward pass covers it plus
        the draft. stats is updated as tokens are emitted.
        """
        self._check_prompt(prompt_ids)
        start = time.perf_counter()
        sampler = Sampler(config.sampling)
        context = list(prompt_ids)
        self.target.reset()
        if self.drafter is not None:
            self.drafter.begin(context)
        try:
            logits, draft = self.target.forward(context, num_logits=1), empty_draft()  # [1, V]
            stats.prompt_tokens += len(prompt_ids)
            stats.prefill_s += time.perf_counter() - start
            budget = config.max_new_tokens
            draft_s = 0.0
            while True:
                # 1. Accept a prefix of the draft, plus one token of the target's own.
                verdict = verify(logits, draft, sampler)
                stats.record(draft, verdict)
                if self.drafter is not None:
                    self.draft_length.observe(self.drafter.name, draft, verdict.num_accepted, draft_s)
                # 2. The cache keeps the pending token and the accepted drafts; the new last token is pending.
                self.target.trim(len(context) + verdict.num_accepted)
                for token in verdict.emitted[:budget]:
                    context.append(token)
                    stats.new_tokens += 1
                    budget -= 1
                    yield token
                    if token in self.eos_token_ids:
                        return
                if budget == 0 or len(context) >= self.context_length:
                    return
                # 3. Draft no more than the budget, the context window and the draft-length policy allow.
                draft, draft_s = self._draft(context, min(budget - 1, self.context_length - len(context)), config, sampler)
                stats.draft_s += draft_s
                # 4. One target pass over the pending token and the draft: p at every position.
                target_start = time.perf_counter()
                logits = self.target.forward([context[-1], *draft.tokens.tolist()])  # [m + 1, V]
                stats.target_s += time.perf_counter() - target_start
        finally:
            self.target.trim(len(context) - 1)  # an early stop leaves a cache that matches the context
            stats.wall_s += time.perf_counter() - start

    def _draft(self, context: list[int], room: int, config: GenerationConfig, sampler: Sampler) -> tuple[Draft, float]:
        """The draft to verify this round (at most room tokens) and the seconds drafting took."""
        if self.drafter is None:
            return empty_draft(), 0.0
        k = self.draft_length.budget(self.drafter.name, min(config.num_speculative_tokens, room))
        if k <= 0:
            return empty_draft(), 0.0
        start = time.perf_counter()
        draft = self.drafter.propose(context, k, sampler)
        seconds = time.perf_counter() - start
        return draft.truncated(self.draft_length.keep(self.drafter.name, draft)), seconds

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise EvospecError("the prompt is empty")
        if len(prompt_ids) >= self.context_length:
            raise EvospecError(
                f"the prompt has {len(prompt_ids)} tokens; the model's context holds {self.context_length}"
            )
