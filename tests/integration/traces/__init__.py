"""Traces as a user reads them in a backend: every process exporting over OTLP to a real
receiver (tests/integration/otlp.py), one Hello one trace, batches linked both ways."""
