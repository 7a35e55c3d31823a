"""`evospec demo`: where speculation pays and where it does not, each against plain decoding.

Three requests, each run by plain decoding and by evospec with the model-free drafters (n-gram,
suffix and the request's prediction, under a selector, the draft length adapting up to k):
- an edit of a function, with the original code as the prediction: the answer copies most of it;
- a summary of an article: the answer quotes some of it;
- a chat question: nothing to copy, so the adaptive length should decline to draft.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rich.console import Console
from rich.table import Table
from tqdm.auto import tqdm

from evospec.bench.methods import ADAPTIVE, build_methods
from evospec.bench.workloads import Prompt, edits, spec_bench
from evospec.config import GenerationConfig, LoadConfig
from evospec.generation import encode_prediction, encode_prompt
from evospec.machine import cpu_description
from evospec.models.loading import load_model

PLAIN = "evospec-plain"
EVOSPEC = f"select:ucb-bd{ADAPTIVE}"


@dataclass(frozen=True)
class DemoTask:
    title: str
    prompt: Prompt
    max_new_tokens: int
    why: str  # what the newcomer should see in the numbers


def demo_tasks() -> list[DemoTask]:
    summary = next(prompt for prompt in spec_bench(1) if prompt.category == "summarization")
    chat = next(prompt for prompt in spec_bench(1) if prompt.category == "mt_bench")
    return [
        DemoTask("edit with a prediction", edits(1)[0], 320, "pays most: the answer repeats the prediction"),
        DemoTask("summary of an article", summary, 128, "pays where the summary quotes the article"),
        DemoTask("chat", chat, 128, "nothing to copy: it should stay level with plain decoding"),
    ]


def run_demo(target_spec: str, config: GenerationConfig, backend: str | None, load: LoadConfig) -> None:
    """Each task with plain decoding and with evospec, interleaved, then a table of both."""
    console = Console()
    console.print(f"loading target {target_spec}")
    target = load_model(target_spec, backend, load)
    methods = build_methods([PLAIN, EVOSPEC], target, None, config.num_speculative_tokens, predictions=True)
    cpu = cpu_description()
    table = Table(
        title=f"{target.name} on {target.backend.name}, greedy, draft length adaptive up to "
        f"{config.num_speculative_tokens}; {cpu['model']}, {'AVX512-BF16' if cpu['avx512_bf16'] else 'AVX2'}, "
        f"{cpu['threads']} threads"
    )
    for column in ("task", "method", "tokens", "tau", "decode tokens/s", "speedup", "what it shows"):
        table.add_column(column)
    for task in tqdm(demo_tasks(), desc="demo", unit="task"):
        ids = encode_prompt(target, task.prompt.text, chat=True)
        prediction = encode_prediction(target, task.prompt.prediction)
        task_config = replace(config, max_new_tokens=task.max_new_tokens)
        runs = {method.name: method.run(ids, task_config, prediction) for method in methods}
        plain_rate = runs[PLAIN].decode_tokens_per_s
        for name, stats in runs.items():
            label = "plain decoding" if name == PLAIN else "evospec (ngram, suffix, prediction)"
            table.add_row(
                task.title if name == PLAIN else "",
                label,
                str(stats.new_tokens),
                f"{stats.tau:.2f}",
                f"{stats.decode_tokens_per_s:.1f}",
                f"{stats.decode_tokens_per_s / plain_rate:.2f}x",
                task.why if name == PLAIN else "",
            )
    console.print(table)
    ceiling, size = target.forward_cost(config.num_speculative_tokens + 1).ceiling()
    console.print(
        f"On this machine one forward of {size} tokens costs {size / ceiling:.1f} one-token steps: no drafter "
        f"can decode faster than {ceiling:.2f}x plain, even with every drafted token accepted."
    )
