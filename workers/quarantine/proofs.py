"""The fleet's Hello proofs said loudly: the quarantine worker reads the policy and counts
the connected sessions whose Hello was not proven, once a minute, in the replica holding
its release loop's lease — `bcw_hello_proof_policy{policy}`, `bcw_unproven_sessions`,
a line in `/readyz`, the alert `BcwHelloProofNotRequired`, and a WARNING when the policy
is `warn` or `off` (at start, and whenever it changes to one of them)."""

from __future__ import annotations

import logging
import time

from workers.quarantine.metrics import QuarantineMetrics
from workers.runtime.effects.worker import Runtime
from workers.runtime.store import migrate

log = logging.getLogger(__name__)

POLICIES = ("off", "warn", "require")


class ProofWatch:
    """Looks at most once `every` seconds (the first time at once)."""

    def __init__(self, every: float = 60.0) -> None:
        self.every = every
        self._next = 0.0
        self._said: str | None = None

    async def look(self, runtime: Runtime) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every
        async with runtime.pool.acquire() as conn:
            policy = await migrate.hello_proof(conn)
            unproven = await migrate.unproven_sessions(conn)
        metrics = runtime.metrics.of(QuarantineMetrics)
        for name in POLICIES:
            metrics.hello_proof_policy.set(1.0 if name == policy else 0.0, name)
        metrics.unproven_sessions.set(float(unproven))
        if policy != "require" and policy != self._said:
            log.warning("%s", migrate.proof_warning(policy, unproven))
        self._said = policy
