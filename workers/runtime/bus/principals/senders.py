"""What each worker's rules publish through its outbox (its `grants.py`'s `EMITS`): all
its bus principal may publish besides its dead letters. The registry composes the
workers' and hands them over (`install`) before anything here is asked: `OutboxBatch.add`
refuses any other message from that worker, so a worker that starts emitting something
new fails its tests until its `grants.py` lists it; a relay and a dead letters' re-drive
judge a row's or a letter's sender by it (`refusal`).
"""

from __future__ import annotations

from collections.abc import Mapping

from schemas import events
from schemas.base import CamelMessage, SnakeMessage
from schemas.subjects import Subjects

Emitted = tuple[type[CamelMessage | SnakeMessage], ...]

#: worker → what its rules publish (`install`: the registry's `EMITS`)
EMITS: dict[str, Emitted] = {}
#: the same, by message type (what `OutboxBatch.add` looks up)
EMITTED_TYPES: dict[str, frozenset[str]] = {}


def install(emits: Mapping[str, Emitted]) -> None:
    """Take what each worker publishes (the registry's `EMITS`), in place of any before."""
    EMITS.clear()
    EMITS.update(emits)
    EMITTED_TYPES.clear()
    EMITTED_TYPES.update({w: frozenset(t.BC_TYPE for t in made) for w, made in emits.items()})


def dead_publishers() -> tuple[str, ...]:
    """Who publishes dead letters, each under `<root>.dead.<its name>` to a stream of its
    own: every worker, and the relay."""
    return (*EMITS, "relay")


class NotEmitted(ValueError):
    """A worker's outbox was given a message that worker does not emit (not in `EMITS`):
    its principal could not publish it. A defect of the worker, found by its tests."""


def emitted(subjects: Subjects, worker: str) -> tuple[str, ...]:
    """The subjects `worker`'s rules publish to (a notice to any gateway)."""
    return tuple(_subject(subjects, made) for made in EMITS[worker])


def _subject(subjects: Subjects, made: type[CamelMessage | SnakeMessage]) -> str:
    if made is events.Revocations:
        return subjects.revocations
    if issubclass(made, SnakeMessage):
        return subjects.notice("*", made.BC_TYPE)
    return subjects.event(made.BC_TYPE)


def refusal(
    subjects: Subjects, worker: str | None, bc_type: str | None, subject: str
) -> str | None:
    """Why a relay must not publish a message an outbox row holds, or None when the row's
    worker could publish it itself: the worker must be one of `EMITS`, a sender of the
    message's `Bc-Type`, and the subject that type's subject of the worker (`emitted`).
    The relay trusts no row (a worker's login may write any row of its own). Pure."""
    if worker not in EMITS:
        return f"no worker {worker!r} sends messages"
    if bc_type is None:
        return "it has no Bc-Type"
    if bc_type not in EMITTED_TYPES[worker]:
        return f"worker {worker} does not send {bc_type!r}"
    made = next(m for m in EMITS[worker] if bc_type == m.BC_TYPE)
    if not matches(_subject(subjects, made), subject):
        return f"worker {worker} does not send {bc_type} to {subject}"
    return None


def matches(pattern: str, subject: str) -> bool:
    """Whether a NATS subject pattern (`*` one token, `>` the rest) covers `subject`."""
    wanted, given = pattern.split("."), subject.split(".")
    for i, token in enumerate(wanted):
        if token == ">":
            return len(given) > i
        if i >= len(given) or (token != "*" and token != given[i]):
            return False
    return len(wanted) == len(given)
