"""The figures the benches print that are computed, not measured."""

from __future__ import annotations

import pytest

from workers.bench.common import CpuSpent, ceiling
from workers.bench.herd import cores_for


def test_cores_for_spreads_the_work_over_the_herd_and_the_time_after_it() -> None:
    # 100,000 Hellos from 20 gateways at 200/s arrive over 25 s; with 30 s after the
    # last one, 110 CPU-seconds fit exactly on 2 cores
    assert cores_for(110.0, 100_000, 20, 200.0, 30.0) == pytest.approx(2.0)
    # the same work admitted twice as fast leaves less time: more cores
    assert cores_for(110.0, 100_000, 20, 400.0, 30.0) == pytest.approx(110.0 / 42.5)
    # nothing to wait for: only the time after the last Hello is left to the work
    assert cores_for(60.0, 0, 20, 200.0, 30.0) == pytest.approx(2.0)


def test_ceiling_is_the_tighter_of_one_core_per_process_and_the_cores_for_all() -> None:
    # one Python process at 200 µs a fact can do 5,000/s, however many cores there are
    assert ceiling([200e-6], [50e-6], cores=64) == pytest.approx(5_000)
    # on 2 cores, 200 + 300 µs of all processes together allow 4,000/s
    assert ceiling([200e-6], [300e-6], cores=2) == pytest.approx(4_000)
    # two processes: the busier one bounds it
    assert ceiling([100e-6, 250e-6], [0.0], cores=8) == pytest.approx(4_000)
    # a process that spent nothing (no relay process) bounds nothing
    assert ceiling([100e-6, 0.0], [100e-6], cores=2) == pytest.approx(10_000)
    assert ceiling([], [], cores=2) == float("inf")


def test_cpu_readings_subtract_part_by_part() -> None:
    later = CpuSpent(process=5.0, children=2.0, postgres=9.0, nats=1.5)
    spent = later - CpuSpent(process=1.0, children=0.5, postgres=4.0, nats=1.0)
    assert spent == CpuSpent(process=4.0, children=1.5, postgres=5.0, nats=0.5)
    assert spent.total == pytest.approx(11.0)
    now = CpuSpent.now()  # this process has run: its own time is there
    assert now.process > 0
