"""Results in the one shape of shared/benchmarks.md, a Markdown table and a plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evospec.stats import SpecStats

# The first present is "plain" for speedup_vs_plain: what users of that backend run today, else evospec's.
PLAIN_METHODS = ("llamacpp-plain", "evospec-plain", "hf-plain")


def aggregate(runs: Sequence[SpecStats]) -> dict[str, Any]:
    """One method's fields over some generations (tokens/s over the summed wall time)."""
    total = SpecStats()
    for stats in runs:
        total.merge(stats)
    return {
        "tokens_per_s": total.tokens_per_s,
        "tau": total.tau,
        "acceptance_rate": total.acceptance_rate,
        "rounds": total.num_verifications,
        "new_tokens": total.new_tokens,
        "wall_s": total.wall_s,
        "prefill_s": total.prefill_s,
        "draft_s": total.draft_s,
        "loop_overhead_us": total.loop_overhead_us,
        "learn_s": 0.0,
    }


def summarize(runs: dict[str, list[tuple[str, SpecStats]]]) -> tuple[dict[str, Any], str]:
    """runs: method -> [(category, stats) per prompt] -> (the "methods" object, the plain method's name)."""
    methods = {}
    for name, method_runs in runs.items():
        categories = sorted({category for category, _ in method_runs}, key=[c for c, _ in method_runs].index)
        methods[name] = aggregate([stats for _, stats in method_runs])
        methods[name]["per_category"] = {
            category: aggregate([stats for c, stats in method_runs if c == category]) for category in categories
        }
    plain = next((name for name in PLAIN_METHODS if name in methods), next(iter(methods)))
    for fields in methods.values():
        fields["speedup_vs_plain"] = fields["tokens_per_s"] / methods[plain]["tokens_per_s"]
        for category, category_fields in fields["per_category"].items():
            plain_rate = methods[plain]["per_category"][category]["tokens_per_s"]
            category_fields["speedup_vs_plain"] = category_fields["tokens_per_s"] / plain_rate
    return methods, plain


def markdown(results: dict[str, Any]) -> str:
    """A table over all prompts, then the speedup per category."""
    methods = results["methods"]
    lines = [
        f"`{results['command']}`",
        "",
        f"target {results['target']} on {results.get('backend', 'hf')}, {results['dtype']}, temperature {results['temperature']}, "
        f"{results['prompts']} prompts, max_new_tokens {results['max_new_tokens']}, "
        f"{results['threads']} threads, load {results['load_average']}; plain = {results['plain_method']}",
        "",
        "| method | tokens/s | speedup vs plain | tau | acceptance | new tokens | wall s | loop µs/round |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, m in methods.items():
        rate = "-" if m["acceptance_rate"] is None else f"{m['acceptance_rate']:.2f}"
        # Only evospec's own loop is timed piece by piece; the baselines' loops are not visible.
        overhead = f"{m['loop_overhead_us']:.0f}" if name.startswith("evospec") else "-"
        lines.append(
            f"| {name} | {m['tokens_per_s']:.2f} | {m['speedup_vs_plain']:.2f}x | {m['tau']:.2f} | {rate} "
            f"| {m['new_tokens']} | {m['wall_s']:.1f} | {overhead} |"
        )
    categories = list(next(iter(methods.values()))["per_category"])
    lines += ["", "Speedup vs plain per category (tau in brackets):", "",
              "| method | " + " | ".join(categories) + " |", "|---" * (len(categories) + 1) + "|"]
    for name, m in methods.items():
        cells = [f"{m['per_category'][c]['speedup_vs_plain']:.2f}x ({m['per_category'][c]['tau']:.2f})"
                 for c in categories]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_speedups(results: dict[str, Any], path: Path) -> None:
    """Grouped bars: speedup vs plain per category (and over all prompts) for each method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = results["methods"]
    categories = [*next(iter(methods.values()))["per_category"], "all"]
    width = 0.8 / len(methods)
    figure, axes = plt.subplots(figsize=(max(8, 1.4 * len(categories)), 5.5))
    for index, (name, m) in enumerate(methods.items()):
        values = [m["per_category"][c]["speedup_vs_plain"] for c in categories[:-1]] + [m["speedup_vs_plain"]]
        axes.bar([c + index * width for c in range(len(categories))], values, width, label=name)
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.set_xticks([c + 0.4 - width / 2 for c in range(len(categories))], categories, rotation=20)
    axes.set_ylabel(f"tokens/s vs {results['plain_method']}")
    axes.set_title(f"{results['target']} ({results['dtype']}, greedy)")
    axes.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(results: dict[str, Any], out_dir: Path) -> None:
    """results.json, results.md and speedup.png in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / "results.md").write_text(markdown(results))
    plot_speedups(results, out_dir / "speedup.png")
