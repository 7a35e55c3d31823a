"""The one thread that owns the model: it loads it, then runs generations one at a time, in arrival order."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from evospec.config import GenerationConfig
from evospec.errors import EvospecError
from evospec.generation import Prompt, TextGenerator
from evospec.serve.config import ServerConfig
from evospec.serve.metrics import LearningMetrics, Metrics
from evospec.serve.protocol import APIError, as_api_error, usage
from evospec.serve.state import SelectorState, Stateful, StateStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """What the loader gives the server: the generator, and the components whose state is kept across
    restarts (the engine's selector is kept too, as "selector")."""

    generator: TextGenerator
    components: Mapping[str, Stateful] = field(default_factory=dict)

    @classmethod
    def with_learners(cls, generator: TextGenerator) -> Served:
        """The generator, its learners kept across restarts, each named after its drafter."""
        return cls(generator, {f"learner:{learner.drafter.name}": learner for learner in generator.engine.learners})

    def state_components(self) -> dict[str, Stateful]:
        """The loader's components and the engine's selector, by name: what a saved state holds."""
        selector = self.generator.engine.selector
        if selector is None:
            return dict(self.components)
        if "selector" in self.components:
            raise EvospecError("the component name 'selector' is taken by the engine's selector")
        return {**self.components, "selector": SelectorState(selector)}

    def drafter_versions(self) -> dict[str, int]:
        """Learning steps applied to each learning drafter, by name."""
        return {learner.drafter.name: learner.drafter.version for learner in self.generator.engine.learners}


@dataclass(frozen=True)
class Finished:
    """How a generation ended, as the app answers it (it crosses processes: plain values only)."""

    text: str  # all of it
    finish_reason: str
    usage: dict[str, Any]  # protocol.usage


@dataclass
class Job:
    """One request's generation. The worker answers on `events`, in the request's event loop:
    ("piece", text) as text is made, then ("done", Finished) or ("error", APIError)."""

    prompt: Prompt
    chat: bool
    config: GenerationConfig
    prediction: str | None  # the predicted output, for the prediction drafter
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)  # the client left: stop, answer nothing
    _on_cancel: list[Callable[[], None]] = field(default_factory=list)

    def send(self, kind: str, value: Any) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))

    def cancel(self) -> None:
        """The client left: whoever runs the job stops it."""
        self.cancelled.set()
        for callback in self._on_cancel:
            callback()
        self._on_cancel.clear()

    def when_cancelled(self, callback: Callable[[], None]) -> None:
        """Call callback (in the job's event loop) once the job is cancelled, now if it already is."""
        if self.cancelled.is_set():
            callback()
        else:
            self._on_cancel.append(callback)


class StateKeeper(Protocol):
    """What becomes of what the engine learns, around the worker's jobs (on the worker's thread)."""

    def begin(self, served: Served) -> None:
        """The model is loaded and no job has run yet: take up what was kept."""

    def after_request(self, served: Served) -> None:
        """A job generated, and so may have taught the components something."""

    def end(self, served: Served) -> None:
        """The worker stops: keep what is left."""


class DurableState:
    """The learned state of one process: restored from `config.state_dir` at begin, saved there every
    `config.save_every` requests and at the end (nothing without a state directory)."""

    def __init__(self, config: ServerConfig, metrics: LearningMetrics) -> None:
        self._store = StateStore(config.state_dir) if config.state_dir else None
        self._save_every = config.save_every
        self._metrics = metrics
        self._components: dict[str, Stateful] = {}
        self._drafter_version = 0  # learning steps applied to the served drafters, restored ones included
        self._unsaved = 0

    def begin(self, served: Served) -> None:
        self._components = served.state_components()
        saved = self._store.load(self._components) if self._store else None
        if saved is not None:
            log.info(
                "restored state %d (drafter version %d) from %s",
                saved.sequence,
                saved.drafter_version,
                self._store.directory,
            )
            self._metrics.state_sequence.set(saved.sequence)
            self._drafter_version = saved.drafter_version
        self._metrics.observe_learners(served.generator.engine.learners, self._drafter_version)

    def after_request(self, served: Served) -> None:
        self._unsaved += 1
        self._drafter_version = sum(served.drafter_versions().values()) or self._drafter_version
        self._metrics.observe_learners(served.generator.engine.learners, self._drafter_version)
        if self._unsaved >= self._save_every:
            self._save()

    def end(self, served: Served) -> None:
        if self._unsaved:
            self._save()

    def _save(self) -> None:
        if self._store is None:
            return
        self._unsaved = 0  # after a failed save, the next one is due save_every requests later
        try:
            saved = self._store.save(self._components, self._drafter_version)
        except Exception:  # a full disk or a component's bad state must not take the server down; the next save tries
            log.exception("saving the state to %s failed", self._store.directory)
            return
        self._metrics.state_sequence.set(saved.sequence)
        log.info("saved state %d to %s", saved.sequence, self._store.directory)


