"""The machine evospec runs on: its cores and the processor features that decide which kernels run.

/proc/cpuinfo names AVX2-only and AVX512 hosts alike ("AMD EPYC"), so what is recorded and what keys
a measurement is the feature list, not the name.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

# The processor features that decide which kernels llama.cpp and torch run.
KERNEL_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
)


def default_threads() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cpu_kernel_flags() -> list[str]:
    """Which of KERNEL_FLAGS this processor has (from /proc/cpuinfo; empty where it cannot be read)."""
    flags = set((_cpu_info("flags") or _cpu_info("Features")).split())
    return [flag for flag in KERNEL_FLAGS if flag in flags]


def machine_key() -> str:
    """The processor, its kernel features and the thread count: what a forward's cost depends on."""
    return f"{platform.machine()}-{_cpu_info('model name')}-{'+'.join(cpu_kernel_flags())}-{default_threads()}threads"


def cpu_description() -> dict[str, object]:
    """What a benchmark records of the machine: the processor's name, its SIMD features, the threads."""
    flags = cpu_kernel_flags()
    return {
        "model": _cpu_info("model name") or platform.processor() or "unknown",
        "flags": flags,
        "avx2": "avx2" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "threads": default_threads(),
    }


def _cpu_info(field: str) -> str:
    """The first value of a field of /proc/cpuinfo ('' where there is none)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
