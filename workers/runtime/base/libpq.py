"""What a libpq URL says, read as asyncpg reads it: the servers it names, and the TLS it
asks for — its `sslmode` and the files it will load (`sslrootcert`, `sslcert`, `sslkey`,
`sslcrl`), each from the URL's parameter, else from the libpq variable (`PGSSLMODE`,
`PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`, `PGSSLCRL`), else from `~/.postgresql/`.

Used by the settings (a file that cannot be read is a setting that can never work: refused
before any connection) and by `bcw config` (which CA it uses). Pure but for `unreadable`,
which looks at the files.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

URL_SETTING = "BCW_DATABASE_URL"
#: libpq's modes, weakest first (asyncpg's `SSLMode`)
MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
#: each TLS file: its libpq variable, its default under ~/.postgresql, whether the mode
#: needs it (`verify-ca` and `verify-full` need a CA), from which mode it is loaded at all
_FILES = {
    "sslrootcert": ("PGSSLROOTCERT", "root.crt", "require"),
    "sslcrl": ("PGSSLCRL", "root.crl", "require"),
    "sslcert": ("PGSSLCERT", "postgresql.crt", "allow"),
    "sslkey": ("PGSSLKEY", "postgresql.key", "allow"),
}


@dataclass(frozen=True)
class TlsFile:
    """A file the TLS of a connection loads: `param` (sslrootcert, …) at `path`, given by
    `origin` — `BCW_DATABASE_URL` (the URL's parameter), the libpq variable, or `default`
    (a file under ~/.postgresql, taken when it exists)."""

    param: str
    path: str
    origin: str

    def said(self) -> str:
        if self.origin == URL_SETTING:
            return f"{URL_SETTING}: its {self.param}={self.path}"
        return f"{self.origin}: {self.path}"


@dataclass(frozen=True)
class Tls:
    mode: str
    mode_origin: str  # BCW_DATABASE_URL, PGSSLMODE or default
    files: tuple[TlsFile, ...]

    @property
    def ca(self) -> TlsFile | None:
        return next((f for f in self.files if f.param == "sslrootcert"), None)

    def said(self) -> str:
        """One line for `bcw config`: the mode and every file, each with where it comes from."""
        parts = [f"sslmode={self.mode} ({self.mode_origin})"]
        parts += [f"{f.param}={f.path} ({f.origin})" for f in self.files]
        if self.mode in ("require", "verify-ca", "verify-full") and self.ca is None:
            parts.append("no CA: the server's certificate is not verified")
        return ", ".join(parts)


def database_hosts(url: str) -> list[tuple[str, int]]:
    """The (host, port) of each server a libpq URL names, in order: one, or several for a
    primary and its standbys (`postgresql://u@h1:5432,h2:5432/db?target_session_attrs=
    read-write`: a client tries each and keeps the one that takes writes). Raises
    ValueError without echoing the URL (it may carry a password)."""
    try:
        parts = urlsplit(url)
    except ValueError as error:
        raise ValueError(f"not a valid URL ({error})") from None
    if parts.scheme not in ("postgresql", "postgres"):
        raise ValueError("must be a postgresql:// URL")
    out = []
    for server in parts.netloc.rpartition("@")[2].split(","):
        if server.startswith("["):  # [IPv6]:port
            host, _, rest = server[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = server.partition(":")
        port = port or "5432"
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("not a valid URL (a port is not a number from 1 to 65535)")
        out.append((host or "localhost", int(port)))
    return out


def tls(
    url: str,
    environ: Mapping[str, str],
    home: Path | None,
    exists: Callable[[str], bool] = lambda _path: False,
) -> Tls:
    """The TLS a connection to `url` uses, as asyncpg resolves it (`connect_utils`): the
    URL's parameter wins over the variable (an empty one counts as given), the variable
    over the default file under `home` (None: no home), taken when it `exists`. Raises
    ValueError for an `sslmode` libpq does not know. Pure."""
    query = {key: values[-1] for key, values in parse_qs(urlsplit(url).query).items()}
    if "sslmode" in query:
        mode, mode_origin = query["sslmode"], URL_SETTING
    elif "PGSSLMODE" in environ:
        mode, mode_origin = environ["PGSSLMODE"], "PGSSLMODE"
    else:
        mode, mode_origin = "prefer", "default"
    if mode not in MODES:
        where = f"{URL_SETTING}: its sslmode" if mode_origin == URL_SETTING else f"{mode_origin}:"
        raise ValueError(f"{where} {mode!r} is not one of {', '.join(MODES)}")
    files = []
    for param, (variable, default, loaded_from) in _FILES.items():
        if MODES.index(mode) < MODES.index(loaded_from):
            continue
        if param in query:
            path, origin = query[param], URL_SETTING
        else:
            path, origin = environ.get(variable, ""), variable
        if not path and home is not None and exists(str(home / ".postgresql" / default)):
            path, origin = str(home / ".postgresql" / default), "default"
        if path:
            files.append(TlsFile(param, path, origin))
    return Tls(mode, mode_origin, tuple(files))


def _readable(path: str) -> bool:
    return Path(path).is_file() and os.access(path, os.R_OK)


def unreadable(settings: Tls, readable: Callable[[str], bool] = _readable) -> str | None:
    """Why the TLS files cannot work, in one line naming the setting, or None: a file given
    that cannot be read, or no CA at all where the mode verifies the server."""
    for file in settings.files:
        if file.param == "sslrootcert" and file.path == "system":  # libpq 16's, not asyncpg's
            return (
                f"{file.said()}: asyncpg does not know `system`; give the CA bundle's file "
                "(e.g. /etc/ssl/certs/ca-certificates.crt)"
            )
        if not readable(file.path):
            what = "is not a readable file" if Path(file.path).exists() else "does not exist"
            return f"{file.said()} {what}"
    verifying = settings.mode in ("verify-ca", "verify-full")
    if verifying and settings.ca is None:
        said = URL_SETTING if settings.mode_origin == "default" else settings.mode_origin
        return (
            f"{said}: sslmode={settings.mode} verifies the server, but no CA file is "
            f"given: add sslrootcert=<file> to the URL or set PGSSLROOTCERT (nor is there a "
            "~/.postgresql/root.crt)"
        )
    return None
