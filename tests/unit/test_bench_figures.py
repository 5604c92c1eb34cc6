"""The figures the benches print that are computed, not measured."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import REGISTRY
from schemas.facts import Liveness, node_hash
from schemas.subjects import Subjects
from tests.factories import make_fact
from workers.bench.costs import CpuSpent, ceiling
from workers.bench.herd import cores_for
from workers.bench.soak import Sample, figures_of, levels, problems, slope_per_hour
from workers.bench.steady.figures import (
    Minute,
    Starved,
    growth_percent,
    percentile,
    summarize,
    warm_minute,
)
from workers.bench.steady.figures import problems as steady_problems
from workers.bench.steady.fleet import HEADERS, HEARTBEAT_MS, Gateway, silenced
from workers.bench.steady.sightread import SightRead
from workers.demo.run import kept_up
from workers.embedded.servers import EmbeddedNats, EmbeddedPostgres
from workers.gateway.facts import MAX_FLUSH_BYTES, entry_bytes, range_bits, range_cut


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


def test_the_soak_slope_is_least_squares_in_mib_per_hour() -> None:
    # 1 MiB more every 10 minutes is 6 MiB an hour, wherever it starts
    assert slope_per_hour([(600.0 * i, 70.0 + i) for i in range(5)]) == pytest.approx(6.0)
    # up and back down again: no slope
    assert slope_per_hour([(0.0, 71.0), (60.0, 71.4), (120.0, 71.4), (180.0, 71.0)]) == 0.0
    # shrinking is negative
    assert slope_per_hour([(0.0, 80.0), (3600.0, 78.0)]) == pytest.approx(-2.0)
    # one time, or none, says nothing
    assert slope_per_hour([(5.0, 70.0), (5.0, 90.0)]) == 0.0
    assert slope_per_hour([]) == 0.0


def _sample(at: float, rss: float, fds: int = 12) -> Sample:
    return Sample(at=at, rss_mib=rss, fds=fds, postgres=4, nats=1)


def test_a_soaked_process_figures_measure_the_slope_after_the_warm_up_only() -> None:
    samples = [_sample(0, 50.0), _sample(300, 60.0), _sample(600, 70.0), _sample(1800, 70.0, 13)]
    logged = Counter({"warning": 3, "error": 1, "critical": 1, "unparsed": 2, "info": 9})
    figures = figures_of("replay", samples, warmup=600, logged=logged)
    assert (figures.rss_start, figures.rss_warm, figures.rss_end) == (50.0, 70.0, 70.0)
    assert figures.slope == 0.0  # the growth before the warm-up does not count
    assert figures.fds == (12, 13) and figures.postgres == (4, 4) and figures.nats == (1, 1)
    assert (figures.warnings, figures.errors) == (3, 4)
    # a warm-up longer than the run: the last reading stands for it
    assert figures_of("replay", samples, warmup=3600, logged=Counter()).rss_warm == 70.0


def test_a_soak_fails_on_a_slope_above_the_bound_or_any_dead_letter() -> None:
    flat = figures_of("labeler", [_sample(0, 50), _sample(3600, 52)], 0, Counter())
    growing = figures_of("liveness", [_sample(0, 50), _sample(3600, 60)], 0, Counter())
    assert problems([flat], dead_letters=0, max_slope=5) == []
    assert problems([flat, growing], dead_letters=0, max_slope=5) == [
        "liveness: memory grew +10.0 MiB/h after the warm-up (bound 5)"
    ]
    assert problems([flat], dead_letters=2, max_slope=5) == ["2 message(s) dead-lettered"]


def test_a_worker_log_is_counted_by_level(tmp_path: Path) -> None:
    log = tmp_path / "quarantine.log"
    log.write_text(
        '{"level": "warning", "message": "a"}\n{"level": "error", "message": "b"}\n'
        '{"level": "warning", "message": "c"}\nTraceback (most recent call last):\n\n'
    )
    assert levels(log) == Counter({"warning": 2, "error": 1, "unparsed": 1})
    assert levels(tmp_path / "missing.log") == Counter()


def test_the_demo_says_what_it_keeps_up(tmp_path: Path) -> None:
    nats, postgres = (
        EmbeddedNats(tmp_path / "n", port=4222),
        EmbeddedPostgres(tmp_path / "p", port=5432),
    )
    lines = kept_up(nats, postgres, 4711).splitlines()
    assert lines[1].split() == ["NATS", "(JetStream)", "nats://127.0.0.1:4222", "pid", "?"]
    assert lines[2].split()[:2] == ["PostgreSQL", "postgresql://postgres@127.0.0.1:5432/postgres"]
    assert "labeler, liveness, quarantine, recorder, replay, in this process, pid 4711" in lines[3]
    assert lines[4] == (
        "export BCW_NATS_URL=nats://127.0.0.1:4222 "
        "BCW_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres"
    )


def test_the_cpu_ratios_line_reads_the_costs_against_the_floor() -> None:
    from workers.bench.costs import cpu_ratios

    line = cpu_ratios({"a": 115e-6, "a1": 114e-6, "b": 49e-6, "c": 581e-6})
    assert line == "cpu a/b = 2.35   a'/b = 2.33   (target <= 1.5 each)"


def test_the_parts_line_takes_the_runtime_apart() -> None:
    from workers.bench.costs import what_parts_cost

    per_fact = {"a1i": 105e-6, "a1": 95e-6, "a1n": 45e-6, "b": 47e-6}
    assert what_parts_cost(per_fact) == (
        "parts of (a') per fact: a published message 50.0 µs; the rest 0.96 of (b); "
        "an inbox would add 10.0 µs"
    )


def test_the_cost_table_takes_medians_per_fact_and_the_ceiling_they_allow() -> None:
    from workers.bench.costs import CpuSpent, cost_rows

    spent = {  # 1,000 facts; the middle round decides
        "a": [
            CpuSpent(0.05, 0.01, 0.02, 0.02),
            CpuSpent(0.06, 0.01, 0.02, 0.02),
            CpuSpent(0.09, 0.03, 0.05, 0.05),
        ],
        "b": [CpuSpent(0.05, 0.0, 0.01, 0.01)],
    }
    header, rows, totals = cost_rows(spent, 1000, 10_000.0, [("a", "(a)"), ("b", "(b)")], 2)
    assert header[0] == "pipeline" and header[-1] == "vs (b)"
    assert rows[0][:6] == ("(a)", "60", "10", "20", "20", "110")
    assert rows[1][:6] == ("(b)", "50", "0", "10", "10", "70")
    assert totals == pytest.approx({"a": 110e-6, "b": 70e-6})
    # one core for its 60 µs process (2 cores for 110 µs in all would allow 18,182)
    assert rows[0][6:] == ("16,667", "1.67")


def test_the_cpu_ratios_per_round_compare_each_round_with_its_own_floor() -> None:
    from workers.bench.costs import CpuSpent, cpu_ratios_per_round

    def spent(*totals: float) -> list[CpuSpent]:
        return [CpuSpent(t, 0.0, 0.0, 0.0) for t in totals]

    rounds = {"a": spent(3.0, 1.6), "a1": spent(2.8, 1.5), "b": spent(2.0, 1.0)}
    assert cpu_ratios_per_round(rounds) == (
        "cpu a/b, a'/b per round (same round): 1.50/1.40, 1.60/1.50"
    )


# -- bcw bench steady ------------------------------------------------------------------------
def test_the_steady_bench_flushes_what_the_reference_gateway_would() -> None:
    """The spliced bodies are byte for byte the reference gateway's facts of those entries,
    cut by the ranges it cuts them by; the silenced nodes leave the flushes."""
    gateway = Gateway(3, nodes=20_000, gateways=4, subjects=Subjects("bench"))
    flushed = gateway.flush()
    facts = [REGISTRY.decode(dict(HEADERS), body) for _, body in flushed]
    assert all(isinstance(f, Liveness) for f in facts)
    entries = [e for f in facts for e in f.entries]  # type: ignore[attr-defined]
    ids = [f"node-{i}" for i in range(3, 20_001, 4)]
    assert [e["node_id"] for e in entries] == sorted(ids, key=node_hash)
    assert all(
        e["epoch"] == 1 and 0 <= e["age_ms"] < HEARTBEAT_MS and e.get("node_load") for e in entries
    )
    sizes = [entry_bytes(e) for e in entries]
    hashes = [node_hash(e["node_id"]) for e in entries]
    cut = range_cut(hashes, sizes, range_bits(5_000, 0))
    assert [(f.range_start, f.range_end, len(f.entries)) for f in facts] == [  # type: ignore[attr-defined]
        (start, end, hi - lo) for start, end, lo, hi in cut
    ]
    assert len(cut) == 8
    for (fact_id, body), fact in zip(flushed, facts, strict=True):
        assert fact.fact_id == fact_id
        assert REGISTRY.encode(fact)[0] == body
        assert len(body) < MAX_FLUSH_BYTES + 1024
    quiet = gateway.silence(0.01, gateways=4)
    assert len(quiet) == 50
    again = [
        e["node_id"] for _, b in gateway.flush() for e in REGISTRY.decode(dict(HEADERS), b).entries
    ]  # type: ignore[attr-defined]
    assert len(again) == 4_950 and not set(again) & set(quiet)


@given(st.integers(1, 200), st.sampled_from([0.0, 0.01, 0.05, 0.5]))
def test_the_silenced_share_is_the_same_on_every_gateway(gateways: int, share: float) -> None:
    per_gateway = 100
    quiet = Counter(
        i % gateways for i in range(1, gateways * per_gateway + 1) if silenced(i, gateways, share)
    )
    for g in range(gateways):
        assert abs(quiet[g] - share * per_gateway) <= 1


def _minute(m: int, lags: list[float], size: int, rss: float = 100.0, **kw: object) -> Minute:
    base: dict[str, object] = {
        "minute": m,
        "lags": lags,
        "sweep_max": 0.2,
        "blind": 0,
        "expected": 0,
        "wrong": 0,
        "cores": {"postgres": 0.5, "liveness-1": 0.25},
        "sizes": {"node_sessions": size},
        "rss": {"liveness-1": rss, "postgres": 100.0 * m},
    }
    return Minute(**{**base, **kw})  # type: ignore[arg-type]


def test_the_steady_summary_reads_as_the_issue_asks() -> None:
    minutes = [_minute(m, [0.5] * 99 + [3.0], 1000) for m in range(1, 10)]
    minutes.append(_minute(10, [0.5, 12.0], 1050, expected=50, sweep_max=0.4))
    summary = summarize(1_000_000, minutes, silenced_in_time=50, silenced=50)
    assert summary.last_line() == (
        "held 1000000 nodes for 10 min: flush lag p99 3.00 s, sweep max 0.40 s, blind 0, "
        "wrong disconnects 0, silenced disconnected 50 of 50, size growth 5.0 % after "
        "warm-up, cpu 0.75 cores, max lag 12.00 s, held for lag 0 sessions"
    )
    assert steady_problems(summary) == []  # the servers' memory is not judged, the workers' is
    assert "flush lag p50 0.50 p99 0.50 max 3.00 s (100 facts)" in minutes[0].line()


def test_the_last_sight_read_is_a_line_of_its_own_beside_the_last() -> None:
    read = SightRead(4.2, 1_000_000, 0, tuple(t / 1000 for t in (0.8, 1.0, 1.2, 9.0)))
    assert read.line() == (
        "last sight read (node_last_seen): whole fleet 4.20 s (1,000,000 sessions, 0 connected "
        "seen before the stale threshold), one node p50 1.00 ms max 9.00 ms (4 lookups)"
    )
    assert not read.line().startswith("held ")  # the summary stays the run's last line


def test_a_starved_run_is_held_to_what_overload_must_not_do() -> None:
    """Starved on purpose: its lag, sweeps and blindness are what the starving makes, not
    bounds; no gateway left blind, none wrongly disconnected, every silenced node gone once
    it could be judged — and a controller far behind that said nothing is a failure."""
    minutes = [_minute(m, [90.0], 1000, blind=80) for m in range(1, 10)]
    minutes.append(_minute(10, [0.5, 258.0], 1000, expected=50, blind=80, sweep_max=21.0))
    starved = Starved(fraction=0.15, seconds=150, blind_during=80, blind_at_end=0, recovered=42.4)
    summary = summarize(1_000_000, minutes, 50, 50, held_for_lag=400_000, starved=starved)
    assert summary.last_line().endswith(
        "cpu 0.75 cores, max lag 258.00 s, held for lag 400000 sessions; starved to 15% for "
        "150 s: blind 80 during, 0 at the end, recovered in 42 s"
    )
    assert steady_problems(summary) == []
    quiet = dataclasses.replace(starved, blind_during=0, blind_at_end=3, recovered=None)
    said = steady_problems(summarize(1_000_000, minutes, 40, 50, starved=quiet))
    assert len(said) == 3, said
    assert any("3 gateway(s) still blind" in s for s in said)
    assert any("fell 258 s behind and said no gateway blind" in s for s in said)
    assert any("10 silenced node(s)" in s for s in said)


def test_every_broken_bound_is_said() -> None:
    minutes = [
        _minute(m, [20.0], 1000 + 200 * m, rss=100.0 + m, blind=1, wrong=2) for m in range(1, 26)
    ]
    minutes[-1] = _minute(25, [20.0], 6000, rss=200.0, blind=1, wrong=2, sweep_max=1.5)
    said = steady_problems(summarize(100, minutes, silenced_in_time=3, silenced=5))
    assert len(said) == 7, said
    assert any("flush lag p99 20.00 s" in s for s in said)
    assert any("sweep max 1.50 s" in s for s in said)
    assert any("2 silenced node(s)" in s for s in said)
    assert any(s.startswith("liveness-1 RSS grows") for s in said)


def test_a_memory_step_in_a_short_run_is_not_read_as_a_slope() -> None:
    """5 minutes whose RSS steps by 4 MiB at minute 3 (a 100,000-node run's) read as
    +57 MiB/h: not judged, and said so. 25 minutes after warm-up are judged: the same step
    made during warm-up holds, a climb of 6 MiB/h does not."""
    rss = [74.0, 74.0, 78.0, 77.0, 77.0]
    short = summarize(100, [_minute(m, [0.5], 1000, rss=r) for m, r in enumerate(rss, 1)], 0, 0)
    assert steady_problems(short) == [] and short.rss_slopes == {}
    assert short.notes == (
        "memory slopes not judged: 3 min after warm-up, 20 needed to tell a step from a slope",
    )
    stepped = [74.0] * 4 + [78.0] * 26
    held = summarize(100, [_minute(m, [0.5], 1000, rss=r) for m, r in enumerate(stepped, 1)], 0, 0)
    assert steady_problems(held) == [] and held.notes == ()
    climbing = [100.0 + m / 10 for m in range(1, 31)]
    grew = summarize(100, [_minute(m, [0.5], 1000, rss=r) for m, r in enumerate(climbing, 1)], 0, 0)
    assert steady_problems(grew) == ["liveness-1 RSS grows +6.0 MiB/h after warm-up"]


def test_size_growth_is_against_minute_five_or_the_middle_of_a_short_run() -> None:
    assert warm_minute(30) == 5 == warm_minute(6) and warm_minute(4) == 2 and warm_minute(1) == 1
    assert growth_percent([100, 100, 100, 100, 200, 220, 210], 7) == pytest.approx(5.0)
    assert growth_percent([100, 150, 150], 3) == pytest.approx(50.0)
    assert percentile([], 0.5) != percentile([], 0.5)  # NaN: nothing measured
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0 and percentile([1.0, 2.0], 0.99) == 2.0


_BENCH_KILLED = """
import asyncio, sys
from workers.bench.common import spawn_workers

async def main():
    procs = await spawn_workers({}, command=(sys.executable, "-c", "import time; time.sleep(60)", "x"), names=["relay"])
    print(procs["relay"].pid, flush=True)
    await asyncio.sleep(60)

asyncio.run(main())
"""


def test_a_bench_killed_leaves_no_worker_running() -> None:
    """A bench's workers die with it, even when it is killed with SIGKILL (no `finally`
    of its own runs)."""
    with subprocess.Popen(
        [sys.executable, "-c", _BENCH_KILLED], stdout=subprocess.PIPE, text=True
    ) as bench:
        assert bench.stdout is not None
        worker = int(bench.stdout.readline())
        assert _alive(worker)
        bench.kill()
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    try:  # dead, or a zombie its new parent has not reaped yet
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_the_range_design_cuts_each_gateway_into_ranges_of_node_hashes() -> None:
    """`bcw bench flush`'s range facts: each gateway's entries once each, as they came, in
    the range of their hash, the ranges covering every hash; the hash is md5's first 4
    bytes, signed (what the bench's SQL function computes: it exits 1 when they disagree)."""
    import hashlib

    from workers.bench.steady.flushcost import RANGES, node_hash, range_facts

    unsigned = int(hashlib.md5(b"node-1").hexdigest()[:8], 16)
    assert node_hash("node-1") == (unsigned - 2**32 if unsigned >= 2**31 else unsigned)
    load = {
        "load_average": 0.5,
        "memory_available_bytes": 8,
        "running_commands": 0,
        "pending_events": 1,
    }
    entries = [
        {
            "node_id": f"node-{i}",
            "epoch": 1 + i % 3,
            "age_ms": i,
            "credits": {"a": i},
            "load": 0.5,
            "node_load": load,
        }
        for i in range(200)
    ]
    facts = [
        make_fact("liveness", gateway_id="gw-0", entries=entries[:120]),
        make_fact("liveness", gateway_id="gw-1", entries=entries[120:]),
    ]
    cut = range_facts(facts)  # type: ignore[arg-type]
    assert len(cut) == 2 * RANGES
    assert [f[2] for f in cut] == ["gw-0"] * RANGES + ["gw-1"] * RANGES
    assert cut[0][3] == -(2**31) and cut[RANGES - 1][4] == 2**31 - 1
    for ids, epochs, _, lo, hi, text in cut:
        assert all(lo <= node_hash(n) <= hi for n in ids)
        stored = json.loads(text)
        assert stored == [entries[int(n.removeprefix("node-"))] for n in ids]
        assert epochs == [e["epoch"] for e in stored]
    assert sorted(n for f in cut for n in f[0]) == sorted(e["node_id"] for e in entries)
