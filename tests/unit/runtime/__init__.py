"""The runtime's pieces, each alone: its heap, errors and waiting, metrics, tracing, and
its checks of poison values."""
