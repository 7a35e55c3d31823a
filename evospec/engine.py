"""The speculative decoding loop."""

from __future__ import annotations

import time
from collections.abc import Iterator

from evospec.config import GenerationConfig
from evospec.drafters import Drafter, empty_draft
from evospec.errors import EvospecError
from evospec.sampling import Sampler
from evospec.stats import SpecStats
from evospec.target import CachedLM
from evospec.verify import verify


class Engine:
    """A target, an optional drafter, and the loop that makes them speak as the target alone would."""

    def __init__(
        self,
        target: CachedLM,
        drafter: Drafter | None,
        eos_token_ids: frozenset[int],
        context_length: int,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.eos_token_ids = eos_token_ids
        self.context_length = context_length

    def generate(self, prompt_ids: list[int], config: GenerationConfig, stats: SpecStats) -> Iterator[int]:
        """Yield new token ids until EOS (yielded too), max_new_tokens or the context is full.

        The last context token is always "pending": the target has not seen it yet, and each round's
        one forward pass covers it plus the draft. stats is updated as tokens are emitted.
        """
        self._check_prompt(prompt_ids)
        start = time.perf_counter()
        sampler = Sampler(config.sampling)
        context = list(prompt_ids)
        self.target.reset()
        if self.drafter is not None:
            self.drafter.begin(context)
        try:
            if len(context) > 1:
                self.target.forward(context[:-1], num_logits=1)  # prefill all but the pending token
            stats.prompt_tokens += len(prompt_ids)
            stats.prefill_s += time.perf_counter() - start
            budget = config.max_new_tokens
            while budget > 0 and len(context) < self.context_length:
                # 1. Draft no more than the budget and the context window can take.
                k = min(config.num_speculative_tokens, budget - 1, self.context_length - len(context))
                use_drafter = self.drafter is not None and k > 0
                draft = self.drafter.propose(context, k, sampler) if use_drafter else empty_draft()
                # 2. One target pass over the pending token and the draft: p at every position.
                logits = self.target.forward([context[-1], *draft.tokens.tolist()])  # [m + 1, V]
                # 3. Accept a prefix, plus one token of the target's own.
                verdict = verify(logits, draft, sampler)
                stats.record(draft, verdict)
                # 4. The cache keeps the pending token and the accepted drafts; the new last token is pending.
                self.target.trim(len(context) + verdict.num_accepted)
                for token in verdict.emitted[:budget]:
                    context.append(token)
                    stats.new_tokens += 1
                    budget -= 1
                    yield token
                    if token in self.eos_token_ids:
                        return
        finally:
            self.target.trim(len(context) - 1)  # an early stop leaves a cache that matches the context
            stats.wall_s += time.perf_counter() - start

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise EvospecError("the prompt is empty")
        if len(prompt_ids) >= self.context_length:
            raise EvospecError(
                f"the prompt has {len(prompt_ids)} tokens; the model's context holds {self.context_length}"
            )
