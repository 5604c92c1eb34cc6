"""A daemon's end of a stream, as a reference gateway sees it (`DaemonStream`): it records
what the gateway sent it, so a test can assert on deliveries and on how the stream ended."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from schemas.notices import Dispatch
from workers.gateway.admission import DesiredState


class RecordingStream:
    def __init__(self) -> None:
        self.delivered: list[Dispatch] = []
        self.dropped: list[str] = []
        self.codes: list[str] = []  # the status code of each drop
        self.acked: list[tuple[str, int]] = []
        #: what followed the Welcome, in order: ("ack", ids) and ("desired", state)
        self.followed: list[tuple[str, object]] = []

    async def deliver(self, dispatch: Dispatch) -> None:
        self.delivered.append(dispatch)

    async def event_ack(self, journal_id: str, seq: int) -> None:
        self.acked.append((journal_id, seq))

    async def ack_results(self, command_ids: Sequence[UUID]) -> None:
        self.followed.append(("ack", tuple(command_ids)))

    async def desired_state(self, desired: DesiredState) -> None:
        self.followed.append(("desired", desired))

    def drop(self, reason: str, code: str = "") -> None:
        self.dropped.append(reason)
        self.codes.append(code)
