"""The runtime on real servers: exactly-once effects, the outbox, PubAcks, leases,
migrations and provisioning."""
