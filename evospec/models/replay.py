"""A recorded target: the replay backend of `evospec replay`.

A greedy target's part in speculative decoding is to say, at every verified position, which token
it prefers (and, to learners and white-box drafters, its top-K next tokens and final hidden state
there). Every verified position lies on the target's own answer, so a recording of the answer says
all of it: the engine, drafters, learners and selectors run unchanged over a recorded target and
make every round's draft, verdict, reward, learning step and selector pull that serving would.

Each pass is charged the seconds of a cost profile on a clock that the engine reads (the real
seconds the replay spends building the pass are left out). The rows a learner reads (top-K and
hidden states) are cached on disk beside the answers: a collection writes them as it decodes, and
where they are missing, one pass of the real target over prompt + answer makes them when asked for.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from evospec.config import LoadConfig
from evospec.cost import ForwardCost
from evospec.errors import EvospecError
from evospec.files import save_tensors_atomically
from evospec.models.backend import LoadedModel, TokenMatrices
from evospec.target import FEEDBACK_TOP_K, LanguageModel, PromptPass, full_pass

ROWS_PER_PASS = 256  # tokens per forward when the real target recomputes a request's rows


@dataclass(frozen=True)
class Answer:
    """One recorded request: the prompt and the target's greedy answer to it."""

    prompt_ids: tuple[int, ...]
    answer_ids: tuple[int, ...]

    @property
    def tokens(self) -> list[int]:
        return [*self.prompt_ids, *self.answer_ids]


@dataclass(frozen=True)
class Rows:
    """What the target says at each position of prompt + answer: its top-K next tokens, and (when
    asked for) its final hidden states."""

    top_ids: torch.Tensor  # [T, K] int64
    top_probs: torch.Tensor  # [T, K] float32
    hidden: torch.Tensor | None = None  # [T, H] float32


def save_rows(rows: Rows, path: Path) -> None:
    """Cache an answer's rows (hidden states included, when they are there) at path, atomically."""
    tensors = {"top_ids": rows.top_ids, "top_probs": rows.top_probs}
    if rows.hidden is not None:
        tensors["hidden"] = rows.hidden
    path.parent.mkdir(parents=True, exist_ok=True)
    save_tensors_atomically(tensors, path, {})


def load_rows(path: Path, length: int) -> Rows | None:
    """The rows cached at path for an answer of `length` tokens (prompt + answer), hidden states included
    where the file has them; None if missing, damaged or of another length."""
    if not path.is_file():
        return None
    try:
        tensors = load_file(path)
    except (SafetensorError, OSError):
        return None
    if tensors["top_ids"].shape[0] != length:
        return None
    return Rows(tensors["top_ids"], tensors["top_probs"], tensors.get("hidden"))


def pass_rows(lm: LanguageModel, ids: Sequence[int], rows_per_pass: int, path: Path | None) -> Rows:
    """The rows of one pass of lm over ids (full_pass, hidden states included), cached at path if given."""
    hidden_states, top_ids, top_probs = full_pass(lm, ids, FEEDBACK_TOP_K, rows_per_pass)
    rows = Rows(top_ids, top_probs, hidden_states)
    if path is not None:
        save_rows(rows, path)
    return rows


class ReplayClock:
    """Seconds as the engine reads them in a replay: real time, less what the replay spends building
    passes, plus the modeled seconds of the recorded target's passes."""

    def __init__(self) -> None:
        self.modeled_s = 0.0
        self.excluded_s = 0.0

    def __call__(self) -> float:
        return time.perf_counter() - self.excluded_s + self.modeled_s


