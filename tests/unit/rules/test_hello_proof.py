"""The Hello's proof as docs/contract.md gives it: the exact bytes and the test vector a
daemon's implementation checks itself against."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas.proof import HelloProof, message, prove

VECTOR_KEY = bytes(range(32))  # 00 01 02 … 1f
VECTOR_NONCE = "0123456789abcdef0123456789abcdef"
VECTOR_MAC = "920453b47aadae1417ad55048654c4aaf1f77917a6e071cdbab6234f89c52cda"


def test_the_bytes_are_seven_lines_without_a_trailing_newline() -> None:
    assert message("node-17", "boot-1", "journal-1", "gw-3", 1796200000, VECTOR_NONCE) == (
        b"bc-hello-proof-v1\nnode-17\nboot-1\njournal-1\ngw-3\n1796200000\n" + VECTOR_NONCE.encode()
    )
    assert message("nœud", "b", "j", "g", 0, VECTOR_NONCE).startswith(
        "bc-hello-proof-v1\nnœud\n".encode()
    )  # UTF-8


def test_the_contracts_vector() -> None:
    proof = prove(VECTOR_KEY, "node-17", "boot-1", "journal-1", "gw-3", 1796200000, VECTOR_NONCE)
    assert proof == HelloProof(at=1796200000, nonce=VECTOR_NONCE, mac=VECTOR_MAC)


def test_each_field_changes_the_mac() -> None:
    base = ("node-17", "boot-1", "journal-1", "gw-3", 1796200000, VECTOR_NONCE)
    macs = {prove(VECTOR_KEY, *base).mac}
    for i in range(len(base)):
        changed = list(base)
        changed[i] = changed[i] + 1 if isinstance(changed[i], int) else f"{changed[i]}x"
        macs.add(prove(VECTOR_KEY, *changed).mac)  # type: ignore[arg-type]
    assert len(macs) == len(base) + 1


def test_a_fresh_nonce_each_time() -> None:
    first = prove(VECTOR_KEY, "n", "b", "j", "g", 1)
    assert first.nonce != prove(VECTOR_KEY, "n", "b", "j", "g", 1).nonce


@pytest.mark.parametrize(
    "fields",
    [
        {"at": 1, "nonce": "short", "mac": VECTOR_MAC},
        {"at": 1, "nonce": "x" * 65, "mac": VECTOR_MAC},
        {"at": 1, "nonce": "with space in it!", "mac": VECTOR_MAC},
        {"at": 1, "nonce": VECTOR_NONCE, "mac": VECTOR_MAC.upper()},
        {"at": -1, "nonce": VECTOR_NONCE, "mac": VECTOR_MAC},
        {"at": "1", "nonce": VECTOR_NONCE, "mac": VECTOR_MAC},
    ],
)
def test_a_malformed_proof_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        HelloProof.model_validate(fields)
