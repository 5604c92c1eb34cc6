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


def parse(version: str | None) -> tuple[int, ...] | None:
    """`0.4.0` → (0, 4, 0); a version with a suffix (`0.5.0rc1`, `0.5.0+local`,
    `2.14.0-RC.1`) by its numbers, a tag's `v` left out; None when it does not start with
    `N.N`. Pure: the one reader of versions, ours and nats-server's."""
    if not version:
        return None
    numbers = []
    for part in version.removeprefix("v").split("."):
        digits = part[: len(part) - len(part.lstrip("0123456789"))]
        if not digits:
            break
        numbers.append(int(digits))
        if len(digits) < len(part):  # a suffix ends the numbers
            break
    return tuple(numbers) if len(numbers) >= 2 else None
