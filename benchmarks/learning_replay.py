"""How well do the online learners learn, apart from the speed of this machine? A prequential replay.

The target answers a Spec-Bench stream once (greedy); what it said at every position is cached (the
traces of `evospec train-drafter`). Then each learner setting replays the stream: positions come in
order, a few at a time; the drafter first predicts each position's next token (teacher-forced: a
white-box drafter from the target's features, a small LM from the tokens before it: exactly what its
first drafted token of a round sees), and then the learner receives the rows as serving feedback
(RoundFeedback, one row per round) and steps on its own schedule. A learner that steps only between
requests sees a whole answer predicted with the same weights. Agreement with the target's choice,
measured before learning from it, is first-token acceptance under greedy decoding. Minutes of compute,
no timing noise: a way to compare learner settings quickly.

    python benchmarks/learning_replay.py --white-box CKPT --traces DIR --setting none --setting ogd \\
        --setting ogd:every=8 --setting ensemble --out benchmarks/learning-replay-1.5b
    python benchmarks/learning_replay.py --small-lm qwen2.5-coder-0.5b-instruct --traces DIR --setting none \\
        --setting ogd:schedule=request,batch_rows=128 --out benchmarks/learning-replay-lora-0.5b
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from pathlib import Path

import torch
from tqdm import tqdm

from evospec.bench.workloads import spec_bench
from evospec.config import DistillConfig, LoadConfig
from evospec.distill import Sample, collect
from evospec.drafters.adapted_lm import AdaptedLMDrafter, AdapterConfig
from evospec.drafters.registry import new_white_box_drafter
from evospec.drafters.whitebox import checkpoint_kind
from evospec.errors import EvospecError
from evospec.learning import LEARNERS, NO_LEARNER, LearnerConfig, build_learner
from evospec.models.loading import load_model
from evospec.types import RoundFeedback

POSITIONS_PER_STEP = 8  # positions predicted with the same weights before their feedback arrives


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    drafter = parser.add_mutually_exclusive_group(required=True)
    drafter.add_argument("--white-box", type=Path, help="a warm-started eagle or hydra checkpoint")
    drafter.add_argument(
        "--small-lm", help="a small LM that learns through adapters (lora:MODEL in serving), run in fp32"
    )
    parser.add_argument(
        "--context-tokens",
        type=int,
        default=AdapterConfig.context_tokens,
        help="small LM: tokens before the answer so far that it reads, to predict and to learn",
    )
    parser.add_argument("--traces", required=True, type=Path, help="cache of the target's answers (made if missing)")
    parser.add_argument("--per-category", type=int, default=5)
    parser.add_argument("--category", help="one Spec-Bench category only (default: the domain-shift stream of all six)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--setting",
        action="append",
        required=True,
        help="none, or LEARNER[:field=value,...] with LearnerConfig fields, e.g. ogd:lr=0.5,every=8",
    )
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    settings = {setting: parse_setting(setting) for setting in args.setting}  # bad ones fail before any loading
    try:
        kind = checkpoint_kind(args.white_box) if args.white_box else None
        adapters = AdapterConfig(context_tokens=args.context_tokens)
    except EvospecError as error:
        raise SystemExit(str(error)) from error
    stream = spec_bench(args.per_category)
    prompts = [prompt for prompt in stream if args.category in (None, prompt.category)]
    if not prompts:
        known = ", ".join(dict.fromkeys(prompt.category for prompt in stream))
        raise SystemExit(f"Spec-Bench has no category {args.category!r}; choose one of {known}")
    torch.set_num_threads(2)
    target = load_model(args.target)
    samples = collect(
        target, [prompt.text for prompt in prompts], args.traces, DistillConfig(max_new_tokens=args.max_new_tokens)
    ).samples
    categories = [prompt.category for prompt in prompts]
    methods = {}
    for setting, (name, config) in settings.items():
        if kind:
            drafter = new_white_box_drafter(kind, target, args.white_box)
        else:  # a fresh copy each time: the adapters go into the model's own modules
            small_lm = load_model(args.small_lm, "hf", LoadConfig(dtype="fp32"))
            drafter = AdaptedLMDrafter(small_lm.model, f"lora:{small_lm.name}", adapters)
        learner = build_learner(name, drafter, config)
        hits = replay(drafter, learner, samples, desc=setting)
        methods[setting] = {
            "agreement": sum(map(sum, hits)) / sum(map(len, hits)),
            "learning_steps": learner.stats.steps if learner else 0,
            "per_block": [
                {"category": category, "agreement": sum(h) / len(h)} for category, h in zip(categories, hits)
            ],
        }
        print(f"{setting}: agreement {methods[setting]['agreement']:.3f}", flush=True)
    results = {
        "command": "python benchmarks/learning_replay.py " + " ".join(sys.argv[1:]),
        "target": args.target,
        "drafter": str(args.white_box) if kind else f"lora:{args.small_lm}",
        "stream": f"category:{args.category}" if args.category else "domain-shift",
        "prompts": len(samples),
        "max_new_tokens": args.max_new_tokens,
        "methods": methods,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, args.out / "agreement.png")


def parse_setting(setting: str) -> tuple[str, LearnerConfig]:
    """'LEARNER[:field=value,...]' -> (learner name, its config); nonsense exits with a one-line reason."""
    name, _, fields = setting.partition(":")
    if name not in (NO_LEARNER, *LEARNERS):
        raise SystemExit(f"{setting}: unknown learner {name!r}; choose one of {NO_LEARNER}, {', '.join(LEARNERS)}")
    types = typing.get_type_hints(LearnerConfig)
    values = {}
    try:
        for item in filter(None, fields.split(",")):
            key, _, value = item.partition("=")
            if key not in types:
                raise SystemExit(f"{setting}: LearnerConfig has no field {key!r}")
            values[key] = parse_value(types[key], value)
        return name, LearnerConfig(**values)
    except (ValueError, EvospecError) as error:
        raise SystemExit(f"{setting}: {error}") from error


def parse_value(kind: type, value: str):
    """A LearnerConfig field's value from its text, by the field's type (ValueError if it is not one)."""
    if kind is bool:
        if value not in ("true", "false"):
            raise ValueError(f"{value!r} is not true or false")
        return value == "true"
    if kind not in (float, int, str):
        raise ValueError(f"a {kind} field cannot be set here")
    return kind(value)


def replay(drafter, learner, samples: list[Sample], desc: str) -> list[list[float]]:
    """Per sample, whether the drafter's first-token prediction at each answer position was the target's choice."""
    hits = []
    target_id_of_row = torch.zeros(int(drafter.row_of.max()) + 1, dtype=torch.long)
    known = torch.nonzero(drafter.row_of >= 0).squeeze(1)
    target_id_of_row[drafter.row_of[known]] = known
    learns_in_requests = learner is not None and learner.config.schedule == "rounds"
    for request, sample in enumerate(tqdm(samples, desc=desc, unit="prompt")):
        first = sample.prompt_length  # the first answer token: the pending token of the first round
        chunk = POSITIONS_PER_STEP if learns_in_requests else sample.tokens.numel() - first
        sample_hits = []
        if (
            learner
        ):  # the prefill's feedback, as in serving: the prompt, with p at its last token or its last prompt rows
            rows = max(1, min(first, learner.prompt_rows))
            learner.observe(
                RoundFeedback(
                    request=request,
                    position=0,
                    drafter=None,
                    tokens=sample.tokens[:first],
                    drafted=torch.empty(0, dtype=torch.long),
                    num_accepted=0,
                    hidden=sample.hidden[first - rows : first].float(),
                    top_ids=sample.top_ids[first - rows : first],
                    top_probs=sample.top_probs[first - rows : first],
                )
            )
        for start in range(first, sample.tokens.numel(), chunk):
            end = min(start + chunk, sample.tokens.numel())
            with torch.no_grad():  # the answer so far, as the drafter's cache holds it in serving
                outputs = drafter.training_outputs(drafter.module, sample.trace(first - 1, end))
            predicted = target_id_of_row[outputs.logits[-(end - start) :].argmax(dim=-1)]
            sample_hits += (predicted == sample.top_ids[start:end, 0]).float().tolist()
            if learner:
                for position in range(start, end):
                    learner.observe(
                        RoundFeedback(
                            request=request,
                            position=position,
                            drafter=drafter.name,
                            tokens=sample.tokens[position : position + 1],
                            drafted=predicted[position - start : position - start + 1],
                            num_accepted=int(sample_hits[position - first]),
                            hidden=sample.hidden[position : position + 1].float(),
                            top_ids=sample.top_ids[position : position + 1],
                            top_probs=sample.top_probs[position : position + 1],
                        )
                    )
        if learner:
            learner.end_request()
        hits.append(sample_hits)
    return hits


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(10, 4.8))
    for name, method in results["methods"].items():
        axis.plot(
            [block["agreement"] for block in method["per_block"]],
            marker=".",
            label=f"{name} ({method['agreement']:.3f})",
        )
    blocks = next(iter(results["methods"].values()))["per_block"]
    for index, block in enumerate(blocks):
        if index == 0 or block["category"] != blocks[index - 1]["category"]:
            axis.axvline(index - 0.5, color="grey", linewidth=0.5)
            axis.text(index - 0.4, 0.98, block["category"], fontsize=7, va="top", transform=axis.get_xaxis_transform())
    axis.set_xlabel("prompt of the stream")
    axis.set_ylabel("first-token agreement with the target")
    axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=4)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
