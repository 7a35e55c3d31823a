"""Step-level speculation on GSM8K: final-answer accuracy, step acceptance and speed, methods interleaved
question by question (benchmarks/README.md, "Step-level speculation").

    python benchmarks/reasoning_gsm8k.py --target qwen2.5-coder-1.5b-instruct \
        --drafter qwen2.5-coder-0.5b-instruct --split test --n 300 \
        --method target-alone --method evospec --method reason@judge=embedding --method reason@judge=target \
        --out benchmarks/reasoning-gsm8k-1.5b

Methods (names as ../shared/benchmarks.md gives them):
- target-alone: plain decoding of the target;
- evospec: token-level speculation with the drafter (adaptive draft length);
- reason@judge=J: step-level speculation, the frozen drafter writing steps, judge J (target | embedding);
  reason@judge=J,same_numbers=true: a drafted step stands only if it states the target's step's numbers;
  reason@judge=J,lookahead=N: Lookahead Reasoning's rounds, N drafted steps whose target versions are
  written side by side (evospec.reasoning.steps); after '@', any int, float, str or bool field of
  StepConfig (bools as true or false), over --similarity and --max-step-tokens;
- reason+dpo@judge=J, reason+osd@judge=J: the drafter's adapters learning on line from the judged
  steps, by DPO (Online-LR) or by cross-entropy on the target's steps (OSD-LR). Learning methods and
  `reason-lora` (the same adapted drafter, frozen) run the drafter on the hf backend.

--replay DIR runs the methods over the target's answers that a live run wrote to DIR (its target-alone
rows), charged a cost profile (--profile: measured, or a GPU's): every step follows the target, so the
drafter's steps are judged and learned from on the target's own answer, as evospec replay does for
tokens; the drafter, judge and learners run (and are timed) for real. Only the embedding judge can
judge there.

Every answer is written to answers.jsonl as it is made; results.json (the one shape) and results.png
(accuracy and step acceptance per block) at the end, or at Ctrl-C (SIGINT) for the questions answered
so far. --resume goes on from answers.jsonl (frozen methods only: a learner's state is not kept
between runs).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import shlex
import sys
from collections import Counter
from importlib import resources
from pathlib import Path

import torch
from tqdm.auto import tqdm

from evospec.bench.report import aggregate
from evospec.bench.traces import SHIPPED, dataset_prompts
from evospec.config import GenerationConfig, LoadConfig, method_settings
from evospec.cost import MEASURED, cost_profile, cost_profiles, cost_under, profile_cost, profile_source
from evospec.draft_length import AdaptiveDraftLength
from evospec.drafters.registry import build_drafter
from evospec.engine import Engine
from evospec.errors import EvospecError
from evospec.generation import build_engine, encode_prompt
from evospec.learning import LearnerConfig, build_learner
from evospec.machine import cpu_description, default_threads
from evospec.models.backend import LoadedModel
from evospec.models.loading import load_model
from evospec.models.replay import Answer, Recording, replayed
from evospec.reasoning import StepConfig, StepSpeculator, TargetJudge, build_judge
from evospec.stats import DrafterStats, SpecStats

GPU_PROFILE = "h100-bf16-roofline"  # evospec replay's GPU profile (evospec/data/cost_profiles.toml)
INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."  # OnlineSPEC's LR prompt
LEARNERS = {"dpo": "dpo", "osd": "step-ce"}  # method suffix -> evospec learner


def final_number(text: str) -> float | None:
    """The answer a reply gives: the last \\boxed{...}, else its last number."""
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
    candidates = boxed[-1:] or [text]
    numbers = re.findall(r"-?\d[\d,]*\.?\d*", candidates[-1])
    if not numbers:
        return None
    try:
        return float(numbers[-1].replace(",", "").rstrip("."))
    except ValueError:
        return None


def gold_number(answer: str) -> float:
    return float(answer.split("####")[-1].strip().replace(",", ""))


def stats_record(stats: SpecStats) -> dict:
    fields = dataclasses.asdict(stats)
    fields["drafters"] = {name: dataclasses.asdict(arm) for name, arm in stats.drafters.items()}
    return fields


def stats_from(record: dict) -> SpecStats:
    drafters = {name: DrafterStats(**arm) for name, arm in record.pop("drafters").items()}
    return SpecStats(**record, drafters=drafters)


class CountedLM:
    """A LanguageModel that counts its forwards by their number of new tokens (for the GPU projection)."""

    def __init__(self, lm) -> None:
        self.lm = lm
        self.passes: Counter[int] = Counter()

    def __getattr__(self, name: str):
        return getattr(self.lm, name)

    def forward(self, token_ids, num_logits: int = 0):
        self.passes[len(token_ids)] += 1
        return self.lm.forward(token_ids, num_logits)

    def forward_with_hidden(self, token_ids, num_logits: int = 0):
        self.passes[len(token_ids)] += 1
        return self.lm.forward_with_hidden(token_ids, num_logits)

    def forward_branches(self, branches, token_ids):
        self.passes[sum(map(len, token_ids))] += 1  # the branches side by side: one pass of all their tokens
        return self.lm.forward_branches(branches, token_ids)

    def taken(self) -> dict[str, int]:
        """The passes counted since the last call."""
        passes, self.passes = {str(n): count for n, count in sorted(self.passes.items())}, Counter()
        return passes


def counted_target_lms(runner) -> list[CountedLM]:
    """Every target cache a runner computes on, wrapped to count its passes (the target judge's too)."""
    counted = []
    if isinstance(runner, Engine):
        runner.target = CountedLM(runner.target)
        counted.append(runner.target)
    elif runner.engine is not None:  # a step a round
        runner.engine.target = CountedLM(runner.engine.target)
        counted.append(runner.engine.target)
    else:  # lookahead rounds, on a cache that forks
        runner.trunk = CountedLM(runner.trunk)
        counted.append(runner.trunk)
    judge = getattr(runner, "judge", None)
    if isinstance(judge, TargetJudge):
        judge.lm = CountedLM(judge.lm)
        counted.append(judge.lm)
    return counted


def recorded_answers(log: Path, prompt_of, max_new_tokens: int) -> dict[int, Answer]:
    """The target's answers a live run wrote to log (its target-alone rows), by question;
    prompt_of(question) gives the question's prompt ids."""
    settings = log.parent / "results.json"
    if settings.exists() and json.loads(settings.read_text())["max_new_tokens"] != max_new_tokens:
        raise EvospecError(f"{log.parent} answered with another --max-new-tokens: replay it with the same")
    answers = {
        row["question"]: Answer(tuple(prompt_of(row["question"])), tuple(row["answer_ids"]))
        for row in read_answers(log)
        if row["method"] == "target-alone" and "answer_ids" in row
    }
    if not answers:
        raise EvospecError(f"{log} holds no target-alone answers with their token ids to replay")
    return answers


def step_method(name: str, steps: StepConfig) -> tuple[str, str, StepConfig]:
    """A step-level method's name, e.g. reason+dpo@judge=embedding,lookahead=3 -> (kind, learner or "",
    `steps` with the StepConfig fields the name sets)."""
    method, steps = method_settings(name, steps)
    kind, _, learner = method.partition("+")
    if kind not in ("reason", "reason-lora") or (learner and learner not in LEARNERS):
        raise EvospecError(f"unknown method {name!r}")
    return kind, learner, steps


class Methods:
    """The engines of the run's methods on one target (each with caches of its own): the real one,
    or (replay) its recorded answers charged a cost profile."""

    def __init__(self, args: argparse.Namespace, target: LoadedModel, replay: dict[int, Answer] | None = None) -> None:
        self.args = args
        self.cost = target.forward_cost(args.k + 1)
        if replay is not None:
            self.cost = cost_under(args.profile, self.cost, args.k + 1)
            target = replayed(target, Recording(list(replay.values()), target.vocab_size, self.cost))
        self.target = target
        self._drafters: dict[str, object] = {}
        self.learners: dict[str, object] = {}
        self.runners = {name: self._build(name) for name in args.method}
        self.counted = {name: counted_target_lms(runner) for name, runner in self.runners.items()}

    def drafter(self, spec: str):
        if spec not in self._drafters:
            self._drafters[spec] = build_drafter(spec, self.target)
        return self._drafters[spec]

    def _build(self, name: str):
        args, target = self.args, self.target
        if name == "target-alone":
            return build_engine(target, [])
        if name == "evospec":
            return build_engine(target, [self.drafter(f"lm:{args.drafter}")], AdaptiveDraftLength(self.cost))
        base = StepConfig(
            similarity=args.similarity, max_step_tokens=args.max_step_tokens, follow_target=args.replay is not None
        )
        kind, learner, steps = step_method(name, base)
        if learner or kind == "reason-lora":  # adapters: a drafter of its own, on the hf backend
            drafter = build_drafter(f"lora:{args.drafter}", target)
        else:
            drafter = self.drafter(f"lm:{args.drafter}")
        learners = []
        if learner:
            config = LearnerConfig(lr=args.lr, every=args.learn_every, epochs=args.learn_epochs)
            learners = [build_learner(LEARNERS[learner], drafter, config)]
            self.learners[name] = learners[0]
        return StepSpeculator(
            target,
            drafter,
            build_judge(steps.judge, target, steps.similarity),
            steps,
            learners,
            AdaptiveDraftLength(self.cost),
        )


def read_answers(log: Path) -> list[dict]:
    """The answers written so far; a last line cut short by a killed run is dropped (it is answered again)."""
    if not log.exists():
        return []
    lines = log.read_text().splitlines()
    records = []
    for number, line in enumerate(lines):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number != len(lines) - 1:
                raise SystemExit(f"{log}: line {number + 1} is not JSON") from None
    if len(records) < len(lines):
        log.write_text("".join(json.dumps(record) + "\n" for record in records))
    return records


def merged_passes(counts) -> dict[str, int]:
    total: Counter[str] = Counter()
    for count in counts:
        total.update(count)
    return dict(total)


def projected_tokens_per_s(rows: list[dict], step_s: float) -> float | None:
    """Tokens/s with every target pass charged the GPU profile's T(n) (scaled to this machine's T(1), as
    evospec replay charges them) and the drafter's, judge's and learner's seconds as measured here."""
    if not rows or any("target_passes" not in row for row in rows):
        return None
    cost = profile_cost(GPU_PROFILE, step_s, 512)
    seconds = tokens = 0.0
    for row in rows:
        stats = row["stats"]
        measured_target = stats["target_s"] + stats["prefill_s"] + (stats["judge_s"] if row["target_judge"] else 0.0)
        charged = sum(count * cost.of(min(int(n), 512)) for n, count in row["target_passes"].items())
        seconds += stats["wall_s"] - measured_target + charged
        tokens += stats["new_tokens"]
    return tokens / seconds


def answer(
    runner: Engine | StepSpeculator, prompt_ids: list[int], config: GenerationConfig
) -> tuple[list[int], SpecStats]:
    stats = SpecStats()
    tokens = list(runner.generate(prompt_ids, config, stats))
    return tokens, stats


def summarize(records: list[dict], methods: list[str], block_size: int, step_s: float) -> dict:
    """The "methods" object: per method the fields over the questions every method answered, with
    accuracy and step acceptance, and the same per block of block_size questions."""

    def fields(rows: list[dict]) -> dict:
        total = SpecStats()
        for row in rows:
            total.merge(stats_from(dict(row["stats"])))
        return {
            "accuracy": None if rows[0]["correct"] is None else sum(row["correct"] for row in rows) / len(rows),
            "step_acceptance": total.step_acceptance_rate,
            **aggregate([total]),
            "target_s": total.target_s,
            "judge_s": total.judge_s,
            "draft_steps": total.num_draft_steps,
            "accepted_steps": total.num_accepted_steps,
            "identical_steps": total.num_identical_steps,
            "questions": len(rows),
        }

    answered = [{row["question"] for row in records if row["method"] == method} for method in methods]
    paired = set.intersection(*answered)  # questions every method answered: the comparison is question by question
    summary = {}
    for method in methods:
        rows = [row for row in records if row["method"] == method and row["question"] in paired]
        if not rows:
            continue
        summary[method] = fields(rows)
        summary[method]["per_block"] = [
            {"block": f"{start}-{min(start + block_size, len(rows)) - 1}", **fields(rows[start : start + block_size])}
            for start in range(0, len(rows), block_size)
        ]
    plain = summary.get("target-alone")
    projected = [row for row in records if row["question"] in paired and "target_passes" in row]
    projected_questions = {row["question"] for row in projected}
    for method in summary:  # the GPU projection over the questions whose passes were counted (all, in a new run)
        rows = [row for row in projected if row["method"] == method]
        summary[method]["projected_tokens_per_s"] = {GPU_PROFILE: projected_tokens_per_s(rows, step_s)}
        summary[method]["projected_questions"] = len(projected_questions)
    for entry in summary.values():
        if plain:
            entry["speedup_vs_plain"] = entry["tokens_per_s"] / plain["tokens_per_s"]
            speed, plain_speed = (
                entry["projected_tokens_per_s"][GPU_PROFILE],
                plain["projected_tokens_per_s"][GPU_PROFILE],
            )
            if speed and plain_speed:
                entry["projected_speedup_vs_plain"] = {GPU_PROFILE: speed / plain_speed}
            if plain["accuracy"] is not None:
                entry["accuracy_vs_plain_points"] = 100 * (entry["accuracy"] - plain["accuracy"])
    return summary


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = results["methods"]
    scored = any(entry["accuracy"] is not None for entry in methods.values())
    timed = "target-alone" in methods  # speeds are drawn against the target alone's
    keys = ("accuracy", "step_acceptance")[not scored :]
    figure, axes = plt.subplots(1, len(keys) + timed, figsize=(5.5 * (len(keys) + timed), 4.2), squeeze=False)
    panels = dict(zip(keys, axes[0]))
    titles = {"accuracy": "final-answer accuracy", "step_acceptance": "step acceptance (kept / drafted steps)"}
    for name, entry in methods.items():
        for key, axis in panels.items():
            if entry[key] is not None:
                axis.plot([block[key] for block in entry["per_block"]], marker="o", label=name)
    labels = [block["block"] for block in next(iter(methods.values()))["per_block"]]
    for key, axis in panels.items():
        axis.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
        axis.set_title(titles[key])
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    if timed:
        axis, width = axes[0][-1], 0.4
        names = list(methods)
        live = [methods[name]["speedup_vs_plain"] for name in names]
        projected = [(methods[name].get("projected_speedup_vs_plain") or {}).get(GPU_PROFILE, 0.0) for name in names]
        positions = range(len(names))
        axis.bar([x - width / 2 for x in positions], live, width, label="live, this CPU")
        axis.bar([x + width / 2 for x in positions], projected, width, label=f"projected, {GPU_PROFILE}")
        axis.axhline(1.0, color="grey", linewidth=0.8)
        axis.set_xticks(list(positions), [name.replace(",", ",\n") for name in names], fontsize=6)
        axis.set_title("tokens/s vs the target alone")
        axis.legend(fontsize=7)
    figure.suptitle(f"{results['target']} with {results['drafter']}: GSM8K {results['split']}, per block of questions")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True, help="the small LM that writes steps (a zoo alias or model)")
    parser.add_argument("--backend")
    parser.add_argument("--split", choices=["test", "train"], default="test")
    parser.add_argument("--start", type=int, default=0, help="first question of the split")
    parser.add_argument("--n", type=int, required=True, help="questions")
    parser.add_argument("--method", action="append", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument("--max-step-tokens", type=int, default=StepConfig.max_step_tokens)
    parser.add_argument("--k", type=int, default=16, help="longest token-level draft")
    parser.add_argument("--similarity", type=float, default=StepConfig.similarity)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--learn-every", type=int, default=LearnerConfig.every, help="judged steps between updates")
    parser.add_argument("--learn-epochs", type=int, default=LearnerConfig.epochs)
    parser.add_argument("--block-size", type=int, default=50)
    parser.add_argument("--out", required=True)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--replay", help="a live run's --out: replay its target's answers (see above)")
    parser.add_argument("--profile", default=MEASURED, choices=[MEASURED, *cost_profiles()], help="replay's costs")
    args = parser.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "answers.jsonl"
    records = read_answers(log)
    if records and not args.resume:
        raise SystemExit(f"{log} holds {len(records)} answers: --resume to go on, or another --out")
    if records and any("+" in method for method in args.method):
        raise SystemExit("a learning method cannot resume: its learner's state is not kept between runs")
    done = {(row["method"], row["question"]) for row in records}

    questions = dataset_prompts(f"gsm8k-{args.split}")  # the questions, in file order
    shipped = resources.files("evospec").joinpath(SHIPPED[f"gsm8k-{args.split}"]).read_text()
    # The shipped train split has no worked answers (evospec/data/gsm8k/SOURCE.md): its accuracy is not scored.
    golds = [
        gold_number(row["answer"]) if "answer" in row else None
        for row in map(json.loads, filter(str.strip, shipped.splitlines()))
    ]
    chosen = range(args.start, min(args.start + args.n, len(questions)))
    load_average = os.getloadavg()[0]
    cpu = cpu_description()
    target = load_model(args.target, args.backend, LoadConfig())
    replay = None
    if args.replay:
        replay = recorded_answers(
            Path(args.replay) / "answers.jsonl",
            lambda index: encode_prompt(target, questions[index] + INSTRUCTION, chat=True),
            args.max_new_tokens,
        )
        chosen = [index for index in chosen if index in replay]
    methods = Methods(args, target, replay)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, num_speculative_tokens=args.k)
    with log.open("a") as sink, contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the results so far
        for index in tqdm(chosen, desc="questions", unit="q"):
            prompt_ids = encode_prompt(methods.target, questions[index] + INSTRUCTION, chat=True)
            for name, runner in methods.runners.items():
                if (name, index) in done:
                    continue
                tokens, stats = answer(runner, prompt_ids, config)
                text = methods.target.tokenizer.decode(tokens, skip_special_tokens=True)
                predicted = final_number(text)
                row = {
                    "method": name,
                    "question": index,
                    "correct": None
                    if golds[index] is None
                    else predicted is not None and abs(predicted - golds[index]) < 1e-6,
                    "predicted": predicted,
                    "gold": golds[index],
                    "text": text,
                    "stats": stats_record(stats),
                    "target_passes": merged_passes(lm.taken() for lm in methods.counted[name]),
                    "target_judge": isinstance(getattr(runner, "judge", None), TargetJudge),
                    "cpu": cpu["model"],  # a resumed run may go on on another machine
                }
                if name == "target-alone" and replay is None:
                    row["answer_ids"] = tokens  # what --replay replays
                records.append(row)
                sink.write(json.dumps(row) + "\n")
                sink.flush()

    results = {
        "command": "python " + shlex.join(sys.argv),
        "target": args.target,
        "drafter": args.drafter,
        "weights": methods.target.weights_format,
        "temperature": 0.0,
        "stream": f"gsm8k-{args.split}[{args.start}:{args.start + args.n}]",
        "split": args.split,
        "prompts": len({row["question"] for row in records}),  # answered (a Ctrl-C stops early)
        "max_new_tokens": args.max_new_tokens,
        "k": args.k,
        "threads": default_threads(),
        "cpu": cpu,
        "questions_by_cpu": dict(Counter(row["cpu"] for row in records if row["method"] == args.method[0])),
        "load_average_at_start": load_average,
        "forward_cost_ms": {str(n): round(1000 * s, 2) for n, s in zip(methods.cost.sizes, methods.cost.seconds)},
        "learners": {name: learner.report() for name, learner in methods.learners.items()},
        "gpu_profile": {"name": GPU_PROFILE, "source": cost_profile(GPU_PROFILE)["source"]},
        "replay": None
        if replay is None
        else {
            "answers": args.replay,
            "profile": args.profile,
            "source": profile_source(args.profile),
        },
        "methods": summarize(records, args.method, args.block_size, methods.cost.of(1)),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out / "results.png")
    for name, entry in results["methods"].items():
        acceptance, accuracy = entry["step_acceptance"], entry["accuracy"]
        print(
            f"{name:40s} accuracy {'-' if accuracy is None else f'{accuracy:.3f}'}  step acceptance "
            f"{'-' if acceptance is None else f'{acceptance:.3f}'}  {entry['tokens_per_s']:.2f} tokens/s"
        )


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
