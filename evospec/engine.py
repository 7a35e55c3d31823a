"""The speculative decoding loop."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass

import torch

from evospec.config import GenerationConfig
from evospec.cost import ForwardCost
from evospec.draft_length import DraftLength, FixedDraftLength
from evospec.drafters import Drafter, empty_draft
from evospec.drafters.base import common_prefix_length
from evospec.errors import EvospecError
from evospec.learning import OnlineLearner
from evospec.sampling import Sampler
from evospec.selection import REWARDS, Selector, build_selector
from evospec.stats import SpecStats
from evospec.target import FEEDBACK_TOP_K, LanguageModel, PromptPass, top_next_tokens
from evospec.types import ArmScore, Attempt, Draft, Offer, RoundFeedback, RoundTime, Verdict
from evospec.verify import verify


@dataclass(frozen=True)
class TargetPass:
    """What one target forward returned, handed from the pass to the steps of the round that read it."""

    logits: torch.Tensor  # [n, V] at every position of the pass (the last one only at the prefill)
    hidden: torch.Tensor | None  # [n, H] final hidden states, when a listener reads them
    prompt: PromptPass | None  # the prefill's view of the prompt's last rows, when learners learn from them
    seconds: float


def emit(
    tokens: Sequence[int], context: list[int], stats: SpecStats, eos_token_ids: frozenset[int]
) -> Generator[int, None, bool]:
    """Append tokens to context and yield each once counted as emitted -> whether one of them was an
    end-of-generation token (the ones after it are not emitted)."""
    for token in tokens:
        context.append(token)
        stats.new_tokens += 1
        yield token
        if token in eos_token_ids:
            return True
    return False


def reads_hidden_states(drafters: Sequence[Drafter], learners: Sequence[OnlineLearner]) -> bool:
    """Whether a drafter or a learner reads the target's hidden states: then every pass must return them."""
    return any(listener.needs_hidden_states for listener in (*drafters, *learners))


