"""A worker process's heap: how its garbage collector runs (`settle`, once its start-up
is done), the C allocator's free memory handed back every minute (`release`), and
snapshots of what it holds, for finding what grows (`snapshots`, `growth`).

A worker holds a large heap from its start for as long as it runs (modules, pydantic's
schemas, OpenTelemetry, its settings) and makes, for each fact, a few container objects
that live until the fact is settled. With CPython's default thresholds (700, 10, 10) the
collector ran about 760 times for 50,000 facts and its full collections walked the whole
heap each time: 12 % of a worker's CPU in `bcw bench runtime` (`docs/benchmarks.md`).
`settle` moves what exists after start-up out of the collector's sight (`gc.freeze`: it
lives as long as the process anyway) and collects young objects after `YOUNG` new ones
instead of 700 — 0.6 µs a fact instead of 6. Reference counting frees nearly all garbage
at once either way; only garbage in cycles waits for the next collection.

A process whose memory grows over hours is traced with `BCW_HEAP_SNAPSHOTS`: a snapshot
every `BCW_HEAP_SNAPSHOT_EVERY`, two of which `bcw heap diff` compares — the places, by
stack, holding more than before (`bcw bench soak --heap` does it for every worker).
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import pickle
import sysconfig
import threading
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from workers.runtime.base.errors import SettingError

log = logging.getLogger(__name__)

#: container objects allocated (less those freed) between two collections of the youngest
#: generation; the older generations keep CPython's thresholds
YOUNG = 20_000


def settle() -> None:
    """Freeze what the process holds after its start-up, and collect young objects less
    often (`YOUNG`). Call once, before the work begins."""
    gc.collect()  # what start-up left as garbage is not frozen with the rest
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)


#: how often a worker process hands the C allocator's free memory back (`release`)
RELEASE_SECONDS = 60.0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return cast(Callable[[int], int], trim)


_TRIM = _malloc_trim()


def release() -> bool:
    """Hand what glibc's allocator holds free back to the system (`malloc_trim(0)`: free
    pages anywhere in its arenas, not only at the top); False where there is no glibc.

    What `bcw bench soak` found growing after its warm-up was not Python's objects (the
    traced heap stayed flat) but glibc's main arena: memory freed inside it — message
    bodies and other blocks over 512 bytes, which Python takes from `malloc` — stays
    resident until the top of the arena is free, so each new high-water mark of the
    process's work raised its RSS for good (one worker's arena held 19.2 MB for 14.0 MB
    in use). A few milliseconds a minute keep RSS at what is in use."""
    return _TRIM is not None and bool(_TRIM(0))


#: how deep a traced allocation's stack is kept: enough to see which of our lines called
#: into a library, at about 8 x 16 bytes more per live allocation
FRAMES = 8
_SUFFIX = ".tracemalloc"


def snapshots(directory: Path, every: float) -> threading.Thread:
    """Trace this process's allocations (`tracemalloc`) and write a snapshot into
    `directory` every `every` seconds, as `heap-<pid>-<seconds since start>.tracemalloc`.

    For finding what grows in a long run (`bcw heap diff` compares two of them); tracing
    costs each allocation a few hundred nanoseconds and its stack's memory, so it is off
    unless `BCW_HEAP_SNAPSHOTS` names a directory. A daemon thread: it stops with the
    process, and a snapshot is written under a temporary name, then renamed — a reader
    never sees half of one; one that cannot be written is logged, and the next tried.
    Raises SettingError when `directory` cannot be made or written to."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / ".written").touch()
    except OSError as error:
        reason = error.strerror or str(error)
        raise SettingError("BCW_HEAP_SNAPSHOTS", f"cannot write to {directory}: {reason}") from None
    if not tracemalloc.is_tracing():
        tracemalloc.start(FRAMES)
    started = time.monotonic()
    pid = os.getpid()

    def write() -> None:
        while True:
            time.sleep(every)
            path = directory / f"heap-{pid}-{time.monotonic() - started:012.3f}{_SUFFIX}"
            part = path.with_suffix(".part")
            try:
                tracemalloc.take_snapshot().dump(str(part))
                part.rename(path)
            except OSError as error:  # a full disk, the directory gone: tried again later
                log.warning("heap snapshot %s not written: %s", path.name, error)

    thread = threading.Thread(target=write, name="heap-snapshots", daemon=True)
    thread.start()
    return thread


