"""The bus layer alone on a real nats-server: frames written at once, the acked
publisher, the continuous pull (`workers.runtime.bus`)."""
