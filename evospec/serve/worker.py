"""The one thread that owns the model: it loads it, then runs generations one at a time, in arrival order."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from evospec.config import GenerationConfig
from evospec.errors import EvospecError
from evospec.generation import Prompt, TextGenerator
from evospec.serve.config import ServerConfig
from evospec.serve.metrics import Metrics
from evospec.serve.protocol import APIError, as_api_error
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


@dataclass
class Job:
    """One request's generation. The worker answers on `events`, in the request's event loop:
    ("piece", text) as text is made, then ("done", TextStream) or ("error", APIError)."""

    prompt: Prompt
    chat: bool
    config: GenerationConfig
    prediction: str | None  # the predicted output, for the prediction drafter
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)  # the client left: stop, answer nothing

    def send(self, kind: str, value: Any) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))


class Worker:
    """Loads the model on its own thread (the server answers /health with 503 meanwhile), restores the
    saved state, then serves queued jobs one by one and saves the state every `save_every` requests and
    when stopped. A failed load is kept in `load_error` and reported through on_load_error."""

    def __init__(
        self,
        load: Callable[[], Served],
        config: ServerConfig,
        metrics: Metrics,
        on_load_error: Callable[[BaseException], None],
    ) -> None:
        self._load = load
        self._config = config
        self._metrics = metrics
        self._on_load_error = on_load_error
        self._jobs: queue.Queue[Job | None] = queue.Queue()  # None: stop
        self._thread = threading.Thread(target=self._run, name="evospec-worker", daemon=True)
        self.ready = threading.Event()
        self.load_error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        self._jobs.put(job)

    def stop(self) -> None:
        """Finish the queued jobs, save the state and end the thread (one still loading is left to die
        with the process)."""
        self._jobs.put(None)
        if self.ready.is_set():
            self._thread.join()

    def _run(self) -> None:
        try:
            served = self._load()
            components = _stateful_components(served)
        except Exception as error:  # whatever stops the load, the server reports it rather than hang
            log.error("loading the model failed: %s", error)
            self.load_error = error
            self._on_load_error(error)
            return
        store = StateStore(self._config.state_dir) if self._config.state_dir else None
        drafter_version = self._restore(store, components)
        self._metrics.observe_learners(served.generator.engine.learners)
        self.ready.set()
        unsaved = 0
        while (job := self._jobs.get()) is not None:
            if self._serve(served.generator, job):
                unsaved += 1
                drafter_version = _drafter_version(served) or drafter_version
                self._metrics.drafter_version.set(drafter_version)
                self._metrics.observe_learners(served.generator.engine.learners)
            if store and unsaved >= self._config.save_every:
                self._save(store, components, drafter_version)
                unsaved = 0
        if store and unsaved:
            self._save(store, components, drafter_version)

    def _serve(self, generator: TextGenerator, job: Job) -> bool:
        """Run one job, streaming its text to its client; whether it generated (and so may have taught the
        components something)."""
        if job.cancelled.is_set():  # its client left while it waited
            return False
        aborted = False
        try:
            stream = generator.stream(job.prompt, job.config, chat=job.chat, prediction=job.prediction)
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
        job.send("done", stream)
        return True

    def _restore(self, store: StateStore | None, components: Mapping[str, Stateful]) -> int:
        """Load the newest complete state, if any; the drafters' version it had (0 without one)."""
        saved = store.load(components) if store else None
        if saved is None:
            return 0
        log.info(
            "restored state %d (drafter version %d) from %s", saved.sequence, saved.drafter_version, store.directory
        )
        self._metrics.state_sequence.set(saved.sequence)
        self._metrics.drafter_version.set(saved.drafter_version)
        return saved.drafter_version

    def _save(self, store: StateStore, components: Mapping[str, Stateful], drafter_version: int) -> None:
        try:
            saved = store.save(components, drafter_version)
        except (
            Exception
        ):  # a full disk or a component's bad state must not take the server down; the next save tries again
            log.exception("saving the state to %s failed", store.directory)
            return
        self._metrics.state_sequence.set(saved.sequence)
        log.info("saved state %d to %s", saved.sequence, store.directory)


def _drafter_version(served: Served) -> int:
    """Learning steps applied to the served drafters (0 without learners)."""
    return sum(learner.drafter.version for learner in served.generator.engine.learners)


def _stateful_components(served: Served) -> dict[str, Stateful]:
    """The loader's components and the engine's selector, by name."""
    selector = served.generator.engine.selector
    if selector is None:
        return dict(served.components)
    if "selector" in served.components:
        raise EvospecError("the component name 'selector' is taken by the engine's selector")
    return {**served.components, "selector": SelectorState(selector)}
