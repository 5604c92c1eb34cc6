"""The running release: the installed distribution's version, for `--version`, the
build-info metric and the traces' `service.version`."""

from __future__ import annotations

from importlib import metadata


def release() -> str:
    """The installed bc-workers version, or "unknown" when run from a bare checkout."""
    try:
        return metadata.version("bc-workers")
    except metadata.PackageNotFoundError:  # pragma: no cover - a bare checkout
        return "unknown"
