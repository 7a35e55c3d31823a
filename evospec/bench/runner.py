"""`evospec bench`: methods interleaved prompt by prompt on Spec-Bench, greedy, batch 1."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from evospec.bench.methods import build_methods, check_method_names, method_names
from evospec.bench.report import summarize, write_report
from evospec.bench.workloads import spec_bench
from evospec.config import DEFAULT_DTYPE, GenerationConfig
from evospec.errors import EvospecError
from evospec.generation import encode_prompt
from evospec.models.llamacpp import default_threads
from evospec.models.loading import default_backend, load_model
from evospec.stats import SpecStats

WARMUP_TOKENS = 8  # one short generation per method first, so no method pays first-call costs


@dataclass(frozen=True)
class BenchSettings:
    target: str
    draft_model: str
    methods: tuple[str, ...] | None  # None: every method of method_names()
    per_category: int
    dtype: str | None  # hf backend only; None: DEFAULT_DTYPE
    backend: str | None  # None: default_backend(target)
    generation: GenerationConfig
    out_dir: Path
    command: str  # recorded with the results


def run_bench(settings: BenchSettings) -> dict:
    """Run, print the Markdown table, write results.json/.md and a plot into settings.out_dir."""
    if not settings.generation.sampling.greedy:
        raise EvospecError("the benchmark is greedy (Spec-Bench convention); drop --temperature")
    prompts = spec_bench(settings.per_category)
    load_average = os.getloadavg()[0]
    backend = settings.backend or default_backend(settings.target)
    known = method_names(settings.draft_model, backend)
    names = list(settings.methods or known)
    check_method_names(names, known)  # before loading GBs of weights
    target = load_model(settings.target, settings.dtype, backend)
    draft_model = load_model(settings.draft_model, settings.dtype, backend)
    methods = build_methods(names, target, draft_model, settings.generation.num_speculative_tokens)
    prompt_ids = [encode_prompt(target, prompt.text, chat=True) for prompt in prompts]

    warmup = replace(settings.generation, max_new_tokens=WARMUP_TOKENS)
    for method in methods:
        method.run(prompt_ids[0], warmup)
    runs: dict[str, list[tuple[str, SpecStats]]] = {method.name: [] for method in methods}
    with tqdm(total=len(prompts) * len(methods), desc="bench", unit="gen") as progress:
        for prompt, ids in zip(prompts, prompt_ids):
            for method in methods:  # interleaved: A B C A B C ..., since machine speed drifts
                progress.set_postfix_str(f"{prompt.category} {method.name}")
                runs[method.name].append((prompt.category, method.run(ids, settings.generation)))
                progress.update()

    methods_summary, plain = summarize(runs)
    results = {
        "command": settings.command,
        "target": target.name,
        "backend": backend,
        "dtype": "gguf" if backend == "llamacpp" else settings.dtype or DEFAULT_DTYPE,
        "temperature": settings.generation.sampling.temperature,
        "stream": "spec-bench",
        "prompts": len(prompts),
        "max_new_tokens": settings.generation.max_new_tokens,
        "num_speculative_tokens": settings.generation.num_speculative_tokens,
        "threads": default_threads() if backend == "llamacpp" else torch.get_num_threads(),
        "load_average": round(load_average, 2),
        "plain_method": plain,
        "methods": methods_summary,
    }
    write_report(results, settings.out_dir)
    print((settings.out_dir / "results.md").read_text())
    return results
