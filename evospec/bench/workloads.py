"""Evaluation prompts shipped with the package (see evospec/data/*/SOURCE.md for origin and licence)."""

from __future__ import annotations

import ast
import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

from evospec.errors import EvospecError

# Spec-Bench reports its 80 MT-Bench questions (8 sub-categories) as one category.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
MT_BENCH = "mt_bench"


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str
    prediction: str | None = None  # the output expected to repeat much of it (OpenAI Predicted Outputs)


def spec_bench(per_category: int) -> list[Prompt]:
    """per_category prompts of each Spec-Bench category (first turns), category after category.
    MT-Bench's are taken round-robin over its sub-categories."""
    if per_category < 1:
        raise EvospecError(f"--per-category must be >= 1, got {per_category}")
    rows = resources.files("evospec").joinpath("data/spec_bench/question.jsonl").read_text().splitlines()
    by_category: dict[str, list[dict]] = {}
    for row in map(json.loads, rows):
        by_category.setdefault(row["category"], []).append(row)
    mt_bench = [row for group in zip(*(by_category.pop(c) for c in MT_BENCH_CATEGORIES)) for row in group]
    by_category = {MT_BENCH: mt_bench, **by_category}
    return [
        Prompt(id=str(row["question_id"]), category=category, text=row["turns"][0])
        for category, group in by_category.items()
        for row in group[:per_category]
    ]


EDIT_REPLY = "Reply with the complete updated code in one Python code block, nothing else."


def _rename_function(code: str, function: ast.FunctionDef) -> str:
    return f"Rename the function `{function.name}` to `compute_{function.name}`."


def _rename_parameter(code: str, function: ast.FunctionDef) -> str:
    name = function.args.args[0].arg
    return f"Rename the parameter `{name}` of `{function.name}` to `input_{name}` everywhere, docstring included."


def _guard(code: str, function: ast.FunctionDef) -> str:
    name = function.args.args[0].arg
    return f"Add a check at the start of the body of `{function.name}` that raises a TypeError if `{name}` is None."


def _comment(code: str, function: ast.FunctionDef) -> str:
    return f"Add a short comment above each loop, if statement and return statement in the body of `{function.name}`."


def _remove_examples(code: str, function: ast.FunctionDef) -> str:
    return (
        "Remove the examples (the lines starting with >>> and the results below them) "
        f"from the docstring of `{function.name}`."
    )


# Edits whose answer copies most of the input: each kind gives the instruction for a function.
EDITS: dict[str, Callable[[str, ast.FunctionDef], str]] = {
    "edit-rename": _rename_function,
    "edit-parameter": _rename_parameter,
    "edit-guard": _guard,
    "edit-comment": _comment,
    "edit-examples": _remove_examples,
}


def humaneval_problems() -> list[dict]:
    """HumanEval's 164 problems (task_id, prompt, canonical_solution, entry_point, ...), in order."""
    with gzip.open(resources.files("evospec").joinpath("data/humaneval/HumanEval.jsonl.gz").open("rb"), "rt") as rows:
        return [json.loads(row) for row in rows]


def edits(per_kind: int) -> list[Prompt]:
    """per_kind edit requests of each kind (EDITS) on HumanEval's canonical solutions, kind after kind.
    Each asks for the whole edited function back and carries the original code as its prediction;
    kind i takes problems i, i + len(EDITS), ... so that no two requests edit the same function."""
    if per_kind < 1:
        raise EvospecError(f"--per-category must be >= 1, got {per_kind}")
    problems = humaneval_problems()
    if per_kind * len(EDITS) > len(problems):
        raise EvospecError(
            f"the edit workload has {len(problems) // len(EDITS)} requests of each kind, asked for {per_kind}"
        )
    prompts = []
    for offset, (kind, instruction) in enumerate(EDITS.items()):
        for problem in problems[offset :: len(EDITS)][:per_kind]:
            code = problem["prompt"] + problem["canonical_solution"]
            function = next(
                node
                for node in ast.walk(ast.parse(code))
                if isinstance(node, ast.FunctionDef) and node.name == problem["entry_point"]
            )
            text = f"{instruction(code, function)}\n\n```python\n{code}```\n\n{EDIT_REPLY}"
            prompts.append(Prompt(id=problem["task_id"], category=kind, text=text, prediction=code))
    return prompts
