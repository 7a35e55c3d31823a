"""Benchmarks: workloads, methods, an interleaved runner, reports and plots."""
