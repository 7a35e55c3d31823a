"""A bounded buffer of what verification told: the learners' training data.

Rounds arrive as RoundFeedback; the buffer keeps their rows (one per verified context position that
has the target's next-token distribution) in context order, so that consecutive rows of one request
form a trace a drafter can be trained on as a sequence. The oldest rows go first when it is full.
It also keeps the token ids of every request that still has rows, so that a trace comes with the
context before it (a small LM reads it; white-box drafters read the target's features instead).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from evospec.learnable import Trace
from evospec.types import RoundFeedback


@dataclass(frozen=True)
class _Row:
    request: int
    position: int
    token: int
    hidden: torch.Tensor | None  # [H]
    top_ids: torch.Tensor  # [K]
    top_probs: torch.Tensor  # [K]
    rejected: bool


class FeedbackBuffer:
    """The newest `capacity` rows of feedback; `recent(n)` gives them back as traces."""

    def __init__(self, capacity: int) -> None:
        if capacity < 2:
            raise ValueError(f"a feedback buffer needs room for at least 2 rows, got {capacity}")
        self.capacity = capacity
        self._rows: deque[_Row] = deque(maxlen=capacity)
        self._request_tokens: dict[int, list[int]] = {}  # by request: its token ids so far
        self.rows_added = 0  # ever, including the ones dropped since

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, feedback: RoundFeedback) -> None:
        """Keep the rows of one round (the last rows of its tokens: those the target's distribution came with)."""
        rows = feedback.top_ids.shape[0]
        first = feedback.tokens.numel() - rows
        tokens = self._request_tokens.setdefault(feedback.request, [])
        if feedback.position > len(tokens):  # else traces would come with a wrong context before them
            raise ValueError(
                f"feedback of request {feedback.request} starts at position {feedback.position}, but only its first "
                f"{len(tokens)} tokens were seen: a request's feedback must start with its prefill"
            )
        del tokens[feedback.position :]
        tokens.extend(feedback.tokens.tolist())
        for row in range(rows):
            self._rows.append(
                _Row(
                    request=feedback.request,
                    position=feedback.position + first + row,
                    token=int(feedback.tokens[first + row]),
                    hidden=None if feedback.hidden is None else feedback.hidden[row].detach().clone(),
                    top_ids=feedback.top_ids[row].clone(),
                    top_probs=feedback.top_probs[row].clone(),
                    rejected=feedback.rejected and row == rows - 1,
                )
            )
        self.rows_added += rows
        oldest = self._rows[0].request
        for request in [request for request in self._request_tokens if request < oldest]:
            del self._request_tokens[request]

    def recent(self, rows: int) -> list[Trace]:
        """The newest `rows` rows (at most), cut into traces of consecutive positions of one request."""
        picked = list(self._rows)[-rows:]
        traces, start = [], 0
        for i in range(1, len(picked) + 1):
            if i == len(picked) or (picked[i].request, picked[i].position) != (
                picked[i - 1].request,
                picked[i - 1].position + 1,
            ):
                rows_of_trace = picked[start:i]
                first = rows_of_trace[0]
                traces.append(_trace(rows_of_trace, self._request_tokens[first.request][: first.position]))
                start = i
        return traces

    def nbytes(self) -> int:
        """Memory held by the rows' tensors (the requests' token ids, a few bytes per row, aside)."""
        return sum(
            row.top_ids.nbytes + row.top_probs.nbytes + (row.hidden.nbytes if row.hidden is not None else 0)
            for row in self._rows
        )


def window_spans(start: int, end: int, size: int) -> list[tuple[int, int]]:
    """Rows start..end-1 cut into (start, stop) spans of at most `size` >= 2 rows. Consecutive spans
    share a row: a trace's first row has nothing to predict, so no row is lost."""
    spans = []
    while True:
        stop = min(start + size, end)
        spans.append((start, stop))
        if stop == end:
            return spans
        start = stop - 1


def packed(items: list, lengths: list[int], limit: int) -> list[list]:
    """items, in order, packed into batches whose lengths add up to at most `limit` (an item longer
    than that gets a batch of its own)."""
    batches, filled = [], 0
    for item, length in zip(items, lengths):
        if not batches or filled + length > limit:
            batches.append([])
            filled = 0
        batches[-1].append(item)
        filled += length
    return batches


def trace_of(feedback: RoundFeedback, rows: int) -> Trace:
    """The last `rows` rows of one round's feedback as a trace of their own, without a buffer."""
    first = feedback.tokens.numel() - rows
    if not 0 < rows <= feedback.top_ids.shape[0]:
        raise ValueError(f"the feedback has {feedback.top_ids.shape[0]} rows, not {rows}")
    return Trace(
        tokens=feedback.tokens[first:],
        prefix=feedback.tokens[:first],
        hidden=None if feedback.hidden is None else feedback.hidden[-rows:].float(),
        top_ids=feedback.top_ids[-rows:],
        top_probs=feedback.top_probs[-rows:],
        rejected=torch.zeros(rows, dtype=torch.bool),
    )


def _trace(rows: list[_Row], prefix: list[int]) -> Trace:
    has_hidden = rows[0].hidden is not None
    return Trace(
        tokens=torch.tensor([row.token for row in rows], dtype=torch.long),
        prefix=torch.tensor(prefix, dtype=torch.long),
        hidden=torch.stack([row.hidden for row in rows]) if has_hidden else None,
        top_ids=torch.stack([row.top_ids for row in rows]),
        top_probs=torch.stack([row.top_probs for row in rows]),
        rejected=torch.tensor([row.rejected for row in rows], dtype=torch.bool),
    )
