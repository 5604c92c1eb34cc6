"""A model-based test of the replay dispatcher (hypothesis stateful).

Random sequences of Hellos (same or new journal, same or new boot, running sets),
progress, results and BUSY answers from the session of now and from the one before,
stale Hellos, disconnects, enqueues, dispatch rounds
and time jumps are applied to the real database through the worker's handler and the
dispatch round, and to a small in-memory reference model of the rules written here
independently of `workers/replay/decide.py`. After every step the database must equal
the model, and the invariants must hold: no command in flight at an epoch other than
the session's, none lost, seq order per lane at each dispatch, credits never exceeded,
terminal states never changed.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from schemas.subjects import Subjects
from tests.factories import make_fact
from tests.integration import fleet
from tests.integration.direct import apply, of_type, take_outbox
from workers import replay
from workers.replay.dispatch import dispatch_round
from workers.replay.settings import ReplaySettings
from workers.settings import Settings

CREDITS = 2
LANES = ("a", "b")
IN_FLIGHT = {"dispatched", "acked", "running"}
TERMINAL = {"done", "failed", "cancelled"}
WORKER = replay.build(Settings())


@dataclass
class Cmd:
    id: uuid.UUID
    seq: int
    lane: str
    kind: str
    state: str = "pending"
    epoch: int | None = None
    attempt: int = 0
    busy: int = 0
    busy_epoch: int | None = None
    backing_off: bool = False
    delivered: set[int] = field(default_factory=set)  # the epochs it was delivered at


@dataclass
class Model:
    epoch: int = 1
    connected: bool = True
    boot: int = 1
    journal: int = 1
    commands: dict[uuid.UUID, Cmd] = field(default_factory=dict)

    def in_flight(self, lane: str) -> int:
        return sum(1 for c in self.commands.values() if c.lane == lane and c.state in IN_FLIGHT)

    def dispatch(self) -> list[Cmd]:
        if not self.connected:
            return []
        sent = []
        for lane in LANES:
            for c in sorted(
                (c for c in self.commands.values() if c.lane == lane and c.state == "pending"),
                key=lambda c: c.seq,
            ):
                if c.backing_off or self.in_flight(lane) >= CREDITS:
                    break
                c.state, c.epoch, c.attempt = "dispatched", self.epoch, c.attempt + 1
                c.delivered.add(self.epoch)
                sent.append(c)
        return sent

    def hello(self, new_boot: bool, new_journal: bool, running: set[uuid.UUID]) -> None:
        self.epoch += 1
        self.connected = True
        for c in sorted(self.commands.values(), key=lambda c: c.seq):
            if c.state not in IN_FLIGHT:
                continue
            if new_journal:
                c.state = "failed"
            elif c.kind == "node.reboot" and new_boot:
                c.state = "done"
            elif c.id in running:
                c.state, c.epoch = "running", self.epoch
                c.delivered.add(self.epoch)
            else:
                c.state, c.epoch, c.attempt = "dispatched", self.epoch, c.attempt + 1
                c.delivered.add(self.epoch)


class ReplayMachine(RuleBasedStateMachine):
    database_url: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)  # this thread's own loop
        self.node = f"m{uuid.uuid4().hex[:10]}"
        self.subjects = Subjects(f"m{uuid.uuid4().hex[:8]}")
        self.model = Model()
        self.terminal: dict[uuid.UUID, str] = {}
        self.offset = timedelta(0)
        self.conn: asyncpg.Connection = self.run(asyncpg.connect(self.database_url))
        self.pool: asyncpg.Pool = self.run(
            asyncpg.create_pool(self.database_url, min_size=1, max_size=2)
        )
        # a BUSY back-off the machine's own pace never outlasts (a loaded machine takes
        # seconds between steps; the default's first second would lapse unseen by the
        # model): only `time_passes` ends one, as the model says
        self.settings = ReplaySettings(
            credits=CREDITS, nodes_per_round=10_000, busy_base=timedelta(seconds=20)
        )

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        self.run(self.conn.execute("DELETE FROM nodes WHERE node_id = $1", self.node))
        self.run(self.conn.execute("DELETE FROM outbox"))
        self.run(self.conn.close())
        self.run(self.pool.close())
        self.loop.close()

    @initialize()
    def joined_and_connected(self) -> None:
        # each example starts its clock at zero: a previous example's offset must not make
        # `time_passes` move the clock backwards
        self.run(self.conn.execute("SELECT set_compute_now_offset(interval '0')"))
        self.run(
            fleet.session(self.conn, self.node, epoch=1, boot_id="boot-1", journal_id="journal-1")
        )

    # -- steps ---------------------------------------------------------------------------
    @rule(lane=st.sampled_from(LANES), reboot=st.booleans())
    def enqueue(self, lane: str, reboot: bool) -> None:
        kind = "node.reboot" if reboot else "exec"
        command_id = self.run(
            self.conn.fetchval("SELECT enqueue_command($1, $2, '{}', $3)", self.node, kind, lane)
        )
        seq = len(self.model.commands) + 1
        self.model.commands[command_id] = Cmd(command_id, seq, lane, kind)

    @rule()
    def dispatch(self) -> None:
        before = {c.id: (c.state, c.backing_off) for c in self.model.commands.values()}
        expected = self.model.dispatch()
        self.run(dispatch_round(self.pool, None, self.subjects, self.settings))
        notices = [
            n
            for n in of_type(self.run(take_outbox(self.conn)), "dispatch")
            if n["node_id"] == self.node
        ]
        assert [uuid.UUID(n["command_id"]) for n in notices] == [
            c.id for c in sorted(expected, key=lambda c: c.seq)
        ]
        for notice in notices:  # seq order: nothing lower was pending and ready in its lane
            sent = self.model.commands[uuid.UUID(notice["command_id"])]
            assert notice["epoch"] == self.model.epoch
            for other in self.model.commands.values():
                if other.lane == sent.lane and other.seq < sent.seq:
                    assert before[other.id][0] != "pending" or other in expected

    @rule(new_boot=st.booleans(), new_journal=st.booleans(), data=st.data())
    def hello(self, new_boot: bool, new_journal: bool, data: st.DataObject) -> None:
        in_flight = sorted(
            (c.id for c in self.model.commands.values() if c.state in IN_FLIGHT), key=str
        )
        running = (
            set(data.draw(st.lists(st.sampled_from(in_flight), unique=True)))
            if in_flight
            else set()
        )
        previous = {
            "epoch": self.model.epoch,
            "gateway_id": "gw-1",
            "boot_id": f"boot-{self.model.boot}",
            "journal_id": f"journal-{self.model.journal}",
            "live": False,
        }
        self.model.boot += new_boot
        self.model.journal += new_journal
        self.model.hello(new_boot, new_journal, running)
        boot, journal = f"boot-{self.model.boot}", f"journal-{self.model.journal}"
        self.run(
            fleet.session(
                self.conn, self.node, epoch=self.model.epoch, boot_id=boot, journal_id=journal
            )
        )
        fact = fleet.hello(
            self.node,
            self.model.epoch,
            boot_id=boot,
            journal_id=journal,
            previous=previous,
            running_command_ids=[str(i) for i in running],
        )
        self.run(apply(self.conn, WORKER, self.subjects, fact))
        self.run(take_outbox(self.conn))

    @rule()
    def stale_hello(self) -> None:
        if self.model.epoch < 2:
            return
        fact = fleet.hello(self.node, self.model.epoch - 1, journal_id="journal-elsewhere")
        self.run(take_outbox(self.conn))
        self.run(apply(self.conn, WORKER, self.subjects, fact))
        assert self.run(take_outbox(self.conn)) == []

    @rule()
    def disconnect(self) -> None:
        self.model.connected = False
        self.run(
            self.conn.execute(
                "UPDATE node_sessions SET gateway_id = NULL WHERE node_id = $1", self.node
            )
        )

    @precondition(lambda self: bool(self.model.commands))
    @rule(data=st.data(), state=st.sampled_from(["acked", "running"]), stale=st.booleans())
    def progress(self, data: st.DataObject, state: str, stale: bool) -> None:
        command = data.draw(
            st.sampled_from(sorted(self.model.commands.values(), key=lambda c: c.seq))
        )
        order = {"dispatched": 0, "acked": 1, "running": 2}
        epoch = self.model.epoch - 1 if stale else self.model.epoch
        # progress is about the delivery of now (docs/contract.md: the seed names results,
        # events and status as facts of any epoch, not progress): it moves a command in
        # flight at its epoch, forward only — an older delivery's word never moves a
        # command re-sent since
        moves = command.state in order and order[state] > order[command.state]
        if moves and command.epoch == max(1, epoch):
            command.state = state
        fact = make_fact(
            "progress",
            node_id=self.node,
            epoch=max(1, epoch),
            command_id=str(command.id),
            state=state,
        )
        self.run(apply(self.conn, WORKER, self.subjects, fact))

    @precondition(lambda self: bool(self.model.commands))
    @rule(data=st.data(), outcome=st.sampled_from(["done", "failed"]), stale=st.booleans())
    def result(self, data: st.DataObject, outcome: str, stale: bool) -> None:
        command = data.draw(
            st.sampled_from(sorted(self.model.commands.values(), key=lambda c: c.seq))
        )
        epoch = self.model.epoch - 1 if stale and self.model.epoch > 1 else self.model.epoch
        # once, for a delivery at its epoch (re-sent since or not): never one not sent then
        if command.state not in TERMINAL and epoch in command.delivered:
            command.state = outcome
        fact = make_fact(
            "result",
            node_id=self.node,
            epoch=epoch,
            command_id=str(command.id),
            outcome=outcome,
            result=None,
            error=None if outcome == "done" else "boom",
        )
        self.run(apply(self.conn, WORKER, self.subjects, fact))

    @precondition(lambda self: bool(self.model.commands))
    @rule(data=st.data(), stale=st.booleans())
    def busy(self, data: st.DataObject, stale: bool) -> None:
        command = data.draw(
            st.sampled_from(sorted(self.model.commands.values(), key=lambda c: c.seq))
        )
        epoch = self.model.epoch - 1 if stale and self.model.epoch > 1 else self.model.epoch
        if command.state == "dispatched" and command.epoch == epoch:
            command.busy = command.busy + 1 if command.busy_epoch == epoch else 1
            command.busy_epoch = epoch
            command.state, command.epoch, command.backing_off = "pending", None, True
        fact = make_fact(
            "rejected", node_id=self.node, epoch=epoch, command_id=str(command.id), reason="BUSY"
        )
        self.run(apply(self.conn, WORKER, self.subjects, fact))

    @rule()
    def time_passes(self) -> None:
        self.offset += timedelta(seconds=31)  # longer than the largest back-off
        self.run(self.conn.execute("SELECT set_compute_now_offset($1)", self.offset))
        for command in self.model.commands.values():
            command.backing_off = False

    # -- checks ------------------------------------------------------------------------
    @invariant()
    def database_equals_model_and_invariants_hold(self) -> None:
        rows = self.run(
            self.conn.fetch(
                "SELECT command_id, state, session_epoch, delivery_attempt, busy_attempts FROM commands "
                "WHERE node_id = $1",
                self.node,
            )
        )
        actual = {
            r["command_id"]: (r["state"], r["session_epoch"], r["delivery_attempt"]) for r in rows
        }
        expected = {
            c.id: (c.state, c.epoch if c.state in IN_FLIGHT else None, c.attempt)
            for c in self.model.commands.values()
        }
        actual_cmp = {k: (s, e if s in IN_FLIGHT else None, a) for k, (s, e, a) in actual.items()}
        assert actual_cmp == expected
        for command_id, (state, epoch, _attempt) in actual.items():
            # none lost, none in flight at two epochs: in flight means at the session's epoch
            assert state in IN_FLIGHT | TERMINAL | {"pending"}
            if state in IN_FLIGHT:
                assert epoch == self.model.epoch
            if command_id in self.terminal:
                assert state == self.terminal[command_id]  # terminal states never change
            elif state in TERMINAL:
                self.terminal[command_id] = state
        for lane in LANES:
            assert self.model.in_flight(lane) <= CREDITS


def _run_machine(database_url: str) -> None:
    ReplayMachine.database_url = database_url
    machine_test = ReplayMachine.TestCase
    machine_test.settings = settings(
        max_examples=40,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    machine_test("runTest").runTest()


@pytest.mark.slow
async def test_replay_rules_against_a_reference_model(database_url: str) -> None:
    # the machine runs its own event loop: in a thread of its own, beside the test's loop
    await asyncio.to_thread(_run_machine, database_url)
