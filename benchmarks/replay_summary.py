"""The tables of benchmarks/README.md from an `evospec replay` results.json: rounds and tau against a
reference method (the frozen drafter, or the best single arm in hindsight), tau per block, learning
seconds, and projected tokens/s against the reference under every profile.

    python benchmarks/replay_summary.py RESULTS.json [--against METHOD]   (default: the fewest-rounds evospec: method)

Several results files of replays over the same stream (e.g. methods split across processes) make one
table; --plot PNG draws their tau per block together. Projections are compared only under one T(n):
runs that timed different curves are charged again under the measured curve of the first one (from
each method's recorded target passes); runs too old to record their passes leave those columns out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evospec.bench.replay import projected_speed, recorded_cost
from evospec.bench.report import plot_blocks
from evospec.cost import MEASURED, cost_under


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="results.json files of replays over the same stream")
    parser.add_argument("--against", help="the reference method (default: the single drafter with the fewest rounds)")
    parser.add_argument("--plot", type=Path, help="also draw tau per block of every method in this PNG")
    args = parser.parse_args()
    runs = [json.loads(Path(path).read_text()) for path in args.results]
    # a run's "oracle" is the best of its own single drafters, not of the joined runs'
    methods = {
        name: fields for run in runs for name, fields in run["methods"].items() if len(runs) == 1 or name != "oracle"
    }
    if args.plot:
        plot_blocks({**runs[0], "methods": methods}, args.plot)
    singles = [name for name in methods if name.startswith("evospec:")]
    against = args.against or min(singles, key=lambda name: methods[name]["rounds"])
    reference = methods[against]
    profiles = list(reference.get("projected_tokens_per_s", {}))
    if len({json.dumps(run.get("forward_cost_ms"), sort_keys=True) for run in runs}) > 1:
        profiles = charge_one_curve(runs, args.results, profiles)
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


def charge_one_curve(runs: list[dict], paths: list[str], profiles: list[str]) -> list[str]:
    """Re-project every run's methods under the measured T(n) of the first measured run; return the
    profiles that can be compared (none where a run does not record its target passes)."""
    projected = [fields for run in runs for fields in run["methods"].values() if "projected_tokens_per_s" in fields]
    measured = [(run, path) for run, path in zip(runs, paths) if run.get("profile") == MEASURED]
    if not measured or any("target_passes" not in fields for fields in projected):
        print("the runs timed different T(n) and do not all record their target passes: projections left out\n")
        return []
    run, path = measured[0]
    curve = recorded_cost(run)
    costs = {profile: cost_under(profile, curve, curve.max_tokens) for profile in profiles}
    for fields in projected:
        fields["projected_tokens_per_s"] = {profile: projected_speed(fields, cost) for profile, cost in costs.items()}
    print(f"the runs timed different T(n): every run is charged the measured T(n) of {path}\n")
    return profiles


if __name__ == "__main__":
    main()
