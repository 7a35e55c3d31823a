"""Step-level speculation for reasoning (Lookahead Reasoning, Fu et al. 2025, arXiv 2506.19830), with
the drafter learning from the judge's verdicts (OnlineSPEC's Online-LR).

Each round, from the same prefix, the drafter writes a reasoning step and the target writes its own.
A step ends with the token that completes the delimiter (a paragraph break). The target's step is
made by token-level speculative decoding with the drafter's step as its draft, so it is exactly what
the target alone would write next. A judge then decides whether the drafter's step says the same:
if so the drafter's step is kept, otherwise the target's. Kept drafter steps make this mode lossy by
design (opt-in); with a judge that accepts nothing, or with follow_target (the verdicts are then only
counted and learned from), its output is plain decoding's.

With lookahead above 1, a round is Lookahead Reasoning's: the drafter writes several steps, one
after another, and the target writes its versions of all of them side by side, each from the prefix
the drafted steps before it make. One target pass over every drafted step verifies each step's
tokens; where a step parts from the target's, a fork of the target's cache goes on from there, and
the forks decode together (one llama.cpp call over several sequences), each verifying the drafted
step's later tokens where the target's version finds them again. The steps are judged in order:
the round keeps drafted steps while they stand and ends with the target's version of the first that
does not (its later steps came from a prefix no longer kept). The trunk then takes the cells of
that version's fork, so the next round reads none of it again.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from evospec.config import GenerationConfig, StepConfig
from evospec.draft_length import AdaptiveDraftLength, DraftLength, FixedDraftLength
from evospec.drafters.base import common_prefix_length
from evospec.drafters.prediction import PREDICTION, PredictionDrafter
from evospec.drafters.small_lm import SmallLMDrafter
from evospec.engine import Engine, emit
from evospec.errors import EvospecError
from evospec.learning.preference import StepPreferenceLearner
from evospec.models.backend import LoadedModel
from evospec.reasoning.judges import Judge, TargetJudge, build_judge
from evospec.sampling import Sampler
from evospec.stats import SpecStats
from evospec.target import BranchingLM
from evospec.types import Attempt, JudgedStep, Verdict


class StepLearner(Protocol):
    """A learner that learns from judged steps (evospec.learning.preference)."""

    def begin_request(self) -> None: ...

    def observe_step(self, step: JudgedStep) -> None: ...

    def end_request(self) -> None: ...


def numbers_in(text: str) -> Counter[str]:
    """The numbers a text states, as a multiset (thousands separators dropped, so 1,250 is 1250)."""
    return Counter(re.findall(r"\d+(?:\.\d+)?", re.sub(r"(?<=\d),(?=\d{3})", "", text)))


def build_step_speculator(target: LoadedModel, engine: Engine, config: StepConfig) -> StepSpeculator:
    """A step-level speculator beside engine: engine's one small-LM drafter writes the steps, and its
    step learners (dpo, step-ce) learn from them. Where engine adapts its draft length, so does the
    target's step, by how much of the drafter's step it has been accepting."""
    writers = [drafter for drafter in engine.drafters.values() if isinstance(drafter, SmallLMDrafter)]
    if len(writers) != 1:
        raise EvospecError(
            "step-level speculation needs one drafter that writes steps, a small LM sharing the target's "
            f"tokenizer (--drafter lm:MODEL or lora:MODEL); got {sorted(engine.drafters) or 'none'}"
        )
    learners = [learner for learner in engine.learners if isinstance(learner, StepPreferenceLearner)]
    judge = build_judge(config.judge, target, config.similarity)
    adaptive = isinstance(engine.draft_length, AdaptiveDraftLength)
    draft_length = AdaptiveDraftLength(engine.draft_length.cost) if adaptive else None
    return StepSpeculator(target, writers[0], judge, config, learners, draft_length)


@dataclass
class Fork:
    """The target's version of a drafted step from where it parts from the step: on a branch of the
    trunk holding `cached` tokens, with tokens so far (the last not yet read), drafting by the step."""

    index: int  # the step's place in its round
    start: int  # where the step begins in the trunk
    branch: Any
    cached: int
    tokens: list[int]
    room: int
    prediction: PredictionDrafter


@dataclass(frozen=True)
class Step:
    """A step as one side wrote it, and how it ended: "step" (the delimiter), "eos" or "length"."""

    tokens: list[int]
    ending: str


class StepSpeculator:
    """Step-level speculation over a target (see the module docstring). Its generate() is the
    Engine's, so TextStream runs either; SpecStats' step counters say what it did. draft_length:
    how much of the drafter's step each round of the target's step verifies (default: k tokens)."""

    def __init__(
        self,
        target: LoadedModel,
        drafter: SmallLMDrafter,
        judge: Judge,
        config: StepConfig = StepConfig(),
        learners: Sequence[StepLearner] = (),
        draft_length: DraftLength | None = None,
    ) -> None:
        if not isinstance(drafter, SmallLMDrafter):
            raise EvospecError(
                f"step-level speculation needs a small-LM drafter (lm:MODEL or lora:MODEL) to write steps, "
                f"not '{drafter.name}'"
            )
        if target.backend.name == "replay":  # a recording knows the target's steps on its own answer only
            if not config.follow_target:
                raise EvospecError("a replay of recorded answers judges steps only while following the target")
            if isinstance(judge, TargetJudge):
                raise EvospecError("the target judge reads the target on a judge prompt, which no recording holds")
        self.target = target
        self.drafter = drafter
        self.judge = judge
        self.config = config
        self.learners = list(learners)
        self.tokenizer = target.tokenizer
        self.eos_token_ids = target.eos_token_ids
        self.clock = target.clock  # a replayed target's passes cost its profile's seconds on its own clock
        # The target writes its steps on a cache of its own, each step's prefill reading only the new step:
        # one step a round by the engine's speculative decoding; lookahead rounds on a cache whose forks
        # decode side by side (a recording's cache cannot fork: its backend says so).
        self.engine: Engine | None = None
        self.trunk: BranchingLM | None = None
        if config.lookahead == 1:
            self.engine = Engine(
                target.new_lm(),
                [PredictionDrafter()],
                target.eos_token_ids,
                target.context_length,
                draft_length,
                clock=target.clock,
                keep_prefix=True,
            )
        else:
            self.trunk = target.new_lm(branches=config.lookahead)
        self.draft_length = draft_length or FixedDraftLength()  # how much of a drafted step a fork verifies
        self.trunk_tokens: list[int] = []  # what the trunk caches
        self.requests = 0

    def generate(
        self, prompt_ids: list[int], config: GenerationConfig, stats: SpecStats, prediction: Sequence[int] = ()
    ) -> Iterator[int]:
        """Yield new token ids step by step until EOS (yielded too), max_new_tokens or the context is full."""
        if prediction:
            raise EvospecError("step-level speculation drafts with the drafter's steps; a prediction cannot join it")
        if self.trunk is not None and config.sampling.temperature > 0:
            raise EvospecError("lookahead rounds write the target's steps greedily: sample with lookahead 1")
        self.requests += 1
        start = self.clock()
        sampler = Sampler(config.sampling)
        context = list(prompt_ids)
        budget = config.max_new_tokens
        self.drafter.begin(context, ())
        for learner in self.learners:
            learner.begin_request()
        try:
            stats.prompt_tokens += len(prompt_ids)
            while budget > 0 and len(context) < self.target.context_length:
                if self.trunk is None:
                    steps = [self._step_round(context, budget, config, sampler, stats)]
                else:
                    steps = self._lookahead_round(context, budget, config.num_speculative_tokens, sampler, stats)
                for step in steps:  # each at most its room, so within the budget
                    if (yield from emit(step, context, stats, self.eos_token_ids)):
                        return
                    budget -= len(step)
        finally:
            learn_start = self.clock()
            for learner in self.learners:
                learner.end_request()
            stats.learn_s += self.clock() - learn_start
            stats.wall_s += self.clock() - start

    def _room(self, context_tokens: int, budget: int) -> int:
        """The most tokens the next step may take."""
        return min(budget, self.config.max_step_tokens, self.target.context_length - context_tokens)

    def _step_round(
        self, context: list[int], budget: int, config: GenerationConfig, sampler: Sampler, stats: SpecStats
    ) -> list[int]:
        """One drafted step and the target's own, judged -> the step kept."""
        room = self._room(len(context), budget)
        drafted = self._drafter_step(context, room, sampler, stats)
        written = self._target_step(context, drafted, room, config, stats.num_draft_steps, stats)
        accepted = self._judge(drafted, written, stats)
        self._teach(context, drafted, written, accepted, stats)
        return (written if self.config.follow_target or not accepted else drafted).tokens

    def _lookahead_round(
        self, context: list[int], budget: int, k: int, sampler: Sampler, stats: SpecStats
    ) -> list[list[int]]:
        """Up to `lookahead` drafted steps and the target's versions of them, judged in order -> the
        steps kept: drafted ones while they stand, then the target's version of the first that does
        not (following the target, only identical steps stand for themselves)."""
        drafted: list[Step] = []
        rooms: list[int] = []
        prefix = list(context)
        while len(drafted) < self.config.lookahead:
            room = self._room(len(prefix), budget - (len(prefix) - len(context)))
            if room <= 0:
                break
            step = self._drafter_step(prefix, room, sampler, stats)
            drafted.append(step)
            rooms.append(room)
            prefix += step.tokens
            if step.ending == "eos":
                break
        kept: list[list[int]] = []
        prefix = list(context)
        written_steps, forks = self._target_steps(context, drafted, rooms, k, sampler, stats)
        replaced = None  # the step whose target version is kept in its place
        for index, (step, written) in enumerate(zip(drafted, written_steps)):
            accepted = self._judge(step, written, stats)
            self._teach(prefix, step, written, accepted, stats)
            stands = step.tokens == written.tokens or (accepted and not self.config.follow_target)
            kept.append(step.tokens if stands else written.tokens)
            if not stands:
                replaced = index
                break
            prefix += step.tokens
        stats.num_discarded_steps += len(drafted) - len(kept)
        self._keep_cells(forks, replaced)
        return kept

    def _keep_cells(self, forks: dict[int, Fork], replaced: int | None) -> None:
        """Drop the round's forks, but where the target's version of a step replaces it, the trunk
        takes the cells of that version's fork where it can, so the next round does not read the step
        again."""
        for index, fork in forks.items():
            if index != replaced or not self.trunk.can_adopt:
                self.trunk.drop(fork.branch)
                continue
            self.trunk.adopt(fork.branch)
            read = min(fork.cached, fork.start + len(fork.tokens))  # a fork may read past its step's end
            self.trunk_tokens = self.trunk_tokens[: fork.start] + fork.tokens[: read - fork.start]
            self.trunk.trim(read)

    def _target_steps(
        self, context: list[int], drafted: list[Step], rooms: list[int], k: int, sampler: Sampler, stats: SpecStats
    ) -> tuple[list[Step], dict[int, Fork]]:
        """The target's version of each drafted step, from context and the drafted steps before it:
        one pass over them all, then a fork a step that parts from the target's, decoding together
        -> the steps, and the forks by step (their branches still held)."""
        start = self.clock()
        trunk = self.trunk
        cached = min(common_prefix_length(self.trunk_tokens, context), len(context) - 1)  # a token left to read
        trunk.trim(cached)
        draft = [token for step in drafted for token in step.tokens]
        predicted = trunk.forward(context[cached:] + draft).argmax(dim=-1).tolist()
        self.trunk_tokens = context + draft
        stats.num_verifications += 1
        stats.num_drafts += 1
        stats.num_draft_tokens += len(draft)
        written: list[Step | None] = []
        forks: list[Fork] = []
        offset = len(context)  # where the step begins in the trunk
        for index, (step, room) in enumerate(zip(drafted, rooms)):
            rows = predicted[offset - cached - 1 : offset - cached - 1 + len(step.tokens)]  # the target's choices
            agreed = next((i for i, (a, b) in enumerate(zip(step.tokens, rows)) if a != b), len(step.tokens))
            stats.num_accepted_tokens += agreed
            if agreed == len(step.tokens):
                written.append(step)
            else:
                tokens = step.tokens[:agreed] + [rows[agreed]]
                ending = self._ending(tokens, room)
                written.append(None if ending is None else Step(tokens, ending))
                if ending is None:
                    prediction = PredictionDrafter()
                    prediction.begin([], step.tokens)
                    branch = trunk.fork(offset + agreed)
                    forks.append(Fork(index, offset, branch, offset + agreed, tokens, room, prediction))
            offset += len(step.tokens)
        every = {fork.index: fork for fork in forks}
        while forks:
            forks = self._fork_round(forks, written, k, sampler, stats)
        stats.target_s += self.clock() - start
        return written, every

    def _fork_round(
        self, forks: list[Fork], written: list[Step | None], k: int, sampler: Sampler, stats: SpecStats
    ) -> list[Fork]:
        """One pass of every fork side by side, each verifying up to k tokens of what its drafted step
        says next (a prediction drafter finds its place in the step again after the fork parted from
        it) -> the forks going on; a fork whose step ends writes it into written and stops."""
        trunk = self.trunk
        attempts = []
        for fork in forks:
            asked = self.draft_length.budget(PREDICTION, min(k, fork.room - len(fork.tokens)), True)
            proposed = fork.prediction.propose(fork.tokens, asked, sampler)  # empty when asked is 0
            kept = proposed.truncated(self.draft_length.keep(PREDICTION, proposed))
            attempts.append(Attempt(PREDICTION, kept, proposed, asked, draft_s=0.0))
        drafts = [attempt.draft.tokens.tolist() for attempt in attempts]
        fed = [[fork.tokens[-1], *draft] for fork, draft in zip(forks, drafts)]
        logits = trunk.forward_branches([fork.branch for fork in forks], fed)
        stats.num_verifications += 1
        going = []
        for fork, attempt, draft, rows in zip(forks, attempts, drafts, logits):
            chosen = rows.argmax(dim=-1).tolist()
            accepted = common_prefix_length(draft, chosen)
            emitted = draft[:accepted] + [chosen[accepted]]
            stats.num_draft_tokens += len(draft)
            stats.num_accepted_tokens += accepted
            fork.cached += 1 + accepted  # the token fed last and the accepted draft; the rest is dropped
            trunk.trim_branch(fork.branch, fork.cached)
            self.draft_length.observe(attempt, Verdict(accepted, emitted))
            for token in emitted:
                fork.tokens.append(token)
                if (ending := self._ending(fork.tokens, fork.room)) is not None:
                    written[fork.index] = Step(fork.tokens, ending)
                    break
            else:
                going.append(fork)
        return going

    def _ending(self, tokens: list[int], room: int) -> str | None:
        """How a step of these tokens ends, or None while it goes on."""
        if tokens and tokens[-1] in self.eos_token_ids:
            return "eos"
        if self.config.delimiter in self.tokenizer.decode(tokens).lstrip():
            return "step"
        return "length" if len(tokens) >= room else None

    def _drafter_step(self, context: list[int], room: int, sampler: Sampler, stats: SpecStats) -> Step:
        """The drafter's next step, a token a forward on its own cache."""
        start = self.clock()
        tokens: list[int] = []
        while (ending := self._ending(tokens, room)) is None:
            tokens.append(int(self.drafter.propose(context + tokens, 1, sampler).tokens[0]))
        stats.draft_s += self.clock() - start
        stats.num_draft_steps += 1
        return Step(tokens, ending)

    def _target_step(
        self, context: list[int], drafted: Step, room: int, config: GenerationConfig, index: int, stats: SpecStats
    ) -> Step:
        """The target's own next step, by speculative decoding with the drafter's step as the draft
        (exact rejection sampling when sampling: the draft's q is one-hot); index: the step's number,
        which gives each step's draws a seed of their own."""
        step_stats = SpecStats()
        tokens: list[int] = []
        step_config = GenerationConfig(
            max_new_tokens=room,
            num_speculative_tokens=config.num_speculative_tokens,
            sampling=replace(config.sampling, seed=config.sampling.seed + index),
        )
        generation = self.engine.generate(context, step_config, step_stats, drafted.tokens)
        try:
            for token in generation:
                tokens.append(token)
                if (ending := self._ending(tokens, room)) is not None:
                    break
            else:
                ending = self._ending(tokens, room) or "length"  # the context is full
        finally:
            generation.close()
        stats.merge_rounds(step_stats)
        return Step(tokens, ending)

    def _judge(self, drafted: Step, written: Step, stats: SpecStats) -> bool:
        """Whether the drafter's step stands: equal to the target's, or judged aligned with it. A step
        that ends otherwise than the target's (one ends the answer, the other goes on) never does."""
        if drafted.tokens == written.tokens:
            stats.num_accepted_steps += 1
            stats.num_identical_steps += 1
            return True
        if drafted.ending != written.ending:
            return False
        start = self.clock()
        drafted_text, written_text = self.tokenizer.decode(drafted.tokens), self.tokenizer.decode(written.tokens)
        aligned = (not self.config.same_numbers or numbers_in(drafted_text) == numbers_in(written_text)) and (
            " ".join(drafted_text.split()).lower() == " ".join(written_text.split()).lower()
            or self.judge.aligned(drafted_text, written_text)
        )
        stats.judge_s += self.clock() - start
        stats.num_accepted_steps += aligned
        return aligned

    def _teach(self, context: list[int], drafted: Step, written: Step, accepted: bool, stats: SpecStats) -> None:
        if not self.learners:
            return
        start = self.clock()
        step = JudgedStep(
            request=self.requests,
            prefix=torch.tensor(context),
            drafted=torch.tensor(drafted.tokens, dtype=torch.long),
            target=torch.tensor(written.tokens, dtype=torch.long),
            accepted=accepted,
        )
        for learner in self.learners:
            learner.observe_step(step)
        stats.learn_s += self.clock() - start
