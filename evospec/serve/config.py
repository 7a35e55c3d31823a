"""Server settings: each default defined here once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evospec.errors import EvospecError


@dataclass(frozen=True)
class ServerConfig:
    """Where the server listens, who may call it, what it accepts and where it keeps its state."""

    host: str = "127.0.0.1"  # loopback: reachable from this machine only, unless asked otherwise
    port: int = 8000
    api_key: str | None = None  # when set, every route but /health needs `Authorization: Bearer <key>`
    state_dir: Path | None = None  # where learned state is saved and restored from; None keeps nothing
    save_every: int = 32  # requests between two saves of the state (and one more on shutdown)
    max_prompt_tokens: int = 8192
    max_prediction_tokens: int = 8192  # the longest prediction (OpenAI Predicted Outputs) a request may send
    max_tokens_limit: int = 4096  # the largest max_tokens a request may ask for
    max_body_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise EvospecError(f"port must be in 0..65535, got {self.port}")
        if self.api_key is not None and not self.api_key.strip():
            raise EvospecError("the API key is empty")
        for name in ("save_every", "max_prompt_tokens", "max_prediction_tokens", "max_tokens_limit", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise EvospecError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class ClusterConfig:
    """A server of engine replicas on Ray Serve (evospec serve --replicas): one ingress, `replicas` engines
    and one learner that learns for all of them."""

    replicas: int = 2
    ray_address: str | None = None  # an existing Ray cluster ("auto", "HOST:PORT", "ray://HOST:PORT"); None: start one
    threads_per_replica: int = 1  # CPU threads of each replica's engine (and of the learner)
    sync_every_s: float = 1.0  # an idle replica's exchanges with the learner; each finished request syncs at once
    outbox_requests: int = 64  # finished requests a replica keeps for the learner; the oldest go first

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise EvospecError(f"replicas must be >= 1, got {self.replicas}")
        if self.threads_per_replica < 1:
            raise EvospecError(f"threads-per-replica must be >= 1, got {self.threads_per_replica}")
        if self.ray_address is not None and not self.ray_address.strip():
            raise EvospecError("the Ray address is empty")
        if not self.sync_every_s > 0 or self.outbox_requests < 1:
            raise EvospecError(f"invalid cluster settings: {self}")
