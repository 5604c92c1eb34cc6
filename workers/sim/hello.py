"""How a fake daemon says Hello: which gateway it dials (one whose challenge it holds,
else its own unless distrusted), what its Hello carries and how it proves it, and what it
makes of the answer — a Welcome (events it may forget, credits, sections asked for; a
server time more than 5 minutes behind its mark ends the session) or a refusal (a
pushback honoured, else its own back-off; a server time and challenge kept:
`workers.sim.servertime`). Mixed into `workers.sim.daemon.FakeDaemon`, whose state it
reads."""

from __future__ import annotations

import math
import random
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, cast

from schemas.proof import HelloProof, prove
from workers.gateway import DaemonStream, Gateway, HelloRequest, Refused
from workers.sim.journal import Finished
from workers.sim.servertime import ServerTime

#: a gateway's pushback (retry_after) is honoured up to this many seconds
MAX_PUSHBACK = 900.0


class Hellos:
    """The daemon's Hellos (its state lives in `FakeDaemon`)."""

    node_id: str
    serial: str
    boot_id: str
    journal_id: str
    version: str
    capabilities: list[str]
    transport: str
    trust_version: int
    approver_set: tuple[int, str] | None
    hello_key: bytes | None
    home: int
    rng: random.Random
    running: dict[uuid.UUID, Any]
    finished: Finished
    in_hello: set[uuid.UUID]
    process_started: float
    generation: int
    spec_hash: str | None
    refusals: Counter[str]
    server: ServerTime
    behind_welcomes: int
    distrusted: Gateway | None
    gateway: Gateway | None
    epoch: int
    failures: int
    next_try: float
    welcomes: int
    last_heartbeat: float
    heartbeats: int
    journal: list[dict[str, Any]]
    sent_seq: int
    welcome_credits: int
    told: dict[str, str]
    now: Callable[[], float]
    _back_off: Callable[[], None]
    inventory_hashes: Callable[[], dict[str, str]]
    _send_sections: Callable[[Sequence[str]], Any]

    def _dial(self, gateways: Sequence[Gateway]) -> Gateway | None:
        """The gateway its next Hello goes to: the one whose challenge it holds, else its
        own, else any — but not the one whose server time it did not believe, if it can."""
        alive = [g for g in gateways if g.alive]
        trusted = [g for g in alive if g is not self.distrusted] or alive
        held = self.server.challenged_by()
        challenged = [g for g in trusted if held is not None and g.gateway_id == held]
        if challenged:
            return challenged[0]
        if not trusted:
            return None
        if gateways[self.home % len(gateways)] in trusted:
            return trusted[self.home % len(trusted)]
        return self.rng.choice(trusted)

    async def _connect(self, gateways: Sequence[Gateway]) -> None:
        gateway = self._dial(gateways)
        if gateway is None:
            self._back_off()
            return
        request = HelloRequest(
            node_id=self.node_id,
            cert_serial=self.serial,
            cert_node_id=self.node_id,
            role="worker",
            boot_id=self.boot_id,
            journal_id=self.journal_id,
            daemon_version=self.version,
            capabilities=list(self.capabilities),
            running_command_ids=[str(c) for c in self.running],
            transport=self.transport,
            trust_version=self.trust_version,
            approver_set_epoch=self.approver_set[0] if self.approver_set else None,
            approver_set_sha256=self.approver_set[1] if self.approver_set else None,
            process_started_at=datetime.fromtimestamp(self.process_started, UTC),
            inventory_hashes=self.inventory_hashes(),
            results=list(self.finished.unacked.values()),
            applied_generation=self.generation,
            spec_hash=self.spec_hash,
            proof=self.proof(gateway),
        )
        self.in_hello = set(self.finished.unacked)
        try:
            welcome = await gateway.hello(request, cast("DaemonStream", self))
        except Refused as refused:
            self._refused(gateway, refused)
            return
        if not self.server.told(welcome.server_time, self.now()):
            # a server whose time went back (a restored snapshot, a wrong clock): not trusted
            self.behind_welcomes += 1
            self.distrusted = gateway  # the next attempt goes elsewhere, if it can
            await gateway.disconnect(self.node_id, welcome.epoch)  # it closes the stream
            self._back_off()
            return
        self.gateway, self.epoch = gateway, welcome.epoch
        self.failures = 0
        self.welcomes += 1
        self.last_heartbeat = self.now()
        self.heartbeats = 0
        # the control plane holds its journal up to acked_event_seq: forget those events,
        # re-send only the rest; hold no more per lane than the Welcome allows
        self.journal = [e for e in self.journal if e["seq"] > welcome.acked_event_seq]
        self.sent_seq = welcome.acked_event_seq
        self.welcome_credits = welcome.credits
        self.told = request.inventory_hashes
        await self._send_sections(welcome.request_sections)

    def _refused(self, gateway: Gateway, refused: Refused) -> None:
        """A refused Hello: its server time and challenge kept (a time more than 5 minutes
        behind the mark is not believed: another gateway next), then the pushback, or its
        own back-off."""
        self.refusals[refused.code.value] += 1
        if not self.server.refused(
            gateway.gateway_id, refused.server_time, refused.challenge, self.now()
        ):
            self.behind_welcomes += 1
            self.distrusted = gateway
        pushback = refused.retry_after
        if pushback is not None and math.isfinite(pushback) and pushback >= 0:
            # honoured (capped at 15 minutes); its own doubling starts afresh after it
            self.next_try = self.now() + min(pushback, MAX_PUSHBACK)
            self.failures = 0
        else:  # none, negative or malformed: its own back-off
            self._back_off()

    def proof(self, gateway: Gateway) -> HelloProof | None:
        """Its Hello's proof for `gateway`, by its key: at its own clock (or the
        last `at` it signed + 1: `ServerTime.sign_at`) with a fresh one-time id, or at the time of the challenge that gateway's refusal gave it (never
        a time a gateway told it with an id of its own: `workers.sim.servertime`)."""
        if self.hello_key is None:
            return None
        challenge = self.server.take_challenge(gateway.gateway_id, self.now())
        if challenge is not None:
            at, nonce = challenge.at, challenge.nonce
        else:
            at, nonce = self.server.sign_at(self.now()), None
        return prove(
            self.hello_key,
            self.node_id,
            self.boot_id,
            self.journal_id,
            gateway.gateway_id,
            at,
            nonce,
        )
