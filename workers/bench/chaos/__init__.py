"""`bcw bench chaos`: a soak under faults, on embedded servers.

`flow` joins the fleet, publishes a Hello per node through any outage and counts what the
workers made of them (the fault and upgrade tests use it too); `run` starts the servers
and the workers behind TCP proxies, injects the faults and judges the figures.
"""

from workers.bench.chaos.run import run

__all__ = ["run"]
