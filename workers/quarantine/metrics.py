"""The quarantine worker's own metrics: the quarantines waiting for an operator (`breaker`),
the fleet's Hello proof policy and its unproven sessions (`proofs`), and the line `/readyz`
says of them."""

from __future__ import annotations

from prometheus_client.registry import CollectorRegistry

from workers.runtime.observability.metrics import Gauge, Metrics, MetricSet


class QuarantineMetrics(MetricSet):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        r = registry
        self.quarantines_held = Gauge(
            r,
            "bcw_quarantines_held",
            "Quarantines whose revocation waits for an operator (one gateway's alternations, "
            "or the breaker): bcw quarantine release.",
        )
        self.hello_proof_policy = Gauge(
            r,
            "bcw_hello_proof_policy",
            "1 for the fleet's Hello proof policy (off, warn, require), as the quarantine worker "
            "last read it: below require, a gateway's credentials open sessions of nodes without "
            "a Hello key.",
            ("policy",),
        )
        self.unproven_sessions = Gauge(
            r,
            "bcw_unproven_sessions",
            "Connected sessions whose Hello was not proven, as the quarantine worker last counted.",
        )


def hello_proof_note(metrics: Metrics) -> str | None:
    """One line for `/readyz` when the fleet's Hellos need no proof (the policy as this
    process last read it is `warn` or `off`); None otherwise."""
    mine = metrics.of(QuarantineMetrics)
    policy = next((p for (p,), on in mine.hello_proof_policy.by_labels().items() if on), None)
    if policy is None or policy == "require":
        return None
    unproven = int(mine.unproven_sessions.value())
    return (
        f"hello-proof {policy}: {unproven} session(s) unproven; a gateway's credentials "
        "can open sessions of nodes without a Hello key (BCW_HELLO_PROOF=require)"
    )