class Worker:
    """Loads the model on its own thread, has the keeper take up the kept state, then serves queued jobs
    one by one, telling the keeper of each one that generated. A failed load is kept in `load_error`
    and reported through on_load_error."""

    def __init__(
        self,
        load: Callable[[], Served],
        config: ServerConfig,
        metrics: Metrics,
        keeper: StateKeeper,
        on_load_error: Callable[[BaseException], None] = lambda error: None,
    ) -> None:
        self._load = load
        self._config = config
        self._metrics = metrics
        self._keeper = keeper
        self._on_load_error = on_load_error
        self._jobs: queue.Queue[Job | None] = queue.Queue()  # None: stop
        self._thread = threading.Thread(target=self._run, name="evospec-worker", daemon=True)
        self.ready = threading.Event()
        self.load_error: BaseException | None = None

    @property
    def status(self) -> str:
        """ok (serving), loading or failed (to load)."""
        if self.ready.is_set():
            return "ok"
        return "failed" if self.load_error else "loading"

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job; refused with a 503 until the model is loaded."""
        if not self.ready.is_set():
            state = "failed to load" if self.load_error else "is still loading"
            raise APIError(503, f"the model {state}", kind="server_error", code="model_not_ready")
        self._jobs.put(job)

    def stop(self) -> None:
        """Finish the queued jobs, let the keeper keep the state and end the thread (one still loading is
        left to die with the process)."""
        self._jobs.put(None)
        if self.ready.is_set():
            self._thread.join()

    def _run(self) -> None:
        try:
            served = self._load()
            self._keeper.begin(served)
        except Exception as error:  # whatever stops the load, the server reports it rather than hang
            log.error("loading the model failed: %s", error)
            self.load_error = error
            self._on_load_error(error)
            return
        self.ready.set()
        while (job := self._jobs.get()) is not None:
            if self._serve(served, job):
                self._keeper.after_request(served)
        self._keeper.end(served)

    def _serve(self, served: Served, job: Job) -> bool:
        """Run one job, streaming its text to its client; whether it generated (and so may have taught the
        components something)."""
        if job.cancelled.is_set():  # its client left while it waited
            return False
        aborted = False
        try:
            stream = served.generator.stream(job.prompt, job.config, chat=job.chat, prediction=job.prediction)
            if len(stream.prompt_ids) > self._config.max_prompt_tokens:
                raise APIError(
                    400,
                    f"the prompt has {len(stream.prompt_ids)} tokens; this server takes at most "
                    f"{self._config.max_prompt_tokens}",
                    param="messages" if job.chat else "prompt",
                    code="context_length_exceeded",
                )
            if len(stream.prediction_ids) > self._config.max_prediction_tokens:
                raise APIError(
                    400,
                    f"the prediction has {len(stream.prediction_ids)} tokens; this server takes at most "
                    f"{self._config.max_prediction_tokens}",
                    param="prediction",
                )
            pieces = iter(stream)
            try:
                for piece in pieces:
                    if job.cancelled.is_set():
                        aborted = True
                        break
                    job.send("piece", piece)
            finally:
                pieces.close()  # the engine's cleanup runs now, not whenever the generator is collected
        except Exception as error:  # the client gets an answer; the worker goes on with the next job
            answer = as_api_error(error)
            if answer.status >= 500:
                log.exception("a generation failed")
            job.send("error", answer)
            return False
        self._metrics.observe(stream.stats, "abort" if aborted else stream.finish_reason)
        counts = usage(len(stream.prompt_ids), len(stream.token_ids), stream.stats, served.drafter_versions())
        job.send("done", Finished(stream.text, stream.finish_reason, counts))
        return True
