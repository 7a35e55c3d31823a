"""Recorded answers of a target (`evospec traces collect`): what `evospec replay` replays.

A trace set is one target's greedy answers (plain decoding) to the prompts of one dataset, in order,
in a directory (by default $EVOSPEC_HOME/traces/<target>/<backend>-<weights>/<data>-<max new tokens>):
  answers.jsonl  one line per prompt, {"index", "prompt_ids", "answer_ids"}, appended as each is
                 answered, so an interrupted collection resumes where it stopped (also read gzipped:
                 answers.jsonl.gz, the form committed under benchmarks/)
  meta.json      the target, its backend and weights, the dataset, the answer length, the CPU
  rows/          what the target said at every position of each answer, NNNNNN.safetensors: its
                 top-K next tokens and final hidden states, written as the answer is decoded (the
                 replay and train-drafter make the missing ones by one pass over prompt + answer)
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from tqdm.auto import tqdm

from evospec.bench.workloads import humaneval_problems, spec_bench
from evospec.config import GenerationConfig
from evospec.distill import read_corpus
from evospec.errors import EvospecError
from evospec.files import evospec_home, write_atomically
from evospec.generation import build_engine, encode_prompt
from evospec.machine import cpu_description
from evospec.models.backend import LoadedModel
from evospec.models.replay import Answer, Rows, save_rows
from evospec.stats import SpecStats
from evospec.target import FEEDBACK_TOP_K, LanguageModel, top_next_tokens
from evospec.types import RoundFeedback

TRACES_FORMAT = "evospec-answers-1"
SHIPPED = {
    "gsm8k-train": "data/gsm8k/train.jsonl",
    "gsm8k-test": "data/gsm8k/test.jsonl",
}  # datasets in the package; humaneval and spec-bench[:CATEGORY] are read by their workloads
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with the whole function in one code block.\n\n"


def dataset_prompts(data: str) -> list[str]:
    """The prompts of a dataset: gsm8k-train, gsm8k-test, humaneval, spec-bench, spec-bench:CATEGORY
    (Spec-Bench's first turns) or a .jsonl / .txt file (as train-drafter reads them)."""
    if data in SHIPPED:
        text = resources.files("evospec").joinpath(SHIPPED[data]).read_text()
        return [json.loads(line)["question"] for line in text.splitlines() if line.strip()]
    if data == "humaneval":
        return [HUMANEVAL_INSTRUCTION + problem["prompt"] for problem in humaneval_problems()]
    if data == "spec-bench" or data.startswith("spec-bench:"):
        prompts = spec_bench(per_category=10_000)
        category = data.partition(":")[2]
        categories = list(dict.fromkeys(prompt.category for prompt in prompts))
        if category and category not in categories:
            raise EvospecError(f"Spec-Bench has no category {category!r}; choose one of {', '.join(categories)}")
        return [prompt.text for prompt in prompts if category in ("", prompt.category)]
    if Path(data).suffix in (".jsonl", ".txt"):
        return read_corpus(data)
    raise EvospecError(
        f"--data {data}: expected {', '.join(SHIPPED)}, humaneval, spec-bench[:CATEGORY], or a .jsonl or .txt file"
    )


def default_directory(target: LoadedModel, data: str, max_new_tokens: int) -> Path:
    """Where a collection of this target's answers to data is kept unless --out says otherwise."""
    dataset = _slug(Path(data).stem if Path(data).suffix else data)
    weights = f"{target.backend.name}-{target.weights_format}"
    return evospec_home() / "traces" / _slug(target.name) / weights / f"{dataset}-{max_new_tokens}"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


@dataclass(frozen=True)
class TraceSet:
    """A directory of recorded answers (see the module docstring)."""

    directory: Path
    meta: dict
    answers: list[Answer]

    def rows_path(self, index: int) -> Path:
        """Where answer `index`'s rows are cached."""
        return rows_path(self.directory, index)


def rows_path(directory: Path, index: int) -> Path:
    """Where the rows of answer `index` of the trace set in directory are cached."""
    return directory / "rows" / f"{index:06d}.safetensors"


class RowsRecorder:
    """What every pass of plain decoding says about the tokens it verifies (top-K, hidden states), kept
    as a collection's rows: the engine tells it each pass as it tells a learner, so the rows cost no
    pass beyond the answer's own. prompt_rows: at least the longest prompt (all its rows are kept)."""

    needs_hidden_states = True

    def __init__(self, prompt_rows: int) -> None:
        self.prompt_rows = prompt_rows
        self._parts: list[Rows] = []

    def observe(self, feedback: RoundFeedback) -> None:
        # A pass's hidden states may view the backend's buffers, which the next pass overwrites.
        self._parts.append(Rows(feedback.top_ids, feedback.top_probs, feedback.hidden.clone()))

    def end_request(self) -> None:
        """Nothing to learn: the rows wait for take()."""

    def take(self, target: LanguageModel, last_token: int) -> Rows:
        """The request's rows, in context order. Its last token is emitted without a pass over it, so one
        more step of target (the engine's, holding every token but that one) says what follows it."""
        logits, hidden = target.forward_with_hidden([last_token], num_logits=1)
        parts, self._parts = [*self._parts, Rows(*top_next_tokens(logits, FEEDBACK_TOP_K), hidden.clone())], []
        fields = ("top_ids", "top_probs", "hidden")
        return Rows(*(torch.cat([getattr(part, field) for part in parts]) for field in fields))


def load_traces(directory: Path) -> TraceSet:
    """The trace set in directory; a missing or damaged one is a clear error."""
    directory = directory.expanduser()
    meta_path = directory / "meta.json"
    if not meta_path.is_file():
        raise EvospecError(f"{directory}: not a trace set (no meta.json); make one with evospec traces collect")
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError as error:
        raise EvospecError(f"{meta_path}: not JSON ({error})") from error
    if meta.get("format") != TRACES_FORMAT:
        raise EvospecError(f"{meta_path}: format {meta.get('format')!r}, expected {TRACES_FORMAT!r}")
    return TraceSet(directory, meta, _read_answers(directory))


def _read_answers(directory: Path) -> list[Answer]:
    """The answers of a trace set in order; a last line cut short (a collection killed mid-write) is dropped."""
    plain, packed = directory / "answers.jsonl", directory / "answers.jsonl.gz"
    if plain.is_file():
        lines = plain.read_text().splitlines()
    elif packed.is_file():
        with gzip.open(packed, "rt") as file:
            lines = file.read().splitlines()
    else:
        return []
    answers = []
    for number, line in enumerate(lines):
        try:
            row = json.loads(line)
        except ValueError as error:
            if number == len(lines) - 1:
                break
            raise EvospecError(f"{directory}/answers.jsonl:{number + 1}: not JSON ({error})") from error
        if row.get("index") != number:
            raise EvospecError(f"{directory}/answers.jsonl:{number + 1}: answer {row.get('index')} out of order")
        answers.append(Answer(tuple(row["prompt_ids"]), tuple(row["answer_ids"])))
    return answers


def collect_traces(
    target: LoadedModel,
    data: str,
    count: int,
    max_new_tokens: int,
    directory: Path | None = None,
    progress: bool = True,
) -> TraceSet:
    """The target's greedy answers to the first `count` prompts of data, resuming what directory holds."""
    prompts = dataset_prompts(data)
    if count < 1:
        raise EvospecError(f"--n must be >= 1, got {count}")
    if count > len(prompts):
        raise EvospecError(f"{data} has {len(prompts)} prompts, fewer than --n {count}")
    directory = (directory or default_directory(target, data, max_new_tokens)).expanduser()
    meta = {
        "format": TRACES_FORMAT,
        "target": target.name,
        "backend": target.backend.name,
        "weights": target.weights_format,
        "data": data,
        "max_new_tokens": max_new_tokens,
        "cpu": cpu_description(),
    }
    done = _resumable(directory, meta)
    chat = bool(target.tokenizer.chat_template)
    recorder = RowsRecorder(prompt_rows=target.context_length)
    engine = build_engine(target, [], learners=[recorder])
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    directory.mkdir(parents=True, exist_ok=True)
    write_atomically(directory / "meta.json", json.dumps({**meta, "cpu": done.meta.get("cpu", meta["cpu"])}))
    answers = list(done.answers)
    _rewrite_whole_lines(directory, answers)
    bar = tqdm(total=count, initial=min(len(answers), count), desc="collect", unit="answer", disable=not progress)
    with (directory / "answers.jsonl").open("a") as file:
        for index in range(len(answers), count):
            prompt_ids = encode_prompt(target, prompts[index], chat)
            if len(prompt_ids) + max_new_tokens > target.context_length:
                raise EvospecError(
                    f"{data} prompt {index} has {len(prompt_ids)} tokens: with {max_new_tokens} new ones it does not "
                    f"fit the target's context of {target.context_length}"
                )
            answer_ids = list(engine.generate(prompt_ids, config, SpecStats()))
            answers.append(Answer(tuple(prompt_ids), tuple(answer_ids)))
            save_rows(recorder.take(engine.target, answer_ids[-1]), rows_path(directory, index))
            file.write(_line(index, answers[-1]))
            file.flush()
            bar.update()
    bar.close()
    return TraceSet(directory, json.loads((directory / "meta.json").read_text()), answers[:count])


def _resumable(directory: Path, meta: dict) -> TraceSet:
    """What directory already holds for this collection (nothing if it is new); another collection's is an error."""
    if not (directory / "meta.json").is_file():
        if directory.exists() and any(directory.iterdir()):
            raise EvospecError(f"{directory} is not empty and holds no trace set; choose another --out")
        return TraceSet(directory, {}, [])
    existing = load_traces(directory)
    for key in ("target", "backend", "weights", "data", "max_new_tokens"):
        if existing.meta.get(key) != meta[key]:
            raise EvospecError(
                f"{directory} holds answers with {key} {existing.meta.get(key)!r}, not {meta[key]!r}; "
                "choose another --out"
            )
    return existing


def _rewrite_whole_lines(directory: Path, answers: list[Answer]) -> None:
    """answers.jsonl as exactly these answers, so that appending after a cut-short line stays valid JSONL,
    and a collection resumed from the committed answers.jsonl.gz alone goes on after all of them."""
    path = directory / "answers.jsonl"
    written = len(path.read_text().splitlines()) if path.is_file() else 0
    if written != len(answers):
        write_atomically(path, "".join(_line(index, answer) for index, answer in enumerate(answers)))


def _line(index: int, answer: Answer) -> str:
    """One answer as a line of answers.jsonl."""
    return (
        json.dumps({"index": index, "prompt_ids": list(answer.prompt_ids), "answer_ids": list(answer.answer_ids)})
        + "\n"
    )


def export_answers(traces: TraceSet, path: Path) -> None:
    """The answers and meta of a trace set as a small directory to commit: answers.jsonl.gz and meta.json."""
    path.mkdir(parents=True, exist_ok=True)
    lines = "".join(_line(index, answer) for index, answer in enumerate(traces.answers))
    (path / "answers.jsonl.gz").write_bytes(gzip.compress(lines.encode(), mtime=0))
    write_atomically(path / "meta.json", json.dumps(traces.meta, indent=1))
