"""The tables of benchmarks/README.md from an `evospec replay` results.json: rounds and tau against a
reference method (the frozen drafter, or the best single arm in hindsight), tau per block, learning
seconds, and projected tokens/s against the reference under every profile.

    python benchmarks/replay_summary.py RESULTS.json [--against METHOD]   (default: the fewest-rounds evospec: method)

Several results files of replays over the same stream (e.g. methods split across processes) make one
table; --plot PNG draws their tau per block together. Projections are compared only between runs that
charged the same T(n): runs that measured different curves leave those columns out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evospec.bench.report import plot_blocks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="results.json files of replays over the same stream")
    parser.add_argument("--against", help="the reference method (default: the single drafter with the fewest rounds)")
    parser.add_argument("--plot", type=Path, help="also draw tau per block of every method in this PNG")
    args = parser.parse_args()
    runs = [json.loads(Path(path).read_text()) for path in args.results]
    methods = {name: fields for run in runs for name, fields in run["methods"].items()}
    if args.plot:
        plot_blocks({**runs[0], "methods": methods}, args.plot)
    singles = [name for name in methods if name.startswith("evospec:")]
    against = args.against or min(singles, key=lambda name: methods[name]["rounds"])
    reference = methods[against]
    profiles = list(reference.get("projected_tokens_per_s", {}))
    if len({json.dumps(run.get("forward_cost_ms"), sort_keys=True) for run in runs}) > 1:
        print("the runs measured different T(n) (forward_cost_ms): their projections are not compared\n")
        profiles = []
    print(f"reference: {against}\n")
    print(
        "| method | rounds | rounds vs ref | tau | tau vs ref | tau per block | learn s |"
        + "".join(f" tokens/s vs ref, {profile} |" for profile in profiles)
    )
    print("|---" * (7 + len(profiles)) + "|")
    for name, fields in methods.items():
        if name == "evospec-plain" or "projected_tokens_per_s" not in fields:  # plain; the oracle, a composite
            continue
        blocks = " ".join(f"{block['tau']:.3f}" for block in fields["per_block"])
        projected = "".join(
            f" {fields['projected_tokens_per_s'][p] / reference['projected_tokens_per_s'][p]:.3f}x |" for p in profiles
        )
        print(
            f"| {name} | {fields['rounds']:,} | {fields['rounds'] / reference['rounds']:.3f}x "
            f"| {fields['tau']:.3f} | {fields['tau'] / reference['tau']:.3f}x | {blocks} "
            f"| {fields['learn_s']:.0f} |{projected}"
        )


if __name__ == "__main__":
    main()
