"""The fleet simulator: fake daemons over reference gateways, scenarios with checks.
May use the gateway, the runtime and `schemas`, never a worker."""

from workers.sim.scenarios import SCENARIOS
from workers.sim.simulator import Check, Simulator

__all__ = ["SCENARIOS", "Check", "Simulator"]
