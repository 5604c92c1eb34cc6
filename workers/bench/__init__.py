"""Benchmarks (`bcw bench …`): figures printed, recorded in docs/benchmarks.md."""
