"""The pure rules of the workers, the gateway and the fake daemon: table-driven and
hypothesis tests, no server."""
