"""Speculative-decoding counters, named as vLLM names them."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from evospec.types import Attempt, Draft, Verdict


def add_counters(into: Any, other: Any) -> None:
    """Add other's counters (its int and float fields) to those of into, a dataclass of the same kind."""
    for counter in fields(other):
        value = getattr(other, counter.name)
        if isinstance(value, int | float):
            setattr(into, counter.name, getattr(into, counter.name) + value)


@dataclass
class DrafterStats:
    """One drafter's share of the rounds (an arm of the selector)."""

    pulls: int = 0  # rounds in which the selector picked it
    reward_sum: float = 0.0
    num_drafts: int = 0  # of its rounds, those that drafted at least one token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    emitted: int = 0  # tokens its rounds emitted, accepted drafts plus the target's own
    draft_s: float = 0.0  # in its propose, catch-up on the tokens it did not see included

    def merge(self, other: DrafterStats) -> None:
        add_counters(self, other)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pulls": self.pulls,
            "mean_reward": self.reward_sum / self.pulls if self.pulls else None,
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "tau": self.emitted / self.pulls if self.pulls else None,
            "draft_s": self.draft_s,
        }


@dataclass
class SpecStats:
    """Counters of one or more generations; `merge` adds another's."""

    num_drafts: int = 0  # rounds that drafted at least one token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)  # [position] accepted count
    num_verifications: int = 0  # target forwards, one per round; the prefill is the round of the first token
    new_tokens: int = 0  # tokens emitted to the caller
    prompt_tokens: int = 0
    prefill_s: float = 0.0
    draft_s: float = 0.0  # in drafters' propose (catch-up included)
    target_s: float = 0.0  # in target forwards after the prefill
    learn_s: float = 0.0  # telling white-box drafters and learners what the target said, and learning
    wall_s: float = 0.0  # prefill included
    drafters: dict[str, DrafterStats] = field(default_factory=dict)  # per drafter (selector arm)
    # Step-level speculation (evospec.reasoning): the drafter's steps, those kept, and the judge's seconds.
    num_draft_steps: int = 0
    num_accepted_steps: int = 0
    num_identical_steps: int = 0  # of the kept steps, those that equal the target's token for token
    num_discarded_steps: int = 0  # drafted past a step that did not stand in a lookahead round, never judged
    judge_s: float = 0.0

    def record(self, draft: Draft, verdict: Verdict) -> None:
        self.num_verifications += 1
        if draft.size:
            self.num_drafts += 1
            self.num_draft_tokens += draft.size
            self.num_accepted_tokens += verdict.num_accepted
            self._grow(draft.size)
            for position in range(verdict.num_accepted):
                self.num_accepted_tokens_per_pos[position] += 1

    def record_drafter(self, attempt: Attempt, verdict: Verdict, reward: float) -> None:
        arm = self.drafters.setdefault(attempt.drafter, DrafterStats())
        arm.pulls += 1
        arm.reward_sum += reward
        arm.num_drafts += int(attempt.draft.size > 0)
        arm.num_draft_tokens += attempt.draft.size
        arm.num_accepted_tokens += verdict.num_accepted
        arm.emitted += len(verdict.emitted)
        arm.draft_s += attempt.draft_s
        self.draft_s += attempt.draft_s

    def merge(self, other: SpecStats) -> None:
        add_counters(self, other)
        for name, arm in other.drafters.items():
            self.drafters.setdefault(name, DrafterStats()).merge(arm)
        self._grow(len(other.num_accepted_tokens_per_pos))
        for position, count in enumerate(other.num_accepted_tokens_per_pos):
            self.num_accepted_tokens_per_pos[position] += count

    def merge_rounds(self, other: SpecStats) -> None:
        """Add other's rounds (verifications, drafts, accepted tokens, per drafter) and their seconds,
        its prefill counted as target time, but not its tokens or wall time: those of a generation
        inside this one, whose tokens it may not emit (a step-level speculator's target steps)."""
        tokens = (self.new_tokens, self.prompt_tokens, self.wall_s, self.prefill_s)
        self.merge(other)
        self.new_tokens, self.prompt_tokens, self.wall_s, self.prefill_s = tokens
        self.target_s += other.prefill_s

    def _grow(self, positions: int) -> None:
        missing = positions - len(self.num_accepted_tokens_per_pos)
        self.num_accepted_tokens_per_pos.extend([0] * max(0, missing))

    @property
    def tau(self) -> float:
        """Emitted tokens per target verification, bonus included (1.0 for plain decoding)."""
        return self.new_tokens / self.num_verifications if self.num_verifications else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """vLLM's 1 + accepted / drafts, over rounds that drafted."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens; None when nothing was drafted."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def step_acceptance_rate(self) -> float | None:
        """Kept / judged steps; None without step-level speculation."""
        judged = self.num_draft_steps - self.num_discarded_steps
        return self.num_accepted_steps / judged if judged else None

    @property
    def loop_overhead_us(self) -> float:
        """Microseconds per round spent outside the target, the drafters and the learners: the engine's own cost."""
        rounds = self.num_verifications
        own = self.wall_s - self.prefill_s - self.target_s - self.draft_s - self.learn_s - self.judge_s
        return 1e6 * own / rounds if rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        """New tokens per second outside the prefill: the part of the wall time drafting can change."""
        decode_s = self.wall_s - self.prefill_s
        return self.new_tokens / decode_s if decode_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
            "num_verifications": self.num_verifications,
            "new_tokens": self.new_tokens,
            "prompt_tokens": self.prompt_tokens,
            "tau": self.tau,
            "mean_acceptance_length": self.mean_acceptance_length,
            "acceptance_rate": self.acceptance_rate,
            "prefill_s": self.prefill_s,
            "draft_s": self.draft_s,
            "target_s": self.target_s,
            "learn_s": self.learn_s,
            "loop_overhead_us": self.loop_overhead_us,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "drafters": {name: arm.to_dict() for name, arm in self.drafters.items()},
            **(
                {
                    "num_draft_steps": self.num_draft_steps,
                    "num_accepted_steps": self.num_accepted_steps,
                    "num_identical_steps": self.num_identical_steps,
                    "num_discarded_steps": self.num_discarded_steps,
                    "step_acceptance_rate": self.step_acceptance_rate,
                    "judge_s": self.judge_s,
                }
                if self.num_draft_steps
                else {}
            ),
        }