class Recording:
    """The recorded answers of a target, the cost profile its passes are charged, and the real
    target (when loaded) that recomputes the rows learners and white-box drafters read.

    rows_paths: where each answer's top-K rows are cached (None: nowhere); rows: whether passes carry
    the recorded top-K (learners read it) or only the answer's next token (enough for greedy
    verification, and no pass of the real target is needed).
    """

    def __init__(
        self,
        answers: Sequence[Answer],
        vocab_size: int,
        cost: ForwardCost,
        real_target: LoadedModel | None = None,
        rows_paths: Sequence[Path | None] | None = None,
    ) -> None:
        self.by_prompt = {answer.prompt_ids: index for index, answer in enumerate(answers)}
        if len(self.by_prompt) != len(answers):
            raise EvospecError("a recording holds each prompt once: two answers share a prompt")
        self.answers = list(answers)
        self.vocab_size = vocab_size
        self.cost = cost
        self.real_target = real_target
        self.rows_paths = list(rows_paths) if rows_paths is not None else [None] * len(self.answers)
        if len(self.rows_paths) != len(self.answers):
            raise EvospecError("a recording needs one rows path (or None) per answer")
        self.rows = False
        self.clock = ReplayClock()
        self.reordered_rows = 0  # positions whose recorded top-1 was not the answer's token (see _logits)
        self._current: tuple[int, Rows] | None = None  # (index, rows) of the last request
        self._real_lm: LanguageModel | None = None

    def index_of(self, prompt_ids: Sequence[int]) -> int:
        index = self.by_prompt.get(tuple(prompt_ids))
        if index is None:
            raise EvospecError("the replay was asked for a prompt it has no recorded answer to")
        return index

    def rows_of(self, index: int, hidden: bool) -> Rows:
        """The rows of answer `index`, with hidden states if asked for: from the cache, or one pass of the target."""
        rows = self._current[1] if self._current is not None and self._current[0] == index else None
        if rows is None or (hidden and rows.hidden is None):
            rows = self._cached_rows(index)
        if rows is None or (hidden and rows.hidden is None):
            rows = self._target_pass(index)
        self._current = (index, rows)
        return rows

    def _cached_rows(self, index: int) -> Rows | None:
        """The rows cached for answer `index`, hidden states included where the file has them (None if
        missing or damaged)."""
        path = self.rows_paths[index]
        return None if path is None else load_rows(path, len(self.answers[index].tokens))

    def _target_pass(self, index: int) -> Rows:
        """One pass of the real target (fresh cache) over prompt + answer, in pieces; its rows are cached."""
        if self.real_target is None:
            raise EvospecError(
                "this replay needs the target's rows (a learner or a white-box drafter reads them) "
                "and has no target to compute them: give the replay the target model"
            )
        if self._real_lm is None:
            self._real_lm = self.real_target.new_lm(hidden_states=True)
        return pass_rows(self._real_lm, self.answers[index].tokens, ROWS_PER_PASS, self.rows_paths[index])

    def logits(self, index: int, positions: Sequence[int]) -> torch.Tensor:
        """Logits [n, V] at these context positions of answer `index`, whose argmax is the answer's next token.

        With rows, they reproduce the recorded top-K probabilities (the rest of the mass spread
        evenly over the other tokens); where the recorded top-1 is not the answer's token (a
        backend whose one-token steps and long forwards round apart), the answer's token is moved to
        the top. Past the recorded answer (a draft running through its end of generation) nothing
        was recorded; those rows are uniform.
        """
        tokens = self.answers[index].tokens
        inside = [position for position in positions if position + 1 < len(tokens)]
        logits = torch.zeros(len(positions), self.vocab_size)
        if not inside:
            return logits
        rows_at = torch.arange(len(inside))
        next_ids = torch.tensor([tokens[position + 1] for position in inside])
        if not self.rows:
            logits[: len(inside)] = -1e4
            logits[rows_at, next_ids] = 0.0
            return logits
        rows = self.rows_of(index, hidden=False)
        ids, probs = rows.top_ids[inside], rows.top_probs[inside]
        rest = (1.0 - probs.sum(dim=-1)).clamp_min(1e-12) / max(self.vocab_size - ids.shape[1], 1)
        recorded = logits[: len(inside)]  # a view: the rows are written in place
        recorded.copy_(rest.log()[:, None].expand_as(recorded))
        recorded.scatter_(1, ids, probs.log())
        below = ids[:, 0] != next_ids
        if bool(below.any()):  # the answer's token just above the recorded top-1
            self.reordered_rows += int(below.sum())
            recorded[rows_at[below], next_ids[below]] = recorded[below].max(dim=-1).values + 1e-4
        return logits

    def hidden(self, index: int, positions: Sequence[int]) -> torch.Tensor:
        """The target's final hidden states [n, H] at these positions of answer `index` (zeros past its end)."""
        states = self.rows_of(index, hidden=True).hidden
        rows = torch.zeros(len(positions), states.shape[1])
        inside = [i for i, position in enumerate(positions) if position < states.shape[0]]
        rows[inside] = states[[positions[i] for i in inside]]
        return rows


