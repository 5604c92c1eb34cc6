"""The labeler's pure rules: sanitize (property-tested) and the labeling decision."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.facts import CAPABILITY_RE, sanitize
from tests.factories import hello
from workers.labeler.decide import SessionRow, decide, decide_batch

names = st.one_of(
    st.text(max_size=80),
    st.text(alphabet=string.ascii_lowercase + string.digits + "._-", min_size=1, max_size=70),
    st.from_regex(r"[a-z0-9][a-z0-9._-]{0,63}", fullmatch=True),
)
anything = st.one_of(names, st.integers(), st.none(), st.binary(max_size=8), st.floats())


@settings(max_examples=300)
@given(st.lists(anything, max_size=300))
def test_sanitize_output_is_valid_sorted_unique_and_bounded(advertised: list[object]) -> None:
    out = sanitize(advertised)
    assert all(isinstance(n, str) and CAPABILITY_RE.fullmatch(n) for n in out)
    assert list(out) == sorted(set(out))
    assert len(out) <= 64


@given(st.lists(anything, max_size=300))
def test_sanitize_is_idempotent(advertised: list[object]) -> None:
    assert sanitize(sanitize(advertised)) == sanitize(advertised)


@given(st.lists(names, max_size=200))
def test_sanitize_keeps_every_valid_name_when_there_are_few(advertised: list[str]) -> None:
    valid = sorted({n for n in advertised if CAPABILITY_RE.fullmatch(n)})
    if len(valid) <= 64:
        assert list(sanitize(advertised)) == valid


def test_sanitize_ten_thousand_names() -> None:
    advertised = [f"cap{i:05d}" for i in range(10_000)] + ["BAD", "", "é", "-x"]
    out = sanitize(advertised)
    assert out == tuple(f"cap{i:05d}" for i in range(64))


@pytest.mark.parametrize(
    ("advertised", "kept"),
    [
        pytest.param(["nvml", "nvml", "cuda.12"], ("cuda.12", "nvml"), id="dedupe-and-sort"),
        pytest.param(["Nvml", "nvml!", " x", "-dash", ".dot", "ok"], ("ok",), id="invalid-dropped"),
        pytest.param(["a" * 64, "b" * 65], ("a" * 64,), id="length-64-kept-65-dropped"),
        pytest.param([], (), id="empty"),
        pytest.param(["é", "日本", "\x00"], (), id="unicode"),
    ],
)
def test_sanitize_cases(advertised: list[str], kept: tuple[str, ...]) -> None:
    assert sanitize(advertised) == kept


def test_the_65th_capability_is_not_kept() -> None:
    advertised = [f"c{i:02d}" for i in range(65)]
    assert sanitize(advertised)[-1] == "c63" and len(sanitize(advertised)) == 64


ROW = SessionRow(session_epoch=3, system_cap_labels=frozenset({"a", "b"}))


@pytest.mark.parametrize(
    ("caps", "row", "expected"),
    [
        pytest.param(["a", "b"], ROW, ((), (), (), ()), id="unchanged"),
        pytest.param(["a", "c"], ROW, (("c",), ("b",), ("c",), ("b",)), id="one-swapped"),
        pytest.param([], ROW, ((), ("a", "b"), (), ("a", "b")), id="all-dropped"),
        pytest.param(
            ["a", "b"],
            SessionRow(3, frozenset({"a"})),
            (("b",), (), ("b",), ()),
            id="a-label-the-node-lacked-is-added-and-said",
        ),
        pytest.param(
            ["a", "c"],
            SessionRow(3, frozenset({"a", "b"})),
            (("c",), ("b",), ("c",), ("b",)),
            id="the-hello-transaction-stored-them-the-labels-say-what-changed",
        ),
    ],
)
def test_decide(caps: list[str], row: SessionRow, expected: tuple[tuple[str, ...], ...]) -> None:
    labeling = decide(hello("n", 3, capabilities=caps), row)
    assert labeling is not None
    got = (labeling.labels_to_add, labeling.labels_to_remove, labeling.added, labeling.removed)
    assert got == expected
    assert labeling.changed == bool(expected[2] or expected[3])


@pytest.mark.parametrize("epoch", [2, 4])
def test_a_hello_of_another_epoch_decides_nothing(epoch: int) -> None:
    assert decide(hello("n", epoch, capabilities=["z"]), ROW) is None


@pytest.mark.parametrize(("proven", "labels"), [(True, True), (None, True), (False, False)])
def test_an_unproven_hello_of_a_node_that_proves_labels_nothing(
    proven: bool | None, labels: bool
) -> None:
    """`proven` false, as the Hello transaction records it: the node has a Hello key and
    this Hello proved nothing (a takeover attempt); None: nothing to prove it by."""
    labeling = decide(hello("n", 3, capabilities=["z"], proven=proven), ROW)
    assert (labeling is not None) is labels


def test_unknown_node_decides_nothing() -> None:
    assert decide(hello("n", 3), None) is None


def test_batch_keeps_the_newest_hello_per_node() -> None:
    older, newer = hello("n", 2, capabilities=["old"]), hello("n", 3, capabilities=["new"])
    labelings = decide_batch([newer, older], {"n": ROW})
    assert labelings["n"].capabilities == ("new",)
