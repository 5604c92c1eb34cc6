"""What an operator runs: the CLI's errors and exit codes, bcw events, entry points, the
storm benchmark (traces over OTLP: tests/integration/traces)."""
