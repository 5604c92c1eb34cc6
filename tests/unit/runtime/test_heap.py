"""A worker process's heap (`workers.runtime.base.heap`): its collector settled after
start-up, and the snapshots that find what grows (`BCW_HEAP_SNAPSHOTS`, `bcw heap diff`).
Each process under test is a child of its own: tracing allocations in the test process
would slow every other test it runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.runtime.base import heap

_SETTLED_WORKER = """
import gc, json, weakref
import workers.runtime.process as process
from workers.cli.running import run_workers
from workers.runtime.base import heap
from workers.settings import Settings

before = gc.get_freeze_count()
seen = {}

async def run_process(settings, workers, stopping):
    seen["frozen"], seen["young"] = gc.get_freeze_count(), gc.get_threshold()[0]
    class Cycle: pass
    cycle = Cycle(); cycle.me = cycle
    gone = weakref.ref(cycle)
    del cycle
    junk = [[] for _ in range(2 * heap.YOUNG)]  # young objects enough for a collection
    seen["cycle collected"] = gone() is None

process.run_process = run_process
run_workers(Settings(), [])
print(json.dumps({"before": before, **seen}))
"""


def test_a_worker_process_freezes_its_start_up_heap_and_still_collects_cycles() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SETTLED_WORKER], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["before"] == 0 and seen["frozen"] > 10_000  # modules, schemas, settings
    assert seen["young"] == heap.YOUNG
    assert seen["cycle collected"]


_GROWER = """
import asyncio, sys
from pathlib import Path
import workers.runtime.process as process
from workers.cli.running import run_workers
from workers.settings import Settings

kept = []
snapshots = Path(sys.argv[1])

def grow():
    kept.extend({"n": n, "s": str(n) * 4} for n in range(20_000))  # GROWS HERE

async def taken(n):
    while len(list(snapshots.glob("*.tracemalloc"))) < n:
        await asyncio.sleep(0.05)

async def run_process(settings, workers, stopping):
    await taken(1)
    grow()
    await taken(3)

process.run_process = run_process
run_workers(Settings(heap_snapshots=str(snapshots), heap_snapshot_every=0.3), [])
"""


def test_heap_snapshots_name_the_line_that_grew_between_two_of_them(tmp_path: Path) -> None:
    script, snapshots = tmp_path / "grower.py", tmp_path / "heap"
    script.write_text(_GROWER)
    line = _GROWER.splitlines().index(next(s for s in _GROWER.splitlines() if "GROWS HERE" in s))
    done = subprocess.run(
        [sys.executable, str(script), str(snapshots)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    [(pid, taken)] = heap.snapshot_files(snapshots).items()
    assert pid > 0 and len(taken) >= 3
    ages = [heap.snapshot_age(path) for path in taken]
    assert ages == sorted(ages) and 0.25 < ages[0] < ages[-1]
    # each written whole, then renamed: one the exit cut short is left as .part, unlisted
    assert all(path.suffix == ".tracemalloc" for path in taken)

    total, places = heap.growth(taken[0], taken[-1], top=3)
    assert total > 2_000_000  # 20,000 dicts and strings, kept
    assert places[0].where == f"{script}:{line + 1}"
    assert places[0].size_diff > 1_000_000 and places[0].count_diff >= 20_000
    assert places[0].stack[-1].startswith(str(script))  # outermost first, ours innermost

    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.cli",
            "heap",
            "diff",
            str(taken[0]),
            str(taken[-1]),
            "--top",
            "2",
            "--stacks",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    first, top, *rest = shown.stdout.splitlines()
    assert first.startswith("traced memory +") and taken[0].name in first
    assert top.endswith(f"grower.py:{line + 1}") and "KiB" in top and "blocks" in top
    assert any(f"grower.py:{line + 1}" in frame for frame in rest)  # its stack


@pytest.mark.parametrize(
    "content", [b"", b"not a pickle", b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00K\x01."]
)
def test_bcw_heap_diff_of_what_is_no_snapshot_says_so_in_one_line(
    tmp_path: Path, content: bytes
) -> None:
    bad = tmp_path / "heap-1-00000060.000.tracemalloc"
    bad.write_bytes(content)
    for before, after in ((bad, bad), (tmp_path / "missing.tracemalloc", bad)):
        done = subprocess.run(
            [sys.executable, "-m", "workers.cli", "heap", "diff", str(before), str(after)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1
        assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith("bcw heap diff: cannot read the snapshots: ")
        assert "Traceback" not in done.stderr


def test_snapshot_files_are_grouped_by_process_in_time_order(tmp_path: Path) -> None:
    for name in ("heap-7-00000120.000", "heap-7-00000060.500", "heap-9-00000060.000"):
        (tmp_path / f"{name}.tracemalloc").touch()
    (tmp_path / "heap-7-00000180.000.part").touch()  # being written
    (tmp_path / "notes.txt").touch()
    (tmp_path / "heap-of-mine.tracemalloc").touch()  # not one of ours
    found = heap.snapshot_files(tmp_path)
    assert {pid: [p.name for p in paths] for pid, paths in found.items()} == {
        7: ["heap-7-00000060.500.tracemalloc", "heap-7-00000120.000.tracemalloc"],
        9: ["heap-9-00000060.000.tracemalloc"],
    }
    assert [heap.snapshot_age(p) for p in found[7]] == [60.5, 120.0]


def test_a_frame_is_named_from_its_package() -> None:
    root = Path(heap.__file__).resolve().parents[3]
    assert heap._short(f"{root}/workers/liveness/sweep.py:12") == "workers/liveness/sweep.py:12"
    assert (
        heap._short("/x/.venv/lib/python3.11/site-packages/asyncpg/pool.py:3")
        == "asyncpg/pool.py:3"
    )
    assert heap._short("/usr/lib/python3.11/asyncio/events.py:80") == "asyncio/events.py:80"
    assert heap._short("/tmp/grower.py:5") == "/tmp/grower.py:5"


def test_a_heap_snapshot_directory_that_cannot_be_written_is_named_in_one_line(
    tmp_path: Path,
) -> None:
    """`bcw run` with BCW_HEAP_SNAPSHOTS under a file: one line naming the setting, exit
    2, before it connects to anything."""
    (tmp_path / "file").write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "run", "relay"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "BCW_HEAP_SNAPSHOTS": str(tmp_path / "file" / "heap")},
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"bcw run: BCW_HEAP_SNAPSHOTS: cannot write to {tmp_path}/file/heap: Not a directory"
    ], done.stderr
