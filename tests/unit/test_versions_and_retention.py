"""Versions and what follows from them: how this release sees each migration of the
ledger (`migrate.classify`, `migrate.refusal`: docs/contract.md, "Compatibility", a
rollback within a major); whether range sight may be on beside the releases the ledger
says may still run (`decide.range_sight_on`); which nats-server it runs on and what that server keeps
(`server`); each stream's retention from the settings (`streams.stream_configs`)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.subjects import Subjects
from workers.liveness.decide import RANGED_MIGRATION, range_sight_on
from workers.registry import DEAD_PUBLISHERS
from workers.runtime.base.release import parse
from workers.runtime.base.runtime_settings import NatsSettings
from workers.runtime.bus import server, streams
from workers.runtime.store.migrate import Migration, classify, refusal

DISK = [Migration("0001_a.sql", "SELECT 1;"), Migration("0002_b.sql", "SELECT 2;")]
WHEN = datetime(2026, 12, 2, tzinfo=UTC)


def row(migration: Migration | None = None, release: str | None = "0.4.0") -> dict[str, object]:
    checksum = migration.checksum if migration else "x"
    return {"checksum": checksum, "applied_at": WHEN, "release": release}


def states(ledger: dict[str, dict[str, object]], this: str = "0.4.0") -> dict[str, str]:
    return {s.name: s.state for s in classify(DISK, ledger, this)}


def test_on_disk_each_is_applied_pending_or_changed() -> None:
    ledger = {"0001_a.sql": row(DISK[0]), "0002_b.sql": row(DISK[0])}
    assert states(ledger) == {"0001_a.sql": "applied", "0002_b.sql": "changed"}
    assert states({"0001_a.sql": row(DISK[0], None)}) == {
        "0001_a.sql": "applied",
        "0002_b.sql": "pending",
    }


@pytest.mark.parametrize(
    ("recorded", "this", "state"),
    [
        ("0.5.0", "0.4.0", "newer"),
        ("0.4.1", "0.4.0", "newer"),
        ("0.10.0", "0.9.3", "newer"),  # by number, not by text
        ("0.5.0rc1", "0.4.0", "newer"),
        ("0.5.0", "0.5.0rc1", "newer"),  # a release candidate comes before its release
        ("0.5.0rc1", "0.5.0", "missing"),
        ("0.5.0rc2", "0.5.0rc1", "newer"),
        ("1.0.0", "0.4.0", "newer-major"),
        ("2.1.0", "1.7.0", "newer-major"),
        ("0.4.0", "0.4.0", "missing"),  # this release's own file is gone
        ("0.3.0", "0.4.0", "missing"),
        ("0.5.0", "1.0.0", "missing"),  # an earlier major's: every file of it is ours
        (None, "0.4.0", "missing"),  # recorded by a release before 0.4.0
        ("garbage", "0.4.0", "missing"),
        ("0.5.0", "unknown", "missing"),  # a bare checkout knows no major
    ],
)
def test_one_not_on_disk_is_newer_only_from_a_later_release_of_this_major(
    recorded: str | None, this: str, state: str
) -> None:
    ledger = {
        "0001_a.sql": row(DISK[0]),
        "0002_b.sql": row(DISK[1]),
        "0003_c.sql": row(None, recorded),
    }
    assert states(ledger, this)["0003_c.sql"] == state
    why = refusal(classify(DISK, ledger, this), this)
    assert (why is None) == (state == "newer")
    if why is not None:
        assert f"0003_c.sql ({state}" in why
    if state == "newer-major":
        assert f"release {recorded} is a later major" in str(why)


def test_a_refusal_names_every_migration_in_the_way() -> None:
    ledger = {"0001_a.sql": row(None), "0009_z.sql": row(None, "9.0.0")}
    why = refusal(classify(DISK, ledger, "0.4.0"), "0.4.0")
    assert why is not None and "0001_a.sql (changed, 0.4.0)" in why
    assert "0009_z.sql (newer-major, 9.0.0)" in why and "not release 0.4.0's schema" in why


@given(
    st.lists(st.integers(0, 50), min_size=2, max_size=4),
    st.lists(st.integers(0, 50), min_size=2, max_size=4),
)
def test_versions_order_by_their_numbers(a: list[int], b: list[int]) -> None:
    va, vb = ".".join(map(str, a)), ".".join(map(str, b))

    def numbers(n: list[int]) -> tuple[int, ...]:  # 1.2 is 1.2.0
        return tuple(n + [0] * (4 - len(n)))

    assert (parse(va) < parse(vb)) == (numbers(a) < numbers(b))  # type: ignore[operator]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("0.5.0rc1", "0.5.0"),
        ("0.5.0a1", "0.5.0b1"),
        ("0.5.0.dev1", "0.5.0rc1"),
        ("v2.14.0-RC.1", "2.14.0"),
        ("0.4.0", "0.4.1rc1"),
        ("0.4.0", "0.4.0.post1"),
    ],
)
def test_a_pre_release_is_before_its_release_never_equal(a: str, b: str) -> None:
    assert parse(a) is not None and parse(b) is not None
    assert parse(a) < parse(b)  # type: ignore[operator]
    assert parse(a) != parse(b)


@pytest.mark.parametrize(
    ("version", "refused", "batches"),
    [
        ("2.9.25", True, False),
        ("2.10.0", False, False),
        ("2.12.8", False, False),
        ("v2.14.0-RC.1", False, True),
        ("2.15.1", False, True),
        ("3.0.0", False, True),
        ("", True, False),
        ("garbage", True, False),
    ],
)
def test_one_nats_server_floor_and_fast_batches_from_2_14(
    version: str, refused: bool, batches: bool
) -> None:
    why = server.too_old(version)
    assert (why is not None) == refused
    if why is not None:
        assert "older than 2.10" in why and "2.14" in why
    assert server.has_fast_batches(version) == batches


def test_each_streams_retention_is_its_setting() -> None:
    settings = NatsSettings(
        facts_max_age="2d",
        events_max_age="30d",
        notices_max_age="10m",
        dead_max_age="3d",
        stream_max_bytes=2**30,
        events_max_bytes=2**34,
        dead_max_bytes=0,
    )
    subjects = Subjects("bc")
    configs = {c.name: c for c in streams.stream_configs(subjects, 1, streams.limits_of(settings))}
    ages = {name: c.max_age for name, c in configs.items()}
    assert ages == {
        "BC_FACTS": 2 * 86400,
        "BC_EVENTS": 30 * 86400,
        "BC_GATEWAY": 600,
        **{f"BC_DEAD_{p}": 3 * 86400 for p in DEAD_PUBLISHERS},
    }
    assert configs["BC_EVENTS"].max_bytes == 2**34 and configs["BC_DEAD_relay"].max_bytes == 2**30
    own_bound = streams.limits_of(settings.model_copy(update={"dead_max_bytes": 2**20}))
    dead = [c for c in streams.stream_configs(subjects, 1, own_bound) if "DEAD" in str(c.name)]
    assert {c.name: (c.max_bytes, c.subjects) for c in dead} == {
        f"BC_DEAD_{p}": (2**20, [f"bc.dead.{p}", f"bc.dead.{p}.>"]) for p in DEAD_PUBLISHERS
    }  # each publisher's letters in a stream of its own, bounded in bytes
    assert configs["BC_FACTS"].max_bytes == 2**30 and configs["BC_GATEWAY"].max_bytes == 2**30
    assert all(c.allow_batched for c in configs.values())
    older = streams.stream_configs(subjects, 1, streams.limits_of(settings, "2.12.8"))
    assert all(c.allow_batched is None for c in older)  # a 2.12 server refuses the field
    own = NatsSettings(facts_max_age="2d", facts_gateways="gw-1")
    per_gateway = streams.stream_configs(subjects, 1, streams.limits_of(own))
    assert {c.name: c.max_age for c in per_gateway if "FACTS" in str(c.name)} == {
        "BC_FACTS": 2 * 86400,
        "BC_FACTS_gw-1": 2 * 86400,
    }


@pytest.mark.parametrize("age", ["1m", "0", "-5"])
def test_a_retention_under_the_duplicate_window_is_refused(age: str) -> None:
    with pytest.raises(ValueError, match="facts_max_age"):
        NatsSettings(facts_max_age=age)


OLD = {f"00{k:02d}_x.sql": None for k in range(1, 37)}  # applied before 0.4.0: no release
RANGES = ["0037_liveness_ranges.sql", "0038_last_sight.sql", RANGED_MIGRATION]


@pytest.mark.parametrize("setting", [True, False])
def test_range_sight_set_is_range_sight_whatever_the_ledger_says(setting: bool) -> None:
    for ledger in ({}, OLD, {**OLD, **dict.fromkeys(RANGES, "0.4.0")}):
        assert range_sight_on(setting, ledger, "0.4.0")[0] is setting


@pytest.mark.parametrize(
    ("ledger", "own", "on"),
    [
        # a fresh schema: every migration applied by this release or another of 0.4+
        ({**dict.fromkeys(OLD, "0.4.0"), **dict.fromkeys(RANGES, "0.4.0")}, "0.4.0", True),
        ({**dict.fromkeys(OLD, "0.4.0"), **dict.fromkeys(RANGES, "0.4.0")}, "0.5.0", True),
        # upgraded from 0.3 by this release: 0.3's liveness workers may still run
        ({**OLD, **dict.fromkeys(RANGES, "0.4.0")}, "0.4.0", False),
        ({**OLD, **dict.fromkeys(RANGES, "0.5.0")}, "0.5.0", False),
        # upgraded from 0.3 by an earlier release of 0.4+: none of 0.3's runs any more
        ({**OLD, **dict.fromkeys(RANGES, "0.4.0")}, "0.4.1", True),
        ({**OLD, **dict.fromkeys(RANGES, "0.4.0")}, "0.5.0", True),
        # rolled back to 0.4 after 0.5 upgraded from 0.3: 0.5's workers replaced 0.3's
        ({**OLD, **dict.fromkeys(RANGES, "0.5.0")}, "0.4.0", True),
        # a schema without the marks (not migrated yet): never
        ({**OLD}, "0.4.0", False),
        ({}, "0.4.0", False),
    ],
)
def test_range_sight_auto_is_off_only_while_a_release_before_0_4_may_run(
    ledger: dict[str, str | None], own: str, on: bool
) -> None:
    decided, why = range_sight_on("auto", ledger, own)
    assert decided is on
    assert why  # the worker logs it
