"""What one draft step of each white-box drafter costs, against one target step, on this machine.

    .venv/bin/python benchmarks/white_box_cost.py [--target ALIAS] [--out DIR]

Median of repeated runs; the drafters have random weights (their cost does not depend on them).
A target step runs before each timed draft, as in serving, so the drafter's weights are read from
memory and not from a cache that a loop of drafts alone would keep warm. Writes DIR/white_box_cost.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from evospec.config import SamplingConfig
from evospec.drafters.registry import WHITE_BOX_KINDS, new_white_box_drafter
from evospec.drafters.whitebox import WhiteBoxConfig
from evospec.models.loading import load_model
from evospec.sampling import Sampler
from evospec.types import RoundFeedback

CONTEXT = 100  # tokens before the measured steps
REPEATS = 15


def median_s(run, before=lambda: None) -> float:
    """Median seconds of run(), each time after an untimed before()."""
    run()
    times = []
    for _ in range(REPEATS):
        before()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--head-vocab", type=int, action="append", help="head sizes to measure (default: the config's)")
    parser.add_argument("--out", default="benchmarks/white-box-cost-1.5b")
    args = parser.parse_args()
    target = load_model(args.target)
    context = list(range(1000, 1000 + CONTEXT))
    lm = target.new_lm(hidden_states=True)
    lm.forward_with_hidden(context[:-1], num_logits=1)

    def target_step() -> None:
        lm.forward_with_hidden(context[-1:])
        lm.trim(CONTEXT - 1)

    target_s = median_s(target_step)
    print(f"{args.target}: one target step (with hidden states) {target_s * 1e3:.1f} ms")
    sampler = Sampler(SamplingConfig())
    results = {
        "target": args.target,
        "backend": target.backend.name,
        "target_step_ms": target_s * 1e3,
        "threads": torch.get_num_threads(),
        "drafters": [],
    }
    for kind in WHITE_BOX_KINDS:
        for head_vocab in args.head_vocab or [WhiteBoxConfig(kind, 0).head_vocab]:
            drafter = new_white_box_drafter(
                kind, target, config=WhiteBoxConfig(kind, target.hidden_size, head_vocab=head_vocab)
            )
            feedback = RoundFeedback(
                request=1,
                position=0,
                drafter=None,
                tokens=torch.tensor(context[:-1]),
                drafted=torch.empty(0, dtype=torch.long),
                num_accepted=0,
                hidden=torch.randn(CONTEXT - 1, target.hidden_size),
                top_ids=torch.zeros(CONTEXT - 1, 1, dtype=torch.long),
                top_probs=torch.zeros(CONTEXT - 1, 1),
            )

            def draft(k: int, drafter=drafter, feedback=feedback) -> None:
                drafter.begin(context[:-10], ())  # eagle catches up on the same 10 verified tokens each time
                drafter.observe(feedback)
                drafter.propose(context, k, sampler)

            one, four = median_s(lambda: draft(1), target_step), median_s(lambda: draft(4), target_step)
            step = (four - one) / 3
            row = {
                "kind": kind,
                "head_vocab": head_vocab,
                "params": sum(p.numel() for p in drafter.module.parameters()),
                "first_token_ms": one * 1e3,
                "next_token_ms": step * 1e3,
                "next_token_share": step / target_s,
            }
            results["drafters"].append(row)
            print(
                f"{kind} (head {head_vocab} tokens): first token {one * 1e3:.1f} ms (with catch-up), "
                f"each next {step * 1e3:.1f} ms = {100 * step / target_s:.1f}% of a target step"
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "white_box_cost.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
