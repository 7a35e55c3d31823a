"""The benchmark and demo run end to end on the smallest real model and write the agreed shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evospec.bench.runner import BenchSettings, run_bench
from evospec.bench.workloads import MT_BENCH, spec_bench
from evospec.config import GenerationConfig

SMOL = "smollm2-135m-instruct"
FIELDS = {"tokens_per_s", "tau", "acceptance_rate", "speedup_vs_plain", "rounds", "new_tokens", "wall_s", "learn_s"}


def test_spec_bench_has_six_categories_and_takes_mt_bench_round_robin():
    prompts = spec_bench(2)
    assert [p.category for p in prompts][::2] == [MT_BENCH, "translation", "summarization", "qa", "math_reasoning", "rag"]
    assert len({p.id for p in prompts}) == 12


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "dtype", "baselines"),
    [("hf", "fp32", ["hf-plain", f"hf-assisted:{SMOL}"]), ("llamacpp", None, ["llamacpp-plain", "llamacpp-lookup"])],
)
def test_bench_writes_results_in_the_agreed_shape(tmp_path: Path, backend, dtype, baselines):
    settings = BenchSettings(
        target=SMOL, draft_model=SMOL, methods=None, per_category=1, dtype=dtype, backend=backend,
        generation=GenerationConfig(max_new_tokens=8), out_dir=tmp_path, command="evospec bench (test)",
    )
    run_bench(settings)
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["methods"]) == {
        *baselines, "evospec-plain", f"evospec:{SMOL}", "evospec:ngram", f"evospec:{SMOL}/k=auto", "evospec:ngram/k=auto"
    }
    for method in results["methods"].values():
        assert FIELDS <= set(method)
        assert len(method["per_category"]) == 6 and method["new_tokens"] > 0
    plain = "llamacpp-plain" if backend == "llamacpp" else "evospec-plain"
    assert results["plain_method"] == plain and results["methods"][plain]["speedup_vs_plain"] == 1.0
    assert (tmp_path / "results.md").read_text().count("|") > 20
    assert (tmp_path / "speedup.png").stat().st_size > 1000


@pytest.mark.slow
def test_demo_prints_each_method_and_the_total(capsys, monkeypatch):
    from evospec.cli import main

    monkeypatch.setenv("COLUMNS", "200")  # rich wraps long method names in a narrow terminal
    status = main(["demo", "--target", SMOL, "--draft-model", SMOL, "--prompts", "1", "--max-new-tokens", "8"])
    out = capsys.readouterr().out
    assert status == 0
    assert "evospec-plain" in out and f"evospec:{SMOL}" in out and "evospec:ngram" in out
    assert "all" in out and "1.00x" in out
