"""`evospec bench`: methods interleaved prompt by prompt on Spec-Bench and the edit workload, greedy, batch 1."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm.auto import tqdm

from evospec.bench.methods import EvospecMethod, all_method_names, build_methods, check_method_names, method_names
from evospec.bench.report import plot_blocks, plot_selection, single_drafters, summarize, write_report
from evospec.bench.workloads import Prompt, edits, spec_bench
from evospec.config import GenerationConfig, LoadConfig
from evospec.cost import COST_CONTEXT_TOKENS
from evospec.errors import EvospecError
from evospec.generation import encode_prediction, encode_prompt
from evospec.learning import LearnerConfig
from evospec.machine import cpu_description
from evospec.models.loading import default_backend, load_model
from evospec.stats import SpecStats

WARMUP_TOKENS = 8  # one short generation per method first, so no method pays first-call costs


@dataclass(frozen=True)
class BenchSettings:
    target: str
    draft_model: str
    methods: tuple[str, ...] | None  # None: every method of the suite
    suite: str  # one of bench.methods.SUITES (method_names says what each runs)
    stream: str  # parts joined by "+", each mixed / domain-shift / category:NAME / NAME / edit (see _stream)
    per_category: int
    backend: str | None  # None: default_backend(target)
    generation: GenerationConfig
    out_dir: Path
    command: str  # recorded with the results
    white_box: Path | None = None  # an eagle or hydra checkpoint: evospec:<kind>[+<learner>] methods
    learning: LearnerConfig = LearnerConfig()
    load: LoadConfig = LoadConfig()  # how the target (and a small LM) load and run


def run_bench(settings: BenchSettings) -> dict:
    """Run, print the Markdown table, write results.json/.md and a plot into settings.out_dir."""
    if not settings.generation.sampling.greedy:
        raise EvospecError("the benchmark is greedy (Spec-Bench convention); drop --temperature")
    prompts = _stream(settings.stream, settings.per_category)
    load_average = os.getloadavg()[0]
    backend = settings.backend or default_backend(settings.target)
    suite = method_names(settings.draft_model, backend, settings.suite, settings.white_box)
    names = list(settings.methods or suite)
    check_method_names(names, all_method_names(settings.draft_model, backend, settings.white_box))  # before loading GBs
    target = load_model(settings.target, backend, settings.load)
    # The edit suite runs model-free drafters only: its selectors draft without a small LM.
    draft_model = None if settings.suite == "edit" else load_model(settings.draft_model, backend, settings.load)
    methods = build_methods(
        names,
        target,
        draft_model,
        settings.generation.num_speculative_tokens,
        settings.white_box,
        settings.learning,
        predictions=any(p.prediction for p in prompts),
    )
    prompt_ids = [encode_prompt(target, prompt.text, chat=True) for prompt in prompts]
    predictions = [encode_prediction(target, prompt.prediction) for prompt in prompts]

    warmup = replace(settings.generation, max_new_tokens=WARMUP_TOKENS)
    for method in methods:
        method.run(prompt_ids[0], warmup, predictions[0])
    runs: dict[str, list[tuple[str, SpecStats]]] = {method.name: [] for method in methods}
    with tqdm(total=len(prompts) * len(methods), desc="bench", unit="gen") as progress:
        for prompt, ids, prediction in zip(prompts, prompt_ids, predictions):
            for method in methods:  # interleaved: A B C A B C ..., since machine speed drifts
                progress.set_postfix_str(f"{prompt.category} {method.name}")
                runs[method.name].append((prompt.category, method.run(ids, settings.generation, prediction)))
                progress.update()

    methods_summary, plain = summarize(runs)
    results = {
        "command": settings.command,
        "target": target.name,
        "backend": backend,
        "dtype": target.weights_format,
        "temperature": settings.generation.sampling.temperature,
        "stream": settings.stream,
        "prompts": len(prompts),
        "max_new_tokens": settings.generation.max_new_tokens,
        "num_speculative_tokens": settings.generation.num_speculative_tokens,
        "threads": target.backend.threads(target.model),
        "cpu": cpu_description(),
        "load_average": round(load_average, 2),
        "plain_method": plain,
        "methods": methods_summary,
    }
    learners = {
        method.name: [learner.report() for learner in method.engine.learners]
        for method in methods
        if isinstance(method, EvospecMethod) and method.engine.learners
    }
    if learners:  # what each learner did over the stream, and the memory its state holds
        results["learners"] = learners
    # T(n) on this machine, and the most any drafter could gain from it: every drafted token accepted.
    cost = target.forward_cost(settings.generation.num_speculative_tokens + 1)
    ceiling, size = cost.ceiling()
    results["forward_cost_ms"] = {str(n): round(1000 * s, 2) for n, s in zip(cost.sizes, cost.seconds)}
    results["ceiling"] = {
        "speedup": round(ceiling, 3),
        "forward_tokens": size,
        "note": f"(m + 1) T(1) / T(m + 1) at its best m, T measured after {COST_CONTEXT_TOKENS} tokens",
    }
    # llama-bench's decode figure: one-token forwards and nothing else, after a COST_CONTEXT_TOKENS context.
    results["bare_decode_tokens_per_s"] = round(1 / cost.of(1), 2)
    print(f"bare decode (one-token forwards, {COST_CONTEXT_TOKENS}-token context): {1 / cost.of(1):.2f} tokens/s")
    write_report(results, settings.out_dir)
    if any(name.startswith("select:") for name in runs) and single_drafters(list(runs)):
        plot_selection(runs, settings.out_dir / "selection.png")
    if len({prompt.category for prompt in prompts}) > 1 and settings.stream != "mixed":
        plot_blocks(results, settings.out_dir / "blocks.png")
    print((settings.out_dir / "results.md").read_text())
    return results


def _stream(stream: str, per_category: int) -> list[Prompt]:
    """The prompts of a stream, one part after another; parts are joined by "+", each "mixed" or
    "domain-shift" (every Spec-Bench category, category after category), "category:NAME" or NAME (one
    Spec-Bench category), or "edit" (the edit workload: per_category requests of each kind of edit)."""
    prompts = spec_bench(per_category)
    categories = list(dict.fromkeys(prompt.category for prompt in prompts))
    chosen = []
    for part in stream.split("+"):
        category = part.removeprefix("category:")
        if part in ("mixed", "domain-shift"):
            chosen += prompts
        elif part == "edit":
            chosen += edits(per_category)
        elif category in categories:
            chosen += [prompt for prompt in prompts if prompt.category == category]
        else:
            raise EvospecError(
                f"unknown stream {part!r}; use mixed, domain-shift, edit or category:NAME (NAME one of "
                f"{', '.join(categories)}), or several joined by '+'"
            )
    return chosen