def snapshot_files(directory: Path) -> dict[int, list[Path]]:
    """The snapshots in `directory`, by process id, each process's in time order."""
    found: dict[int, list[Path]] = {}
    for path in sorted(directory.glob(f"heap-*{_SUFFIX}")):
        _, pid, age = path.stem.split("-", 2)
        if pid.isdigit() and age.replace(".", "", 1).isdigit():  # not another's file
            found.setdefault(int(pid), []).append(path)
    return found


def snapshot_age(path: Path) -> float:
    """Seconds from its process's start to a snapshot, from its name."""
    return float(path.stem.rsplit("-", 1)[1])


@dataclass(frozen=True)
class Growth:
    """One place that holds more memory in a later snapshot than in an earlier one."""

    where: str  # file:line of the innermost frame outside the libraries (else of any)
    size_diff: int  # bytes
    count_diff: int  # live allocations
    size: int  # bytes held at the later snapshot
    stack: tuple[str, ...]  # file:line, outermost first


def growth(before: Path, after: Path, top: int = 10) -> tuple[int, list[Growth]]:
    """What grew from snapshot `before` to `after`: (the change of all traced bytes, the
    `top` places by bytes gained). Allocations are grouped by their stack; each group is
    named by its innermost frame outside the libraries (this project's, or the program's):
    where the memory's owner usually is."""
    ignored = [
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
        tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
        tracemalloc.Filter(False, "<unknown>"),
    ]
    old, new = (_load(path).filter_traces(ignored) for path in (before, after))
    stats = new.compare_to(old, "traceback")
    total = sum(stat.size_diff for stat in stats)
    grown = sorted((s for s in stats if s.size_diff > 0), key=lambda s: -s.size_diff)
    return total, [_growth(stat) for stat in grown[:top]]


def _load(path: Path) -> tracemalloc.Snapshot:
    """A snapshot `snapshots` wrote (a pickle: read only files of your own processes).
    Raises OSError, or ValueError for a file that holds no snapshot."""
    try:
        snapshot = tracemalloc.Snapshot.load(str(path))
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as error:
        reason = str(error) or type(error).__name__
        raise ValueError(f"{path.name} is not a heap snapshot ({reason})") from None
    if not isinstance(snapshot, tracemalloc.Snapshot):
        raise ValueError(f"{path.name} is not a heap snapshot")
    return snapshot


def _growth(stat: tracemalloc.StatisticDiff) -> Growth:
    frames = [f"{frame.filename}:{frame.lineno}" for frame in stat.traceback]  # oldest first
    ours = [f for f in frames if not _in_library(f)]
    return Growth(
        where=_short((ours or frames)[-1]),
        size_diff=stat.size_diff,
        count_diff=stat.count_diff,
        size=stat.size,
        stack=tuple(_short(f) for f in frames),
    )


def _in_library(location: str) -> bool:
    """Whether a frame is in an installed package or the standard library."""
    return f"site-packages{os.sep}" in location or location.startswith((_STDLIB, "<"))


def _short(location: str) -> str:
    """A frame's file named from its package (`workers/…`, `asyncpg/…`, `asyncio/…`)."""
    for marker in (f"site-packages{os.sep}", f"{_ROOT}{os.sep}"):
        if marker in location:
            return location.rsplit(marker, 1)[1]
    _, lib, rest = location.partition(f"{os.sep}lib{os.sep}python")
    return rest.split(os.sep, 1)[-1] if lib else location


_ROOT = str(Path(__file__).resolve().parents[3])
_STDLIB = sysconfig.get_paths()["stdlib"]
