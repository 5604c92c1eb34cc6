"""Operator tools (`bcw explain`, `bcw events`, what a terminal shows): may use the runtime
and `schemas` only — never a worker, the registry, the gateway or the simulator."""
