"""Offline warm-up of a white-box drafter: distillation from the target (`evospec train-drafter`).

A drafter that learns on line starts from random weights and drafts little of use at first. Warm-up
gives it a head start: the target answers a corpus of prompts greedily (in its own words, as it will
speak when served); one pass over prompt + answer gives its final hidden states and next-token
distributions (top K) at every position; the drafter learns from these traces with Adam and the
loss the online learners use (forward KL to the target, plus EAGLE's feature regression).

A drafter learns from each answer from the last prompt token on: when it serves, that is where its
inputs begin (the EAGLE layer's cache starts at the first generated token) and what the online
learners' scheduled steps cover (they also step once over each prompt, while answering it).

The output directory holds:
  traces/NNNNNN.safetensors  one per sample: tokens, hidden (bf16), top_ids, top_probs; never collected twice
                             (the answers of a trace set keep theirs in its rows/, the files evospec replay reads)
  model.safetensors, drafter.json  the checkpoint (`--drafter eagle:DIR`); drafter.json["distill"] has the run
  optimizer.safetensors      Adam's moments per parameter name, step counts in the file's metadata
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open
from tqdm.auto import tqdm

from evospec.config import DistillConfig, GenerationConfig
from evospec.drafters.registry import WHITE_BOX_CLASSES, WHITE_BOX_KINDS, new_white_box_drafter
from evospec.drafters.whitebox import ReducedVocab, WhiteBoxConfig, WhiteBoxDrafter
from evospec.errors import EvospecError
from evospec.files import save_tensors_atomically
from evospec.generation import build_engine, encode_prompt
from evospec.learnable import Trace
from evospec.learning.buffer import packed, window_spans
from evospec.learning.losses import LossConfig, drafter_loss
from evospec.models.backend import LoadedModel
from evospec.models.replay import load_rows, pass_rows
from evospec.stats import SpecStats
from evospec.target import FEEDBACK_TOP_K, full_pass

CORPORA = {"gsm8k": "data/gsm8k/train.jsonl"}  # shipped corpora: name -> file in the package
TEXT_FIELDS = ("question", "prompt", "text")  # a .jsonl row's prompt: the first of these it has
TRACE_FORMAT = "evospec-trace-1"
OPTIMIZER_FORMAT = "evospec-adam-1"
# What a resumed run must share with the run it goes on from: they fix the traces and the batches.
RESUME_SETTINGS = ("data", "samples", "max_new_tokens", "batch_rows", "head_vocab", "start_from", "holdout", "seed")
LOSS = LossConfig()


@dataclass(frozen=True)
class Sample:
    """What the target said over one prompt and its own greedy answer."""

    tokens: torch.Tensor  # [T] int64 prompt + answer
    hidden: torch.Tensor  # [T, H] bfloat16 the target's final hidden state at each position
    top_ids: torch.Tensor  # [T, K] int64 its most likely next tokens there
    top_probs: torch.Tensor  # [T, K] float32 their probabilities
    prompt_length: int

    def trace(self, start: int, end: int) -> Trace:
        """Positions start..end-1 as a training trace."""
        return Trace(
            tokens=self.tokens[start:end],
            prefix=self.tokens[:start],
            hidden=self.hidden[start:end].float(),
            top_ids=self.top_ids[start:end],
            top_probs=self.top_probs[start:end],
            rejected=torch.zeros(end - start, dtype=torch.bool),
        )


@dataclass(frozen=True)
class DistillResult:
    """What a run did; `describe()` is the summary the CLI prints."""

    out: Path
    kind: str
    samples: int  # trained on and held out
    held_out: int
    collected: int  # samples the target answered in this run
    reused: int  # samples read back from the trace cache
    skipped: int  # prompts longer than the target's context
    train_rows: int  # scored rows per epoch
    held_out_rows: int
    steps: int  # optimizer steps in all, earlier runs included
    final_loss: float | None  # of the last step
    held_out_loss: tuple[float, float] | None  # (before this run, after)
    agreement: tuple[float, float] | None  # held-out top-1 agreement (before this run, after)

    def describe(self) -> str:
        lines = [
            f"{self.kind} drafter saved to {self.out}",
            f"samples: {self.samples} ({self.samples - self.held_out} trained on, {self.held_out} held out; "
            f"{self.collected} collected, {self.reused} cached"
            + (f"; {self.skipped} too long, skipped)" if self.skipped else ")"),
            f"rows: {self.train_rows} per epoch, {self.held_out_rows} held out",
            f"steps: {self.steps}, final loss {_number(self.final_loss)}",
        ]
        if self.agreement is not None:
            lines.append(
                f"held-out top-1 agreement: {self.agreement[0]:.3f} -> {self.agreement[1]:.3f} "
                f"(loss {self.held_out_loss[0]:.3f} -> {self.held_out_loss[1]:.3f})"
            )
        return "\n".join(lines)


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def check_run(kind: str, out: Path, config: DistillConfig, recorded: bool = False) -> list[str]:
    """Everything that can be checked before the target loads; -> the corpus's prompts (none when
    recorded: config.data is a trace set, whose answers the caller reads)."""
    if kind not in WHITE_BOX_KINDS:
        raise EvospecError(f"unknown drafter kind {kind!r}; train-drafter trains {' or '.join(WHITE_BOX_KINDS)}")
    if config.train_depth > 1 and not WHITE_BOX_CLASSES[kind].unrolls:
        raise EvospecError(f"--train-depth {config.train_depth}: a {kind} drafter has nothing to unroll (eagle has)")
    if (out / "drafter.json").exists() and not config.resume:
        raise EvospecError(
            f"{out} already holds a drafter checkpoint; add --resume to go on with it, or choose another --out"
        )
    if out.exists() and not out.is_dir():
        raise EvospecError(f"--out {out} is a file, not a directory")
    if config.start_from is not None and not (Path(config.start_from).expanduser() / "drafter.json").is_file():
        raise EvospecError(f"--from {config.start_from}: not a drafter checkpoint (no drafter.json)")
    return [] if recorded else read_corpus(config.data)


def read_corpus(data: str) -> list[str]:
    """The prompts of a shipped corpus (CORPORA), of a .jsonl file (a TEXT_FIELDS field per row) or
    of a .txt file (one per line); blank ones are dropped."""
    if data in CORPORA:
        return _jsonl_prompts(resources.files("evospec").joinpath(CORPORA[data]).read_text(), data)
    path = Path(data).expanduser()
    if path.suffix not in (".jsonl", ".txt"):
        raise EvospecError(f"--data {data}: expected {', '.join(CORPORA)}, a .jsonl or a .txt file")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as error:
        raise EvospecError(f"--data {data}: no such file") from error
    except (OSError, UnicodeDecodeError) as error:
        raise EvospecError(f"--data {data}: unreadable ({error})") from error
    prompts = _jsonl_prompts(text, data) if path.suffix == ".jsonl" else [line.strip() for line in text.splitlines()]
    prompts = [prompt for prompt in prompts if prompt.strip()]
    if not prompts:
        raise EvospecError(f"--data {data}: the file holds no prompts")
    return prompts


def _jsonl_prompts(text: str, name: str) -> list[str]:
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            raise EvospecError(f"{name}:{number}: not a JSON object ({error})") from error
        field = next((key for key in TEXT_FIELDS if isinstance(row, dict) and isinstance(row.get(key), str)), None)
        if field is None:
            raise EvospecError(f"{name}:{number}: a row needs a text field: {', '.join(TEXT_FIELDS)}")
        prompts.append(row[field])
    return prompts


def distill(
    target: LoadedModel,
    kind: str,
    out: Path,
    config: DistillConfig,
    progress: bool = True,
    recorded: Sequence[tuple[list[int], list[int]]] = (),
    recorded_rows: Sequence[Path] = (),
) -> DistillResult:
    """Warm up a `kind` drafter for target on the corpus config names and save it to out (see the module
    docstring). recorded: (prompt ids, answer ids) the target already gave (a trace set of evospec
    traces collect); then they are the corpus, and the target only makes the pass over each.
    recorded_rows: where the trace set keeps each answer's rows (read if there, else written), or none."""
    prompts = check_run(kind, out, config, recorded=bool(recorded))[: config.samples]
    resumed = config.resume and (out / "drafter.json").exists()
    # 1. The drafter to go on with, when its weights exist (fail before minutes of collecting).
    drafter, meta = None, {}
    if resumed:
        drafter, meta = _resumed_drafter(kind, target, out, config)
    elif config.start_from is not None:
        start = Path(config.start_from).expanduser()
        drafter = new_white_box_drafter(kind, target, start)
        drafter.version = int(json.loads((start / "drafter.json").read_text()).get("drafter_version", 0))
    # 2. The target answers each prompt; one pass over prompt + answer says what it thinks at every position.
    collection = collect(
        target, prompts, out / "traces", config, progress, recorded[: config.samples], recorded_rows[: config.samples]
    )
    samples = collection.samples
    held_out = min(math.ceil(len(samples) * config.holdout), len(samples) - 1)
    train, test = samples[: len(samples) - held_out], samples[len(samples) - held_out :]
    # 3. A new drafter proposes the tokens the target used most (end-of-generation ones always).
    if drafter is None:
        torch.manual_seed(config.seed)
        drafter = _new_drafter(kind, target, train, config)
    # 4. Adam over windows of the answers, shuffled each epoch; checkpoints on the way and at the end.
    test_traces = [test[index].trace(start, end) for index, start, end in _windows(test, config.batch_rows)]
    before = _evaluate(drafter, test_traces)
    windows = _windows(train, config.batch_rows)
    params = [param for param in drafter.module.parameters() if param.requires_grad]  # _trainable_names' order
    optimizer = torch.optim.Adam(params, lr=config.lr)
    step, loss = 0, meta.get("loss")
    if resumed:
        step = meta["step"]
        _load_optimizer(optimizer, drafter, out, step)
    plan = [(epoch, batch) for epoch in range(config.epochs) for batch in _batches(windows, epoch, config)]
    plan = plan[: config.max_steps]
    bar = tqdm(total=len(plan), initial=min(step, len(plan)), desc="train", unit="step", disable=not progress)
    run_meta = {
        "samples": len(samples),
        "corpus": config.data,
        "target": target.name,
        "settings": _settings(config),
        "train_depth": config.train_depth,
    }
    for epoch, batch in plan[step:]:
        traces = [train[index].trace(start, end) for index, start, end in batch]
        value = _batch_loss(drafter, traces, config.train_depth)
        optimizer.zero_grad()
        value.backward()
        torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
        optimizer.step()
        step, loss = step + 1, value.item()
        drafter.version += 1
        bar.update()
        bar.set_postfix(loss=f"{loss:.3f}", epoch=epoch + 1)
        if step % config.save_every == 0 or step == len(plan):
            _save(drafter, optimizer, out, {**run_meta, "epoch": epoch + 1, "step": step, "loss": loss})
    bar.close()
    # 5. How often the drafter's first choice is the target's on the held-out samples.
    after = _evaluate(drafter, test_traces)
    return DistillResult(
        out=out,
        kind=kind,
        samples=len(samples),
        held_out=held_out,
        collected=collection.collected,
        reused=collection.reused,
        skipped=collection.skipped,
        train_rows=sum(end - start - 1 for _, start, end in windows),
        held_out_rows=sum(trace.length - 1 for trace in test_traces),
        steps=step,
        final_loss=loss,
        held_out_loss=(before[0], after[0]) if test_traces else None,
        agreement=(before[1], after[1]) if test_traces else None,
    )


