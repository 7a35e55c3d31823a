"""Does serving get faster when the drafter learns? Two `evospec serve` processes, the same warm-started
drafter, learning off and on, answer the same stream of chat requests, interleaved request by request.

Each request's speculative stats come back in its usage (`spec_decode`); tokens/s there is the engine's,
learning time included. Both servers must answer every request with the same text (greedy, lossless).
Writes results.json (the project's benchmark shape; per_block = blocks of --block requests) and
learning.png: tokens/s and tau per block for both, and their ratio. Usage:
    python benchmarks/serve_learning.py --target qwen2.5-coder-1.5b-instruct --drafter eagle:CKPT \
        --learner ogd --category translation --requests 24 --max-tokens 96 --out benchmarks/serve-learning-1.5b
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import openai
from serve_load import start_server
from tqdm import tqdm

from evospec.bench.workloads import spec_bench

SUMMED = (
    "new_tokens",
    "wall_s",
    "learn_s",
    "num_drafts",
    "num_draft_tokens",
    "num_accepted_tokens",
    "num_verifications",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True, help="a learnable drafter, e.g. eagle:CKPT")
    parser.add_argument("--learner", default="ogd")
    parser.add_argument("--server-arg", action="append", default=[], help="one more argument for both servers")
    parser.add_argument("--category", default="translation", help="the Spec-Bench category the stream is drawn from")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--block", type=int, default=4, help="requests per block in per_block and the plot")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--out", required=True, help="a directory for results.json and learning.png")
    args = parser.parse_args()
    if min(args.requests, args.block, args.max_tokens) < 1:
        parser.error("--requests, --block and --max-tokens must be >= 1")
    prompts = [prompt.text for prompt in spec_bench(args.requests) if prompt.category == args.category][: args.requests]
    if len(prompts) < args.requests:
        parser.error(f"Spec-Bench has {len(prompts)} prompts of category {args.category!r}")
    drafter = args.drafter.split(":")[0]  # the method names leave the checkpoint path out
    methods = {f"evospec:{drafter}": [], f"evospec:{drafter}+{args.learner}": ["--learner", args.learner]}
    load_average = os.getloadavg()[0]
    servers = {}
    try:
        for name, extra in methods.items():
            server_args = argparse.Namespace(
                target=args.target, drafter=[args.drafter], model=None, server_arg=[*args.server_arg, *extra]
            )
            servers[name] = start_server(server_args)
        records = run_stream(servers, args.target, prompts, args.max_tokens)
    finally:
        for process, _ in servers.values():
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=120)
    results = {
        "command": "python benchmarks/serve_learning.py " + " ".join(sys.argv[1:]),
        "target": args.target,
        "temperature": 0.0,
        "stream": f"category:{args.category}",
        "prompts": len(prompts),
        "max_new_tokens": args.max_tokens,
        "threads": os.cpu_count(),
        "load_average": load_average,
        "same_text": all(len({record[name]["text"] for name in methods}) == 1 for record in records),
        "methods": {name: summary([record[name] for record in records], args.block) for name in methods},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, out / "learning.png", args.block)
    print(
        json.dumps(
            {
                name: {key: value for key, value in method.items() if key != "per_block"}
                for name, method in results["methods"].items()
            },
            indent=1,
        )
    )


def run_stream(servers: dict, model: str, prompts: list[str], max_tokens: int) -> list[dict]:
    """Each prompt to every server (the order alternates), greedy -> per prompt, per server: text and stats."""
    clients = {
        name: openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=3600)
        for name, (_, url) in servers.items()
    }
    names = list(clients)
    records = []
    for index, prompt in enumerate(tqdm(prompts, desc="requests", unit="request")):
        record = {}
        for name in names if index % 2 == 0 else names[::-1]:
            answer = clients[name].chat.completions.create(
                model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0
            )
            record[name] = {"text": answer.choices[0].message.content, **answer.usage.model_extra["spec_decode"]}
        records.append(record)
    return records


def summary(stats: list[dict], block: int) -> dict:
    """The method's figures over the whole stream, and per block of `block` requests."""

    def total(part: list[dict]) -> dict:
        sums = {key: sum(entry[key] for entry in part) for key in SUMMED}
        return {
            "tokens_per_s": sums["new_tokens"] / sums["wall_s"],
            "tau": sums["new_tokens"] / max(1, sums["num_verifications"]),
            "acceptance_rate": sums["num_accepted_tokens"] / sums["num_draft_tokens"]
            if sums["num_draft_tokens"]
            else None,
            "rounds": sums["num_verifications"],
            **{key: sums[key] for key in ("new_tokens", "wall_s", "learn_s")},
        }

    return {**total(stats), "per_block": [total(stats[start : start + block]) for start in range(0, len(stats), block)]}


def plot(results: dict, path: Path, block: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(14, 4))
    methods = results["methods"]
    for name, method in methods.items():
        blocks = range(1, len(method["per_block"]) + 1)
        axes[0].plot(blocks, [entry["tokens_per_s"] for entry in method["per_block"]], marker="o", label=name)
        axes[1].plot(blocks, [entry["tau"] for entry in method["per_block"]], marker="o", label=name)
    off, on = (methods[name]["per_block"] for name in methods)
    axes[2].plot(range(1, len(on) + 1), [b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(off, on)], marker="o")
    axes[2].axhline(1.0, color="grey", linewidth=0.8)
    for axis, label in zip(axes, ("tokens/s", "tau", "tokens/s, learning on / off")):
        axis.set_xlabel(f"block of {block} requests")
        axis.set_ylabel(label)
    axes[0].legend(fontsize=7)
    figure.suptitle(f"{results['target']}, {results['stream']}: learning on vs off while serving")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
