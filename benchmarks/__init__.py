"""Benchmark scripts (not tests): python -m benchmarks.<name>; figures in benchmarks/README.md."""
