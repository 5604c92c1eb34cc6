"""What `bcw bench rollout` prints, and the bounds it is judged by. Pure: the run hands
in what it watched, these functions say what it means."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workers.bench.soak import slope_per_hour
from workers.bench.steady.figures import percentile

#: the reason a drained gateway closes its sessions with: their disconnects are expected
DRAIN_REASON = "gateway-shutdown"


def expected_disconnect(reason: str, gateway_id: str | None, drained: set[str]) -> bool:
    """A `node.disconnected` the drain caused: closed `gateway-shutdown` by a gateway that
    was drained. Any other is wrong. Pure."""
    return reason == DRAIN_REASON and gateway_id in drained


def hello_ms(spent: float, seconds: float, steady_cores: float, hellos: int) -> float:
    """Milliseconds of CPU a Hello: all processes' CPU `spent` over the rollout's `seconds`,
    less what the steady state took at `steady_cores` over as long, per Hello. Pure."""
    if hellos <= 0:
        return math.nan
    return 1000.0 * (spent - steady_cores * seconds) / hellos


def run_twice(runs: Sequence[Mapping[Any, int]]) -> int:
    """Commands some daemon ran more than once (each daemon's count of runs). Pure."""
    return sum(1 for counts in runs for n in counts.values() if n > 1)


@dataclass(frozen=True)
class Line:
    """What one interval of the run looked like (the counts: so far)."""

    at: float  # seconds since the first drain (negative: the steady state before it)
    gateways_done: int
    gateways: int
    moved: int  # sessions welcomed elsewhere after their gateway drained
    hellos_per_s: float  # Welcomes a second in the interval
    reconnects: Sequence[float]  # seconds, close at the drained gateway to Welcome, in it
    lags: Sequence[float]  # flush lags in it
    sweep_max: float
    blind: int
    expected: int
    wrong: int
    duplicates: int
    done: int
    lost: int
    twice: int
    commands: int
    cores: Mapping[str, float]
    rss: Mapping[str, float]

    def line(self) -> str:
        def p(values: Sequence[float], q: float) -> str:
            return f"{percentile(values, q):.2f}"

        cores = " ".join(f"{k} {v:.2f}" for k, v in self.cores.items())
        rss = " ".join(f"{k} {v:.0f}" for k, v in self.rss.items())
        return (
            f"t {self.at:>+6.0f} s: gateways done {self.gateways_done}/{self.gateways}, "
            f"sessions moved {self.moved}, Hellos {self.hellos_per_s:.0f}/s, reconnect "
            f"p50 {p(self.reconnects, 0.5)} p99 {p(self.reconnects, 0.99)} max "
            f"{max(self.reconnects, default=math.nan):.2f} s, flush lag p50 {p(self.lags, 0.5)} "
            f"p99 {p(self.lags, 0.99)} max {max(self.lags, default=math.nan):.2f} s, sweep max "
            f"{self.sweep_max:.2f} s, blind {self.blind}, disconnects {self.expected} expected "
            f"{self.wrong} wrong, duplicate identities {self.duplicates}, commands "
            f"{self.done} done {self.lost} lost {self.twice} duplicated of {self.commands} "
            f"| cores {cores} | RSS MiB {rss}"
        )


@dataclass(frozen=True)
class Bounds:
    """What a rollout must hold (the issue's item 2)."""

    reconnect_p99: float = 60.0
    flush_lag_p99: float = 15.0
    rss_slope_mib_per_hour: float = 5.0


#: minutes of samples after the warm-up a memory slope needs to be judged (`steady`'s)
RSS_MINUTES = 20


@dataclass(frozen=True)
class Final:
    gateways: int
    nodes: int
    minutes: float  # of the rollout: first drain to the last gateway back, every command ended
    reconnects: Sequence[float]
    lags: Sequence[float]
    blind: int
    wrong: int
    duplicates: int
    lost: int
    commands: int
    twice: int
    cores: float  # all processes', over the rollout
    hello_ms: float
    moved: int = 0
    sessions: int = 0  # sessions the drained gateways closed
    rss_slopes: Mapping[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    #: gateways drained and back when the run stopped before the last (`--stop-after`);
    #: None: it rolled every gateway
    rolled: int | None = None

    def last_line(self) -> str:
        gateways = (
            f"{self.gateways}"
            if self.rolled is None
            else f"{self.rolled} of {self.gateways} (stopped)"
        )
        return (
            f"rolled {gateways} gateways under {self.nodes} nodes in {self.minutes:.1f} min: "
            f"reconnect p99 {percentile(self.reconnects, 0.99):.2f} s, flush lag p99 "
            f"{percentile(self.lags, 0.99):.2f} s, blind {self.blind}, wrong disconnects "
            f"{self.wrong}, duplicate identities {self.duplicates}, commands lost {self.lost} of "
            f"{self.commands}, run twice {self.twice}, cpu {self.cores:.2f} cores, "
            f"{self.hello_ms:.2f} ms CPU a Hello"
        )


def rss_slopes(
    samples: Mapping[str, Sequence[tuple[float, float]]], warm_s: float
) -> tuple[dict[str, float], tuple[str, ...]]:
    """Each process's RSS slope (MiB/h) from its (seconds, MiB) samples after `warm_s`, or
    a note that the run was too short to tell a step from a slope (`steady`'s rule). Pure."""
    after = {k: [(t, m) for t, m in v if t >= warm_s] for k, v in samples.items()}
    span = max((v[-1][0] - v[0][0] for v in after.values() if v), default=0.0)
    if span < 60.0 * RSS_MINUTES:
        return {}, (
            f"memory slopes not judged: {span / 60:.1f} min after warm-up, "
            f"{RSS_MINUTES} needed to tell a step from a slope",
        )
    return {k: slope_per_hour(v) for k, v in after.items() if v}, ()


def problems(final: Final, bounds: Bounds = Bounds()) -> list[str]:
    """Every bound the rollout broke, a line each; none: it held."""
    out = []
    if final.rolled is not None and final.rolled < final.gateways:
        out.append(
            f"{final.gateways - final.rolled} of {final.gateways} gateway(s) not rolled "
            f"(stopped after {final.minutes:.1f} min)"
        )
    if final.moved < final.sessions:
        out.append(f"{final.sessions - final.moved} session(s) never welcomed elsewhere")
    if not percentile(final.reconnects, 0.99) <= bounds.reconnect_p99:
        out.append(f"reconnect p99 {percentile(final.reconnects, 0.99):.2f} s > 60 s")
    if not percentile(final.lags, 0.99) <= bounds.flush_lag_p99:
        out.append(f"flush lag p99 {percentile(final.lags, 0.99):.2f} s > 15 s")
    if final.blind:
        out.append(f"{final.blind} gateway(s) reported blind")
    if final.wrong:
        out.append(f"{final.wrong} disconnect(s) the drain did not cause")
    if final.duplicates:
        out.append(f"{final.duplicates} duplicate identity Hello(s)")
    if final.lost:
        out.append(f"{final.lost} of {final.commands} command(s) without their result")
    if final.twice:
        out.append(f"{final.twice} command(s) run twice")
    out += [
        f"{name} RSS grows {slope:+.1f} MiB/h after warm-up"
        for name, slope in final.rss_slopes.items()
        if slope > bounds.rss_slope_mib_per_hour
    ]
    return out
