"""What a run that did not finish in time was waiting for: printed by `bcw demo` when its
scenario overruns, so that a hang seen once (on a loaded CI machine, say) names itself.

Three views, each a few lines: this process's tasks grouped by where they wait (the
innermost frames of this project's code), the workers' consumers (what the facts
stream still holds for each), and PostgreSQL's busy backends (what each waits on).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import asyncpg
from nats.js import JetStreamContext

ROOT = Path(__file__).resolve().parents[2]

BUSY_BACKENDS = """
SELECT pid, state, coalesce(wait_event_type || ':' || wait_event, '') AS waits,
       extract(epoch FROM clock_timestamp() - xact_start)::int AS tx_seconds,
       left(regexp_replace(query, '\\s+', ' ', 'g'), 100) AS query
  FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'
 ORDER BY xact_start NULLS LAST
"""


def _frames(task: asyncio.Task[Any]) -> Iterator[FrameType]:
    """The frames `task` waits in, outermost first: its coroutine, then each it awaits
    (`Task.get_stack` gives only the outermost of a suspended coroutine)."""
    awaited: Any = task.get_coro()
    while awaited is not None:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:
            return
        yield frame
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)


def _ours(path: Path) -> bool:
    return path.is_relative_to(ROOT) and "site-packages" not in path.parts


def where(task: asyncio.Task[Any], depth: int = 3) -> tuple[str, ...]:
    """Where `task` waits: the innermost `depth` frames of this project's code, and the
    library frame it waits in beyond them, if any; () if none of its frames is ours."""
    ours, beyond = [], ""
    for frame in _frames(task):
        path = Path(frame.f_code.co_filename)
        if _ours(path):
            ours.append(f"{path.relative_to(ROOT)}:{frame.f_lineno} {frame.f_code.co_name}")
            beyond = ""
        elif not beyond:
            beyond = f"{path.name}:{frame.f_lineno} {frame.f_code.co_name}"
    if not ours:
        return ()
    return (*ours[-depth:], beyond) if beyond else tuple(ours[-depth:])


def task_lines(tasks: Iterable[asyncio.Task[Any]], top: int = 15) -> list[str]:
    """Tasks grouped by where they wait, the most common first (a fleet's thousand daemons
    waiting in the same place are one line); those in library code only, counted."""
    places = Counter(where(t) for t in tasks if not t.done())
    outside = places.pop((), 0)
    lines = [f"  {count:>5} tasks: {' → '.join(place)}" for place, count in places.most_common(top)]
    return [*lines, f"  {outside:>5} tasks: in library code only (connections' own loops)"]


async def report(pool: asyncpg.Pool, js: JetStreamContext, stream: str) -> list[str]:
    """The three views; a view that cannot be read says why instead."""
    lines = ["tasks of this process, by where they wait:"]
    lines += task_lines(asyncio.all_tasks() - {asyncio.current_task()})
    lines.append(f"consumers of {stream}: pending / waiting for an ack / redelivered")
    try:
        for info in await asyncio.wait_for(js._jsm.consumers_info(stream), 5):
            lines.append(
                f"  {info.name:<24} {info.num_pending:>7} {info.num_ack_pending:>7}"
                f" {info.num_redelivered:>7}"
            )
    except Exception as error:  # the report is best effort: say what could not be read
        lines.append(f"  not read: {error!r}")
    lines.append("PostgreSQL backends not idle: pid state wait tx-seconds query")
    try:
        async with asyncio.timeout(5):
            async with pool.acquire() as conn:
                rows = await conn.fetch(BUSY_BACKENDS)
        for r in rows:
            lines.append(
                f"  {r['pid']} {r['state']} {r['waits'] or '-'} {r['tx_seconds']} {r['query']}"
            )
    except Exception as error:
        lines.append(f"  not read: {error!r}")
    return lines


async def cancel(task: asyncio.Task[object]) -> None:
    """Cancel `task` and wait for it to end (whatever it raises on the way)."""
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
