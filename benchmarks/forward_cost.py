"""T(n): the cost of one target forward over n new tokens after a prompt, per dtype.

Speculation pays only where verifying k + 1 tokens costs little more than decoding one, so this
ratio decides the draft length. Usage:
    python benchmarks/forward_cost.py --target qwen2.5-coder-1.5b-instruct --out benchmarks/forward-cost
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from evospec.models.loading import load_model
from evospec.target import CachedLM

SIZES = (1, 2, 3, 5, 9)


def forward_cost(spec: str, dtype: str, prompt_tokens: int, repeats: int) -> dict[str, float]:
    """Median milliseconds of a forward over n tokens after a prompt of prompt_tokens, for n in SIZES."""
    lm = CachedLM(load_model(spec, dtype).model)
    start = time.perf_counter()
    lm.forward(list(range(1000, 1000 + prompt_tokens)), num_logits=1)
    costs = {"prefill_tokens_per_s": prompt_tokens / (time.perf_counter() - start)}
    for n in SIZES:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            lm.forward([42] * n)
            times.append(time.perf_counter() - start)
            lm.trim(prompt_tokens)
        costs[f"T({n})_ms"] = 1e3 * statistics.median(times)
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/forward-cost")
    args = parser.parse_args()
    results = {
        "command": "python benchmarks/forward_cost.py " + " ".join(os.sys.argv[1:]),
        "target": args.target, "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "load_average": os.getloadavg()[0],
        "dtypes": {},
    }
    for dtype in args.dtypes.split(","):
        costs = forward_cost(args.target, dtype, args.prompt_tokens, args.repeats)
        costs.update({f"T({n})/T(1)": costs[f"T({n})_ms"] / costs["T(1)_ms"] for n in SIZES[1:]})
        results["dtypes"][dtype] = costs
        print(dtype, {key: round(value, 2) for key, value in costs.items()}, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
