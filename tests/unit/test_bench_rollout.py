"""`bcw bench rollout`'s pure parts: the plan of drains, the seed's back-off, the tally
and its lines."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.bench.rollout import gateways as gws
from workers.bench.rollout import plan, tally
from workers.bench.rollout.daemons import Daemons


@given(st.integers(2, 300), st.data())
def test_every_gateway_is_drained_exactly_once_and_at_most_p_at_a_time(
    gateways: int, data: st.DataObject
) -> None:
    parallel = data.draw(st.integers(1, gateways - 1))
    waves = plan.waves(gateways, parallel)
    assert sorted(g for w in waves for g in w) == list(range(gateways))
    assert all(1 <= len(w) <= parallel for w in waves)
    assert len(waves) == math.ceil(gateways / parallel)


@pytest.mark.parametrize(("gateways", "parallel"), [(1, 1), (4, 0), (4, 4), (4, 5)])
def test_a_plan_that_leaves_no_gateway_up_is_refused(gateways: int, parallel: int) -> None:
    with pytest.raises(ValueError):
        plan.waves(gateways, parallel)


def test_the_back_off_is_the_seeds_full_jitter() -> None:
    assert [plan.back_off_cap(n) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert plan.back_off_cap(10_000) == 60.0
    assert plan.back_off(3, lambda: 0.0) == 0.0
    assert plan.back_off(3, lambda: 0.5) == 4.0
    assert plan.back_off(3, lambda: 0.999) < 8.0


@given(st.integers(0, 10_000), st.integers(1, 300))
def test_commands_are_spread_evenly_and_all_of_them(commands: int, parts: int) -> None:
    shares = plan.spread(commands, parts)
    assert sum(shares) == commands and len(shares) == parts
    assert max(shares) - min(shares) <= 1


def test_a_fleet_that_does_not_fit_while_a_wave_is_away_is_seen() -> None:
    assert plan.capacity_left(1_000_000, 250, 1, 5_000) > 0
    assert plan.capacity_left(20_000, 4, 1, 5_000) < 0


def test_only_the_drains_own_closes_are_expected_disconnects() -> None:
    drained = {"gw-1"}
    assert tally.expected_disconnect("gateway-shutdown", "gw-1", drained)
    assert not tally.expected_disconnect("gateway-shutdown", "gw-2", drained)
    assert not tally.expected_disconnect("liveness-timeout", "gw-1", drained)
    assert not tally.expected_disconnect("heartbeat-timeout", None, drained)


def test_a_hellos_cpu_is_what_the_rollout_spent_beyond_the_steady_state() -> None:
    # 100 s of rollout at 1.5 cores, the steady state 1.0: 50 s beyond it, 10,000 Hellos
    assert tally.hello_ms(150.0, 100.0, 1.0, 10_000) == pytest.approx(5.0)
    assert math.isnan(tally.hello_ms(1.0, 1.0, 0.0, 0))


def test_run_twice_counts_commands_a_daemon_ran_more_than_once() -> None:
    assert tally.run_twice([{"a": 1, "b": 2}, {"c": 3}, {}]) == 2


def _final(**fields: object) -> tally.Final:
    base: dict[str, object] = dict(
        gateways=250,
        nodes=1_000_000,
        minutes=29.56,
        reconnects=[1.0] * 99 + [40.0],
        lags=[2.0] * 100,
        blind=0,
        wrong=0,
        duplicates=0,
        lost=0,
        commands=1000,
        twice=0,
        cores=1.93,
        hello_ms=1.234,
        moved=10,
        sessions=10,
    )
    return tally.Final(**{**base, **fields})  # type: ignore[arg-type]


def test_the_last_line_is_in_the_issues_format() -> None:
    assert _final().last_line() == (
        "rolled 250 gateways under 1000000 nodes in 29.6 min: reconnect p99 1.00 s, flush lag "
        "p99 2.00 s, blind 0, wrong disconnects 0, duplicate identities 0, commands lost 0 of "
        "1000, run twice 0, cpu 1.93 cores, 1.23 ms CPU a Hello"
    )
    assert tally.problems(_final()) == []


def test_a_rollout_stopped_before_its_last_gateway_says_how_far_it_got_and_is_not_done() -> None:
    stopped = _final(rolled=20, minutes=30.42)
    assert stopped.last_line().startswith(
        "rolled 20 of 250 (stopped) gateways under 1000000 nodes in 30.4 min: reconnect p99"
    )
    assert tally.problems(stopped) == ["230 of 250 gateway(s) not rolled (stopped after 30.4 min)"]
    assert tally.problems(_final(rolled=250)) == []


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"wrong": 2}, "2 disconnect(s) the drain did not cause"),
        ({"duplicates": 1}, "1 duplicate identity Hello(s)"),
        ({"lost": 3}, "3 of 1000 command(s) without their result"),
        ({"twice": 1}, "1 command(s) run twice"),
        ({"blind": 1}, "1 gateway(s) reported blind"),
        ({"moved": 9}, "1 session(s) never welcomed elsewhere"),
        ({"reconnects": [61.0]}, "reconnect p99 61.00 s > 60 s"),
        ({"lags": [16.0]}, "flush lag p99 16.00 s > 15 s"),
        ({"rss_slopes": {"replay": 6.0}}, "replay RSS grows +6.0 MiB/h after warm-up"),
    ],
)
def test_each_broken_bound_is_said(fields: dict[str, object], said: str) -> None:
    assert tally.problems(_final(**fields)) == [said]


def test_a_line_says_every_field() -> None:
    line = tally.Line(
        at=60.0,
        gateways_done=3,
        gateways=25,
        moved=12_000,
        hellos_per_s=200.0,
        reconnects=[1.0, 2.0],
        lags=[0.5],
        sweep_max=0.25,
        blind=0,
        expected=11_000,
        wrong=0,
        duplicates=0,
        done=40,
        lost=0,
        twice=0,
        commands=50,
        cores={"postgres": 0.5},
        rss={"replay": 60.0},
    )
    assert line.line() == (
        "t    +60 s: gateways done 3/25, sessions moved 12000, Hellos 200/s, reconnect p50 1.00 "
        "p99 2.00 max 2.00 s, flush lag p50 0.50 p99 0.50 max 0.50 s, sweep max 0.25 s, blind 0, "
        "disconnects 11000 expected 0 wrong, duplicate identities 0, commands 40 done 0 lost 0 "
        "duplicated of 50 | cores postgres 0.50 | RSS MiB replay 60"
    )


def test_memory_slopes_are_judged_only_after_twenty_minutes() -> None:
    short = {"replay": [(float(t), 60.0) for t in range(0, 600, 60)]}
    assert tally.rss_slopes(short, 0.0)[0] == {}
    long = {"replay": [(float(t), 60.0 + t / 3600) for t in range(0, 3000, 60)]}
    slopes, notes = tally.rss_slopes(long, 60.0)
    assert slopes["replay"] == pytest.approx(1.0) and notes == ()


@dataclass
class _Up:
    """What a daemon's pick reads of a gateway."""

    gateway_id: str
    held: int
    opening: int = 0
    alive: bool = True

    @property
    def sessions(self) -> dict[str, None]:
        return dict.fromkeys(range(self.held))  # type: ignore[arg-type]

    @property
    def pending_hellos(self) -> int:
        return self.opening


