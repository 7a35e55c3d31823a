"""A server of engine replicas on Ray Serve: `evospec serve --replicas N`.

One ingress runs the same OpenAI-compatible app as a server of one process (app.api_app) and sends each
generation to one of N engine replicas, each a Worker on a model of its own. A replica takes one
request at a time (batch 1, as one process serves): the others wait in Ray Serve's queue for the first
free replica, so a replica that dies fails only the request it was serving, answered 503 with
Retry-After, and Ray starts a new replica in its place. One learner actor, named and detached,
learns for all replicas (sharing.py), keeps the learned state in --state-dir and restores it when
Ray restarts it, and holds the replicas' latest metrics, which /metrics gathers with a `replica` label.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import ray
import torch
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from ray import serve
from ray.exceptions import RayActorError, RayTaskError
from ray.serve.exceptions import ReplicaUnavailableError, RequestCancelledError
from ray.serve.handle import DeploymentHandle

from evospec.config import GenerationConfig
from evospec.errors import EvospecError
from evospec.generation import Prompt
from evospec.serve.app import api_app, check_defaults, warn_if_open
from evospec.serve.config import ClusterConfig, ServerConfig
from evospec.serve.metrics import LearningMetrics, Metrics, gathered
from evospec.serve.protocol import APIError, as_api_error
from evospec.serve.sharing import Batch, Known, Published, ReplicaSharing, SharedLearning
from evospec.serve.worker import Job, Served, Worker

log = logging.getLogger(__name__)

NAMESPACE = "evospec"  # the Ray namespace of the learner actor
APP = "evospec"  # the Serve application
LEARNER = "evospec-learner"  # the learner actor's name
INGRESS_REQUESTS = 1024  # requests in the ingress at once: every request reaches the app (and /health) at once
ANSWER_TIMEOUT_S = 2.0  # how long /health waits for Serve's controller, and /metrics for the learner
CONNECT_TIMEOUT_S = 5.0  # a Ray address that does not answer by then is unreachable (Ray itself waits minutes)
METRICS = "metrics"  # the learner's concurrency group for /metrics: one thread beside the one that learns
GONE_RETRY_S = 1  # the Retry-After of a request whose replica died: another one takes it at once

# A loader of what a replica or the learner serves: given a share hook (ReplicaSharing.share), the engine
# runs what it makes of the selector and the learners.
Load = Callable[..., Served]


def _replica_lost() -> APIError:
    return APIError(
        503,
        "the engine replica serving this request stopped; send the request again",
        kind="server_error",
        code="replica_unavailable",
        retry_after_s=GONE_RETRY_S,
    )


class Learner:
    """The learner actor: SharedLearning over an engine loaded for it, and the latest metric families of
    each replica. Ray restarts it when it dies; it then restores the newest complete saved state."""

    def __init__(self, load: Load, config: ServerConfig, threads: int) -> None:
        logging.basicConfig(level=logging.INFO)
        torch.set_num_threads(threads)
        self._registry = CollectorRegistry()
        self._replicas: dict[int, list[Metric]] = {}  # by replica: its families as it last sent them
        self._learning: SharedLearning | None = None
        self._load_error: Exception | None = None
        try:
            self._learning = SharedLearning(
                load(), config, LearningMetrics(self._registry, by_drafter=True), put=ray.put
            )
        except Exception as error:  # kept for ready(), whose caller then gets this error, not a dead actor's account
            self._load_error = error

    def ready(self) -> None:
        """Answers once it is loaded; raises what stopped it loading."""
        self._loaded()

    def exchange(self, replica: int, batch: Batch, known: Known | None, families: list[Metric]) -> Published:
        """Learn from a replica's batch; what it publishes to that replica."""
        learning = self._loaded()
        learning.learn(batch)
        self._replicas = {**self._replicas, replica: families}  # a new dict: metric_families reads on another thread
        return learning.published(known)

    @ray.method(concurrency_group=METRICS)  # answered while an exchange learns
    def metric_families(self) -> list[Metric]:
        """Its own families and each replica's, labelled with the replica."""
        replicas = (({"replica": str(rank)}, families) for rank, families in sorted(self._replicas.items()))
        return gathered([({}, self._registry.collect()), *replicas])

    def save(self) -> None:
        self._loaded().save()

    def _loaded(self) -> SharedLearning:
        if self._learning is None:
            raise self._load_error
        return self._learning


