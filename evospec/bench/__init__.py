"""Benchmarks: workloads, methods, an interleaved runner, reports and plots."""

# The benchmark suites (bench/methods.py: method_names says what each runs).
SUITES = ("engine", "selection", "edit", "learning")
