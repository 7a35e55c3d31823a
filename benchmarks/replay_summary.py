"""The tables of benchmarks/README.md from an `evospec replay` results.json: rounds and tau against a
reference method (the frozen drafter, or the best single arm in hindsight), tau per block, learning
seconds, and projected tokens/s against the reference under every profile.

    python benchmarks/replay_summary.py RESULTS.json [--against METHOD]   (default: the fewest-rounds evospec: method)
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="results.json files of replays over the same stream")
    parser.add_argument("--against", help="the reference method (default: the single drafter with the fewest rounds)")
    args = parser.parse_args()
    methods = {}
    for path in args.results:
        methods.update(json.load(open(path))["methods"])
    singles = [name for name in methods if name.startswith("evospec:")]
    against = args.against or min(singles, key=lambda name: methods[name]["rounds"])
    reference = methods[against]
    profiles = list(reference.get("projected_tokens_per_s", {}))
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
