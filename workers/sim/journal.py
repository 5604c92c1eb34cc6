"""The fake daemon's journal of finished commands: its half of the seed's resume rules
("the daemon has its own half of these rules, applied at start and on every duplicate
delivery").

A command's result is journaled when it finishes, under its command id:

- **owed** until acked — sent on the stream (the gateway's answer is its ack), or carried
  by the next Hello (acked by the Ack that follows the Welcome); never forgotten before;
- a **duplicate delivery** of a finished command — a second Dispatch, or the replay of a
  command whose result the control plane has not stored — is answered from here: its
  result is sent again, and the command is never run again;
- once acked, it is **kept** as answered for a bound: a day of the daemon's working clock
  after its ack, and the newest `FINISHED_KEPT` acked results at most, whichever is less.
  A redelivery within the bound is answered from the journal; one after it (a day after
  the control plane stored the result, and after 10,000 newer results) would run again.

A crash, a restart, an upgrade and a reboot keep the journal (the same `journal_id`); a
lost journal (`lose_journal`) forgets all of it, which is what `journal-lost` means.
What the daemon actually ran is counted beside the journal, not in it (`FakeDaemon.runs`),
so that a lost journal does not hide a second run.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: acked results kept at most, newest first
FINISHED_KEPT = 10_000
#: seconds (the daemon's working clock) an acked result is kept
FINISHED_KEEP_SECONDS = 86_400.0


@dataclass
class Finished:
    """The finished commands of one journal: command id → its result (`command_id`,
    `outcome`, `result`, `error`, as in a `result` fact)."""

    kept: int = FINISHED_KEPT
    keep_seconds: float = FINISHED_KEEP_SECONDS
    #: every finished command the journal still holds, owed or acked
    results: dict[uuid.UUID, dict[str, Any]] = field(default_factory=dict)
    #: those not acked yet: sent while connected, carried by the next Hello otherwise
    unacked: dict[uuid.UUID, dict[str, Any]] = field(default_factory=dict)
    #: acked command id → when (working clock), oldest first
    acked: dict[uuid.UUID, float] = field(default_factory=dict)

    def finish(
        self, command_id: uuid.UUID, outcome: str, result: Any, error: str | None, now: float
    ) -> dict[str, Any]:
        """Journal a finished command's result: owed until acked."""
        done = {"command_id": str(command_id), "outcome": outcome, "result": result, "error": error}
        self.results[command_id] = self.unacked[command_id] = done
        self.prune(now)
        return done

    def answer(self, command_id: uuid.UUID) -> dict[str, Any] | None:
        """The result a duplicate delivery of `command_id` is answered with, if it finished."""
        return self.results.get(command_id)

    def ack(self, command_ids: Iterable[uuid.UUID], now: float) -> list[uuid.UUID]:
        """These results are stored: owed no more (kept as answered within the bound).
        Returns those that were owed."""
        owed = [c for c in command_ids if self.unacked.pop(c, None) is not None]
        for command_id in owed:
            if command_id in self.results:
                self.acked[command_id] = now
        self.prune(now)
        return owed

    def prune(self, now: float) -> None:
        """Forget acked results beyond the bound (never an owed one)."""
        while self.acked:
            oldest, at = next(iter(self.acked.items()))
            if len(self.acked) <= self.kept and now - at < self.keep_seconds:
                return
            del self.acked[oldest]
            self.results.pop(oldest, None)
