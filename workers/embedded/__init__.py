"""Embedded nats-server and PostgreSQL for the demo, the benchmarks and the tests: may use
the standard library only, nothing of the project (production never imports it)."""
