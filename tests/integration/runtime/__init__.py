"""The runtime on real servers: exactly-once effects, the outbox, leases, migrations and
provisioning (the bus layer alone: `tests/integration/bus`)."""
