"""A daemon's end of a stream, as a reference gateway sees it (`DaemonStream`): it records
what the gateway sent it, so a test can assert on deliveries and on how the stream ended."""

from __future__ import annotations

from schemas.notices import Dispatch


class RecordingStream:
    def __init__(self) -> None:
        self.delivered: list[Dispatch] = []
        self.dropped: list[str] = []
        self.acked: list[tuple[str, int]] = []

    async def deliver(self, dispatch: Dispatch) -> None:
        self.delivered.append(dispatch)

    async def event_ack(self, journal_id: str, seq: int) -> None:
        self.acked.append((journal_id, seq))

    def drop(self, reason: str) -> None:
        self.dropped.append(reason)
