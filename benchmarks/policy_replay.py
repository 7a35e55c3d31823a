"""The draft-length policy and the selectors replayed on the target's cached answers, with each target
pass replaced by its measured cost T(n): how the methods would compare on this machine, without the
timing noise of a live run.

The engine runs unchanged. The target is the greedy answers it gave (the cache of learning_replay.py,
made if missing), and each of its passes costs the T(n) measured by `evospec/cost.py` on a clock the
engine reads. Drafters run for real and their seconds count as measured. Greedy verification only
asks which token the target prefers, so a replay emits exactly the cached answer (checked), with the
rounds, drafts and acceptance that serving would have had. Prefill is left out: it is the same for
every method. So the figure is modeled decode tokens/s: new tokens / (T(n) of every pass + drafting
+ the engine's own time). As in `evospec bench`, each method first generates a few tokens of the
first prompt unrecorded (what its policies learn there, they keep).

A method is a bench method name, optionally with adaptive draft-length settings after '@':
    python benchmarks/policy_replay.py --traces DIR --stream category:mt_bench --per-category 4 \\
        --method evospec-plain --method evospec:ngram/k=auto \\
        --method 'evospec:ngram/k=auto@discount=0.995,exploration=0.2' --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm import tqdm

from evospec.bench.methods import ADAPTIVE
from evospec.bench.report import plot_speedups
from evospec.bench.runner import WARMUP_TOKENS
from evospec.bench.workloads import spec_bench
from evospec.config import DistillConfig, GenerationConfig
from evospec.cost import ForwardCost
from evospec.distill import collect
from evospec.draft_length import AdaptiveConfig, AdaptiveDraftLength
from evospec.drafters import Drafter, NgramDrafter, SmallLMDrafter, SuffixDrafter
from evospec.engine import Engine
from evospec.errors import EvospecError
from evospec.models.backend import LoadedModel
from evospec.models.loading import load_model
from evospec.selection import SELECTORS, build_selector
from evospec.stats import SpecStats


class ReplayClock:
    """`time` for the engine: the real perf_counter plus the modeled seconds of the target's passes."""

    def __init__(self) -> None:
        self.modeled_s = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.modeled_s


