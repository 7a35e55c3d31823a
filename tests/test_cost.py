"""T(n), the cost of a target forward of n tokens: measured at 1..8 and a sparse grid, interpolated,
cached per machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from evospec import cost
from evospec.cost import ForwardCost, cached_forward_cost, measured_sizes
from evospec.errors import EvospecError
from evospec.machine import cpu_kernel_flags, machine_key
from evospec.models.hf import CachedLM


def test_forward_cost_is_measured_once_then_read(tiny_target, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EVOSPEC_HOME", str(tmp_path))
    measured = []
    real_measure = cost.measure_forward_cost

    def counting_measure(*args):
        measured.append(1)
        return real_measure(*args)

    monkeypatch.setattr(cost, "measure_forward_cost", counting_measure)
    lm = CachedLM(tiny_target)
    first = cached_forward_cost(lm, "tiny", max_tokens=3, vocab_size=96)
    second = cached_forward_cost(lm, "tiny", max_tokens=3, vocab_size=96)
    assert first == second and first.max_tokens == 3 and measured == [1]
    assert lm.length == 0  # the measurement leaves the cache empty

    (cache_file,) = (tmp_path / "costs").iterdir()
    cache_file.write_text("{not json")
    assert cached_forward_cost(lm, "tiny", max_tokens=3, vocab_size=96).max_tokens == 3
    assert measured == [1, 1]  # a damaged entry is measured again


def test_a_forward_cost_needs_positive_timings():
    with pytest.raises(EvospecError, match="positive"):
        ForwardCost((0.1, 0.0))


def test_long_curves_are_measured_densely_to_8_then_sparsely_and_interpolated():
    assert measured_sizes(5) == (1, 2, 3, 4, 5)
    assert measured_sizes(65) == (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 65)
    curve = ForwardCost((1.0, 1.5, 2.0, 6.0), sizes=(1, 2, 8, 16))
    assert curve.max_tokens == 16 and curve.of(8) == 2.0 and curve.of(12) == pytest.approx(4.0)
    assert curve.ratios()[:2] == [1.0, 1.5] and len(curve.ratios()) == 16
    assert curve.ceiling() == (pytest.approx(4.0), 8)  # 8 tokens for 2 steps' time
    with pytest.raises(EvospecError, match="covers 1..16"):
        curve.of(17)
    with pytest.raises(EvospecError, match="increasing sizes from 1"):
        ForwardCost((1.0, 2.0), sizes=(2, 4))


def test_a_short_cached_curve_is_measured_again_to_the_longer_length(tiny_target, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EVOSPEC_HOME", str(tmp_path))
    lm = CachedLM(tiny_target)
    assert cached_forward_cost(lm, "tiny", max_tokens=3, vocab_size=96).max_tokens == 3
    assert cached_forward_cost(lm, "tiny", max_tokens=20, vocab_size=96).sizes == measured_sizes(20)
    assert cached_forward_cost(lm, "tiny", max_tokens=9, vocab_size=96).max_tokens == 20  # the longer curve serves
    assert len(list((tmp_path / "costs").iterdir())) == 1


def test_the_cache_key_names_the_cpus_kernel_features():
    flags = cpu_kernel_flags()
    assert all(flag in machine_key() for flag in flags)
