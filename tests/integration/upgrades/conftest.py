"""What the interop tests share: Node.js and the packages of tests/interop."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import pytest

INTEROP = Path(__file__).resolve().parents[2] / "interop"


@pytest.fixture(scope="session")
def node_packages() -> Path:
    """`tests/interop/node_modules`, installed from the lock file (once, whichever test
    process gets here first)."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed: the interop tests need Node.js 18+ and npm")
    with (INTEROP / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        installed = INTEROP / "node_modules" / ".package-lock.json"
        if (
            not installed.exists()
            or installed.stat().st_mtime < (INTEROP / "package-lock.json").stat().st_mtime
        ):
            subprocess.run(
                ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=INTEROP,
                check=True,
                timeout=300,
            )
    return INTEROP
