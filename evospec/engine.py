"""The speculative decoding loop."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import torch

from evospec.config import GenerationConfig
from evospec.draft_length import DraftLength, FixedDraftLength
from evospec.drafters import Drafter, empty_draft
from evospec.errors import EvospecError
from evospec.sampling import Sampler
from evospec.stats import SpecStats
from evospec.selection import REWARDS, Selector, build_selector
from evospec.target import LanguageModel
from evospec.types import Attempt, Verdict
from evospec.verify import verify


class Engine:
    """A target, drafters with a selector that picks one per round, and the loop that makes them speak
    as the target alone would. No drafter: plain decoding."""

    def __init__(
        self,
        target: LanguageModel,
        drafters: Sequence[Drafter],
        eos_token_ids: frozenset[int],
        context_length: int,
        draft_length: DraftLength | None = None,
        selector: Selector | None = None,
    ) -> None:
        self.target = target
        self.drafters = {drafter.name: drafter for drafter in drafters}
        if len(self.drafters) != len(drafters):
            raise EvospecError(f"drafter names must differ, got {[drafter.name for drafter in drafters]}")
        if selector is None and len(drafters) > 1:
            raise EvospecError("several drafters need a selector")
        if selector is not None and set(selector.arms) != set(self.drafters):
            raise EvospecError(f"the selector's arms {selector.arms} are not the drafters {list(self.drafters)}")
        self.selector = selector or (build_selector(f"fixed:{drafters[0].name}", [drafters[0].name]) if drafters else None)
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
        for drafter in self.drafters.values():
            drafter.begin(context)
        if self.selector is not None:
            self.selector.begin_request()
        try:
            logits, attempt = self.target.forward(context, num_logits=1), None  # [1, V]; the prefill drafts nothing
            stats.prompt_tokens += len(prompt_ids)
            stats.prefill_s += time.perf_counter() - start
            budget = config.max_new_tokens
            while True:
                # 1. Accept a prefix of the draft, plus one token of the target's own; tell who drafted.
                draft = attempt.draft if attempt else empty_draft()
                verdict = verify(logits, draft, sampler)
                stats.record(draft, verdict)
                if attempt:
                    self._feed_back(attempt, verdict, logits, sampler, stats)
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
                # 3. A selected drafter drafts no more than the budget, the window and the draft-length policy allow.
                attempt = self._draft(context, min(budget - 1, self.context_length - len(context)), config, sampler)
                # 4. One target pass over the pending token and the draft: p at every position.
                target_start = time.perf_counter()
                logits = self.target.forward([context[-1], *(attempt.draft.tokens.tolist() if attempt else [])])
                stats.target_s += time.perf_counter() - target_start  # logits: [m + 1, V]
        finally:
            self.target.trim(len(context) - 1)  # an early stop leaves a cache that matches the context
            stats.wall_s += time.perf_counter() - start

    def _draft(self, context: list[int], room: int, config: GenerationConfig, sampler: Sampler) -> Attempt | None:
        """This round's attempt: the selected drafter's draft of at most `room` tokens (None without drafters)."""
        if self.selector is None:
            return None
        name = self.selector.select()
        asked = self.draft_length.budget(name, min(config.num_speculative_tokens, room))
        if asked <= 0:
            return Attempt(name, empty_draft(), asked=0, draft_s=0.0)
        start = time.perf_counter()
        draft = self.drafters[name].propose(context, asked, sampler)
        seconds = time.perf_counter() - start
        return Attempt(name, draft.truncated(self.draft_length.keep(name, draft)), asked, seconds)

    def _feed_back(self, attempt: Attempt, verdict: Verdict, logits: torch.Tensor, sampler: Sampler, stats: SpecStats) -> None:
        """The round's outcome to the selector (its reward), the draft-length policy and the per-drafter stats."""
        reward = REWARDS[self.selector.reward_kind](logits, attempt.draft, verdict, sampler, attempt.asked)
        self.selector.update(attempt.drafter, reward)
        self.draft_length.observe(attempt.drafter, attempt.draft, verdict.num_accepted, attempt.draft_s)
        stats.record_drafter(attempt, verdict, reward)

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise EvospecError("the prompt is empty")
        if len(prompt_ids) >= self.context_length:
            raise EvospecError(
                f"the prompt has {len(prompt_ids)} tokens; the model's context holds {self.context_length}"
            )
