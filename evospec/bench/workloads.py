"""Evaluation prompts shipped with the package (see evospec/data/*/SOURCE.md for origin and licence)."""

from __future__ import annotations

import json
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
