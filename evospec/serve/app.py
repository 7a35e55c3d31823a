"""The OpenAI-compatible app: routes, API key, limits and errors, in front of the engines that generate:
one Worker in this process (create_app), or engine replicas (evospec.serve.cluster, through api_app).

Routes: POST /v1/completions and /v1/chat/completions (JSON, or SSE with `stream`), GET /v1/models,
/health (200 once the model is loaded, 503 before) and /metrics (Prometheus text).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, Protocol

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from prometheus_client.metrics_core import Metric
from starlette.exceptions import HTTPException

from evospec.config import GenerationConfig, SamplingConfig
from evospec.errors import EvospecError
from evospec.generation import Prompt
from evospec.serve.config import ServerConfig
from evospec.serve.metrics import LearningMetrics, Metrics, exposition, request_errors
from evospec.serve.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    Reply,
    as_api_error,
    parse_request,
)
from evospec.serve.worker import DurableState, Job, Served, Worker

log = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.25  # how often a request waiting for its answer checks that its client is still there


class ClientLeft(Exception):
    """The client disconnected before its answer was ready."""


class Engines(Protocol):
    """Where the app's jobs run: a Worker of this process, or engine replicas."""

    def start(self) -> None:
        """The app starts listening."""

    async def stop(self) -> None:
        """The app stops: finish what was submitted."""

    async def status(self) -> str:
        """ok (serving), loading or failed (to load): what /health says."""

    def submit(self, job: Job) -> None:
        """Run the job, answering on its events; raises an APIError when it cannot take it."""

    async def metric_families(self) -> list[Metric]:
        """Their metrics, collected."""


class LocalEngine:
    """The Worker of this process as the app's Engines, its metrics in registry."""

    def __init__(self, worker: Worker, registry: CollectorRegistry) -> None:
        self.worker = worker
        self.registry = registry

    def start(self) -> None:
        self.worker.start()

    async def stop(self) -> None:
        await asyncio.to_thread(self.worker.stop)

    async def status(self) -> str:
        return self.worker.status

    def submit(self, job: Job) -> None:
        self.worker.submit(job)

    async def metric_families(self) -> list[Metric]:
        return list(self.registry.collect())


def check_defaults(config: ServerConfig, defaults: GenerationConfig) -> None:
    """Raise if the defaults ask for more than the server's limits allow."""
    if defaults.max_new_tokens > config.max_tokens_limit:
        raise EvospecError(
            f"max-new-tokens ({defaults.max_new_tokens}) exceeds max-tokens-limit ({config.max_tokens_limit})"
        )


def create_app(
    config: ServerConfig,
    model_name: str,
    load: Callable[[], Served],
    defaults: GenerationConfig,
    on_load_error: Callable[[BaseException], None] = lambda error: None,
) -> FastAPI:
    """An app serving what `load` returns (called on the worker thread once the app starts) as model
    `model_name`, its learned state kept as config says. defaults: the draft length, and max_new_tokens
    for requests without max_tokens."""
    registry = CollectorRegistry()
    worker = Worker(load, config, Metrics(registry), DurableState(config, LearningMetrics(registry)), on_load_error)
    return api_app(config, model_name, LocalEngine(worker, registry), defaults)


