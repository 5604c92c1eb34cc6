"""What an operator runs: the CLI's errors and exit codes, bcw events, entry points,
traces over OTLP, the storm benchmark."""
