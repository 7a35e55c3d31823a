"""The bounds of benchmarks/selection_oracle.py on hand-made drafts: rounds, and target steps under a T(n)."""

from __future__ import annotations

import random

import pytest

from conftest import BENCHMARK_SCRIPTS, load_script

oracle = load_script("selection_oracle")

# An answer of 8 tokens; position t (1..7) is where a round starts after t tokens are emitted, and
# asks for min(4, 8 - t - 1) tokens, as the engine does at k = 4.
LENGTH = 8
ASKED = [min(4, LENGTH - t - 1) for t in range(1, LENGTH)]  # 4 4 4 3 2 1 0
STEEP = [1.0, 1.8, 2.7, 2.6, 3.3]  # T(1 + d) / T(1) for d = 0..4, as this repository's CPUs measure it


def drafts(drafted: list[int], accepted: list[int]):
    return oracle.Drafts(drafted=[0, *drafted], accepted=[0, *accepted])


def test_the_rounds_oracle_takes_at_every_position_the_draft_that_goes_furthest():
    arms = {
        "a": drafts(ASKED, [0, 0, 0, 3, 2, 1, 0]),
        "b": drafts(ASKED, [3, 0, 0, 0, 0, 0, 0]),
    }
    # the prefill emits 1 token; b at t=1 takes 3 + 1 -> t=5; a at t=5 takes 2 + 1 -> t=8: 3 rounds
    assert oracle.oracle_per_round(arms, LENGTH) == 3


def test_under_a_flat_cost_the_fastest_whole_drafts_are_the_fewest_rounds():
    rng = random.Random(0)
    for _ in range(50):
        arms = {}
        for name in ("a", "b"):
            arms[name] = drafts(ASKED, [rng.randint(0, d) for d in ASKED])
        flat = [1.0] * 5
        steps = oracle.fastest_per_round(arms, LENGTH, flat, truncate=False)
        assert steps + 1 == oracle.oracle_per_round(arms, LENGTH)  # the prefill is a round, not a step


def test_a_cut_draft_is_never_slower_than_the_whole_one_nor_than_one_token_steps():
    rng = random.Random(1)
    for _ in range(50):
        arms = {"a": drafts(ASKED, [rng.randint(0, d) for d in ASKED])}
        whole = oracle.fastest_per_round(arms, LENGTH, STEEP, truncate=False)
        cut = oracle.fastest_per_round(arms, LENGTH, STEEP, truncate=True)
        assert cut <= whole
        assert cut <= LENGTH - 1  # one-token steps are one of the cuts


def test_where_a_second_token_costs_most_of_a_step_the_oracle_cuts_a_partly_taken_draft():
    # one arm drafting what it is asked everywhere, of which the target takes 1 at position 1, then nothing
    arms = {"a": drafts(ASKED, [1, 0, 0, 0, 0, 0, 0])}
    whole = oracle.fastest_per_round(arms, LENGTH, STEEP, truncate=False)
    cut = oracle.fastest_per_round(arms, LENGTH, STEEP, truncate=True)
    # whole: t=1 costs T(5)/T(1) = 3.3 and reaches t=3; then t=3..6 verify 4, 3, 2, 1 drafted tokens
    # for nothing (3.3 + 2.6 + 2.7 + 1.8), and t=7 a plain step
    assert whole == pytest.approx(3.3 + 3.3 + 2.6 + 2.7 + 1.8 + 1.0)
    # cut: one drafted token at t=1 (1.8 for 2 tokens beats 2 plain steps), then plain steps
    assert cut == pytest.approx(1.8 + 5 * 1.0)


def test_an_unknown_cost_profile_is_a_clear_error_before_any_model_is_loaded(tmp_path, capsys):
    traces = BENCHMARK_SCRIPTS / "traces" / "smollm2-135m-instruct-humaneval-128"
    out = tmp_path / "oracle"
    code = oracle.main(["--traces", f"code={traces}", "--profile", "tpu-v9", "--out", str(out)])
    assert code == 2
    assert "unknown cost profile 'tpu-v9'" in capsys.readouterr().err
    assert not out.exists()
