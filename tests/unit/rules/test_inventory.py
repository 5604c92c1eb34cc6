"""The gateway's inventory rules: which sections to ask for, which frames may be stored."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.gateway.inventory import (
    MAX_SECTION_BYTES,
    agreed,
    section_problem,
    sections_to_request,
    to_apply,
)

names = st.text(alphabet="abcdefgh", min_size=1, max_size=3)
hashes = st.dictionaries(names, st.sampled_from(["h1", "h2", "h3"]), max_size=6)


@given(hashes, hashes)
def test_exactly_the_presented_sections_whose_hash_is_not_stored_are_asked_for(
    presented: dict[str, str], stored: dict[str, str]
) -> None:
    asked = sections_to_request(presented, stored)
    assert list(asked) == sorted(asked)
    for section, digest in presented.items():
        assert (section in asked) == (stored.get(section) != digest)
    assert set(asked) <= set(presented)  # never a section the daemon no longer has


def test_examples() -> None:
    assert sections_to_request({"gpu": "h1", "cpu": "h2"}, {}) == ("cpu", "gpu")
    assert sections_to_request({"gpu": "h1", "cpu": "h2"}, {"gpu": "h1", "cpu": "h0"}) == ("cpu",)
    assert sections_to_request({}, {"gpu": "h1"}) == ()


@pytest.mark.parametrize(
    ("section", "digest", "body", "problem"),
    [
        ("gpu", "h1", {"count": 2}, None),
        ("", "h1", {}, "section"),
        ("a b", "h1", {}, "section"),
        ("x" * 257, "h1", {}, "section"),
        ("gpu", "", {}, "hash"),
        ("gpu", "h1", [1, 2], "body"),
        ("gpu", "h1", {"x": float("nan")}, "body"),
        ("gpu", "h1", {"x": object()}, "body"),
        ("gpu", "h1", {"x": "y" * MAX_SECTION_BYTES}, "body"),
    ],
)
def test_section_problem(section: str, digest: str, body: object, problem: str | None) -> None:
    found = section_problem(section, digest, body)
    assert (found.split(":")[0] if found else None) == problem


@pytest.mark.parametrize(
    ("reported", "stored", "held", "is_agreed", "applied"),
    [
        ({"a": "1"}, {"a": "1"}, {}, True, ()),  # nothing changed
        ({"a": "2"}, {"a": "1"}, {"a": "2"}, True, ("a",)),  # a change, sent
        ({"a": "2", "b": "1"}, {"a": "1"}, {"a": "2"}, False, ()),  # half a collection
        ({"a": "2"}, {"a": "1"}, {"a": "3"}, False, ()),  # collected again since: wait
        ({"a": "1"}, {"a": "1"}, {"x": "9"}, True, ()),  # pushed, not reported (yet): waits
        ({}, {"a": "1"}, {}, True, ()),  # a section no longer reported stays as stored
    ],
    ids=["unchanged", "changed-and-sent", "half", "newer-than-reported", "unreported", "gone"],
)
def test_an_inventory_is_applied_only_once_it_agrees_with_the_report(
    reported: dict[str, str],
    stored: dict[str, str],
    held: dict[str, str],
    is_agreed: bool,
    applied: tuple[str, ...],
) -> None:
    assert agreed(reported, stored, held) is is_agreed
    if is_agreed:
        assert to_apply(reported, held) == applied
