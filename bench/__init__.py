"""Benchmarks that reproduce the seeds' comparisons (see bench/README.md)."""
