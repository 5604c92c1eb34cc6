"""Which answers count (`workers.replay.deliveries`): case by case, and over random lives
of a command — delivered, re-sent by Hellos, handed back by BUSY, kept running — checked
against the delivery epochs the life itself went through."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.replay.decide import IN_FLIGHT, TERMINAL, Command
from workers.replay.deliveries import (
    KEPT,
    busy_counts,
    delivered,
    deliveries,
    progress_counts,
    result_counts,
    settles,
    with_delivery,
)


def cmd(state: str = "dispatched", epoch: int | None = 2, history: tuple[int, ...] = ()) -> Any:
    return Command(
        command_id=uuid.UUID(int=1),
        node_id="n1",
        seq=1,
        kind="exec",
        lane="default",
        state=state,
        session_epoch=epoch,
        delivered_epochs=history,
    )


def test_the_epoch_in_flight_at_counts_as_delivered_without_a_history() -> None:
    """A row dispatched before the history was kept (or by another writer) has only the
    epoch it is in flight at: answers from that delivery count, as they did before."""
    assert deliveries(cmd("acked", 3)) == (3,)
    assert delivered(cmd("running", 3), 3) and not delivered(cmd("running", 3), 2)
    assert deliveries(cmd("pending", None)) == ()
    assert deliveries(cmd("done", 3)) == ()  # finished: only its recorded history


@pytest.mark.parametrize(
    ("state", "epoch", "history", "answer_epoch", "counts"),
    [
        ("dispatched", 2, (1, 2), 1, True),  # a former holder's result, re-sent since
        ("running", 2, (1, 2), 2, True),
        ("dispatched", 2, (2,), 1, False),  # never delivered at 1: a forger's
        ("pending", None, (1,), 1, True),  # handed back since: the daemon ran delivery 1
        ("pending", None, (), 1, False),  # never sent: nobody ran it
        ("pending", None, (1,), 2, False),
        ("done", 2, (1, 2), 1, False),  # finished once
        ("failed", 2, (1, 2), 2, False),
        ("cancelled", None, (1,), 1, False),
    ],
)
def test_a_result_counts_for_a_delivery_at_its_epoch_once(
    state: str, epoch: int | None, history: tuple[int, ...], answer_epoch: int, counts: bool
) -> None:
    assert result_counts(cmd(state, epoch, history), answer_epoch) is counts


@pytest.mark.parametrize(
    ("state", "epoch", "history", "answer_epoch", "reported", "expected"),
    [
        ("dispatched", 2, (1, 2), 2, "acked", "acked"),  # the delivery of now: forward
        ("acked", 2, (1, 2), 2, "running", "running"),
        ("dispatched", 2, (1, 2), 1, "acked", None),  # an older delivery: re-sent since
        ("acked", 2, (1, 2), 1, "running", None),  # (its BUSY must still reach it)
        ("running", 2, (1, 2), 2, "acked", None),  # never back
        ("dispatched", 2, (2,), 1, "running", None),  # not delivered at 1
        ("pending", None, (1,), 1, "running", None),  # pending waits for its own delivery
        ("done", 2, (1, 2), 2, "running", None),
    ],
)
def test_progress_moves_a_command_in_flight_forward_for_a_delivery(
    state: str,
    epoch: int | None,
    history: tuple[int, ...],
    answer_epoch: int,
    reported: str,
    expected: str | None,
) -> None:
    assert progress_counts(cmd(state, epoch, history), answer_epoch, reported) == expected


@pytest.mark.parametrize(
    ("state", "epoch", "history", "answer_epoch", "counts"),
    [
        ("dispatched", 2, (1, 2), 2, True),
        ("dispatched", 2, (1, 2), 1, False),  # an older delivery's BUSY: re-sent since
        ("acked", 2, (2,), 2, False),  # the daemon holds it
        ("pending", None, (2,), 2, False),  # handed back already
    ],
)
def test_busy_is_about_the_delivery_of_now(
    state: str, epoch: int | None, history: tuple[int, ...], answer_epoch: int, counts: bool
) -> None:
    assert busy_counts(cmd(state, epoch, history), answer_epoch) is counts


def test_a_hellos_results_settle_what_was_delivered_before_it() -> None:
    assert settles(cmd("dispatched", 1, (1,)), 2)
    assert settles(cmd("pending", None, (1,)), 2)
    assert not settles(cmd("dispatched", 2, (2,)), 2)  # sent to this very session
    assert not settles(cmd("pending", None, ()), 2)
    assert not settles(cmd("done", 1, (1,)), 2)


def test_the_history_keeps_the_latest_epochs() -> None:
    history = tuple(range(1, KEPT + 1))
    after = with_delivery(cmd("dispatched", KEPT, history), KEPT + 1)
    assert after == tuple(range(2, KEPT + 2))
    assert with_delivery(cmd("dispatched", 3, (3,)), 3) == (3,)  # once


# -- a command's random life ---------------------------------------------------------

STEPS = st.lists(
    st.sampled_from(["dispatch", "hello", "hello-running", "busy", "result"]), max_size=40
)


@given(steps=STEPS, answer_epochs=st.lists(st.integers(1, 45), max_size=10))
def test_over_any_life_an_answer_counts_exactly_for_the_deliveries_it_went_through(
    steps: list[str], answer_epochs: list[int]
) -> None:
    """The life is applied as the replay and the dispatch loop apply it (a dispatch or a
    replay adds a delivery, BUSY and a result keep the history); the epochs it was
    delivered at are counted on the side. At every step: a result counts exactly for
    those epochs (the latest KEPT) while it is not finished; a BUSY only for the delivery
    of now; progress only for the delivery of now, never backwards."""
    command, node_epoch, seen = cmd("pending", None), 1, set()
    for step in steps:
        if step == "dispatch" and command.state == "pending":
            command = dataclasses.replace(
                command,
                state="dispatched",
                session_epoch=node_epoch,
                delivered_epochs=with_delivery(command, node_epoch),
            )
            seen.add(node_epoch)
        elif step.startswith("hello"):
            node_epoch += 1
            if command.state in IN_FLIGHT:  # re-sent, or kept: the daemon runs it
                state = "running" if step == "hello-running" else "dispatched"
                command = dataclasses.replace(
                    command,
                    state=state,
                    session_epoch=node_epoch,
                    delivered_epochs=with_delivery(command, node_epoch),
                )
                seen.add(node_epoch)
        elif step == "busy" and busy_counts(command, node_epoch):
            command = dataclasses.replace(
                command, state="pending", session_epoch=None, delivered_epochs=deliveries(command)
            )
        elif step == "result" and result_counts(command, node_epoch):
            command = dataclasses.replace(
                command, state="done", delivered_epochs=deliveries(command)
            )
        kept = set(sorted(seen)[-KEPT:])
        assert set(deliveries(command)) == kept
        for epoch in answer_epochs:
            finished = command.state in TERMINAL
            assert result_counts(command, epoch) is (not finished and epoch in kept)
            assert busy_counts(command, epoch) is (
                command.state == "dispatched" and epoch == command.session_epoch
            )
            moved = progress_counts(command, epoch, "running")
            if command.state not in IN_FLIGHT or epoch != command.session_epoch:
                assert moved is None
            else:
                assert moved == ("running" if command.state != "running" else None)
