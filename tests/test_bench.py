"""The benchmark and demo run end to end on the smallest real model and write the agreed shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evospec.bench.methods import method_names
from evospec.bench.runner import BenchSettings, run_bench
from evospec.bench.workloads import EDIT_REPLY, EDITS, MT_BENCH, edits, spec_bench
from evospec.config import GenerationConfig, LoadConfig
from evospec.errors import EvospecError

SMOL = "smollm2-135m-instruct"
FIELDS = {
    "tokens_per_s",
    "tau",
    "acceptance_rate",
    "speedup_vs_plain",
    "rounds",
    "new_tokens",
    "wall_s",
    "learn_s",
    "decode_tokens_per_s",
    "decode_speedup_vs_plain",
}


def test_spec_bench_has_six_categories_and_takes_mt_bench_round_robin():
    prompts = spec_bench(2)
    assert [p.category for p in prompts][::2] == [
        MT_BENCH,
        "translation",
        "summarization",
        "qa",
        "math_reasoning",
        "rag",
    ]
    assert len({p.id for p in prompts}) == 12


@pytest.mark.slow
def test_bench_writes_results_in_the_agreed_shape_for_every_category(tmp_path: Path):
    settings = BenchSettings(
        target=SMOL,
        draft_model=SMOL,
        methods=("llamacpp-plain", "evospec-plain", "evospec:ngram"),
        suite="engine",
        stream="mixed",
        per_category=1,
        backend="llamacpp",
        generation=GenerationConfig(max_new_tokens=8),
        out_dir=tmp_path,
        command="evospec bench (test)",
    )
    run_bench(settings)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["stream"] == "mixed" and results["backend"] == "llamacpp"
    for method in results["methods"].values():
        assert FIELDS <= set(method)
        assert len(method["per_category"]) == 6 and method["new_tokens"] > 0
        assert 0 < method["prefill_s"] < method["wall_s"]  # the baselines' prefill is timed too
    assert results["plain_method"] == "llamacpp-plain"
    assert results["methods"]["llamacpp-plain"]["speedup_vs_plain"] == 1.0
    assert (tmp_path / "results.md").read_text().count("|") > 20
    assert (tmp_path / "speedup.png").stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "dtype", "baselines"),
    [("hf", "fp32", ["hf-plain", f"hf-assisted:{SMOL}"]), ("llamacpp", None, ["llamacpp-plain", "llamacpp-lookup"])],
)
def test_the_engine_suite_has_each_backends_baselines(tmp_path: Path, backend, dtype, baselines):
    settings = BenchSettings(
        target=SMOL,
        draft_model=SMOL,
        methods=None,
        suite="engine",
        stream="category:qa",
        per_category=1,
        backend=backend,
        load=LoadConfig(dtype=dtype),
        generation=GenerationConfig(max_new_tokens=8),
        out_dir=tmp_path,
        command="evospec bench (test)",
    )
    run_bench(settings)
    results = json.loads((tmp_path / "results.json").read_text())
    singles = [f"evospec:{SMOL}", "evospec:ngram", "evospec:suffix"]
    assert set(results["methods"]) == {*baselines, "evospec-plain", *singles, *(f"{name}/k=auto" for name in singles)}
    assert results["stream"] == "category:qa" and all(m["new_tokens"] > 0 for m in results["methods"].values())
    assert all(0 < m["prefill_s"] < m["wall_s"] for m in results["methods"].values())
    plain = "llamacpp-plain" if backend == "llamacpp" else "evospec-plain"
    assert results["plain_method"] == plain


@pytest.mark.slow
def test_demo_shows_each_task_against_plain_decoding_and_the_ceiling(capsys, monkeypatch):
    from evospec.cli import main

    monkeypatch.setenv("COLUMNS", "250")  # rich wraps long cells in a narrow terminal
    status = main(["demo", "--target", SMOL, "--k", "16"])
    out = capsys.readouterr().out
    assert status == 0
    for task in ("edit with a prediction", "summary of an article", "chat"):
        assert task in out
    assert out.count("plain decoding") >= 3 and out.count("evospec (ngram, suffix, prediction)") == 3
    assert "1.00x" in out and "no drafter can decode faster than" in out


@pytest.mark.slow
def test_the_edit_suite_drafts_the_prediction_beside_spec_bench_prompts(tmp_path: Path):
    assert method_names(SMOL, "llamacpp", "edit") == [
        "llamacpp-plain",
        "llamacpp-lookup",
        "evospec-plain",
        "evospec:ngram/k=auto",
        "evospec:suffix/k=auto",
        "evospec:prediction/k=auto",
        "select:ucb-bd/k=auto",
    ]
    settings = BenchSettings(
        target=SMOL,
        draft_model=SMOL,
        methods=("llamacpp-plain", "evospec:prediction/k=auto", "select:ucb-bd/k=auto"),
        suite="edit",
        stream="edit+summarization",
        per_category=1,
        backend="llamacpp",
        generation=GenerationConfig(max_new_tokens=32, num_speculative_tokens=32),
        out_dir=tmp_path,
        command="evospec bench --suite edit (test)",
    )
    run_bench(settings)
    results = json.loads((tmp_path / "results.json").read_text())
    methods = results["methods"]
    assert list(methods["llamacpp-plain"]["per_category"]) == [*EDITS, "summarization"]
    assert set(methods["select:ucb-bd/k=auto"]["drafters"]) == {"ngram", "suffix", "prediction"}  # no small LM
    edit_rounds = methods["evospec:prediction/k=auto"]["drafters"]["prediction"]
    assert edit_rounds["pulls"] > 0 and edit_rounds["num_accepted_tokens"] > 0
    assert results["cpu"]["model"] and "avx2" in results["cpu"] and results["ceiling"]["speedup"] > 1
    assert "1" in results["forward_cost_ms"] and (tmp_path / "blocks.png").stat().st_size > 1000
    assert (tmp_path / "forward_cost.png").stat().st_size > 1000


@pytest.mark.slow
def test_the_selection_suite_adds_the_oracle_and_plots_regret_and_arm_shares(tmp_path: Path):
    settings = BenchSettings(
        target=SMOL,
        draft_model=SMOL,
        methods=None,
        suite="selection",
        stream="category:qa",
        per_category=2,
        backend="llamacpp",
        generation=GenerationConfig(max_new_tokens=8, num_speculative_tokens=3),
        out_dir=tmp_path,
        command="evospec bench --suite selection (test)",
    )
    run_bench(settings)
    methods = json.loads((tmp_path / "results.json").read_text())["methods"]
    singles = [f"evospec:{SMOL}", "evospec:ngram", "evospec:suffix"]
    assert {"evospec-plain", *singles, "select:ucb-bd", "select:exp3", "oracle"} <= set(methods)
    assert methods["oracle"]["best"] in singles
    arms = methods["select:ucb-bd"]["drafters"]  # per-arm statistics of the selector's run
    assert set(arms) == {SMOL, "ngram", "suffix"} and sum(arm["pulls"] for arm in arms.values()) > 0
    assert methods["oracle"]["tokens_per_s"] == max(methods[name]["tokens_per_s"] for name in singles)
    assert (tmp_path / "selection.png").stat().st_size > 1000


def test_streams_compose_and_an_unknown_one_names_the_categories():
    from evospec.bench.runner import _stream

    assert {prompt.category for prompt in _stream("category:qa", 2)} == {"qa"}
    composed = _stream("edit+summarization+category:rag", 2)
    assert [prompt.category for prompt in composed][::2] == [*EDITS, "summarization", "rag"]
    assert all(prompt.prediction for prompt in composed[: 2 * len(EDITS)]) and not composed[-1].prediction
    for stream in ("category:poetry", "edit+poetry"):
        with pytest.raises(EvospecError, match="math_reasoning"):
            _stream(stream, 1)


def test_each_edit_asks_for_the_whole_function_back_and_predicts_it_unchanged():
    prompts = edits(3)
    assert [prompt.category for prompt in prompts][::3] == list(EDITS) and len({prompt.id for prompt in prompts}) == 15
    for prompt in prompts:
        assert prompt.prediction in prompt.text and prompt.text.endswith(EDIT_REPLY)
        assert f"def {prompt.prediction.split('def ', 1)[1].split('(')[0]}(" in prompt.text
    with pytest.raises(EvospecError, match="per-category"):
        edits(0)


def test_every_suite_method_and_its_adaptive_variants_are_known_before_loading():
    from evospec.bench.methods import all_method_names, method_names

    known = all_method_names(SMOL, "llamacpp")
    assert set(method_names(SMOL, "llamacpp", "engine")) | set(method_names(SMOL, "llamacpp", "selection")) <= set(
        known
    )
    assert {"select:ucb-speed/k=auto", "select:ucb-bd/k=auto", f"evospec:{SMOL}/k=auto"} <= set(known)
    assert {f"evospec:lora:{SMOL}", f"evospec:lora:{SMOL}+ogd/k=auto"} <= set(known)  # OSD
    assert "evospec:eagle/k=auto" not in known  # no white-box checkpoint given
