"""Results in the one shape every benchmark writes (benchmarks/README.md), a Markdown table and plots."""

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
        "decode_tokens_per_s": total.decode_tokens_per_s,
        "tau": total.tau,
        "acceptance_rate": total.acceptance_rate,
        "rounds": total.num_verifications,
        "accepted_per_position": list(total.num_accepted_tokens_per_pos),  # [j]: rounds whose j-th draft token was kept
        "new_tokens": total.new_tokens,
        "wall_s": total.wall_s,
        "prefill_s": total.prefill_s,
        "draft_s": total.draft_s,
        "loop_overhead_us": total.loop_overhead_us,
        "learn_s": total.learn_s,
        "drafters": {name: arm.to_dict() for name, arm in total.drafters.items()},  # per arm: pulls, reward, tau, ...
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
        methods[name]["per_block"] = [
            {"block": category, **aggregate([stats for c, stats in method_runs if c == category])}
            for category in categories
        ]
    _add_oracle(methods)
    plain = next((name for name in PLAIN_METHODS if name in methods), next(iter(methods)))
    for fields in methods.values():
        _add_speedups(fields, methods[plain])
        for category, category_fields in fields["per_category"].items():
            _add_speedups(category_fields, methods[plain]["per_category"][category])
    return methods, plain


def _add_speedups(fields: dict[str, Any], plain: dict[str, Any]) -> None:
    """speedup_vs_plain, and decode_speedup_vs_plain: the same with the prefill (the same work for every
    method, and on long prompts most of the wall time) left out."""
    fields["speedup_vs_plain"] = fields["tokens_per_s"] / plain["tokens_per_s"]
    fields["decode_speedup_vs_plain"] = fields["decode_tokens_per_s"] / plain["decode_tokens_per_s"]


