"""How this release sees each migration of the ledger: `migrate.classify` and
`migrate.refusal` (docs/contract.md, "Compatibility": a rollback within a major)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.runtime.base.release import parse
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
    assert (parse(va) < parse(vb)) == (tuple(a) < tuple(b))  # type: ignore[operator]
