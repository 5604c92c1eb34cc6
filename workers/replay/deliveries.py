"""Which answers count, pure: a command's deliveries and what a daemon's answer about one
of them may change. No await, no clock, no I/O.

The seed: facts are not fenced — a result is true whichever session carried it. What an
answer is about is one delivery of a command, at one epoch. So an answer counts when its
gateway held the node at the answer's epoch (`provenance` checks that before any rule)
and the command was delivered at that epoch — whatever epoch the command is at now, so
the order in which a former holder's answers and the next Hello's replay are applied
does not change the end state. An answer about a delivery that never happened is what
only a forger sends: it changes nothing.

- `result`: finishes a command once (a terminal state never changes), when it was
  delivered at the result's epoch — even one re-sent at a newer epoch since (the later
  delivery's answer then changes nothing), or handed back to pending (BUSY at a later
  delivery, a session that could not take it): the daemon ran what it was sent.
- `progress`: like BUSY, an answer about one delivery that is not the end of it: it moves
  a command forward only (dispatched → acked → running), and only for the delivery of
  now (in flight at the progress's epoch). An older delivery's progress never moves a
  command re-sent since: the daemon of now may answer that re-send BUSY (its new process
  holds no credit for it), and an old "running" would have put the command beyond the
  BUSY's reach, running nowhere until the node's next Hello. The seed names results,
  events and status as facts of any epoch; progress is not among them.
- `rejected` (BUSY): an answer about one delivery, the one of now: it counts only while
  the command is dispatched at the answer's epoch. A BUSY from an older delivery never
  puts back a command re-sent since.
- a Hello's `results`: the daemon ran these in its earlier sessions, so they finish a
  command delivered at an epoch before the Hello's.

Applied by `workers.replay.apply`; the dispatch loop records its deliveries in SQL
(`workers.replay.dispatch.MARK_DISPATCHED`), keeping the latest `KEPT` as here.
"""

from __future__ import annotations

from workers.replay.decide import IN_FLIGHT, TERMINAL, Command, progress_to

#: the latest epochs a command's history keeps: a command re-sent by this many Hellos
#: since has its oldest deliveries' answers refused (as before the history was kept)
KEPT = 32


def deliveries(command: Command) -> tuple[int, ...]:
    """The epochs at which `command` was delivered, ascending: its recorded history and
    the epoch it is in flight at (a row dispatched before the history was kept, or by
    another writer, has only that). Pure."""
    epochs = set(command.delivered_epochs)
    if command.state in IN_FLIGHT and command.session_epoch is not None:
        epochs.add(command.session_epoch)
    return tuple(sorted(epochs)[-KEPT:])


def delivered(command: Command, epoch: int) -> bool:
    """`command` was delivered at `epoch`. Pure."""
    return epoch in deliveries(command)


def with_delivery(command: Command, epoch: int) -> tuple[int, ...]:
    """The history after `command` is delivered (or kept running) at `epoch`, worked out
    from the command as it was before it moved. Pure."""
    return tuple(sorted({*deliveries(command), epoch})[-KEPT:])


def result_counts(command: Command, epoch: int) -> bool:
    """A result at `epoch` finishes `command`: not finished yet, delivered at `epoch`. Pure."""
    return command.state not in TERMINAL and delivered(command, epoch)


def progress_counts(command: Command, epoch: int, reported: str) -> str | None:
    """The state a progress report at `epoch` moves `command` to, or None: forward only,
    for the delivery of now (in flight at `epoch`). Pure."""
    if command.state not in IN_FLIGHT or command.session_epoch != epoch:
        return None
    return progress_to(command.state, reported)


def busy_counts(command: Command, epoch: int) -> bool:
    """A BUSY at `epoch` hands `command` back to pending: only while it is dispatched at
    that very epoch (the delivery of now). Pure."""
    return command.state == "dispatched" and command.session_epoch == epoch


def settles(command: Command, hello_epoch: int) -> bool:
    """A result a Hello at `hello_epoch` carries finishes `command`: not finished yet,
    delivered at an earlier epoch (what the daemon ran before this session). Pure."""
    return command.state not in TERMINAL and any(e < hello_epoch for e in deliveries(command))
