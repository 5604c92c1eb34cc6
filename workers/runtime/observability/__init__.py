"""What an operator sees of a process: OpenTelemetry spans (messaging and SQL), the
Prometheus metrics, structured log lines and the `/healthz`, `/readyz`, `/metrics` port.

May use `base` only: it records what the other rooms report and changes nothing.
"""