def test_a_redial_goes_to_the_gateway_with_fewest_streams_never_a_draining_one() -> None:
    """A least-connections balancer's pick: the gateway back from its drain (empty) takes
    the next wave's nodes, so a node moves once, not once per gateway drained after the
    one it lands on; Hellos under way count; ties go to any of them."""
    [daemon] = gws.daemons(1, seed=7, work=(1.0, 2.0))
    up = [_Up("gw-0", 0), _Up("gw-1", 4_000), _Up("gw-2", 3_990, opening=20), _Up("gw-3", 0)]
    fleet = Daemons([daemon], up)  # type: ignore[arg-type]
    fleet.draining.add("gw-0")
    picks = Counter(daemon._dial(up).gateway_id for _ in range(200))  # type: ignore[arg-type, union-attr]
    assert picks == {"gw-3": 200}
    up[3].held = 4_001
    assert daemon._dial(up).gateway_id == "gw-1"  # type: ignore[arg-type, union-attr]
    ties = [_Up(f"gw-{i}", 5) for i in range(4, 8)]
    spread = Counter(daemon._dial(ties).gateway_id for _ in range(400))  # type: ignore[arg-type, union-attr]
    assert set(spread) == {"gw-4", "gw-5", "gw-6", "gw-7"}
    assert daemon._dial([_Up("gw-9", 0, alive=False)]) is None  # type: ignore[list-item]
