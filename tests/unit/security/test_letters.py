"""Which dead letters a redrive may re-send (`letters.refusal`): only what the letter's
source could have sent itself, checked against the same table the relay checks rows
against (`principals.EMITS`). Every letter a worker's login can plant is tried here."""

from __future__ import annotations

import nats.errors
import pytest

from schemas.subjects import Subjects
from workers.runtime import process
from workers.runtime.base.errors import refused_publish_subject
from workers.runtime.bus import deadletter, letters
from workers.runtime.bus.connection import RefusedSubjects
from workers.runtime.bus.deadletter import SENDER, DeadLetter

S = Subjects("bc")
DISPATCH = S.notice("gw-1", "dispatch")


def _letter(
    worker: str, cause: str, subject: str, on: str | None = None, **headers: str
) -> DeadLetter:
    return DeadLetter(
        stream=S.dead_stream_of(worker),
        seq=1,
        on=S.dead(worker) if on is None else on,
        worker=worker,
        reason="r",
        cause=cause,
        subject=subject,
        stream_seq=7,
        time=None,
        headers=dict(headers),
        data=b"{}",
    )


@pytest.mark.parametrize("cause", ["invalid", "unsupported-major", "handler", "max-deliveries"])
def test_a_consumers_fact_letter_goes_back_to_a_facts_subject_only(cause: str) -> None:
    assert letters.refusal(S, _letter("labeler", cause, S.fact("gw-1", "hello"))) is None
    assert letters.is_fact_letter(_letter("labeler", cause, S.fact("gw-1", "hello")))
    for elsewhere in (DISPATCH, S.event("node.connected"), S.revocations, "bc.facts.gw-1"):
        why = letters.refusal(S, _letter("labeler", cause, elsewhere))
        assert why is not None and "no facts subject" in why


def test_a_letter_is_stored_on_the_subject_of_the_worker_it_names() -> None:
    # the labeler's nkey may publish bc.dead.labeler only: a letter there saying "replay"
    # or "relay" is the labeler's
    for named in ("replay", "relay"):
        planted = _letter(
            named,
            "unpublishable",
            DISPATCH,
            on=S.dead("labeler"),
            **{SENDER: "replay", "Bc-Type": "dispatch"},
        )
        why = letters.refusal(S, planted)
        assert why == f"stored on bc.dead.labeler but names the worker {named}"


def test_the_relays_unpublishable_letter_goes_back_only_where_its_sender_sends() -> None:
    sent = {SENDER: "replay", "Bc-Type": "dispatch"}
    assert letters.refusal(S, _letter("relay", "unpublishable", DISPATCH, **sent)) is None
    assert not letters.is_fact_letter(_letter("relay", "unpublishable", DISPATCH, **sent))
    refused = {
        "the labeler sends no dispatch": {SENDER: "labeler", "Bc-Type": "dispatch"},
        "no type": {SENDER: "replay"},
        "another type's subject": {SENDER: "replay", "Bc-Type": "command.replayed"},
    }
    for what, headers in refused.items():
        assert letters.refusal(S, _letter("relay", "unpublishable", DISPATCH, **headers)), what
    # the right type, to a subject that is not its own
    wrong = _letter("relay", "unpublishable", S.fact("gw-1", "hello"), **sent)
    assert "could not send it" in str(letters.refusal(S, wrong))


def test_a_workers_own_relay_letter_names_itself_as_sender() -> None:
    own = {SENDER: "replay", "Bc-Type": "dispatch"}
    assert letters.refusal(S, _letter("replay", "unpublishable", DISPATCH, **own)) is None
    other = {SENDER: "replay", "Bc-Type": "dispatch"}
    why = letters.refusal(S, _letter("labeler", "unpublishable", DISPATCH, **other))
    assert why == "a worker's letter names another sender (replay)"


def test_forged_rows_and_other_relay_causes_never_go_back() -> None:
    sent = {SENDER: "replay", "Bc-Type": "dispatch"}
    assert "forged" in str(letters.refusal(S, _letter("relay", "forged", DISPATCH, **sent)))
    assert "forged" in str(letters.refusal(S, _letter("replay", "forged", DISPATCH, **sent)))
    why = letters.refusal(S, _letter("relay", "invalid", S.fact("gw-1", "hello")))
    assert why == "a relay's letter of cause invalid is not re-sent"