@dataclass(frozen=True)
class Collection:
    """The samples of a corpus's prompts, in order, and where they came from."""

    samples: list[Sample]
    collected: int  # answered by the target now
    reused: int  # read back from the cache
    skipped: int  # prompts that do not fit the target's context


def collect(
    target: LoadedModel,
    prompts: list[str],
    directory: Path,
    config: DistillConfig,
    progress: bool = True,
    recorded: Sequence[tuple[list[int], list[int]]] = (),
    recorded_rows: Sequence[Path] = (),
) -> Collection:
    """The target's greedy answer to each prompt (chat template when it has one) and what it says at
    every position of prompt + answer; cached in directory, one file per prompt, so none is answered twice.
    recorded: (prompt ids, answer ids) pairs to use instead of prompts, their answers already given;
    recorded_rows: their rows in the trace set (shared with evospec replay) instead of the cache."""
    cache = _TraceCache(directory, target, config.max_new_tokens)
    engine = build_engine(target, [])
    lm = target.new_lm(hidden_states=True)
    chat = bool(target.tokenizer.chat_template)
    samples, collected, reused = [], 0, 0
    items = recorded or [(encode_prompt(target, prompt, chat), None) for prompt in prompts]
    for index, (prompt_ids, answer) in enumerate(tqdm(items, desc="collect", unit="sample", disable=not progress)):
        if len(prompt_ids) >= target.context_length:
            continue
        if recorded_rows:
            sample, made = _recorded_sample(lm, prompt_ids, answer, recorded_rows[index], config.forward_rows)
            collected, reused = collected + made, reused + (not made)
            samples.append(sample)
            continue
        sample = cache.load(index, prompt_ids)
        if sample is None:
            if answer is None:
                answer = list(
                    engine.generate(prompt_ids, GenerationConfig(max_new_tokens=config.max_new_tokens), SpecStats())
                )
            sample = _target_pass(lm, prompt_ids + answer, len(prompt_ids), config.forward_rows)
            cache.save(index, prompt_ids, sample)
            collected += 1
        else:
            reused += 1
        samples.append(sample)
    if not samples:
        raise EvospecError(f"no prompt of {config.data} fits the target's context of {target.context_length} tokens")
    return Collection(samples, collected, reused, len(items) - len(samples))