@serve.deployment
class EngineReplica:
    """One engine replica: a Worker on what `load` loads, its learning shared through the learner actor.
    It is ready once its model is loaded and it has the learner's weights (Ray Serve routes nothing to
    it before)."""

    def __init__(self, load: Load, config: ServerConfig, cluster: ClusterConfig) -> None:
        rank = serve.get_replica_context().rank
        self._rank = rank.rank
        _use_threads(cluster.threads_per_replica, rank.local_rank)
        learner = ray.get_actor(LEARNER, namespace=NAMESPACE)
        registry = CollectorRegistry()

        def exchange(batch: Batch, known: Known | None, families: list[Metric]) -> Published:
            return ray.get(learner.exchange.remote(self._rank, batch, known, families))

        sharing = ReplicaSharing(exchange, ray.get, registry, cluster)
        self._worker = Worker(lambda: load(sharing.share), config, Metrics(registry), sharing)
        self._worker.start()
        while not self._worker.ready.wait(0.1):
            if self._worker.load_error is not None:
                raise self._worker.load_error

    async def generate(
        self, prompt: Prompt, chat: bool, config: GenerationConfig, prediction: str | None
    ) -> AsyncIterator[tuple[str, Any]]:
        """The job's events, as a Worker sends them; the finished answer's usage names this replica."""
        job = Job(prompt, chat, config, prediction, asyncio.get_running_loop())
        try:
            self._worker.submit(job)
            while True:
                kind, value = await job.events.get()
                if kind == "done":
                    value = replace(value, usage={**value.usage, "replica": self._rank})
                yield kind, value
                if kind != "piece":
                    return
        finally:  # the ingress cancelled (its client left) or the answer is complete
            job.cancel()

    def __del__(self) -> None:  # Ray Serve stops the replica: finish the queued jobs, hand the rest to the learner
        self._worker.stop()


class ReplicaPool:
    """The engine replicas as the app's Engines: each job streamed from one of them, their metrics
    gathered by the learner."""

    def __init__(self, engine: DeploymentHandle, learner: ray.actor.ActorHandle) -> None:
        self._engine = engine
        self._learner = learner
        self._relays: set[asyncio.Task] = set()  # running relays, kept from the garbage collector

    def start(self) -> None:
        """Ray Serve started the replicas."""

    async def stop(self) -> None:
        """Ray Serve stops the replicas."""

    async def status(self) -> str:
        """ok while a replica runs (loaded, with the learner's weights), busy or not: Serve's controller
        says, not a request that would wait for a free replica."""
        try:
            status = await asyncio.wait_for(asyncio.to_thread(serve.status), ANSWER_TIMEOUT_S)
        except TimeoutError:
            return "loading"
        application = status.applications.get(APP)
        engines = application.deployments.get(EngineReplica.name) if application else None
        return "ok" if engines and engines.replica_states.get("RUNNING", 0) else "loading"

    def submit(self, job: Job) -> None:
        relay = asyncio.get_running_loop().create_task(self._relay(job))
        self._relays.add(relay)
        relay.add_done_callback(self._relays.discard)

    async def metric_families(self) -> list[Metric]:
        try:
            return await asyncio.wait_for(_awaited(self._learner.metric_families.remote()), ANSWER_TIMEOUT_S)
        except (TimeoutError, RayActorError) as error:
            raise APIError(
                503, "the learner is not answering (restarting?); try again", kind="server_error", retry_after_s=1
            ) from error

    async def _relay(self, job: Job) -> None:
        """The events of the job's generation on a replica, into the job."""
        response = self._engine.generate.options(stream=True).remote(job.prompt, job.chat, job.config, job.prediction)
        job.when_cancelled(response.cancel)
        try:
            async for kind, value in response:
                job.send(kind, value)
        except RequestCancelledError:  # its client left: nobody waits for an answer
            pass
        except (RayActorError, ReplicaUnavailableError):
            job.send("error", _replica_lost())
        except Exception as error:
            log.exception("relaying a generation failed")
            job.send("error", as_api_error(error))


async def _awaited(response: Any) -> Any:
    """What a Ray response (awaitable, not a coroutine) gives, as a coroutine for asyncio.wait_for."""
    return await response


@serve.deployment
@serve.ingress()  # the app is the one __serve_build_asgi_app__ gives
class Ingress:
    """The OpenAI-compatible app in front of the engine replicas."""

    def __init__(self, engine: DeploymentHandle, config: ServerConfig, model_name: str, defaults: GenerationConfig):
        pool = ReplicaPool(engine, ray.get_actor(LEARNER, namespace=NAMESPACE))
        self._api = api_app(config, model_name, pool, defaults)

    def __serve_build_asgi_app__(self):
        return self._api


