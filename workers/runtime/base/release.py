"""The running release: the installed distribution's version, for `--version`, the
build-info metric and the traces' `service.version`."""

from __future__ import annotations

from importlib import metadata

from packaging.version import InvalidVersion, Version


def release() -> str:
    """The installed bc-workers version, or "unknown" when run from a bare checkout."""
    try:
        return metadata.version("bc-workers")
    except metadata.PackageNotFoundError:  # pragma: no cover - a bare checkout
        return "unknown"


def parse(version: str | None) -> Version | None:
    """A release's version as PEP 440 reads it (`packaging`): `0.4.0`, `v2.14.0-RC.1`
    (a pre-release of 2.14.0), `0.5.0rc1` (before `0.5.0`, never equal to it),
    `0.5.0+local`; None for text that is no version. Pure: the one reader of versions,
    ours and nats-server's."""
    if not version:
        return None
    try:
        return Version(version)
    except InvalidVersion:
        return None
