"""Values passed between the engine, the drafters, the draft-length policy, the selectors and the learners."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class Draft:
    """What a drafter proposes for one round."""

    tokens: torch.Tensor  # [m] int64, m <= k: drafted token ids, in order
    probs: torch.Tensor | None  # [m, V] float32: q at each drafted position; None: q is one-hot on tokens
    label: str = ""  # what kind of draft this is (e.g. an n-gram match length); acceptance is tracked per label

    @property
    def size(self) -> int:
        return int(self.tokens.numel())

    def truncated(self, size: int) -> Draft:
        """The first `size` tokens of this draft (q unchanged at each kept position)."""
        if size >= self.size:
            return self
        probs = None if self.probs is None else self.probs[:size]
        return Draft(self.tokens[:size], probs, self.label)


@dataclass(frozen=True)
class Verdict:
    """The target's judgement of one draft.

    emitted = tokens[:num_accepted] of the draft + one token from the target: the recovered token at
    the first rejection, or the bonus token after full acceptance.
    """

    num_accepted: int  # accepted draft tokens, 0..m
    emitted: list[int]  # num_accepted + 1 token ids to append to the context
    target_argmax: torch.Tensor | None = None  # [m + 1] argmax p at each position; greedy verification only


@dataclass(frozen=True)
class RoundTime:
    """Where a round's seconds went."""

    draft_s: float  # the drafter's propose, catch-up on unseen tokens included
    verify_s: float  # the target's pass over the pending token and the draft
    step_s: float  # a plain decoding step of the target on this machine, T(1) (0 when not measured)


@dataclass(frozen=True)
class Attempt:
    """One drafter's turn in a round: what it was asked for, what it drafted and what is verified."""

    drafter: str  # the name of the drafter the selector picked
    draft: Draft  # what will be verified: a prefix of proposed (cut short by the draft-length policy)
    proposed: Draft  # what the drafter drafted
    asked: int  # tokens asked of the drafter; 0 when the policy chose a plain step
    draft_s: float  # seconds in the drafter's propose, catch-up on unseen tokens included
    # A full-information selector's view: what each other cheap awake drafter would have drafted
    # this round, and the tokens it was asked for (never verified; scored once the output covers it).
    counterfactuals: tuple[tuple[str, Draft, int], ...] = ()
    position: int = 0  # the context's length when the round drafted: where every draft of it starts


@dataclass(frozen=True)
class Offer:
    """One cheap arm's draft of a round as a full-information selector sees it, before the pick."""

    label: str  # the draft's kind (Draft.label), the context a contextual selector keys its estimates by
    asked: int  # tokens the arm was asked for
    size: int  # tokens of it that would be verified (what the draft-length policy keeps)
    verify_steps: float | None = None  # T(1 + size) / T(1): its verification in one-token steps; None without T(n)


@dataclass(frozen=True)
class ArmScore:
    """What one cheap arm's draft of a round achieved, for a full-information selector (Selector.observe)."""

    reward: float  # block efficiency: tokens of the draft the target accepts / tokens asked
    label: str  # the draft's kind (Draft.label), the context a contextual selector keys its estimates by


@dataclass(frozen=True)
class RoundFeedback:
    """What one target pass told about the tokens it verified: the learners' and white-box drafters' signal.

    The rows follow the context: `tokens` are the verified input tokens of the pass (the prompt at
    the prefill; the pending token and the accepted drafts after), each with the target's final hidden
    state and its next-token distribution (top K ids and probabilities, not the full vocabulary row).
    At the prefill only the last prompt tokens have them: the last one, or the last `prompt_rows` of
    them when a learner learns from the prompt.
    """

    request: int  # which request of the stream this round belongs to
    position: int  # context index of tokens[0]
    drafter: str | None  # who drafted this round; None for the prefill and plain steps
    tokens: torch.Tensor  # [n] int64 verified input ids, in context order
    drafted: torch.Tensor  # [m] int64 what was drafted this round
    num_accepted: int  # of drafted
    hidden: torch.Tensor | None  # [r, H] float32 target hidden states at the last r tokens; None unless asked for
    top_ids: torch.Tensor  # [r, K] int64 the target's most likely next tokens after each of the last r tokens
    top_probs: torch.Tensor  # [r, K] float32 their probabilities (temperature 1)

    def last_rows(self, rows: int) -> RoundFeedback:
        """The same round with the target's view of only its last `rows` rows."""
        return replace(
            self,
            hidden=None if self.hidden is None else self.hidden[-rows:],
            top_ids=self.top_ids[-rows:],
            top_probs=self.top_probs[-rows:],
        )

    def copied(self) -> RoundFeedback:
        """The same round in tensors of its own, to keep past the round (a backend may reuse the buffers
        that its tensors view)."""
        return replace(
            self,
            tokens=self.tokens.clone(),
            drafted=self.drafted.clone(),
            hidden=None if self.hidden is None else self.hidden.clone(),
            top_ids=self.top_ids.clone(),
            top_probs=self.top_probs.clone(),
        )

    @property
    def prefill(self) -> bool:
        """Whether this is the prefill's feedback: the prompt, from context position 0, nothing drafted."""
        return self.position == 0 and self.drafter is None

    @property
    def rejected(self) -> bool:
        """Whether the target rejected a drafted token this round (at the last row)."""
        return self.num_accepted < self.drafted.numel()


@dataclass(frozen=True)
class JudgedStep:
    """One step of step-level speculation (evospec.reasoning): the drafter's step, the target's own
    step from the same prefix, and the judge's verdict. A rejected step is a preference pair: the
    target's step is preferred to the drafter's (what Online-LR learns from)."""

    request: int  # which request of the stream this step belongs to
    prefix: torch.Tensor  # [P] int64 the context both steps follow, prompt included
    drafted: torch.Tensor  # [d] int64 the drafter's step
    target: torch.Tensor  # [t] int64 the target's step
    accepted: bool  # the judge found the drafter's step aligned with the target's: it is kept

    @property
    def identical(self) -> bool:
        return torch.equal(self.drafted, self.target)
