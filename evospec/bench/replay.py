"""`evospec replay`: bench methods over a recorded target, for streams of thousands of requests.

Greedy tau and rounds do not depend on the hardware, and a recording of the target's answers
(evospec traces collect) is all a greedy target says during speculative decoding (models/replay.py).
So the engine, drafters, learners and selectors run unchanged over a replayed target, interleaved
request by request as in `evospec bench`, and every method must emit exactly the recorded answers
(checked). Target passes cost what the profile says; drafting and learning seconds are measured
here. Projected tokens/s = new tokens / (the profile's target seconds + measured drafting, learning
and engine seconds), prefill left out (the same for every method). With `live`, the same methods run
on the real target over the same prompts, timed for real: the check of a replay's numbers.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from evospec.bench.methods import EvospecMethod, build_methods
from evospec.bench.report import plot_blocks, plot_selection, single_drafters, summarize, write_report
from evospec.bench.traces import TraceSet, load_traces
from evospec.config import DTYPES, GenerationConfig, LoadConfig, method_settings
from evospec.cost import MEASURED, ForwardCost, cost_profiles, cost_under, profile_source
from evospec.errors import EvospecError
from evospec.learning import LearnerConfig
from evospec.machine import cpu_description
from evospec.models.backend import LoadedModel
from evospec.models.loading import load_model
from evospec.models.replay import Answer, Recording, replayed
from evospec.stats import SpecStats

STREAM_PART = re.compile(r"^(?P<name>[^\[\]]+)(\[(?P<start>\d*):(?P<end>\d*)\])?$")


@dataclass(frozen=True)
class ReplaySettings:
    traces: tuple[tuple[str, Path], ...]  # (name, trace set directory), as --traces NAME=DIR names them
    stream: str | None  # parts joined by "+", each NAME or NAME[START:END]; None: every trace set, whole
    interleave: bool  # parts request by request (a mixed stream) instead of one after another (domain shift)
    methods: tuple[str, ...]
    profile: str  # MEASURED or a cost_profiles() name
    block_size: int  # requests per block of per_block and the tau plot
    num_speculative_tokens: int
    out_dir: Path
    command: str  # recorded with the results
    draft_model: str | None = None  # a small LM: evospec:<model>, the selectors' small-LM arm, evospec:lora:<model>
    white_box: Path | None = None  # an eagle or hydra checkpoint: evospec:<kind>[+<learner>] methods
    learning: LearnerConfig = LearnerConfig()
    live: bool = False  # run the methods on the real target instead (a live check of the replay's numbers)


def stream_of(sets: dict[str, TraceSet], stream: str | None, interleave: bool) -> list[tuple[str, Answer]]:
    """(part name, answer) per request of the stream, in order."""
    parts = []
    for part in (stream or "+".join(sets)).split("+"):
        match = STREAM_PART.match(part.strip())
        if not match or match["name"] not in sets:
            raise EvospecError(
                f"stream part {part!r}: expected NAME or NAME[START:END], NAME one of {', '.join(sets)} (--traces)"
            )
        answers = sets[match["name"]].answers
        start = int(match["start"] or 0)
        end = int(match["end"]) if match["end"] else len(answers)
        if end > len(answers) or start >= end:
            raise EvospecError(f"stream part {part!r}: {match['name']} holds answers 0..{len(answers)}")
        parts.append([(match["name"], answer) for answer in answers[start:end]])
    if not interleave:
        return [request for part in parts for request in part]
    longest = max(len(part) for part in parts)
    return [part[i] for i in range(longest) for part in parts if i < len(part)]


def recorded_target(sets: dict[str, TraceSet]) -> tuple[LoadedModel, LoadConfig]:
    """The real target the trace sets were recorded from, loaded as it ran then, and its load settings."""
    metas = {(s.meta["target"], s.meta["backend"], s.meta["weights"]) for s in sets.values()}
    if len(metas) != 1:
        raise EvospecError(f"the trace sets were recorded from different targets: {sorted(metas)}")
    target_name, backend, weights = metas.pop()
    load = LoadConfig(dtype=weights if weights in DTYPES else None)  # the weights run as they were recorded
    return load_model(target_name, backend, load), load


def run_replay(settings: ReplaySettings) -> dict:
    """Replay the stream with every method; write results.json/.md, tau per block, and the selectors' plot."""
    if settings.block_size < 1:
        raise EvospecError(f"--block-size must be >= 1, got {settings.block_size}")
    source = profile_source(settings.profile)
    if settings.live and settings.profile != MEASURED:
        raise EvospecError("a live run is timed for real: --live takes no --profile")
    sets = {name: load_traces(directory) for name, directory in settings.traces}
    stream = stream_of(sets, settings.stream, settings.interleave)
    target, load = recorded_target(sets)
    max_tokens = settings.num_speculative_tokens + 1
    measured = target.forward_cost(max_tokens)
    cost = cost_under(settings.profile, measured, max_tokens)

    answers = list(dict.fromkeys(answer for _, answer in stream))
    rows_paths = {
        answer: traces.rows_path(index) for traces in sets.values() for index, answer in enumerate(traces.answers)
    }
    recording = Recording(answers, target.vocab_size, cost, target, [rows_paths[answer] for answer in answers])
    draft_model = load_model(settings.draft_model, target.backend.name, load) if settings.draft_model else None
    engines = {}
    for name in settings.methods:  # NAME@field=value,...: the method with its own learner settings
        base, learning = method_settings(name, settings.learning)
        (method,) = build_methods(
            [base],
            target if settings.live else replayed(target, recording),
            draft_model,
            settings.num_speculative_tokens,
            settings.white_box,
            learning,
        )
        if not isinstance(method, EvospecMethod):
            raise EvospecError(f"{name} runs a backend's own loop, which a recording cannot replay")
        engines[name] = method.engine
    recording.rows = any(engine.listeners for engine in engines.values())  # learners read the target's top-K

    load_average = os.getloadavg()[0]
    runs: dict[str, list[tuple[str, SpecStats]]] = {name: [] for name in engines}
    departed = dict.fromkeys(engines, 0)  # live: answers that differ from the recorded ones
    for index, (part, answer) in enumerate(tqdm(stream, desc="replay", unit="request")):
        block = _block_label(index, settings.block_size, len(stream), part if not settings.interleave else "mixed")
        config = GenerationConfig(
            max_new_tokens=len(answer.answer_ids), num_speculative_tokens=settings.num_speculative_tokens
        )
        for name, engine in engines.items():  # interleaved, as a live run would be
            stats = SpecStats()
            emitted = list(engine.generate(list(answer.prompt_ids), config, stats))
            if tuple(emitted) != answer.answer_ids:
                if not settings.live:
                    raise EvospecError(f"{name} emitted something other than the recorded answer {index}: a replay bug")
                departed[name] += 1  # llama.cpp's long forwards may round a near-tie the other way
            stats.wall_s -= stats.prefill_s  # the prefill is left out of the projection (the same for every method)
            stats.prefill_s = 0.0
            runs[name].append((block, stats))

    methods_summary, plain = summarize(runs)
    ceiling, ceiling_size = cost.ceiling()
    if not settings.live:
        _add_projections(methods_summary, engines, measured, max_tokens)
    results = {
        "command": settings.command,
        "replay": not settings.live,
        "profile": settings.profile,
        "profile_source": source,
        "target": target.name,
        "backend": target.backend.name,
        "dtype": target.weights_format,
        "temperature": 0.0,
        "stream": settings.stream or "+".join(sets),
        "interleaved": settings.interleave,
        "traces": {name: str(directory) for name, directory in settings.traces},
        "prompts": len(stream),
        "max_new_tokens": max(traces.meta["max_new_tokens"] for traces in sets.values()),
        "block_size": settings.block_size,
        "num_speculative_tokens": settings.num_speculative_tokens,
        "threads": target.backend.threads(target.model),
        "cpu": cpu_description(),
        "load_average": round(load_average, 2),
        "forward_cost_ms": {str(n): round(1000 * cost.of(n), 3) for n in range(1, max_tokens + 1)},
        "ceiling": {
            "speedup": round(ceiling, 3),
            "forward_tokens": ceiling_size,
            "note": "(m + 1) T(1) / T(m + 1) at its best m, under the profile",
        },
        "reordered_rows": recording.reordered_rows,
        **({"answers_departing_from_the_recording": departed} if settings.live else {}),
        "plain_method": plain,
        "methods": methods_summary,
    }
    learners = {name: [learner.report() for learner in engine.learners] for name, engine in engines.items()}
    if any(learners.values()):
        results["learners"] = {name: reports for name, reports in learners.items() if reports}
    write_report(results, settings.out_dir)
    plot_blocks(results, settings.out_dir / "blocks.png")
    if any(name.startswith("select:") for name in runs) and single_drafters(list(runs)):
        plot_selection(runs, settings.out_dir / "selection.png")
    print((settings.out_dir / "results.md").read_text())
    return results


