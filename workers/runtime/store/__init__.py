"""PostgreSQL: the pool and connections, migrations, the database roles and their grants,
retention, LISTEN/NOTIFY wake-ups, and leases (who runs a singleton loop).

May use `base` and `observability` (a lease reports whether it is held): it knows
tables and statements, not facts or the bus.
"""
