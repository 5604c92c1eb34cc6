"""The reference gateway core (a library): admission, the Hello transaction under the
gateway's lease, the facts a gateway publishes and the notices it obeys. Used by the
simulator, the demo and the end-to-end tests. May use the runtime and `schemas`, never a
worker."""

from workers.gateway.admission import Code, HelloRequest
from workers.gateway.gateway import Gateway
from workers.gateway.types import DaemonStream, GatewaySettings, HeartbeatAck, Refused, Welcome

__all__ = [
    "Code",
    "DaemonStream",
    "Gateway",
    "GatewaySettings",
    "HeartbeatAck",
    "HelloRequest",
    "Refused",
    "Welcome",
]
