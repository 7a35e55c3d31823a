"""The OpenAI wire format: request bodies (validated strictly), responses, stream chunks and errors."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from fastapi.responses import JSONResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from evospec.drafters.prediction import PREDICTION
from evospec.errors import EvospecError
from evospec.stats import SpecStats


class APIError(Exception):
    """An error answered as OpenAI answers it: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.retry_after_s = retry_after_s  # answered as the Retry-After header: the request may be sent again

    def __reduce__(self):  # pickled whole (a replica's answer crosses processes): its fields, not just the message
        return type(self), (self.status, self.message), self.__dict__

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s is not None else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def as_api_error(error: Exception) -> APIError:
    """What the client is told: a bad request (EvospecError) is a 400; anything else a 500 whose details stay
    in the server's log."""
    if isinstance(error, APIError):
        return error
    if isinstance(error, EvospecError):
        return APIError(400, str(error))
    return APIError(500, "the server failed on this request; its log says why", kind="server_error")


class _Strict(BaseModel):
    # No silent coercion ("5" is not a number); fields that are not ours (user, logprobs, ...) are ignored.
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False  # one more chunk before [DONE], with the usage of the whole request


# OpenAI takes one stop string or a list of up to 4.
Stop = Annotated[
    list[Annotated[str, Field(min_length=1)]],
    Field(max_length=4),
    BeforeValidator(lambda value: [value] if isinstance(value, str) else value),
]


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Prediction(_Strict):
    """OpenAI Predicted Outputs: text the answer is expected to repeat much of (e.g. the code being edited)."""

    type: Literal["content"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class _Request(_Strict):
    """Fields both endpoints take. temperature 0 is greedy; the default 1 is OpenAI's."""

    model: str
    max_tokens: int | None = Field(None, ge=1)  # None: the server's --max-new-tokens
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)  # not OpenAI's (vLLM's): 0 or -1 keeps every token
    seed: int | None = Field(None, ge=0, lt=2**63)  # None: a fresh one per request
    stop: Stop | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Literal[1] = 1  # one choice per request
    prediction: Prediction | None = None
    reasoning_speculation: bool | None = None  # not OpenAI's: step-level speculation; None: the server's default

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class CompletionRequest(_Request):
    prompt: str


class ChatMessage(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # OpenAI's newer name for max_tokens

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


Request = TypeVar("Request", bound=_Request)


def parse_request(kind: type[Request], body: bytes) -> Request:
    """Validate a request body; what is wrong with it becomes a 400 that names the field."""
    try:
        return kind.model_validate_json(body)
    except ValidationError as error:
        problems = error.errors(include_url=False)
        where = [".".join(str(part) for part in problem["loc"]) for problem in problems]
        message = "; ".join(
            f"{loc}: {problem['msg']}" if loc else problem["msg"] for loc, problem in zip(where, problems)
        )
        raise APIError(400, message, param=where[0] or None) from None


def usage(
    prompt_tokens: int, completion_tokens: int, stats: SpecStats, drafter_versions: Mapping[str, int]
) -> dict[str, Any]:
    """OpenAI's token counts, the request's speculative-decoding counters under `spec_decode`, and the
    version of each learning drafter when the request ended under `drafter_versions`.

    Of the prediction's tokens, accepted ones were drafted and accepted; rejected ones were drafted,
    verified and rejected (the target's work the prediction cost)."""
    drafted = stats.drafters.get(PREDICTION)
    accepted = drafted.num_accepted_tokens if drafted else 0
    rejected = drafted.num_draft_tokens - accepted if drafted else 0
    details = {"accepted_prediction_tokens": accepted, "rejected_prediction_tokens": rejected}
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens_details": details,
        "spec_decode": stats.to_dict(),
        "drafter_versions": dict(drafter_versions),
    }


class Reply:
    """Builds the response objects of one request: the full answer, or its stream chunks."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat = chat
        kind = "chatcmpl" if chat else "cmpl"
        self.head = {"id": f"{kind}-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}

    def full(self, text: str, finish_reason: str, usage: dict[str, Any]) -> dict[str, Any]:
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            return {**self.head, "object": "chat.completion", "choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {**self.head, "object": "text_completion", "choices": [choice], "usage": usage}

    def chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False) -> dict[str, Any]:
        """A piece of text (None: none, e.g. with the finish reason); a chat's first chunk names the role."""
        if self.chat:
            delta = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return {**self.head, "object": "chat.completion.chunk", "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return {**self.head, "object": "text_completion", "choices": [choice]}

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        """The last chunk when the client asked for stream_options.include_usage: no choices, the usage."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self.head, "object": kind, "choices": [], "usage": usage}
