"""Benchmarks: each module runs with `python -m benchmarks.NAME` and records into RESULTS.md."""
