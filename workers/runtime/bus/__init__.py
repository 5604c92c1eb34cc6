"""NATS JetStream: the connection, streams and consumers, the continuous pull, publishes
with their PubAcks, the bus principals and their permissions, and dead letters.

May use `base` only: it knows subjects and messages as bytes and headers, not what a
fact does, and nothing of PostgreSQL.
"""