def _recorded_sample(
    lm, prompt_ids: list[int], answer_ids: list[int], rows_path: Path, rows_per_pass: int
) -> tuple[Sample, bool]:
    """A recorded answer's sample from its trace set's rows, the file evospec replay reads, made by one
    pass of the target when it is missing -> (sample, whether the pass ran)."""
    ids = prompt_ids + answer_ids
    rows = load_rows(rows_path, len(ids))
    made = rows is None or rows.hidden is None
    if made:
        rows = pass_rows(lm, ids, rows_per_pass, rows_path)
    sample = Sample(torch.tensor(ids), rows.hidden.to(torch.bfloat16), rows.top_ids, rows.top_probs, len(prompt_ids))
    return sample, made


def _resumed_drafter(kind: str, target: LoadedModel, out: Path, config: DistillConfig) -> tuple[WhiteBoxDrafter, dict]:
    """The drafter saved in out and its run's metadata, checked against this run's target and settings."""
    drafter = new_white_box_drafter(kind, target, out)  # checks the kind and the target's vocabulary
    meta = json.loads((out / "drafter.json").read_text())
    run = meta.get("distill")
    if run is None:
        raise EvospecError(
            f"{out} holds a drafter that train-drafter did not make; start a new run from it with --from {out}"
        )
    if run["target"] != target.name:
        raise EvospecError(f"{out} was trained for target '{run['target']}', not '{target.name}'")
    for name, value in _settings(config).items():
        if run["settings"].get(name) != value:
            option = {"start_from": "from"}.get(name, name).replace("_", "-")
            raise EvospecError(
                f"{out} was trained with --{option} {run['settings'].get(name)}, not {value}; "
                "resume with the same settings or choose another --out"
            )
    drafter.version = int(meta.get("drafter_version", 0))
    return drafter, run


