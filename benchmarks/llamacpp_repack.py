"""llama.cpp with repacked weights or not: T(n), and whether an n-token call's rows equal one-token steps.

Both loads of the GGUF file are timed interleaved (sizes and variants alternate over the repeats).
Exactness is checked with unchunked calls: the rows of one n-token forward against n one-token
forwards after the same context, at several context lengths. Usage:
    python benchmarks/llamacpp_repack.py --target qwen2.5-coder-1.5b-instruct --out benchmarks/llamacpp-repack-1.5b
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from evospec.cost import COST_CONTEXT_TOKENS, COST_REPEATS
from evospec.machine import default_threads
from evospec.models.llamacpp import LlamaCppConfig, LlamaCppModel
from evospec.models.loading import load_model

EXACTNESS_CONTEXTS = (40, 300, 1100)  # tokens cached before the compared rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--out", default="benchmarks/llamacpp-repack")
    args = parser.parse_args()
    gguf = load_model(args.target, backend="llamacpp").source
    variants = {"repacked": True, "unpacked": False}
    models = {
        name: LlamaCppModel(gguf, LlamaCppConfig(repack=repack, exact_rows=args.max_tokens))
        for name, repack in variants.items()
    }
    token_ids = [(7 + 31 * i) % models["repacked"].vocab_size for i in range(max(EXACTNESS_CONTEXTS) + args.max_tokens)]
    results = {
        "command": "python benchmarks/llamacpp_repack.py " + " ".join(sys.argv[1:]),
        "target": args.target,
        "threads": default_threads(),
        "load_average": round(os.getloadavg()[0], 2),
        "context_tokens": COST_CONTEXT_TOKENS,
        "variants": {},
    }
    seconds = timings(models, token_ids, args.max_tokens)
    for name, model in models.items():
        ms = [1e3 * statistics.median(seconds[name, n]) for n in range(1, args.max_tokens + 1)]
        results["variants"][name] = {
            "ms": [round(t, 1) for t in ms],
            "ratio": [round(t / ms[0], 2) for t in ms],
            "inexact_rows": {str(c): inexact_sizes(model, token_ids, c, args.max_tokens) for c in EXACTNESS_CONTEXTS},
        }
        print(name, results["variants"][name], flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


def timings(
    models: dict[str, LlamaCppModel], token_ids: list[int], max_tokens: int
) -> dict[tuple[str, int], list[float]]:
    """Seconds of forwards of 1..max_tokens tokens after COST_CONTEXT_TOKENS, per variant, interleaved."""
    lms = {name: model.new_lm() for name, model in models.items()}
    for lm in lms.values():
        lm.forward(token_ids[:COST_CONTEXT_TOKENS], num_logits=1)
    seconds: dict[tuple[str, int], list[float]] = {}
    for _ in range(COST_REPEATS):
        for n in range(1, max_tokens + 1):
            for name, lm in lms.items():
                start = time.perf_counter()
                lm.forward(token_ids[COST_CONTEXT_TOKENS : COST_CONTEXT_TOKENS + n])
                seconds.setdefault((name, n), []).append(time.perf_counter() - start)
                lm.trim(COST_CONTEXT_TOKENS)
    return seconds


def inexact_sizes(model: LlamaCppModel, token_ids: list[int], context: int, max_tokens: int) -> list[int]:
    """The call sizes n in 2..max_tokens whose rows differ from one-token steps after `context` tokens."""
    lm = model.new_lm()
    lm.forward(token_ids[:context], num_logits=1)
    stepped = torch.cat([lm.forward([token]).clone() for token in token_ids[context : context + max_tokens]])
    inexact = []
    for n in range(2, max_tokens + 1):
        lm.trim(context)
        if not torch.equal(lm.forward(token_ids[context : context + n]), stepped[:n]):
            inexact.append(n)
    return inexact


if __name__ == "__main__":
    main()
