"""How few rounds, and how few target seconds, any selector over the model-free arms could need on a
recorded stream: the bounds that a bandit's rounds and speed are measured against.

A greedy target's answer does not depend on who drafted, so the context at every position of a
request is known in advance, and so is what each model-free arm would draft there and how much of
it the target would accept (its common prefix with the recorded answer). From that, per request:
- each arm alone: its own rounds, as `evospec replay --method evospec:ARM` counts them;
- the oracle per request: the best arm for the request, chosen in hindsight (the most a selector
  that keeps one arm per request could reach, e.g. MetaSD's UCB on a stream where domains differ);
- the oracle per round: at every position the arm whose draft takes the answer furthest, by
  dynamic programming over positions (the most any selector could reach; it needs to know which
  draft the target will accept, so no selector reaches it).

The same in time, under the target's T(n) (--profile, as evospec replay takes it), in target steps:
a round that verifies d drafted tokens costs T(1 + d) / T(1), the prefill left out:
- each arm alone at the fixed draft length k, and one-token steps (plain decoding);
- the fastest per request: the arm whose run is quickest for the request, in hindsight;
- the fastest per round: every round the arm whose whole draft gives the quickest rest of the
  request (the bound of select:contextual-speed at a fixed k);
- the fastest per round, drafts cut: the same where each draft may also be cut to any part of what
  the target accepts of it (the bound of any selector with any draft-length policy).

    python benchmarks/selection_oracle.py --traces gsm=GSM --traces code=CODE \
        --stream 'gsm[1800:1880]+code[0:80]' --interleave --k 4 --out benchmarks/selection-oracle-smollm2-mixed

The oracle per round calls each arm at every position, so the suffix arm's corpus also holds the
last tokens of each answer that its own run never drafts after; the difference is a few tokens a request.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

from evospec.bench.methods import MODEL_FREE  # noqa: E402
from evospec.bench.replay import recorded_target, stream_of  # noqa: E402
from evospec.bench.traces import load_traces  # noqa: E402
from evospec.cli import named_traces  # noqa: E402
from evospec.config import SamplingConfig  # noqa: E402
from evospec.cost import MEASURED, cost_under, profile_source  # noqa: E402
from evospec.drafters.base import common_prefix_length  # noqa: E402
from evospec.errors import EvospecError  # noqa: E402
from evospec.machine import cpu_description  # noqa: E402
from evospec.models.replay import Answer  # noqa: E402
from evospec.sampling import Sampler  # noqa: E402

GREEDY = Sampler(SamplingConfig())


@dataclass
class Run:
    """One request with one arm alone: its rounds (the prefill's verification included) and its target
    steps, each round's forward of 1 + drafted tokens charged T(1 + drafted) / T(1), the prefill left out."""

    rounds: int
    steps: float


def own_run(drafter, answer: Answer, k: int, step_cost: list[float]) -> Run:
    """A run with this arm alone at a fixed draft length k, as the engine makes it (step_cost[d] = T(1 + d) / T(1))."""
    drafter.begin(list(answer.prompt_ids), ())
    context, length = list(answer.prompt_ids), len(answer.answer_ids)
    emitted, run = 1, Run(rounds=1, steps=0.0)  # the prefill's verification emits the first token
    context.append(answer.answer_ids[0])
    while emitted < length:
        asked = min(k, length - emitted - 1)
        draft = drafter.propose(context, asked, GREEDY).tokens.tolist() if asked > 0 else []
        accepted = common_prefix_length(draft, list(answer.answer_ids[emitted : emitted + len(draft)]))
        step = min(accepted + 1, length - emitted)
        context.extend(answer.answer_ids[emitted : emitted + step])
        emitted += step
        run.rounds += 1
        run.steps += step_cost[len(draft)]
    return run


@dataclass
class Drafts:
    """Per position of an answer, what an arm drafts there and how much of it the target would accept."""

    drafted: list[int]
    accepted: list[int]


def drafts_everywhere(drafter, answer: Answer, k: int) -> Drafts:
    """The arm called at every position of the answer (0 drafted where nothing is asked)."""
    drafter.begin(list(answer.prompt_ids), ())
    tokens, prompt, length = answer.tokens, len(answer.prompt_ids), len(answer.answer_ids)
    drafts = Drafts(drafted=[0] * length, accepted=[0] * length)
    for emitted in range(1, length):
        asked = min(k, length - emitted - 1)
        if asked > 0:
            draft = drafter.propose(tokens[: prompt + emitted], asked, GREEDY).tokens.tolist()
            drafts.drafted[emitted] = len(draft)
            drafts.accepted[emitted] = common_prefix_length(
                draft, list(answer.answer_ids[emitted : emitted + len(draft)])
            )
    return drafts


def oracle_per_round(drafts: dict[str, Drafts], length: int) -> int:
    """The fewest rounds of a request when every round may pick any arm: R(t) = 1 + min_a R(t + 1 + acc_a(t))."""
    fewest = [0] * (length + 1)
    for emitted in range(length - 1, 0, -1):
        fewest[emitted] = 1 + min(fewest[emitted + 1 + arm.accepted[emitted]] for arm in drafts.values())
    return 1 + fewest[1] if length > 1 else 1


def fastest_per_round(drafts: dict[str, Drafts], length: int, step_cost: list[float], truncate: bool) -> float:
    """The fewest target steps of a request when every round may pick any arm's draft, verified whole,
    S(t) = min_a c(d_a(t)) + S(t + 1 + acc_a(t)); with `truncate`, also cut to any m of its accepted
    tokens, S(t) = min_a min_{m <= acc_a(t)} c(m) + S(t + 1 + m). c(d) = T(1 + d) / T(1)."""
    fastest = [0.0] * (length + 1)
    for emitted in range(length - 1, 0, -1):
        if truncate:
            longest = max(arm.accepted[emitted] for arm in drafts.values())
            fastest[emitted] = min(step_cost[m] + fastest[emitted + 1 + m] for m in range(longest + 1))
        else:
            fastest[emitted] = min(
                step_cost[arm.drafted[emitted]] + fastest[emitted + 1 + arm.accepted[emitted]]
                for arm in drafts.values()
            )
    return fastest[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", action="append", required=True, help="[NAME=]DIR, as evospec replay takes it")
    parser.add_argument("--stream", help="as evospec replay takes it")
    parser.add_argument("--interleave", action="store_true")
    parser.add_argument("--arm", action="append", choices=["ngram", "suffix"], help="default: both")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--profile", default=MEASURED, help="the target's T(n), as evospec replay takes it")
    parser.add_argument("--block-size", type=int, default=40)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        sets = {name: load_traces(directory) for name, directory in named_traces(args.traces)}
        stream = stream_of(sets, args.stream, args.interleave)
        source = profile_source(args.profile)  # an unknown profile fails here, before a model is loaded
        target, _ = recorded_target(sets)
        cost = cost_under(args.profile, target.forward_cost(args.k + 1), args.k + 1)
    except EvospecError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    step_cost = [cost.of(1 + drafted) / cost.of(1) for drafted in range(args.k + 1)]
    arms = args.arm or ["ngram", "suffix"]
    alone = {arm: MODEL_FREE[arm]() for arm in arms}
    everywhere = {arm: MODEL_FREE[arm]() for arm in arms}
    requests = []
    for part, answer in tqdm(stream, desc="oracle", unit="request"):
        length = len(answer.answer_ids)
        runs = {arm: own_run(alone[arm], answer, args.k, step_cost) for arm in arms}
        drafts = {arm: drafts_everywhere(everywhere[arm], answer, args.k) for arm in arms}
        rounds = {arm: run.rounds for arm, run in runs.items()}
        rounds["oracle per request"] = min(rounds[arm] for arm in arms)
        rounds["oracle per round"] = oracle_per_round(drafts, length)
        steps = {arm: run.steps for arm, run in runs.items()}
        steps["one-token steps"] = float(length - 1)
        steps["fastest per request"] = min(steps[arm] for arm in arms)
        steps["fastest per round"] = fastest_per_round(drafts, length, step_cost, truncate=False)
        steps["fastest per round, drafts cut"] = fastest_per_round(drafts, length, step_cost, truncate=True)
        requests.append({"part": part, "tokens": length, "rounds": rounds, "steps": steps})

    methods = [*arms, "oracle per request", "oracle per round"]
    total = {method: sum(r["rounds"][method] for r in requests) for method in methods}
    best = min(arms, key=total.__getitem__)
    timed = [*arms, "one-token steps", "fastest per request", "fastest per round", "fastest per round, drafts cut"]
    total_steps = {method: sum(r["steps"][method] for r in requests) for method in timed}
    fastest_arm = min(arms, key=total_steps.__getitem__)
    parts = sorted({r["part"] for r in requests})
    by_part = {
        part: {method: sum(r["rounds"][method] for r in requests if r["part"] == part) for method in methods}
        for part in parts
    }
    tokens = sum(r["tokens"] for r in requests)
    results = {
        "command": "python benchmarks/selection_oracle.py " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "stream": args.stream,
        "interleaved": args.interleave,
        "prompts": len(requests),
        "new_tokens": tokens,
        "num_speculative_tokens": args.k,
        "cpu": cpu_description(),
        "best_single_arm": best,
        "methods": {
            method: {
                "rounds": total[method],
                "tau": round(tokens / total[method], 4),
                "rounds_vs_best_single_arm": round(total[method] / total[best], 4),
            }
            for method in methods
        },
        "by_part": by_part,
        "requests_won": {
            arm: sum(r["rounds"][arm] == r["rounds"]["oracle per request"] for r in requests) for arm in arms
        },
        "time": {
            "profile": args.profile,
            "profile_source": source,
            "step_cost": {f"T({1 + drafted})/T(1)": round(c, 4) for drafted, c in enumerate(step_cost)},
            "fastest_single_arm": fastest_arm,
            "methods": {
                method: {
                    "target_steps": round(total_steps[method], 1),
                    "speedup_vs_fastest_single_arm": round(total_steps[fastest_arm] / total_steps[method], 4),
                    "speedup_vs_one_token_steps": round(total_steps["one-token steps"] / total_steps[method], 4),
                }
                for method in timed
            },
        },
        "per_request": requests,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(requests, methods, best, args.block_size, out / "oracle.png")
    for method in methods:
        fields = results["methods"][method]
        ratio = fields["rounds_vs_best_single_arm"]
        print(f"{method:30s} rounds {fields['rounds']:7d}  tau {fields['tau']:.3f}  {ratio:.3f}x")
    for part, counts in by_part.items():
        print(part, {method: f"{counts[method] / counts[best]:.3f}x" for method in methods})
    print(
        f"target steps under {args.profile} ({', '.join(f'{k} {v}' for k, v in results['time']['step_cost'].items())}):"
    )
    for method, fields in results["time"]["methods"].items():
        print(
            f"{method:30s} steps {fields['target_steps']:9.1f}  {fields['speedup_vs_fastest_single_arm']:.3f}x "
            f"{fastest_arm}'s speed, {fields['speedup_vs_one_token_steps']:.3f}x one-token steps'"
        )
    return 0


def plot(requests: list[dict], methods: list[str], best: str, block_size: int, path: Path) -> None:
    """Rounds per block of requests, relative to the best single arm's."""
    blocks = range(0, len(requests), block_size)
    figure, axes = plt.subplots(figsize=(8, 4))
    for method in methods:
        ratios = [
            sum(r["rounds"][method] for r in requests[start : start + block_size])
            / sum(r["rounds"][best] for r in requests[start : start + block_size])
            for start in blocks
        ]
        axes.plot([start for start in blocks], ratios, marker="o", label=method)
    axes.set_xlabel("request")
    axes.set_ylabel(f"rounds / {best}'s rounds")
    axes.set_title("rounds per block against the best single arm")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


if __name__ == "__main__":
    raise SystemExit(main())