def plot_blocks(results: dict[str, Any], path: Path) -> None:
    """tau per block of the stream, one line per method (how drafters follow a domain shift)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4.5))
    for name, fields in results["methods"].items():
        if fields["rounds"]:
            axis.plot([block["tau"] for block in fields["per_block"]], marker="o", label=name)
    blocks = [block["block"] for block in next(iter(results["methods"].values()))["per_block"]]
    step = -(-len(blocks) // 20)  # at most 20 labels: a long stream's would overlap
    axis.set_xticks(range(0, len(blocks), step), blocks[::step], rotation=30, ha="right")
    axis.set_ylabel("tau (tokens per target pass)")
    axis.set_title(f"{results['target']}: tau per block of the {results['stream']} stream")
    axis.grid(alpha=0.3)
    # below the axes: long method names (learner settings) would hide the lines
    axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=2)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)


def single_drafters(names: Sequence[str]) -> list[str]:
    """The methods that run one drafter (evospec:<drafter>, its draft length fixed or adaptive)."""
    return [name for name in names if name.startswith("evospec:")]


def _add_oracle(methods: dict[str, Any]) -> None:
    """With selectors in the run, "oracle": the best single drafter in hindsight (by tokens/s) over the
    stream, and per category the best single drafter of that category (a stationary stream each)."""
    singles = single_drafters(list(methods))
    if not singles or not any(name.startswith("select:") for name in methods):
        return
    best = max(singles, key=lambda name: methods[name]["tokens_per_s"])
    oracle = {**methods[best], "best": best, "per_category": {}}
    for category in methods[best]["per_category"]:
        best_here = max(singles, key=lambda name: methods[name]["per_category"][category]["tokens_per_s"])
        oracle["per_category"][category] = {**methods[best_here]["per_category"][category], "best": best_here}
    methods["oracle"] = oracle


def plot_selection(runs: dict[str, list[tuple[str, SpecStats]]], path: Path) -> None:
    """Left: each selector's cumulative regret in rounds against the single drafter with the fewest
    rounds over the stream. Right: the share of pulls of each arm, prompt by prompt, for each selector."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    singles = single_drafters(list(runs))
    selectors = [name for name in runs if name.startswith("select:")]
    best = min(singles, key=lambda name: sum(stats.num_verifications for _, stats in runs[name]))
    categories = [category for category, _ in runs[best]]
    figure, (regret_axes, share_axes) = plt.subplots(1, 2, figsize=(14, 5))
    for name in selectors:
        regret, curve = 0, []
        for (_, stats), (_, reference) in zip(runs[name], runs[best]):
            regret += stats.num_verifications - reference.num_verifications
            curve.append(regret)
        regret_axes.plot(range(1, len(curve) + 1), curve, marker=".", label=name)
    regret_axes.axhline(0, color="grey", linewidth=0.8)
    regret_axes.set_xlabel("prompt (blocks: " + ", ".join(dict.fromkeys(categories)) + ")", fontsize=8)
    regret_axes.set_ylabel(f"cumulative rounds - rounds of {best}")
    regret_axes.set_title("regret in rounds (stopping time)")
    regret_axes.legend(fontsize=8)
    arms = sorted({arm for name in selectors for _, stats in runs[name] for arm in stats.drafters})
    width = 0.8 / max(1, len(selectors))
    for index, name in enumerate(selectors):
        bottom = [0.0] * len(categories)
        for arm_index, arm in enumerate(arms):
            shares = []
            for _, stats in runs[name]:
                pulls = sum(a.pulls for a in stats.drafters.values())
                shares.append(stats.drafters[arm].pulls / pulls if pulls and arm in stats.drafters else 0.0)
            share_axes.bar(
                [i + index * width for i in range(len(categories))],
                shares,
                width,
                bottom=bottom,
                color=f"C{arm_index}",
                label=arm if index == 0 else None,
                edgecolor="white",
                linewidth=0.3,
            )
            bottom = [b + v for b, v in zip(bottom, shares)]
    share_axes.set_xlabel(
        "prompt; bars left to right: " + ", ".join(name.removeprefix("select:") for name in selectors), fontsize=8
    )
    share_axes.set_ylabel("share of pulls")
    share_axes.set_title("arms pulled per prompt")
    share_axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def markdown(results: dict[str, Any]) -> str:
    """A table over all prompts, then the speedup per category."""
    methods = results["methods"]
    lines = [
        f"`{results['command']}`",
        "",
        f"target {results['target']} on {results.get('backend', 'hf')}, {results['dtype']}, "
        f"temperature {results['temperature']}, "
        f"{results['prompts']} prompts, max_new_tokens {results['max_new_tokens']}, "
        f"{results['threads']} threads, load {results['load_average']}; plain = {results['plain_method']}",
        *_machine_lines(results),
        "",
        "| method | tokens/s | speedup vs plain | decode speedup | tau | acceptance | new tokens | wall s | prefill s "
        "| loop µs/round |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in methods.items():
        rate = "-" if m["acceptance_rate"] is None else f"{m['acceptance_rate']:.2f}"
        # Only evospec's own loop is timed piece by piece; the baselines' loops are not visible.
        overhead = f"{m['loop_overhead_us']:.0f}" if name.startswith(("evospec", "select")) else "-"
        name = f"oracle ({m['best']})" if name == "oracle" else name
        lines.append(
            f"| {name} | {m['tokens_per_s']:.2f} | {m['speedup_vs_plain']:.2f}x | {m['decode_speedup_vs_plain']:.2f}x "
            f"| {m['tau']:.2f} | {rate} | {m['new_tokens']} | {m['wall_s']:.1f} | {m['prefill_s']:.1f} | {overhead} |"
        )
    categories = list(next(iter(methods.values()))["per_category"])
    for title, field in (
        ("Speedup vs plain", "speedup_vs_plain"),
        ("Decode speedup (prefill left out)", "decode_speedup_vs_plain"),
    ):
        lines += [
            "",
            f"{title} per category (tau in brackets):",
            "",
            "| method | " + " | ".join(categories) + " |",
            "|---" * (len(categories) + 1) + "|",
        ]
        for name, m in methods.items():
            cells = [f"{m['per_category'][c][field]:.2f}x ({m['per_category'][c]['tau']:.2f})" for c in categories]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _machine_lines(results: dict[str, Any]) -> list[str]:
    """The CPU, the target's T(n) and the ceiling it allows, where the run recorded them."""
    if "forward_cost_ms" not in results:
        return []
    cost = ", ".join(f"{n}: {ms:g}" for n, ms in results["forward_cost_ms"].items())
    ceiling = results["ceiling"]
    return [
        "",
        f"CPU {results['cpu']['model']} ({', '.join(results['cpu']['flags'])}); T(n) in ms, n: {cost}; "
        f"ceiling {ceiling['speedup']:.2f}x (every drafted token accepted, {ceiling['forward_tokens']}-token forwards)",
    ]


def plot_speedups(results: dict[str, Any], path: Path) -> None:
    """Grouped bars per category (and over all prompts) for each method: speedup vs plain over the
    whole wall time (left) and with the prefill left out (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = results["methods"]
    first = next(iter(methods.values()))
    categories = [*first["per_category"], "all"]
    shown = [
        (field, title)
        for field, title in (("speedup_vs_plain", "tokens/s"), ("decode_speedup_vs_plain", "decode tokens/s"))
        if field in first
    ]
    width = 0.8 / len(methods)
    figure, panels = plt.subplots(
        1, len(shown), figsize=(len(shown) * max(7, 1.2 * len(categories)), 5.5), sharey=True, squeeze=False
    )
    panels = panels[0]
    for axes, (field, title) in zip(panels, shown):
        for index, (name, m) in enumerate(methods.items()):
            values = [m["per_category"][c][field] for c in categories[:-1]] + [m[field]]
            axes.bar([c + index * width for c in range(len(categories))], values, width, label=name)
        axes.axhline(1.0, color="grey", linewidth=0.8)
        axes.set_xticks([c + 0.4 - width / 2 for c in range(len(categories))], categories, rotation=20)
        axes.set_ylabel(f"{title} vs {results['plain_method']}")
        axes.set_title(f"{results['target']} ({results['dtype']}, greedy): {title}")
    panels[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, -0.2), ncol=4)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_forward_cost(results: dict[str, Any], path: Path) -> None:
    """The target's measured T(n) on this machine: seconds per forward and per token, and the ceiling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [int(n) for n in results["forward_cost_ms"]]
    milliseconds = list(results["forward_cost_ms"].values())
    cpu = results["cpu"]
    figure, (total, per_token) = plt.subplots(1, 2, figsize=(12, 4.5))
    total.plot(sizes, milliseconds, marker="o")
    total.set_xlabel("tokens in one forward (n)")
    total.set_ylabel("T(n), ms")
    per_token.plot(sizes, [ms / n / milliseconds[0] for n, ms in zip(sizes, milliseconds)], marker="o")
    per_token.set_xlabel("tokens in one forward (n)")
    per_token.set_ylabel("T(n) / n, in one-token steps")
    per_token.set_ylim(bottom=0)
    for axes in (total, per_token):
        axes.grid(alpha=0.3)
    flags = "AVX512-BF16" if cpu["avx512_bf16"] else "AVX2" if cpu["avx2"] else "no AVX2"
    figure.suptitle(
        f"{results['target']} on {results['backend']}, {cpu['model']} ({flags}), {cpu['threads']} threads: "
        f"ceiling {results['ceiling']['speedup']:.2f}x at n = {results['ceiling']['forward_tokens']}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_report(results: dict[str, Any], out_dir: Path) -> None:
    """results.json, results.md, speedup.png and, where the run measured T(n), forward_cost.png in out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / "results.md").write_text(markdown(results))
    plot_speedups(results, out_dir / "speedup.png")
    if "forward_cost_ms" in results:
        plot_forward_cost(results, out_dir / "forward_cost.png")
