"""How `Roles.of` composes what a worker's role declares beyond its own grants: the tables
it names its own, the tables behind a view, what it lends a runtime group. Pure."""

from __future__ import annotations

from workers.runtime.store.roles import LAST_SEEN, RUNTIME, TABLES, Grant, Lent, Roles, WorkerRole

RELEASE = Grant("UPDATE (released_at)", "owned_ranges")
OWNER = WorkerRole(
    purpose="owner",
    grants=(Grant("SELECT, INSERT", "owned_ranges"), *LAST_SEEN),
    tables=("owned_ranges", "owned_secrets"),
    behind_views={"node_last_seen": ("owned_ranges",)},
    lends={"bcw_operator": Lent((RELEASE,), ("bcw owner release",))},
)
USER = WorkerRole(purpose="user", grants=(*LAST_SEEN, Grant("SELECT", "nodes")))
ROLES = Roles.of({"owner": OWNER, "user": USER})


def test_a_workers_tables_are_the_schemas_and_readable() -> None:
    assert (*TABLES, "owned_ranges", "owned_secrets") == ROLES.TABLES
    assert {"owned_ranges", "owned_secrets", "node_last_seen"} <= set(ROLES.READABLE)
    for group in ("bcw_reader", "bcw_operator"):
        read = {g.table for g in ROLES.GROUPS[group] if g.privileges == "SELECT"}
        assert {"owned_ranges", "owned_secrets"} <= read
    assert "owned_secrets" in ROLES.strip_sql("bcw_reader")
    assert "owned_secrets" not in Roles.of({"user": USER}).strip_sql("bcw_reader")


def test_a_group_reading_a_view_reads_the_tables_behind_it_right_after_it_once() -> None:
    view, behind = Grant("SELECT", "node_last_seen"), Grant("SELECT", "owned_ranges")
    assert ROLES.GROUPS["bcw_user"] == (*RUNTIME, view, behind, Grant("SELECT", "nodes"))
    assert behind not in ROLES.GROUPS["bcw_owner"]  # it reads them already
    assert ROLES.GROUPS["bcw_reader"].count(behind) == 1
    assert ROLES.GROUPS["bcw_gateway"].count(behind) == 1  # a runtime group's view too
    alone = Roles.of({"user": USER})  # no role says what the view reads: nothing more
    assert alone.GROUPS["bcw_user"] == (*RUNTIME, view, Grant("SELECT", "nodes"))


def test_what_a_role_lends_follows_the_groups_own_and_its_purpose_names_the_commands() -> None:
    assert ROLES.GROUPS["bcw_operator"][-1] == RELEASE
    assert ROLES.PURPOSES["bcw_operator"].endswith(", `bcw owner release`")
    alone = Roles.of({"user": USER})
    assert RELEASE not in alone.GROUPS["bcw_operator"]
    assert "bcw owner release" not in alone.PURPOSES["bcw_operator"]
