"""`evospec demo`: the default pair against plain decoding on a few short Spec-Bench prompts."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from tqdm.auto import tqdm

from evospec.bench.methods import ADAPTIVE, build_methods
from evospec.bench.report import aggregate
from evospec.bench.workloads import spec_bench
from evospec.config import GenerationConfig
from evospec.errors import EvospecError
from evospec.generation import encode_prompt
from evospec.models.loading import load_model
from evospec.stats import SpecStats

PLAIN = "evospec-plain"
# Categories with short prompts: the demo should show decoding, not minutes of prefill of long articles.
DEMO_CATEGORIES = ("mt_bench", "qa", "math_reasoning", "translation")


def run_demo(
    target_spec: str, draft_model_spec: str, prompts: int, config: GenerationConfig, dtype: str | None, backend: str | None
) -> None:
    """Plain decoding, the small-LM drafter and the n-gram drafter, interleaved on each prompt."""
    workload = [prompt for prompt in spec_bench(1) if prompt.category in DEMO_CATEGORIES]
    if not 1 <= prompts <= len(workload):
        raise EvospecError(f"--prompts must be between 1 and {len(workload)}, got {prompts}")
    console = Console()
    console.print(f"loading target {target_spec} and drafter {draft_model_spec}")
    target = load_model(target_spec, dtype, backend)
    draft_model = load_model(draft_model_spec, dtype, target.backend)
    names = [PLAIN, f"evospec:{draft_model.name}", "evospec:ngram", f"evospec:ngram{ADAPTIVE}"]
    methods = build_methods(names, target, draft_model, config.num_speculative_tokens)

    runs: dict[str, list[SpecStats]] = {name: [] for name in names}
    table = Table(title=f"{target.name} on {target.backend}, greedy, k={config.num_speculative_tokens}, {config.max_new_tokens} new tokens")
    for column in ("prompt", "method", "tokens", "tau", "tokens/s", "speedup"):
        table.add_column(column)
    for prompt in tqdm(workload[:prompts], desc="demo", unit="prompt"):
        ids = encode_prompt(target, prompt.text, chat=True)
        for method in methods:
            runs[method.name].append(method.run(ids, config))
        plain_rate = runs[PLAIN][-1].tokens_per_s
        for name in names:
            stats = runs[name][-1]
            table.add_row(f"{prompt.category} #{prompt.id}", name, str(stats.new_tokens), f"{stats.tau:.2f}",
                          f"{stats.tokens_per_s:.2f}", f"{stats.tokens_per_s / plain_rate:.2f}x")
    plain_total = aggregate(runs[PLAIN])["tokens_per_s"]
    for name in names:
        total = aggregate(runs[name])
        table.add_row("[bold]all[/bold]", name, str(total["new_tokens"]), f"{total['tau']:.2f}",
                      f"{total['tokens_per_s']:.2f}", f"{total['tokens_per_s'] / plain_total:.2f}x")
    console.print(table)
