"""Benchmark and tuning tools for the embedding service: python -m bench, python -m bench.tune."""