def api_app(config: ServerConfig, model_name: str, engines: Engines, defaults: GenerationConfig) -> FastAPI:
    """The OpenAI-compatible app in front of engines, as model `model_name` (defaults: as create_app's)."""
    check_defaults(config, defaults)
    registry = CollectorRegistry()
    errors = request_errors(registry)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engines.start()
        yield
        await engines.stop()

    app = FastAPI(title="evospec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)

    def answer_error(request: Request, error: Exception) -> JSONResponse:
        answer = as_api_error(error)
        errors.labels(str(answer.status)).inc()
        return answer.response()

    def answer_http_error(request: Request, error: HTTPException) -> JSONResponse:  # 404, 405 from routing
        return answer_error(request, APIError(error.status_code, str(error.detail)))

    for kind in (APIError, EvospecError, Exception):
        app.add_exception_handler(kind, answer_error)
    app.add_exception_handler(HTTPException, answer_http_error)

    def authorize(request: Request) -> None:
        sent = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(sent, f"Bearer {config.api_key}".encode()):  # in constant time
            raise APIError(
                401, "missing or wrong API key; send the header 'Authorization: Bearer <key>'", code="invalid_api_key"
            )

    api = APIRouter(dependencies=[Depends(authorize)] if config.api_key else [])

    @app.get("/health")
    async def health() -> JSONResponse:
        status = await engines.status()
        return JSONResponse({"status": status}, status_code=200 if status == "ok" else 503)

    @api.get("/metrics")
    async def prometheus() -> Response:
        families = [*registry.collect(), *await engines.metric_families()]
        return Response(exposition(families), media_type=CONTENT_TYPE_LATEST)

    @api.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": started, "owned_by": "evospec"}
        return {"object": "list", "data": [card]}

    @api.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = parse_request(CompletionRequest, await read_body(request, config.max_body_bytes))
        return await generate(request, body, body.prompt, chat=False)

    @api.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = parse_request(ChatCompletionRequest, await read_body(request, config.max_body_bytes))
        return await generate(request, body, [message.model_dump() for message in body.messages], chat=True)

    async def generate(
        request: Request, body: CompletionRequest | ChatCompletionRequest, prompt: Prompt, chat: bool
    ) -> Response:
        if body.model != model_name:
            raise APIError(
                404,
                f"the model '{body.model}' does not exist; this server serves '{model_name}'",
                param="model",
                code="model_not_found",
            )
        prediction = body.prediction.text() if body.prediction else None
        job = Job(prompt, chat, generation_config(body), prediction, asyncio.get_running_loop())
        engines.submit(job)
        reply = Reply(chat, model_name)
        try:
            kind, value = await next_event(job, request)
            if kind == "error":
                raise value
            if body.stream:  # the answer is 200 from here on: later errors go into the stream
                include_usage = bool(body.stream_options and body.stream_options.include_usage)
                return StreamingResponse(
                    sse(job, (kind, value), reply, include_usage),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache"},
                )
            while kind == "piece":
                kind, value = await next_event(job, request)
        except ClientLeft:
            job.cancel()
            return Response(status_code=499)  # nobody reads it; nginx's code for "client closed request"
        except BaseException:
            job.cancel()
            raise
        if kind == "error":
            raise value
        return JSONResponse(reply.full(value.text, value.finish_reason, value.usage))

    def generation_config(body: CompletionRequest | ChatCompletionRequest) -> GenerationConfig:
        max_tokens = body.requested_max_tokens() or defaults.max_new_tokens
        if max_tokens > config.max_tokens_limit:
            raise APIError(
                400,
                f"max_tokens is {max_tokens}; this server allows at most {config.max_tokens_limit}",
                param="max_tokens",
            )
        seed = body.seed if body.seed is not None else secrets.randbits(63)
        sampling = SamplingConfig(temperature=body.temperature, top_k=max(body.top_k, 0), top_p=body.top_p, seed=seed)
        reasoning = defaults.reasoning_speculation if body.reasoning_speculation is None else body.reasoning_speculation
        return replace(
            defaults,
            max_new_tokens=max_tokens,
            stop=tuple(body.stop or ()),
            sampling=sampling,
            reasoning_speculation=reasoning,
        )

    app.include_router(api)
    return app


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with a 413 once it is known to exceed `limit` bytes."""
    too_large = APIError(413, f"the request body exceeds {limit} bytes", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)


async def next_event(job: Job, request: Request) -> tuple[str, Any]:
    """The job's next event, waiting as long as it takes while the client stays connected."""
    while True:
        try:
            return await asyncio.wait_for(job.events.get(), DISCONNECT_POLL_S)
        except TimeoutError:
            if await request.is_disconnected():
                raise ClientLeft from None


async def sse(job: Job, first: tuple[str, Any], reply: Reply, include_usage: bool) -> AsyncIterator[str]:
    """The job's events as server-sent events, ending with `data: [DONE]`. A client that leaves cancels
    this generator (Starlette watches the connection), and the finally stops the job."""
    try:
        kind, value = first
        opening = True  # a chat's first chunk names the role
        while kind == "piece":
            yield _event(reply.chunk(value, first=opening))
            opening = False
            kind, value = await job.events.get()
        if kind == "error":
            yield _event(value.body())
        else:
            yield _event(reply.chunk(None, value.finish_reason, first=opening))
            if include_usage:
                yield _event(reply.usage_chunk(value.usage))
        yield "data: [DONE]\n\n"
    finally:
        job.cancel()


def _event(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


def serve(config: ServerConfig, model_name: str, load: Callable[[], Served], defaults: GenerationConfig) -> None:
    """Listen until interrupted (Ctrl-C or SIGTERM: queued requests finish and the state is saved first).
    A model that fails to load stops the server, and its error is raised here."""
    failures: list[BaseException] = []

    def stop_on(error: BaseException) -> None:
        failures.append(error)
        server.should_exit = True

    app = create_app(config, model_name, load, defaults, on_load_error=stop_on)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="info"))
    warn_if_open(config)
    server.run()
    if failures:
        raise failures[0]


def warn_if_open(config: ServerConfig) -> None:
    """Log a warning when anyone who can reach the server can use it."""
    if not config.api_key and not _is_loopback(config.host):
        log.warning("listening on %s without --api-key: anyone who can reach it can use it", config.host)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
