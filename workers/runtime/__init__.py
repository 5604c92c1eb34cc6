"""The runtime every worker runs on: it knows facts, effects and processes, never a worker.

Five rooms, each allowed to use only the rooms below it (checked by import-linter, see
`pyproject.toml`):

- `process` (one module): the lifecycle of a `bcw` process; uses every room.
- `effects/`: exactly-once — the consume loop, the inbox transaction, outcomes, the outbox.
- `bus/` and `store/`, side by side and independent: NATS JetStream and PostgreSQL.
- `observability/`: traces, metrics, logs and the health port.
- `base/`: settings, errors and their classification, waiting and retrying.

As a whole it may use `schemas` and nothing else of this project.
`docs/architecture.md` draws the rooms and what flows between them.
"""
