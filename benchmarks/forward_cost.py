"""T(n): the cost of one target forward over n new tokens, per backend and dtype (evospec.cost).

Speculation pays only where verifying k + 1 tokens costs little more than decoding one, so this
ratio decides the draft length. Usage:
    python benchmarks/forward_cost.py --target qwen2.5-coder-1.5b-instruct --variants llamacpp,hf:int8 \
        --out benchmarks/forward-cost
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from evospec.config import LoadConfig
from evospec.cost import COST_CONTEXT_TOKENS, measure_forward_cost
from evospec.machine import default_threads
from evospec.models.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--variants", default="llamacpp,hf:int8,hf:bf16", help="backend or hf:DTYPE, comma-separated")
    parser.add_argument("--max-tokens", type=int, default=9)
    parser.add_argument("--out", default="benchmarks/forward-cost")
    args = parser.parse_args()
    results = {
        "command": "python benchmarks/forward_cost.py " + " ".join(sys.argv[1:]),
        "target": args.target,
        "threads": default_threads(),
        "context_tokens": COST_CONTEXT_TOKENS,
        "load_average": round(os.getloadavg()[0], 2),
        "variants": {},
    }
    for variant in args.variants.split(","):
        backend, _, dtype = variant.partition(":")
        model = load_model(args.target, backend, LoadConfig(dtype=dtype or None))
        cost = measure_forward_cost(model.new_lm(), args.max_tokens, model.vocab_size)
        results["variants"][variant] = {
            "ms": [round(1e3 * s, 1) for s in cost.seconds],
            "ratio": [round(r, 2) for r in cost.ratios()],
        }
        print(variant, results["variants"][variant], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