def _use_threads(threads: int, local_rank: int) -> None:
    """Compute with `threads` threads on cores of their own: the local_rank-th share of the cores this process
    may run on (they wrap around where the node has fewer), which both torch and llama.cpp then use."""
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[(local_rank * threads + i) % len(cores)] for i in range(threads)})
    torch.set_num_threads(threads)


def serve_replicas(
    config: ServerConfig, cluster: ClusterConfig, model_name: str, load: Load, defaults: GenerationConfig
) -> None:
    """Serve with cluster.replicas engine replicas until interrupted (Ctrl-C or SIGTERM): the replicas finish
    their requests and hand what they heard to the learner, which saves the state; then the application
    and the learner go. Ray starts in this process unless cluster.ray_address names a running cluster.
    A model that fails to load stops the server, with its error."""
    check_defaults(config, defaults)
    started_ray = _connect(cluster)
    learner = None
    try:
        serve.start(http_options={"host": config.host, "port": config.port})
        learner = _start_learner(load, config, cluster)
        engine = EngineReplica.options(
            num_replicas=cluster.replicas,
            max_ongoing_requests=1,
            ray_actor_options={"num_cpus": cluster.threads_per_replica},
        ).bind(load, config, cluster)
        ingress = Ingress.options(max_ongoing_requests=INGRESS_REQUESTS, ray_actor_options={"num_cpus": 0})
        try:
            serve.run(ingress.bind(engine, config, model_name, defaults), name=APP, route_prefix="/")
        except RuntimeError as error:
            raise EvospecError(f"the engine replicas did not start: {error}") from error
        warn_if_open(config)
        log.info("serving %s on http://%s:%d with %d replicas", model_name, config.host, config.port, cluster.replicas)
        _wait_for_a_stop_signal()
    finally:
        _stop(learner, started_ray)


def _connect(cluster: ClusterConfig) -> bool:
    """Connect to the cluster's Ray, or start one here for the replicas and the learner; whether it started here."""
    if cluster.ray_address is None:
        ray.init(
            namespace=NAMESPACE,
            num_cpus=(cluster.replicas + 1) * cluster.threads_per_replica,  # each replica's and the learner's
            include_dashboard=False,
        )
        return True
    _check_reachable(cluster.ray_address)
    try:
        ray.init(address=cluster.ray_address, namespace=NAMESPACE)
    except (ConnectionError, ValueError) as error:
        raise EvospecError(f"cannot connect to the Ray cluster at {cluster.ray_address}: {error}") from error
    return False


def _check_reachable(address: str) -> None:
    """Fail fast on an address of HOST:PORT (or ray://HOST:PORT) where nothing listens ('auto' is Ray's to find)."""
    host, separator, port = address.removeprefix("ray://").rpartition(":")
    if not separator:
        return
    if not port.isdigit():
        raise EvospecError(f"--ray-address {address}: expected HOST:PORT, ray://HOST:PORT or auto")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise EvospecError(f"cannot reach the Ray cluster at {address}: {error}") from error


def _start_learner(load: Load, config: ServerConfig, cluster: ClusterConfig) -> ray.actor.ActorHandle:
    """The learner actor, once it has loaded its engine and restored the state (one of an earlier run that
    did not stop cleanly is replaced)."""
    try:
        ray.kill(ray.get_actor(LEARNER, namespace=NAMESPACE))
        while True:  # its name is free once it is gone
            ray.get_actor(LEARNER, namespace=NAMESPACE)
            time.sleep(0.1)
    except ValueError:
        pass
    learner = (
        ray.remote(concurrency_groups={METRICS: 1})(Learner)
        .options(
            name=LEARNER,
            namespace=NAMESPACE,
            lifetime="detached",  # as the Serve application: it outlives a driver that dies
            max_restarts=-1,
            max_task_retries=-1,  # a replica's exchange in flight when it died goes to the restarted learner
            num_cpus=cluster.threads_per_replica,
        )
        .remote(load, config, cluster.threads_per_replica)
    )
    try:
        ray.get(learner.ready.remote())
    except RayTaskError as error:  # its model did not load: that error, as a server of one process raises it
        ray.kill(learner)
        raise error.cause from None
    except RayActorError as error:
        ray.kill(learner)
        raise EvospecError(f"the learner did not start: {error}") from error
    return learner


def _wait_for_a_stop_signal() -> None:
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass


def _stop(learner: ray.actor.ActorHandle | None, started_ray: bool) -> None:
    """The application goes (its replicas hand what is left to the learner), the learner saves and goes,
    and Ray with them if it started here."""
    try:
        serve.delete(APP)
        if learner is not None:
            ray.get(learner.save.remote())
            ray.kill(learner)
    finally:
        if started_ray:
            serve.shutdown()
            ray.shutdown()