class Engine:
    """A target, drafters with a selector that picks one per round, and the loop that makes them speak
    as the target alone would. No drafter: plain decoding. White-box drafters and learners hear what
    each target pass said (RoundFeedback); nothing they do changes what is emitted. clock: the seconds
    every timing reads (a replay passes one that adds the modeled seconds of a recorded target)."""

    def __init__(
        self,
        target: LanguageModel,
        drafters: Sequence[Drafter],
        eos_token_ids: frozenset[int],
        context_length: int,
        draft_length: DraftLength | None = None,
        selector: Selector | None = None,
        learners: Sequence[OnlineLearner] = (),
        forward_cost: ForwardCost | None = None,
        clock: Callable[[], float] = time.perf_counter,
        keep_prefix: bool = False,
    ) -> None:
        self.target = target
        self.clock = clock
        self.drafters = {drafter.name: drafter for drafter in drafters}
        if len(self.drafters) != len(drafters):
            raise EvospecError(f"drafter names must differ, got {[drafter.name for drafter in drafters]}")
        if selector is None and len(drafters) > 1:
            raise EvospecError("several drafters need a selector")
        if selector is not None and set(selector.arms) != set(self.drafters):
            raise EvospecError(f"the selector's arms {selector.arms} are not the drafters {list(self.drafters)}")
        self.selector = selector or (
            build_selector(f"fixed:{drafters[0].name}", [drafters[0].name]) if drafters else None
        )
        if self.selector is not None and self.selector.reward_kind == "speed" and forward_cost is None:
            raise EvospecError(f"selector {self.selector} rewards speed: it needs the target's measured forward cost")
        self.forward_cost = forward_cost
        self.step_s = forward_cost.of(1) if forward_cost else 0.0  # T(1), for the speed reward
        self.eos_token_ids = eos_token_ids
        self.context_length = context_length
        self.draft_length = draft_length or FixedDraftLength()
        self.learners = list(learners)
        self.listeners = [*(d for d in drafters if d.needs_hidden_states), *self.learners]  # they get RoundFeedback
        self._reads_hidden = reads_hidden_states(drafters, self.learners)
        self._prompt_rows = max((learner.prompt_rows for learner in self.learners), default=0)
        if keep_prefix and self._prompt_rows:
            raise EvospecError("learners that learn from the prompt's rows need a prefill of the whole prompt")
        self.keep_prefix = keep_prefix
        self._cached: list[int] = []  # the tokens in the target's cache, when keep_prefix
        self.requests = 0
        self._awake: list[str] = []  # the drafters with something to draft in the current request
        self._unscored: deque[tuple[Attempt, ArmScore | None]] = deque()  # rounds whose cheap drafts await the output

    def generate(
        self, prompt_ids: list[int], config: GenerationConfig, stats: SpecStats, prediction: Sequence[int] = ()
    ) -> Iterator[int]:
        """Yield new token ids until EOS (yielded too), max_new_tokens or the context is full.

        prediction: the output the client expects (token ids), for the drafters that draft from it.
        The prefill gives p for the first new token. After that the last context token is always
        "pending": the target has not seen it yet, and each round's one forward pass covers it plus
        the draft. stats is updated as tokens are emitted.
        """
        self._check_prompt(prompt_ids)
        self.requests += 1
        start = self.clock()
        sampler = Sampler(config.sampling)
        context = list(prompt_ids)
        kept, failed = self._reuse_cache(prompt_ids), False
        self._awake = [name for name, drafter in self.drafters.items() if drafter.begin(context, prediction)]
        if self._awake:  # the drafters with something to draft from in this request; without any, plain decoding
            self.selector.begin_request(self._awake)
        try:
            passed, attempt = self._forward(context[kept:], stats, prefill=True), None  # the prefill drafts nothing
            stats.prompt_tokens += len(prompt_ids)
            stats.prefill_s += self.clock() - start
            budget = config.max_new_tokens
            while True:
                # 1. Accept a prefix of the draft, plus one token of the target's own; tell who drafted.
                draft = attempt.draft if attempt else empty_draft()
                verdict = verify(passed.logits, draft, sampler)
                stats.record(draft, verdict)
                if attempt:
                    self._feed_back(attempt, verdict, passed, sampler, stats)
                if self.listeners:
                    self._tell_listeners(
                        attempt, verdict, context, passed, stats, prefill=len(context) == len(prompt_ids)
                    )
                # 2. The cache keeps the pending token and the accepted drafts; the new last token is pending.
                self.target.trim(len(context) + verdict.num_accepted)
                emitted = verdict.emitted[:budget]
                if (yield from emit(emitted, context, stats, self.eos_token_ids)):
                    return
                budget -= len(emitted)
                self._score_drafts(context)
                if budget == 0 or len(context) >= self.context_length:
                    return
                # 3. A selected drafter drafts no more than the budget, the window and the draft-length policy allow.
                room = min(budget - 1, self.context_length - len(context))
                attempt = self._draft(context, room, config, sampler) if self._awake else None
                # 4. One target pass over the pending token and the draft: p at every position.
                passed = self._forward([context[-1], *(attempt.draft.tokens.tolist() if attempt else [])], stats)
        except Exception:
            failed = True  # a pass that failed may have left the cache anywhere
            raise
        finally:
            self.target.trim(len(context) - 1)  # an early stop leaves a cache that matches the context
            self._score_drafts(context, final=True)
            self._cached = context[:-1] if self.keep_prefix and not failed else []
            learn_start = self.clock()
            for learner in self.learners:
                learner.end_request()
            stats.learn_s += self.clock() - learn_start
            stats.wall_s += self.clock() - start

    def _reuse_cache(self, prompt_ids: list[int]) -> int:
        """How many of the prompt's first tokens the target's cache keeps (keep_prefix: those the last
        request left there; the prompt's last token is fed again for its logits); the rest is forgotten."""
        kept = min(common_prefix_length(self._cached, prompt_ids), len(prompt_ids) - 1) if self.keep_prefix else 0
        if kept:
            self.target.trim(kept)
        else:
            self.target.reset()
        return kept

    def _forward(self, token_ids: list[int], stats: SpecStats, prefill: bool = False) -> TargetPass:
        """The target's pass over token_ids: logits (the last row only at the prefill), with hidden
        states where listeners read them, and at the prefill the prompt's rows where learners learn them."""
        start = self.clock()
        hidden = prompt = None
        if prefill and self._prompt_rows:
            prompt = self.target.forward_prompt(token_ids, FEEDBACK_TOP_K, self._prompt_rows)
            logits, hidden = prompt.logits, prompt.hidden
        elif self._reads_hidden:
            logits, hidden = self.target.forward_with_hidden(token_ids, num_logits=1 if prefill else 0)
        else:
            logits = self.target.forward(token_ids, num_logits=1 if prefill else 0)
        passed = TargetPass(logits, hidden, prompt, self.clock() - start)
        if not prefill:
            stats.target_s += passed.seconds
        return passed

    def _draft(self, context: list[int], room: int, config: GenerationConfig, sampler: Sampler) -> Attempt | None:
        """This round's attempt: the selected drafter's draft of at most `room` tokens. A full-information
        selector picks having seen every cheap awake drafter's draft of the round (as an Offer)."""
        start = self.clock()
        cheap = self._cheap_drafts(context, room, config, sampler)
        name = self.selector.select({arm: self._offer(arm, draft, asked) for arm, (draft, asked) in cheap.items()})
        drafter = self.drafters[name]
        if name in cheap:
            proposed, asked = cheap.pop(name)
        else:
            asked = self.draft_length.budget(name, min(config.num_speculative_tokens, room), drafter.model_free)
            if asked <= 0:
                return Attempt(name, empty_draft(), empty_draft(), asked=0, draft_s=0.0)
            proposed = drafter.propose(context, asked, sampler)
        seconds = self.clock() - start
        draft = proposed.truncated(self.draft_length.keep(name, proposed))
        counterfactuals = tuple((arm, other, other_asked) for arm, (other, other_asked) in cheap.items())
        return Attempt(name, draft, proposed, asked, seconds, counterfactuals, position=len(context))

    def _cheap_drafts(
        self, context: list[int], room: int, config: GenerationConfig, sampler: Sampler
    ) -> dict[str, tuple[Draft, int]]:
        """For a full-information selector: every cheap awake drafter's draft of this round and the
        tokens it was asked for (empty for other selectors)."""
        if not self.selector.full_information:
            return {}
        drafts = {}
        for name in self._awake:
            if self.drafters[name].model_free:
                asked = self.draft_length.budget(name, min(config.num_speculative_tokens, room), True)
                if asked > 0:
                    drafts[name] = (self.drafters[name].propose(context, asked, sampler), asked)
        return drafts

    def _offer(self, arm: str, draft: Draft, asked: int) -> Offer:
        """A cheap draft as the selector sees it: the part of it the draft-length policy would verify,
        and what verifying that would cost where T(n) is known."""
        size = self.draft_length.keep(arm, draft)
        steps = self.forward_cost.of(1 + size) / self.step_s if self.forward_cost is not None else None
        return Offer(draft.label, asked, size, steps)

    def _feed_back(
        self, attempt: Attempt, verdict: Verdict, passed: TargetPass, sampler: Sampler, stats: SpecStats
    ) -> None:
        """The round's outcome to the selector (its reward), the draft-length policy and the per-drafter stats."""
        seconds = RoundTime(attempt.draft_s, passed.seconds, self.step_s)
        reward = REWARDS[self.selector.reward_kind](
            passed.logits, attempt.draft, verdict, sampler, attempt.asked, seconds
        )
        if self.selector.full_information and attempt.asked:  # every cheap draft, scored once the output covers it
            efficiency = verdict.num_accepted / attempt.asked  # what observe() hears, whatever the selector's reward
            pulled = ArmScore(efficiency, attempt.draft.label) if self.drafters[attempt.drafter].model_free else None
            self._unscored.append((attempt, pulled))
        self.selector.update(attempt.drafter, reward)
        self.draft_length.observe(attempt, verdict)
        stats.record_drafter(attempt, verdict, reward)

    def _score_drafts(self, context: list[int], final: bool = False) -> None:
        """Full information: each past round's cheap drafts scored, in order, once the output covers the
        longest of them (final: at the request's end, on what was emitted). The output is what the target
        says after each draft's start, so a greedy target's score is the draft's own acceptance, not one
        censored at the tokens the pulled draft got verified; under sampling it is the common prefix
        with the sampled output."""
        while self._unscored:
            attempt, pulled = self._unscored[0]
            end = attempt.position + max((draft.size for _, draft, _ in attempt.counterfactuals), default=0)
            if end > len(context) and not final:
                return
            output = context[attempt.position : end]
            scores = {
                name: ArmScore(common_prefix_length(draft.tokens.tolist(), output) / asked, draft.label)
                for name, draft, asked in attempt.counterfactuals
            }
            if pulled is not None:
                scores[attempt.drafter] = pulled
            self.selector.observe(scores)
            self._unscored.popleft()

    def _tell_listeners(
        self,
        attempt: Attempt | None,
        verdict: Verdict,
        context: list[int],
        passed: TargetPass,
        stats: SpecStats,
        prefill: bool,
    ) -> None:
        """What the pass said about the tokens it verified, to white-box drafters and learners.

        Called before the round's tokens join the context: at the prefill the verified tokens are the
        prompt (with p at its last token, or at its last rows when learners learn from the prompt);
        after, the pending token and the accepted drafts.
        """
        start = self.clock()
        drafted = attempt.draft.tokens if attempt else torch.empty(0, dtype=torch.long)
        first = 0 if prefill else len(context) - 1
        if passed.prompt is not None:  # the prefill: the prompt's last rows, as many as learners learn from
            hidden, top_ids, top_probs = passed.prompt.hidden, passed.prompt.top_ids, passed.prompt.top_probs
        else:
            rows = verdict.num_accepted + 1
            hidden = passed.hidden[:rows] if passed.hidden is not None else None
            top_ids, top_probs = top_next_tokens(passed.logits[:rows], FEEDBACK_TOP_K)
        feedback = RoundFeedback(
            request=self.requests,
            drafter=attempt.drafter if attempt and drafted.numel() else None,
            position=first,
            tokens=torch.tensor(context[first:] + drafted[: verdict.num_accepted].tolist()),
            drafted=drafted,
            num_accepted=verdict.num_accepted,
            hidden=hidden,
            top_ids=top_ids,
            top_probs=top_probs,
        )
        for listener in self.listeners:
            listener.observe(feedback)
        stats.learn_s += self.clock() - start

    def _check_prompt(self, prompt_ids: list[int]) -> None:
        if not prompt_ids:
            raise EvospecError("the prompt is empty")
        if len(prompt_ids) >= self.context_length:
            raise EvospecError(
                f"the prompt has {len(prompt_ids)} tokens; the model's context holds {self.context_length}"
            )
