"""How a worker process's garbage collector runs (`settle`, once its start-up is done).

A worker holds a large heap from its start for as long as it runs (modules, pydantic's
schemas, OpenTelemetry, its settings) and makes, for each fact, a few container objects
that live until the fact is settled. With CPython's default thresholds (700, 10, 10) the
collector ran about 760 times for 50,000 facts and its full collections walked the whole
heap each time: 12 % of a worker's CPU in `bcw bench runtime` (`docs/benchmarks.md`).
`settle` moves what exists after start-up out of the collector's sight (`gc.freeze`: it
lives as long as the process anyway) and collects young objects after `YOUNG` new ones
instead of 700 — 0.6 µs a fact instead of 6. Reference counting frees nearly all garbage
at once either way; only garbage in cycles waits for the next collection.
"""

from __future__ import annotations

import gc

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
