"""The bus principals' nkey seeds (`bcw auth nats`): each made once and kept, its file
its owner's alone; and the public key a seed logs in with."""

from __future__ import annotations

import os
from pathlib import Path

import nkeys


class SeedFileError(ValueError):
    """An existing seed file that must not be reused (its mode, its owner, its content)."""


def seed_of(path: Path) -> bytes:
    """The principal's seed: kept when its file exists (re-running adds gateways without
    changing anybody's key) — only if that file is this user's and nobody else may read or
    write it (ValueError otherwise) — else a new one written readable by its owner only."""
    if path.exists():
        mode = path.stat()
        if mode.st_mode & 0o077:
            raise SeedFileError(
                f"{path} is readable or writable by others (mode {mode.st_mode & 0o777:o}): "
                "a seed must be its owner's alone (chmod 600), or remove it for a new one"
            )
        if mode.st_uid != os.geteuid():
            raise SeedFileError(f"{path} belongs to another user (uid {mode.st_uid}): not reused")
        seed = path.read_bytes().strip()
        try:
            nkeys.from_seed(bytearray(seed))
        except Exception:
            raise SeedFileError(f"{path} holds no nkey seed") from None
        return seed
    seed = bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(seed + b"\n")
    return seed


def public_key(seed: bytes) -> str:
    pair = nkeys.from_seed(bytearray(seed))
    try:
        return bytes(pair.public_key).decode()
    finally:
        pair.wipe()