def _settings(config: DistillConfig) -> dict:
    return {name: getattr(config, name) for name in RESUME_SETTINGS}


def _new_drafter(kind: str, target: LoadedModel, train: list[Sample], config: DistillConfig) -> WhiteBoxDrafter:
    shape = WhiteBoxConfig(kind, target.hidden_size)
    size = min(shape.head_vocab if config.head_vocab is None else config.head_vocab, target.vocab_size)
    vocab = ReducedVocab.most_frequent(
        [sample.tokens.tolist() for sample in train], target.vocab_size, size, always=sorted(target.eos_token_ids)
    )
    return new_white_box_drafter(kind, target, config=dataclasses.replace(shape, head_vocab=size), vocab=vocab)


def _target_pass(lm, ids: list[int], prompt_length: int, rows_per_pass: int) -> Sample:
    """One pass of the target over ids (full_pass) -> the sample, hidden states kept in bf16."""
    hidden, top_ids, top_probs = full_pass(lm, ids, FEEDBACK_TOP_K, rows_per_pass)
    return Sample(torch.tensor(ids), hidden.to(torch.bfloat16), top_ids, top_probs, prompt_length)


class _TraceCache:
    """Collected samples on disk, one safetensors file each, keyed by target (and backend: their hidden
    states differ), answer length and prompt ids."""

    def __init__(self, directory: Path, target: LoadedModel, max_new_tokens: int) -> None:
        self.directory = directory
        self.target = (target.name, target.backend.name)
        self.max_new_tokens = max_new_tokens

    def _key(self, prompt_ids: list[int]) -> str:
        text = json.dumps([TRACE_FORMAT, *self.target, self.max_new_tokens, prompt_ids])
        return hashlib.sha256(text.encode()).hexdigest()

    def _path(self, index: int) -> Path:
        return self.directory / f"{index:06d}.safetensors"

    def load(self, index: int, prompt_ids: list[int]) -> Sample | None:
        """The cached sample for this prompt, or None (none yet, another run's, or unreadable)."""
        path = self._path(index)
        if not path.is_file():
            return None
        try:
            with safe_open(path, "pt") as file:
                if (file.metadata() or {}).get("key") != self._key(prompt_ids):
                    return None
                tensors = {name: file.get_tensor(name) for name in file.keys()}
        except (SafetensorError, OSError):
            return None
        return Sample(tensors["tokens"], tensors["hidden"], tensors["top_ids"], tensors["top_probs"], len(prompt_ids))

    def save(self, index: int, prompt_ids: list[int], sample: Sample) -> None:
        tensors = {
            "tokens": sample.tokens,
            "hidden": sample.hidden,
            "top_ids": sample.top_ids,
            "top_probs": sample.top_probs,
        }
        self.directory.mkdir(parents=True, exist_ok=True)
        save_tensors_atomically(
            tensors, self._path(index), {"key": self._key(prompt_ids), "prompt_length": str(len(prompt_ids))}
        )


