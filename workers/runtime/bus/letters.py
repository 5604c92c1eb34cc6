"""Which dead letters may go back: a redrive re-sends only what the letter's source could
have sent itself (issue #41). A dead letter's headers are written by whoever published it
— any principal that may publish to its subject — so none of them is taken on trust:

- a letter is stored under `<root>.dead.<worker>` of the worker it names
  (`Bc-Dead-Worker`; `deadletter.subject_of`), in that publisher's own stream; only the
  relay principal publishes under `<root>.dead.relay`, each worker only under its own;
- a consumer's letter holds a fact it read: it goes back to a facts subject only, and
  only as the facts stream still holds it at `Bc-Dead-Stream-Seq` (same subject, same
  body) — what is re-sent is that stored copy, a gateway's own, not the letter's body;
- a relay's `unpublishable` letter goes back only where its sending worker
  (`Bc-Dead-Sender`) sends its `Bc-Type` (`principals.refusal`, the table the relay
  checks rows against); a worker's own relay names itself; a row of no fleet worker is
  the schema owner's, whose letters only the relay principal publishes;
- a `forged` letter (a row no worker of ours wrote) never goes back.

`refusal` is the pure part; `checked` adds what only the facts stream can say. `bcw
dead-letters list` shows each letter's verdict, and redrive refuses any refused letter.
"""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from schemas.registry import TYPE_HEADER
from schemas.subjects import SubjectError, Subjects
from workers.runtime.bus import principals
from workers.runtime.bus.deadletter import SENDER, TRUNCATED, DeadLetter, resend

#: the relay's causes: a row it could not (`unpublishable`) or would not (`forged`) publish
RELAY_CAUSES = frozenset({"unpublishable", "forged"})
#: the name of the dedicated relay in letters (its principal alone publishes them)
RELAY = "relay"


def refusal(subjects: Subjects, letter: DeadLetter) -> str | None:
    """Why `letter` must not be re-driven as it is, from the letter alone; None when its
    source could have sent it (a fact letter still needs `checked`). Pure."""
    home = subjects.dead(letter.worker)
    if letter.on != home and not letter.on.startswith(home + "."):
        return f"stored on {letter.on or '?'} but names the worker {letter.worker or '?'}"
    if letter.cause == "forged":
        return "a forged outbox row: no worker of ours wrote it"
    if letter.worker == RELAY or letter.cause in RELAY_CAUSES:
        if letter.cause != "unpublishable":
            return f"a relay's letter of cause {letter.cause or '?'} is not re-sent"
        sender = letter.headers.get(SENDER, "")
        if letter.worker != RELAY and sender != letter.worker:
            return f"a worker's letter names another sender ({sender or 'none'})"
        if letter.worker == RELAY and sender not in principals.EMITS:
            return None  # the schema owner's row (a test's, a benchmark's): none of a worker
        why = principals.refusal(
            subjects, sender or None, letter.headers.get(TYPE_HEADER), letter.subject
        )
        return None if why is None else f"its source could not send it: {why}"
    try:
        subjects.parse_fact(letter.subject)
    except SubjectError:
        return f"a fact letter bound for {letter.subject or '?'}, which is no facts subject"
    return None


def is_fact_letter(letter: DeadLetter) -> bool:
    """A consumer's letter: a fact it read (every letter but the relays')."""
    return letter.worker != RELAY and letter.cause not in RELAY_CAUSES


async def checked(
    js: JetStreamContext, subjects: Subjects, letter: DeadLetter
) -> tuple[str | None, bytes | None]:
    """(why `letter` must not be re-driven, or None; the body to re-send). A fact letter
    re-sends the facts stream's copy at its sequence, which must be the letter's subject
    and — unless the letter was truncated — its body. A fact the stream no longer holds
    (aged out: a parked fact must be re-driven within the facts stream's `max_age`)
    cannot be checked, and is refused: its body would be only the letter's word."""
    why = refusal(subjects, letter)
    if why is not None:
        return why, None
    if not is_fact_letter(letter):
        if TRUNCATED in letter.headers:
            return (
                f"it carries no body ({letter.headers[TRUNCATED]} bytes, over the bus's max "
                "payload); the message is kept in the outbox_dead table"
            ), None
        return None, letter.data
    try:
        stored = await js.get_msg(subjects.facts_stream, letter.stream_seq)
    except NotFoundError:
        return (
            f"the facts stream no longer holds seq {letter.stream_seq}: its body cannot be checked"
        ), None
    if stored.subject != letter.subject:
        return f"the fact at seq {letter.stream_seq} was published to {stored.subject}", None
    kept = (stored.data or b"")[: len(letter.data)] if TRUNCATED in letter.headers else stored.data
    if (kept or b"") != letter.data:
        return f"its body is not the fact stored at seq {letter.stream_seq}", None
    return None, stored.data or b""


class RedriveError(RuntimeError):
    """This dead letter cannot be re-driven as it is (the reason is the message)."""


async def redrive(js: JetStreamContext, subjects: Subjects, letter: DeadLetter) -> None:
    """Re-send what `letter`'s source sent to where it sent it, then delete the letter;
    raises RedriveError (touching nothing) when `checked` refuses it."""
    why, body = await checked(js, subjects, letter)
    if why is not None or body is None:
        raise RedriveError(f"dead letter {letter.key}: {why}")
    await resend(js, subjects, letter, body)
