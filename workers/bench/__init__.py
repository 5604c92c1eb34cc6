"""Benchmarks (`bcw bench …`): figures printed, recorded in docs/benchmarks.md. May use
every room but the CLI (a worker's modules included); only the CLI and the tests import it."""