def _add_projections(methods: dict, engines: dict, measured: ForwardCost, max_tokens: int) -> None:
    """Per method, the replay's passes ("target_passes": tokens per pass -> count) and the measured
    seconds that are not the target's ("non_target_s": drafting, learning, the engine), and from them
    "projected_tokens_per_s" under every profile. Exact for policies that do not weigh time (fixed k,
    agreement rewards); an adaptive k planned for the run's own profile keeps its plan."""
    profiles = {name: cost_under(name, measured, max_tokens) for name in (MEASURED, *cost_profiles())}
    for name, engine in engines.items():
        passes, fields = engine.target.passes, methods[name]
        charged = sum(count * engine.target.recording.cost.of(n) for n, count in passes.items())
        fields["target_passes"] = {str(n): passes[n] for n in sorted(passes)}
        fields["non_target_s"] = fields["wall_s"] - charged
        fields["projected_tokens_per_s"] = {
            profile: projected_speed(fields, cost) for profile, cost in profiles.items()
        }
    plain = methods.get("evospec-plain")
    if plain is not None:
        for fields in methods.values():
            if "projected_tokens_per_s" in fields:
                fields["projected_speedup_vs_plain"] = {
                    profile: speed / plain["projected_tokens_per_s"][profile]
                    for profile, speed in fields["projected_tokens_per_s"].items()
                }


def projected_speed(fields: dict, cost: ForwardCost) -> float:
    """Tokens/s of a replayed method (its results fields) were its target passes charged `cost`: so
    runs that timed different T(n) can be charged one curve afterwards."""
    target_s = sum(count * cost.of(int(n)) for n, count in fields["target_passes"].items())
    return fields["new_tokens"] / (fields["non_target_s"] + target_s)


def recorded_cost(results: dict) -> ForwardCost:
    """The T(n) a replay's results.json was charged ("forward_cost_ms"), as a curve."""
    curve = sorted((int(n), ms / 1000) for n, ms in results["forward_cost_ms"].items())
    return ForwardCost(tuple(s for _, s in curve), tuple(n for n, _ in curve))


def _block_label(index: int, size: int, total: int, part: str) -> str:
    """The block of request `index`: e.g. 'gsm 800-899' (requests of the stream, not of the trace set)."""
    start = index - index % size
    return f"{part} {start}-{min(start + size, total) - 1}"