class ReplayLM:
    """A LanguageModel that replays a recording: the prefill names the request by its prompt, and each
    later pass is charged the profile's T(n) on the recording's clock."""

    def __init__(self, recording: Recording, hidden_states: bool) -> None:
        self.recording = recording
        self.hidden_states = hidden_states
        self.length = 0
        self.request: int | None = None
        self.passes: Counter[int] = Counter()  # tokens per pass after a prefill -> passes: any profile costs them

    def reset(self) -> None:
        self.length, self.request = 0, None

    def forward(self, token_ids: Sequence[int], num_logits: int = 0) -> torch.Tensor:
        return self._pass(token_ids, num_logits, hidden=False)[0]

    def forward_with_hidden(self, token_ids: Sequence[int], num_logits: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.hidden_states:
            raise EvospecError("forward_with_hidden on a replayed target made without hidden_states=True")
        return self._pass(token_ids, num_logits, hidden=True)

    def forward_prompt(self, token_ids: Sequence[int], top_k: int, rows: int) -> PromptPass:
        if top_k != FEEDBACK_TOP_K:
            raise EvospecError(f"a recording keeps the top {FEEDBACK_TOP_K} next tokens, asked for {top_k}")
        logits, _ = self._pass(token_ids, 1, hidden=False)
        start = time.perf_counter()
        positions = list(range(max(0, len(token_ids) - rows), len(token_ids)))
        recorded = self.recording.rows_of(self.request, hidden=True)
        prompt = PromptPass(
            logits, recorded.hidden[positions], recorded.top_ids[positions], recorded.top_probs[positions]
        )
        self.recording.clock.excluded_s += time.perf_counter() - start
        return prompt

    def trim(self, length: int) -> None:
        self.length = min(self.length, length)

    def _pass(self, token_ids: Sequence[int], num_logits: int, hidden: bool) -> tuple[torch.Tensor, torch.Tensor]:
        start = time.perf_counter()
        recording = self.recording
        if self.length == 0:  # the prefill: the prompt names the request; its cost is left out (the same for all)
            self.request = recording.index_of(token_ids)
        else:
            recording.clock.modeled_s += recording.cost.of(len(token_ids))
            self.passes[len(token_ids)] += 1
        positions = list(range(self.length, self.length + len(token_ids)))
        self.length += len(token_ids)
        rows = positions[-num_logits:] if num_logits else positions
        logits = recording.logits(self.request, rows)
        states = recording.hidden(self.request, rows) if hidden else None
        recording.clock.excluded_s += time.perf_counter() - start
        return logits, states


class ReplayBackend:
    """The backend of recorded targets. It loads nothing by name: `replayed` makes its models from a
    recording; the real target's backend answers for its token matrices and its threads."""

    name = "replay"
    dtypes: tuple[str, ...] = ()
    baselines: tuple[str, ...] = ()  # a recording has no generation loop of its own

    def default_for(self, spec: str) -> bool:
        return False

    def can_run(self, spec: str) -> bool:
        return False

    def load(self, spec: str, config: LoadConfig) -> LoadedModel:
        raise EvospecError("a replayed target is made from recorded answers (evospec replay), not loaded by name")

    def new_lm(self, model: Recording, hidden_states: bool, branches: int) -> LanguageModel:
        if branches:
            raise EvospecError("a recording holds the target on its own answers only, so its cache cannot branch")
        return ReplayLM(model, hidden_states)

    def token_matrices(self, model: Recording) -> TokenMatrices:
        return self._real(model).token_matrices()

    def weights_format(self, model: Recording) -> str:
        return "replayed"

    def cost_key(self, loaded: LoadedModel) -> str:
        raise EvospecError("a replayed target's forward cost is its profile's, not measured")

    def forward_cost(self, loaded: LoadedModel, max_tokens: int) -> ForwardCost:
        cost = loaded.model.cost
        if cost.max_tokens < max_tokens:
            raise EvospecError(f"the cost profile covers forwards of up to {cost.max_tokens} tokens, not {max_tokens}")
        return cost

    def threads(self, model: Recording) -> int:
        return self._real(model).backend.threads(self._real(model).model) if model.real_target else 0

    def clock(self, model: Recording) -> Callable[[], float]:
        return model.clock

    @staticmethod
    def _real(model: Recording) -> LoadedModel:
        if model.real_target is None:
            raise EvospecError("a white-box drafter reads the target's token matrices: give the replay the target")
        return model.real_target


REPLAY = ReplayBackend()


def replayed(real_target: LoadedModel, recording: Recording) -> LoadedModel:
    """The real target as its recording: the same name, tokenizer, sizes and end tokens."""
    return LoadedModel(
        name=real_target.name,
        model=recording,
        tokenizer=real_target.tokenizer,
        source=real_target.source,
        backend=REPLAY,
        vocab_size=real_target.vocab_size,
        hidden_size=real_target.hidden_size,
        context_length=real_target.context_length,
        eos_token_ids=real_target.eos_token_ids,
    )
