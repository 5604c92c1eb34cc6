"""What the upgrade tests share: the previous release, installed (`old`), and a way to
run a `bcw`, this release's or the previous one's."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence

import pytest

from tests.upgrade.release import Release, install, previous_release


@pytest.fixture(scope="module")
def old() -> Release:
    release = previous_release()
    if release is None:
        pytest.skip("CHANGELOG.md lists no release before this version yet")
    install(release)
    return release


async def run_bcw(command: Sequence[str], env: Mapping[str, str], *args: str) -> tuple[int, str]:
    """`command` (a `bcw`) with `args`, `env` over this environment: (its exit code, what
    it printed, errors included)."""
    proc = await asyncio.create_subprocess_exec(
        *command,
        *args,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()
