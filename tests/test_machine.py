"""The machine: its cores and SIMD features, read from /proc/cpuinfo as benchmarks record them."""

from __future__ import annotations

from pathlib import Path

from evospec import machine


def test_the_features_are_read_from_cpuinfo_and_recorded(tmp_path: Path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16\n")
    real_path = machine.Path
    monkeypatch.setattr(machine, "Path", lambda name: cpuinfo if name == "/proc/cpuinfo" else real_path(name))
    assert machine.cpu_kernel_flags() == ["avx", "avx2", "fma", "avx512f", "avx512_bf16"]
    description = machine.cpu_description()
    assert description["model"] == "AMD EPYC" and description["avx2"] and description["avx512_bf16"]
    assert description["threads"] == machine.default_threads() >= 1
    assert "avx2+fma+avx512f+avx512_bf16" in machine.machine_key()
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n")  # the same name, AVX2 only
    assert machine.cpu_description()["avx512_bf16"] is False and "avx512" not in machine.machine_key()
