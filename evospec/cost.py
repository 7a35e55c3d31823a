"""What a target forward of n tokens costs on this machine, measured once and cached.

Speculation pays only where verifying k + 1 tokens costs little more than decoding one. That ratio
T(k + 1) / T(1) differs between backends and machines (about 1.0 up to k = 4 for bf16 torch on a
CPU with AVX512-BF16, 1.6 at k = 1 and 3 at k = 4 for llama.cpp Q4_K on a 2-core AVX2 CPU), so it
is measured rather than assumed.
"""

from __future__ import annotations

import hashlib
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from evospec.errors import EvospecError
from evospec.files import write_atomically
from evospec.models.llamacpp import default_threads
from evospec.models.loading import LoadedModel, vocab_size
from evospec.models.zoo import evospec_home
from evospec.target import LanguageModel

COST_CONTEXT_TOKENS = 128  # tokens already cached when the forwards are timed
COST_REPEATS = 5  # timings per size; the median is kept


@dataclass(frozen=True)
class ForwardCost:
    """seconds[n - 1]: median wall time of one forward of n new tokens, n = 1..len(seconds)."""

    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.seconds or any(not s > 0 for s in self.seconds):
            raise EvospecError(f"a forward cost needs positive timings, got {self.seconds}")

    @property
    def max_tokens(self) -> int:
        return len(self.seconds)

    def of(self, tokens: int) -> float:
        """Seconds for a forward of `tokens` new tokens (1 <= tokens <= max_tokens)."""
        return self.seconds[tokens - 1]

    def ratios(self) -> list[float]:
        """T(n) / T(1) for n = 1..max_tokens."""
        return [s / self.seconds[0] for s in self.seconds]


def measure_forward_cost(lm: LanguageModel, max_tokens: int, vocab_size: int) -> ForwardCost:
    """Time forwards of 1..max_tokens tokens after a COST_CONTEXT_TOKENS context; sizes are interleaved
    over the repeats so that a drift of the machine's speed touches all of them alike."""
    token_ids = [(7 + 31 * i) % vocab_size for i in range(COST_CONTEXT_TOKENS + max_tokens)]
    lm.reset()
    lm.forward(token_ids[:COST_CONTEXT_TOKENS], num_logits=1)
    timings: list[list[float]] = [[] for _ in range(max_tokens)]
    for _ in range(COST_REPEATS):
        for n in range(1, max_tokens + 1):
            start = time.perf_counter()
            lm.forward(token_ids[COST_CONTEXT_TOKENS : COST_CONTEXT_TOKENS + n])
            timings[n - 1].append(time.perf_counter() - start)
            lm.trim(COST_CONTEXT_TOKENS)
    lm.reset()
    return ForwardCost(tuple(statistics.median(t) for t in timings))


def cached_forward_cost(lm: LanguageModel, model_key: str, max_tokens: int, vocab_size: int) -> ForwardCost:
    """The forward cost of a model on this machine: read from the cache, or measured once and saved.

    model_key names the model and how it runs (backend, file, dtype); the machine's processor and
    thread count are added to it.
    """
    path = _cache_path(model_key, max_tokens)
    if path.is_file():
        try:
            return ForwardCost(tuple(json.loads(path.read_text())["seconds"]))
        except (ValueError, KeyError, TypeError, EvospecError):
            path.unlink()  # a damaged cache entry is measured again
    cost = measure_forward_cost(lm, max_tokens, vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps({"model": model_key, "machine": _machine(), **asdict(cost)}))
    return cost


def model_forward_cost(model: LoadedModel, max_tokens: int) -> ForwardCost:
    """The forward cost of a loaded target on this machine (cached per model, backend and how it runs)."""
    # How the weights run: the dtype for hf; for llama.cpp its settings, since they shape each call.
    runs_as = model.model.config if model.backend == "llamacpp" else model.model.dtype
    source = model.source.resolve() if isinstance(model.source, Path) else model.source
    key = f"{model.backend}|{source}|{runs_as}"
    return cached_forward_cost(model.new_lm(), key, max_tokens, vocab_size(model))


def _machine() -> str:
    return f"{platform.machine()}-{_processor_name()}-{default_threads()}threads"


def _processor_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cache_path(model_key: str, max_tokens: int) -> Path:
    digest = hashlib.sha256(f"{model_key}|{_machine()}|{max_tokens}".encode()).hexdigest()[:16]
    return evospec_home() / "costs" / f"{digest}.json"