class ReplayTarget:
    """The target as the answers it gave. A pass puts all probability on the cached next token at each
    position and costs T(n) on the clock; the prefill (the prompt, which names the request) costs nothing."""

    def __init__(
        self, answers: dict[tuple[int, ...], list[int]], vocab: int, cost: ForwardCost, clock: ReplayClock
    ) -> None:
        self.answers = answers  # prompt ids -> prompt + answer ids
        self.vocab = vocab
        self.cost = cost
        self.clock = clock
        self.sequence: list[int] = []
        self.length = 0  # positions in the "cache"

    def reset(self) -> None:
        self.sequence, self.length = [], 0

    def forward(self, token_ids: Sequence[int], num_logits: int = 0) -> torch.Tensor:
        if self.length == 0:
            self.sequence = self.answers[tuple(token_ids)]
        else:
            self.clock.modeled_s += self.cost.of(len(token_ids))
        positions = list(range(self.length, self.length + len(token_ids)))
        self.length += len(token_ids)
        rows = positions[-num_logits:] if num_logits else positions
        if rows[-1] + 1 >= len(self.sequence):
            raise EvospecError("the replay ran past the cached answer")
        logits = torch.full((len(rows), self.vocab), -1e4)
        logits[torch.arange(len(rows)), [self.sequence[position + 1] for position in rows]] = 0.0
        return logits

    def forward_with_hidden(self, token_ids: Sequence[int], num_logits: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        raise EvospecError("the replay has no hidden states: white-box drafters cannot be replayed")

    def trim(self, length: int) -> None:
        self.length = min(self.length, length)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct", help="the small-LM arm (run for real)")
    parser.add_argument("--traces", required=True, type=Path, help="cache of the target's answers (made if missing)")
    parser.add_argument("--stream", required=True, help="mixed (category blocks) or category:NAME")
    parser.add_argument(
        "--collect-per-category",
        type=int,
        default=5,
        help="the answers cached: the first N prompts of each Spec-Bench category",
    )
    parser.add_argument("--skip", type=int, default=0, help="the stream leaves out the first S of each category")
    parser.add_argument("--per-category", type=int, default=5, help="and then takes this many")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="of the cached answers")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument(
        "--method", action="append", required=True, help="NAME[@field=value,...] (AdaptiveConfig fields)"
    )
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    methods = {method: parse_method(method, args.draft_model) for method in args.method}  # before any loading
    torch.set_num_threads(2)
    target = load_model(args.target)
    cost = target.forward_cost(args.k + 1)
    if args.skip + args.per_category > args.collect_per_category:
        raise SystemExit("--skip + --per-category must not exceed --collect-per-category")
    prompts = spec_bench(args.collect_per_category)
    samples = collect(
        target, [prompt.text for prompt in prompts], args.traces, DistillConfig(max_new_tokens=args.max_new_tokens)
    ).samples
    if len(samples) != len(prompts):
        raise SystemExit("a Spec-Bench prompt does not fit the target's context; the replay needs them all")
    stream = pick_stream(
        [(prompt.category, sample) for prompt, sample in zip(prompts, samples)],
        args.stream,
        args.skip,
        args.per_category,
    )
    uses_small_lm = any(name.startswith("select:") or args.draft_model in name for name, _ in methods.values())
    small_lm = load_model(args.draft_model) if uses_small_lm else None
    clock = ReplayClock()
    answers = {tuple(sample.tokens[: sample.prompt_length].tolist()): sample.tokens.tolist() for _, sample in stream}
    replay_target = ReplayTarget(answers, target.vocab_size, cost, clock)
    engines = {method: new_engine(target, replay_target, small_lm, cost, *methods[method]) for method in methods}
    first_prompt = stream[0][1].tokens[: stream[0][1].prompt_length].tolist()
    for engine in engines.values():  # as evospec bench does: the policies keep what this taught them
        list(
            engine.generate(
                first_prompt, GenerationConfig(max_new_tokens=WARMUP_TOKENS, num_speculative_tokens=args.k), SpecStats()
            )
        )
    runs: dict[str, list[tuple[str, SpecStats]]] = {method: [] for method in methods}
    for category, sample in tqdm(stream, desc="replay", unit="prompt"):
        prompt_ids = sample.tokens[: sample.prompt_length].tolist()
        answer = sample.tokens[sample.prompt_length :].tolist()
        config = GenerationConfig(max_new_tokens=len(answer), num_speculative_tokens=args.k)
        for method, engine in engines.items():  # interleaved, as a live run would be
            stats = SpecStats()
            emitted = list(engine.generate(prompt_ids, config, stats))
            if emitted != answer:
                raise SystemExit(f"{method} emitted something other than the target's answer: the replay is broken")
            runs[method].append((category, stats))
    results = {
        "command": "python benchmarks/policy_replay.py " + " ".join(sys.argv[1:]),
        "target": args.target,
        "backend": target.backend,
        "dtype": "modeled decode",
        "plain_method": "evospec-plain",
        "stream": args.stream,
        "prompts": len(stream),
        "max_new_tokens": args.max_new_tokens,
        "num_speculative_tokens": args.k,
        "forward_cost_s": list(cost.seconds),
        "methods": summarize(runs),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    if "evospec-plain" in methods:
        plot_speedups(results, args.out / "speedup.png")
    for method, fields in results["methods"].items():
        print(
            f"{method}: {fields['modeled_tokens_per_s']:.2f} tokens/s, {fields['speedup_vs_plain']:.3f}x plain, "
            f"tau {fields['tau']:.2f}, {fields['rounds']} rounds"
        )


def parse_method(method: str, draft_model: str) -> tuple[str, AdaptiveConfig]:
    """'NAME[@field=value,...]' -> (bench method name, adaptive settings); nonsense exits with one line."""
    name, _, fields = method.partition("@")
    base = name.removesuffix(ADAPTIVE)
    drafters = ("ngram", "suffix", draft_model)
    selectors = [selector for selector in SELECTORS if selector != "fixed"]
    known = (
        base == "evospec-plain"
        or base.removeprefix("evospec:") in drafters
        or base.removeprefix("select:") in selectors
    )
    if not known or (fields and not name.endswith(ADAPTIVE)):
        raise SystemExit(
            f"{method}: expected evospec-plain, evospec:DRAFTER{ADAPTIVE} (DRAFTER one of {', '.join(drafters)}) "
            f"or select:SELECTOR{ADAPTIVE} ({', '.join(selectors)}), {ADAPTIVE} optional, @settings only after it"
        )
    names = {field.name for field in dataclasses.fields(AdaptiveConfig)}
    try:
        values = {}
        for item in filter(None, fields.split(",")):
            key, _, value = item.partition("=")
            if key not in names:
                raise SystemExit(f"{method}: AdaptiveConfig has no field {key!r}")
            values[key] = float(value)
        return name, AdaptiveConfig(**values)
    except (ValueError, EvospecError) as error:
        raise SystemExit(f"{method}: {error}") from error


def pick_stream(
    prompts: list[tuple[str, object]], stream: str, skip: int, per_category: int
) -> list[tuple[str, object]]:
    """The cached prompts of a stream: per category, the per_category after the first skip; all categories
    in blocks (mixed) or one."""
    categories = list(dict.fromkeys(category for category, _ in prompts))
    wanted = categories if stream == "mixed" else [stream.removeprefix("category:")]
    if stream != "mixed" and (not stream.startswith("category:") or wanted[0] not in categories):
        raise SystemExit(f"unknown stream {stream!r}: mixed or category:NAME with NAME one of {', '.join(categories)}")
    return [
        item for category in wanted for item in [p for p in prompts if p[0] == category][skip : skip + per_category]
    ]


def new_engine(
    target: LoadedModel,
    replay_target: ReplayTarget,
    small_lm: LoadedModel | None,
    cost: ForwardCost,
    name: str,
    adaptive: AdaptiveConfig,
) -> Engine:
    """The method's engine on the replayed target, as evospec bench builds it."""
    base = name.removesuffix(ADAPTIVE)
    draft_length = AdaptiveDraftLength(cost, adaptive) if name.endswith(ADAPTIVE) else None

    def drafter(spec: str) -> Drafter:
        if spec == "ngram":
            return NgramDrafter()
        if spec == "suffix":
            return SuffixDrafter()
        return SmallLMDrafter(small_lm.new_lm(), small_lm.name)

    if base == "evospec-plain":
        drafters, selector = [], None
    elif base.startswith("evospec:"):
        drafters, selector = [drafter(base.removeprefix("evospec:"))], None
    else:
        drafters = [drafter(small_lm.name), NgramDrafter(), SuffixDrafter()]
        selector = build_selector(base.removeprefix("select:"), [d.name for d in drafters])
    return Engine(
        replay_target,
        drafters,
        target.eos_token_ids,
        target.context_length,
        draft_length,
        selector,
        forward_cost=cost,
        clock=replay_target.clock.perf_counter,
    )


def summarize(runs: dict[str, list[tuple[str, SpecStats]]]) -> dict[str, dict]:
    """Per method: modeled decode tokens/s, speedup against evospec-plain (when in the run), tau, rounds;
    the same per category."""

    def fields(stats_list: list[SpecStats]) -> dict:
        total = SpecStats()
        for stats in stats_list:
            total.merge(stats)
        return {
            "modeled_tokens_per_s": total.decode_tokens_per_s,
            "tau": total.tau,
            "rounds": total.num_verifications,
            "new_tokens": total.new_tokens,
            "acceptance_rate": total.acceptance_rate,
            "draft_s": total.draft_s,
            "drafters": {name: arm.to_dict() for name, arm in total.drafters.items()},
        }

    methods = {}
    for method, method_runs in runs.items():
        categories = list(dict.fromkeys(category for category, _ in method_runs))
        methods[method] = {
            **fields([stats for _, stats in method_runs]),
            "per_category": {
                category: fields([stats for c, stats in method_runs if c == category]) for category in categories
            },
        }
    plain = methods.get("evospec-plain")
    for method in methods.values():
        for scope, plain_scope in [
            (method, plain),
            *((method["per_category"][c], plain and plain["per_category"][c]) for c in method["per_category"]),
        ]:
            scope["speedup_vs_plain"] = (
                scope["modeled_tokens_per_s"] / plain_scope["modeled_tokens_per_s"] if plain_scope else None
            )
    return methods


if __name__ == "__main__":
    main()