def _windows(samples: list[Sample], size: int) -> list[tuple[int, int, int]]:
    """(sample index, start, end) of each sample's answer from the last prompt token on, in windows of
    at most `size` positions; consecutive windows share one position so that no row is lost."""
    return [
        (index, start, stop)
        for index, sample in enumerate(samples)
        for start, stop in window_spans(sample.prompt_length - 1, sample.tokens.numel(), size)
    ]


def _batches(
    windows: list[tuple[int, int, int]], epoch: int, config: DistillConfig
) -> list[list[tuple[int, int, int]]]:
    """The epoch's windows in a seeded order, packed into batches of at most batch_rows positions."""
    order = torch.randperm(len(windows), generator=torch.Generator().manual_seed((config.seed << 16) + epoch))
    shuffled = [windows[i] for i in order.tolist()]
    return packed(shuffled, [stop - start for _, start, stop in shuffled], config.batch_rows)


def _batch_loss(drafter: WhiteBoxDrafter, traces: list[Trace], depth: int = 1) -> torch.Tensor:
    """Row-weighted mean loss of the drafter's module over traces at draft depths 1..depth (as the
    online learners weigh it)."""
    total = sum(
        drafter_loss(drafter.training_outputs(drafter.module, trace, depth), trace, drafter.row_of, LOSS) * trace.length
        for trace in traces
    )
    return total / sum(trace.length for trace in traces)


@torch.no_grad()
def _evaluate(drafter: WhiteBoxDrafter, traces: list[Trace]) -> tuple[float, float]:
    """(mean loss, top-1 agreement: the share of scored rows where the drafter's first choice is the target's)."""
    if not traces:
        return math.nan, math.nan
    agreed = scored = 0
    for trace in traces:
        outputs = drafter.training_outputs(drafter.module, trace)
        chosen = drafter.vocab.ids[outputs.logits.argmax(dim=-1)]
        agreed += int((chosen == trace.top_ids[outputs.rows, 0]).sum())
        scored += outputs.rows.numel()
    return float(_batch_loss(drafter, traces)), agreed / max(scored, 1)


def _save(drafter: WhiteBoxDrafter, optimizer: torch.optim.Adam, out: Path, run: dict) -> None:
    """Optimizer state first, then the checkpoint: drafter.json, written last, names the step both are at."""
    out.mkdir(parents=True, exist_ok=True)
    names = _trainable_names(drafter)
    tensors, steps = {}, {}
    for index, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            if key == "step":
                steps[names[index]] = int(value)
            else:
                tensors[f"{key}.{names[index]}"] = value
    meta = {"format": OPTIMIZER_FORMAT, "step": str(run["step"]), "param_steps": json.dumps(steps)}
    save_tensors_atomically(tensors, out / "optimizer.safetensors", meta)
    drafter.save(out, run["target"], extra={"distill": run})


def _load_optimizer(optimizer: torch.optim.Adam, drafter: WhiteBoxDrafter, out: Path, step: int) -> None:
    """Adam's state as _save left it at `step`."""
    path = out / "optimizer.safetensors"
    try:
        with safe_open(path, "pt") as file:
            meta = file.metadata() or {}
        tensors = load_file(path)
    except (SafetensorError, OSError) as error:
        raise EvospecError(
            f"{path}: no readable optimizer state to resume from ({error}); "
            f"start a new run from the weights with --from {out}"
        ) from error
    if meta.get("format") != OPTIMIZER_FORMAT or meta.get("step") != str(step):
        raise EvospecError(
            f"{path} is not the optimizer state of the checkpoint's step {step} (a save was cut short?); "
            f"start a new run from the weights with --from {out}"
        )
    index_of = {name: index for index, name in enumerate(_trainable_names(drafter))}
    state = {
        index_of[name]: {"step": torch.tensor(float(count))} for name, count in json.loads(meta["param_steps"]).items()
    }
    for key, value in tensors.items():
        moment, _, name = key.partition(".")  # e.g. exp_avg.fc.weight
        state[index_of[name]][moment] = value
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


def _trainable_names(drafter: WhiteBoxDrafter) -> list[str]:
    """Names of the parameters the optimizer updates, in its order."""
    return [name for name, param in drafter.module.named_parameters() if param.requires_grad]
