"""What a target forward of n tokens costs on this machine, measured once and cached.

Speculation pays only where verifying m drafted tokens in one forward of m + 1 costs little more
than decoding one, and the ratio T(m + 1) / T(1) depends on the backend, the model and the
processor: it is measured rather than assumed. Sizes 1-8 are timed each; past that, every few
sizes up to the longest forward asked for, and T(n) is linear in between.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
import tomllib
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from evospec.errors import EvospecError
from evospec.files import evospec_home, write_atomically
from evospec.machine import machine_key
from evospec.target import LanguageModel

COST_CONTEXT_TOKENS = 128  # tokens already cached when the forwards are timed
COST_REPEATS = 5  # timings per size; the median is kept
DENSE_SIZES = 8  # sizes 1..8 are each measured; larger ones on the sparse grid below
SPARSE_SIZES = (12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def measured_sizes(max_tokens: int) -> tuple[int, ...]:
    """The forward sizes timed for a curve up to max_tokens: 1..8, then the sparse grid, then max_tokens."""
    if max_tokens < 1:
        raise EvospecError(f"a forward cost covers at least one token, got {max_tokens}")
    sizes = [n for n in (*range(1, DENSE_SIZES + 1), *SPARSE_SIZES) if n < max_tokens]
    return (*sizes, max_tokens)


@dataclass(frozen=True)
class ForwardCost:
    """seconds[i]: median wall time of one forward of sizes[i] new tokens; linear in between.

    sizes defaults to 1..len(seconds), a curve measured at every size.
    """

    seconds: tuple[float, ...]
    sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.sizes:
            object.__setattr__(self, "sizes", tuple(range(1, len(self.seconds) + 1)))
        if not self.seconds or any(not s > 0 for s in self.seconds):
            raise EvospecError(f"a forward cost needs positive timings, got {self.seconds}")
        if len(self.sizes) != len(self.seconds) or self.sizes[0] != 1 or list(self.sizes) != sorted(set(self.sizes)):
            raise EvospecError(f"a forward cost needs increasing sizes from 1, one per timing, got {self.sizes}")

    @property
    def max_tokens(self) -> int:
        return self.sizes[-1]

    def of(self, tokens: int) -> float:
        """Seconds for a forward of `tokens` new tokens (1 <= tokens <= max_tokens)."""
        if not 1 <= tokens <= self.max_tokens:
            raise EvospecError(f"the forward cost covers 1..{self.max_tokens} tokens, asked for {tokens}")
        return float(np.interp(tokens, self.sizes, self.seconds))

    def ratios(self) -> list[float]:
        """T(n) / T(1) for n = 1..max_tokens."""
        return [self.of(n) / self.seconds[0] for n in range(1, self.max_tokens + 1)]

    def ceiling(self) -> tuple[float, int]:
        """The largest speedup over one-token steps that any drafter could reach, (m + 1) T(1) / T(m + 1)
        with every one of m drafted tokens accepted, and the forward size m + 1 that reaches it."""
        size = max(range(1, self.max_tokens + 1), key=lambda n: n / self.of(n))
        return size * self.seconds[0] / self.of(size), size


def measure_forward_cost(lm: LanguageModel, max_tokens: int, vocab_size: int) -> ForwardCost:
    """Time forwards of measured_sizes(max_tokens) after a COST_CONTEXT_TOKENS context; sizes are
    interleaved over the repeats so that a drift of the machine's speed touches all of them alike."""
    sizes = measured_sizes(max_tokens)
    token_ids = [(7 + 31 * i) % vocab_size for i in range(COST_CONTEXT_TOKENS + max_tokens)]
    lm.reset()
    lm.forward(token_ids[:COST_CONTEXT_TOKENS], num_logits=1)
    timings: list[list[float]] = [[] for _ in sizes]
    for _ in range(COST_REPEATS):
        for i, n in enumerate(sizes):
            start = time.perf_counter()
            lm.forward(token_ids[COST_CONTEXT_TOKENS : COST_CONTEXT_TOKENS + n])
            timings[i].append(time.perf_counter() - start)
            lm.trim(COST_CONTEXT_TOKENS)
    lm.reset()
    return ForwardCost(tuple(statistics.median(t) for t in timings), sizes)


def cached_forward_cost(lm: LanguageModel, model_key: str, max_tokens: int, vocab_size: int) -> ForwardCost:
    """The forward cost of a model on this machine up to max_tokens: read from the cache, or measured
    once and saved. A cached curve that is too short is measured again, to the longer length.

    model_key names the model and how it runs (backend, file, settings); machine_key() is added to it.
    """
    path = _cache_path(model_key)
    if path.is_file():
        try:
            cached = json.loads(path.read_text())
            cost = ForwardCost(tuple(cached["seconds"]), tuple(cached["sizes"]))
            if cost.max_tokens >= max_tokens:
                return cost
        except (ValueError, KeyError, TypeError, EvospecError):
            path.unlink()  # a damaged cache entry is measured again
    cost = measure_forward_cost(lm, max_tokens, vocab_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps({"model": model_key, "machine": machine_key(), **asdict(cost)}))
    return cost


MEASURED = "measured"  # the profile of this machine: the target's T(n) timed here


def cost_profiles() -> dict[str, dict]:
    """The named cost profiles shipped with the package (data/cost_profiles.toml): name -> source, sizes, ratios."""
    return tomllib.loads(resources.files("evospec").joinpath("data/cost_profiles.toml").read_text())


def cost_profile(name: str) -> dict:
    """The named profile (source, sizes, ratios); an unknown name is a clear error."""
    profiles = cost_profiles()
    if name not in profiles:
        raise EvospecError(f"unknown cost profile {name!r}; choose {MEASURED} or one of {', '.join(profiles)}")
    return profiles[name]


def profile_source(name: str) -> str:
    """Where the seconds of profile `name` (MEASURED or a named one) come from, as results record it."""
    return "this machine's T(n) of the target" if name == MEASURED else cost_profile(name)["source"]


def profile_cost(name: str, step_s: float, max_tokens: int) -> ForwardCost:
    """A named profile's T(n) up to max_tokens, scaled so that T(1) = step_s (this machine's measured step)."""
    profile = cost_profile(name)
    sizes, ratios = profile["sizes"], profile["ratios"]
    if max_tokens > sizes[-1]:
        raise EvospecError(f"cost profile {name} covers forwards of up to {sizes[-1]} tokens, not {max_tokens}")
    curve = range(1, max_tokens + 1)
    return ForwardCost(tuple(step_s * float(np.interp(n, sizes, ratios)) for n in curve), tuple(curve))


def cost_under(profile: str, measured: ForwardCost, max_tokens: int) -> ForwardCost:
    """T(n) up to max_tokens under a profile: the measured curve itself (MEASURED), or the named
    profile's shape scaled by the measured T(1)."""
    return measured if profile == MEASURED else profile_cost(profile, measured.of(1), max_tokens)


def _cache_path(model_key: str) -> Path:
    digest = hashlib.sha256(f"{model_key}|{machine_key()}".encode()).hexdigest()[:16]
    return evospec_home() / "costs" / f"{digest}.json"