def test_a_row_of_no_fleet_worker_is_the_owners_and_only_the_relay_says_so() -> None:
    owners = {SENDER: "", "Bc-Type": "bench.thing"}
    assert letters.refusal(S, _letter("relay", "unpublishable", S.event("x"), **owners)) is None
    why = letters.refusal(S, _letter("labeler", "unpublishable", S.event("x"), **owners))
    assert why == "a worker's letter names another sender (none)"


def test_a_refusal_said_in_lower_case_buries_only_the_subject_that_failed() -> None:
    """nats-py hands the server's error over lower-cased: a refused `BC.EVENTS.X` is said
    as `bc.events.x`. The subject that then failed is known refused (its rows buried before
    they are tried); an allowed `bc.events.x`, which never failed, is never taken for it."""
    error = nats.errors.Error('nats: permissions violation for publish to "bc.events.x"')
    said = refused_publish_subject(error)
    assert said == "bc.events.x"
    refused = RefusedSubjects()
    refused.add(said)
    assert "BC.EVENTS.X" not in refused and "bc.events.x" not in refused  # nothing failed yet
    assert refused.said("BC.EVENTS.X") and refused.confirm("BC.EVENTS.X")
    assert "BC.EVENTS.X" in refused and "bc.events.x" not in refused
    assert not refused.confirm("bc.events.y")  # a failure of another subject: passing


def test_a_letter_goes_under_its_worker_by_cause_and_source() -> None:
    """Bounded per subject by the dead stream: one gateway's junk of one cause evicts only
    its own oldest letters; a parked fact has a subject of its own."""
    from workers.runtime.bus.deadletter import subject_of

    hello = S.fact("gw-1", "hello")
    assert subject_of(S, "labeler", "invalid", hello) == "bc.dead.labeler.invalid.gw-1"
    parked = subject_of(S, "labeler", "unsupported-major", hello)
    assert parked == "bc.dead.labeler.unsupported-major.gw-1"
    assert subject_of(S, "relay", "unpublishable", DISPATCH) == "bc.dead.relay.unpublishable.outbox"
    assert subject_of(S, "replay", "a cause.with dots", "x.y") == "bc.dead.replay.other.outbox"
    # under its worker's subject: the refusal takes it as the worker's
    letter = _letter("labeler", "invalid", hello, on="bc.dead.labeler.invalid.gw-1")
    assert letters.refusal(S, letter) is None
    planted = _letter("replay", "invalid", hello, on="bc.dead.labeler.invalid.gw-1")
    assert "but names the worker replay" in str(letters.refusal(S, planted))
    elsewhere = _letter("labeler", "invalid", hello, on="bc.dead.labelerx.invalid")
    assert letters.refusal(S, elsewhere) is not None


def test_a_letter_is_named_by_its_stream_and_sequence() -> None:
    assert deadletter.parse_key("BC_DEAD_labeler:12") == ("BC_DEAD_labeler", 12)
    assert deadletter.parse_key("A:B:3") == ("A:B", 3)  # the last colon splits
    for bad in ("12", ":12", "BC_DEAD:", "BC_DEAD:0", "BC_DEAD:-1", "BC_DEAD:x"):
        with pytest.raises(ValueError, match="STREAM:SEQ"):
            deadletter.parse_key(bad)
    letter = _letter("replay", "handler", S.fact("gw-1", "result"))
    assert deadletter.parse_key(letter.key) == (S.dead_stream_of("replay"), 1)
    assert deadletter.is_dead(S, S.dead_stream) and deadletter.is_dead(S, S.dead_stream_of("x"))
    assert not deadletter.is_dead(S, S.facts_stream) and not deadletter.is_dead(S, "BC_DEADX")


def test_each_publishers_letters_go_to_its_own_stream() -> None:
    """A letter's subject (`subject_of`) is one only its publisher's stream takes."""
    for publisher in ("labeler", "relay", "tally"):
        on = deadletter.subject_of(S, publisher, "handler", S.fact("gw-1", "hello"))
        assert S.stream_of(on) == S.dead_stream_of(publisher)
        assert S.stream_of(S.dead(publisher)) == S.dead_stream_of(publisher)
    assert S.stream_of(S.legacy_dead) is None  # the old stream's: nothing publishes there


def test_a_process_checks_its_own_dead_streams_only() -> None:
    assert process.dead_publishers(["labeler", "replay"]) == ("labeler", "replay")
    assert process.dead_publishers([]) == ("relay",)  # `bcw run relay`
    assert process.dead_publishers(["tally"]) == ("tally", "relay")  # a test's worker
