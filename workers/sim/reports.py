"""What a fake daemon tells its gateway besides its Hello and heartbeats: the inventory
sections asked for or changed, its done results and its journal's events. Mixed into
`workers.sim.daemon.FakeDaemon`, whose state it reads."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from workers.gateway import Gateway, Refused
from workers.gateway.inventory import section_hashes
from workers.sim.journal import Finished


class Reports:
    """The daemon's reports (its state lives in `FakeDaemon`)."""

    node_id: str
    epoch: int
    journal_id: str
    gateway: Gateway | None
    inventory: dict[str, dict[str, Any]]
    sections_sent: int
    finished: Finished
    in_hello: set[uuid.UUID]
    journal: list[dict[str, Any]]
    next_seq: int
    sent_seq: int
    now: Callable[[], float]
    drop: Callable[..., None]

    def inventory_hashes(self) -> dict[str, str]:
        return section_hashes(self.inventory)

    async def _send_sections(self, sections: Sequence[str]) -> None:
        gateway, hashes = self.gateway, self.inventory_hashes()
        if gateway is None:
            return
        try:
            for section in sections:
                if section in self.inventory:
                    await gateway.inventory(
                        self.node_id, self.epoch, section, hashes[section], self.inventory[section]
                    )
                    self.sections_sent += 1
        except Refused:  # the session ended meanwhile: the next Welcome asks again
            self.drop("refused")

    def _journal(self, kind: str, body: dict[str, Any]) -> None:
        self.journal.append({"seq": self.next_seq, "kind": kind, "body": body, "at": self.now()})
        self.next_seq += 1

    async def _send_result(
        self, gateway: Gateway, command_id: uuid.UUID, done: dict[str, Any]
    ) -> None:
        """A result frame from its journal; the gateway's answer is its ack (Refused: not
        stored, still owed)."""
        await gateway.result(
            self.node_id, self.epoch, command_id, done["outcome"], done["result"], done["error"]
        )
        self.finished.ack([command_id], self.now())

    async def _report(self) -> None:
        gateway = self.gateway
        if gateway is None:
            return
        try:
            for command_id, done in list(self.finished.unacked.items()):
                if command_id in self.in_hello:
                    continue  # its Hello carried it: the Ack that follows the Welcome settles it
                await self._send_result(gateway, command_id, done)
            unsent = [e for e in self.journal if e["seq"] > self.sent_seq]
            if unsent:
                events = [{**e, "at": datetime.fromtimestamp(e["at"], UTC)} for e in unsent[:1000]]
                await gateway.events(self.node_id, self.journal_id, events)
                self.sent_seq = unsent[: len(events)][-1]["seq"]
        except Refused:  # the session ended meanwhile: reported again on the next one
            self.drop("refused")
