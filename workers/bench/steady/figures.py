"""What `bcw bench steady` prints, and the bounds it is judged by. Pure: the run hands
in what it watched, these functions say what it means."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from workers.bench.soak import slope_per_hour


def percentile(values: Sequence[float], q: float) -> float:
    """The `q` quantile (0 to 1) of `values`, nearest rank; NaN for none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True)
class Minute:
    """What one minute of the run looked like."""

    minute: int
    lags: Sequence[float]  # seconds from each flush fact's publish to its commit seen
    sweep_max: float  # the slowest sweep that ended in the minute (NaN: none)
    blind: int  # gateways reported blind so far
    expected: int  # `node.disconnected` of silenced nodes so far
    wrong: int  # `node.disconnected` of any other node so far
    cores: Mapping[str, float]  # CPU cores used in the minute, by process
    sizes: Mapping[str, int]  # bytes of each relation of the session tables
    rss: Mapping[str, float]  # MiB, by process
    hot: float = math.nan  # share of the minute's row updates that were HOT
    dead: int = 0  # dead rows of node_sessions now
    wal: float = math.nan  # bytes a second PostgreSQL wrote to its WAL in the minute
    stream: float = math.nan  # bytes the facts stream holds now

    def line(self) -> str:
        cores = " ".join(f"{k} {v:.2f}" for k, v in self.cores.items())
        sizes = " ".join(f"{k} {v / 2**20:.0f}" for k, v in self.sizes.items())
        rss = " ".join(f"{k} {v:.0f}" for k, v in self.rss.items())
        return (
            f"min {self.minute:>3}: flush lag p50 {percentile(self.lags, 0.5):.2f} "
            f"p99 {percentile(self.lags, 0.99):.2f} max {max(self.lags, default=math.nan):.2f} s"
            f" ({len(self.lags)} facts), sweep max {self.sweep_max:.2f} s, blind {self.blind}, "
            f"disconnected {self.expected} expected {self.wrong} wrong | cores {cores} "
            f"| MiB {sizes}, HOT {self.hot:.0%}, dead rows {self.dead:,}, WAL "
            f"{self.wal / 2**20:.1f} MiB/s, facts stream {self.stream / 2**20:.0f} MiB "
            f"| RSS MiB {rss}"
        )


@dataclass(frozen=True)
class Bounds:
    """What a run must hold (the issue's item 2)."""

    flush_lag_p99: float = 15.0
    sweep_max: float = 1.0
    size_growth_percent: float = 10.0
    rss_slope_mib_per_hour: float = 5.0


@dataclass(frozen=True)
class Starved:
    """What a run that starved the liveness processes (`--starve`) saw of it."""

    fraction: float  # of each second the processes ran
    seconds: float  # for how long
    blind_during: int  # gateways said blind (for lag: the controller was behind)
    blind_at_end: int  # gateways still blind at the end
    #: seconds from the end of the starving until every gateway said blind was seen
    #: again (None: one never was)
    recovered: float | None


@dataclass(frozen=True)
class Summary:
    nodes: int
    minutes: float
    lag_p99: float
    sweep_max: float
    blind: int
    wrong: int
    silenced_in_time: int  # silenced nodes disconnected within the bound
    silenced: int
    growth_percent: float
    cores: float
    #: MiB/h after warm-up, of each liveness process (none: the run was too short to say)
    rss_slopes: Mapping[str, float] = field(default_factory=dict)
    #: what the run could not judge, a line each
    notes: tuple[str, ...] = ()
    lag_max: float = math.nan  # the longest flush lag seen
    #: the most sessions the controller held at once because it was behind its facts
    held_for_lag: int = 0
    starved: Starved | None = None

    def last_line(self) -> str:
        line = (
            f"held {self.nodes} nodes for {self.minutes:g} min: flush lag p99 {self.lag_p99:.2f} s, "
            f"sweep max {self.sweep_max:.2f} s, blind {self.blind}, wrong disconnects {self.wrong}, "
            f"silenced disconnected {self.silenced_in_time} of {self.silenced}, size growth "
            f"{self.growth_percent:.1f} % after warm-up, cpu {self.cores:.2f} cores, "
            f"max lag {self.lag_max:.2f} s, held for lag {self.held_for_lag} sessions"
        )
        if self.starved is not None:
            s = self.starved
            recovered = "never" if s.recovered is None else f"in {s.recovered:.0f} s"
            line += (
                f"; starved to {s.fraction:.0%} for {s.seconds:g} s: blind {s.blind_during} "
                f"during, {s.blind_at_end} at the end, recovered {recovered}"
            )
        return line


#: minutes after the warm minute over which a liveness process's memory slope is judged,
#: at least: RSS moves in steps (an arena the allocator adds, a batch larger than any
#: before), and over a few minutes a 4 MiB step reads as +50 MiB/h. Twenty minutes do
#: not always tell a step from a slope either (a step at minute 21 of a 30-minute run
#: read as +52 MiB/h): what a process's memory does over weeks is `bcw bench soak`'s,
#: over hours
RSS_MINUTES = 20


def warm_minute(minutes: int) -> int:
    """The minute whose sizes and memory are the baseline: minute 5, or the middle of a
    run of 5 minutes or less."""
    return 5 if minutes > 5 else max(1, minutes // 2)


def growth_percent(sizes: Sequence[int], minutes: int) -> float:
    """Total size at the end against the warm minute's (`sizes[m - 1]` is minute m's)."""
    if not sizes:
        return math.nan
    base = sizes[min(len(sizes), warm_minute(minutes)) - 1]
    return 100.0 * (sizes[-1] - base) / base if base else math.nan


def summarize(
    nodes: int,
    minutes: Sequence[Minute],
    silenced_in_time: int,
    silenced: int,
    held_for_lag: int = 0,
    starved: Starved | None = None,
) -> Summary:
    """The run's summary from its minutes (the last holds the counts so far)."""
    if not minutes:
        return Summary(
            nodes, 0, math.nan, math.nan, 0, 0, silenced_in_time, silenced, math.nan, 0.0
        )
    lags = [lag for m in minutes for lag in m.lags]
    sweeps = [m.sweep_max for m in minutes if not math.isnan(m.sweep_max)]
    warm = warm_minute(len(minutes))
    slopes = {
        name: slope_per_hour([(60.0 * m.minute, m.rss[name]) for m in minutes[warm - 1 :]])
        for name in minutes[-1].rss
        if name.startswith("liveness")  # the servers' caches fill for longer than a run
    }
    notes: tuple[str, ...] = ()
    if len(minutes) - warm < RSS_MINUTES:
        slopes, notes = (
            {},
            (
                f"memory slopes not judged: {len(minutes) - warm} min after warm-up, "
                f"{RSS_MINUTES} needed to tell a step from a slope",
            ),
        )
    return Summary(
        nodes=nodes,
        minutes=len(minutes),
        lag_p99=percentile(lags, 0.99),
        sweep_max=max(sweeps, default=math.nan),
        blind=minutes[-1].blind,
        wrong=minutes[-1].wrong,
        silenced_in_time=silenced_in_time,
        silenced=silenced,
        growth_percent=growth_percent([sum(m.sizes.values()) for m in minutes], len(minutes)),
        cores=sum(sum(m.cores.values()) for m in minutes) / len(minutes),
        rss_slopes=slopes,
        notes=notes,
        lag_max=max(lags, default=math.nan),
        held_for_lag=held_for_lag,
        starved=starved,
    )


def problems(summary: Summary, bounds: Bounds = Bounds()) -> list[str]:
    """Every bound the run broke, said in a line each; none: it held. A starved run
    (`--starve`) is not held to the lag, the sweep's time and blindness — the starving
    breaks them on purpose — but to what overload must not do: no gateway left blind once
    the CPU is back, one said blind while the controller was behind (it must know), no
    wrong disconnect, every silenced node disconnected once it could be judged."""
    out = []
    starved = summary.starved
    if starved is None and not summary.lag_p99 <= bounds.flush_lag_p99:
        out.append(f"flush lag p99 {summary.lag_p99:.2f} s > {bounds.flush_lag_p99:g} s")
    if starved is None and not summary.sweep_max <= bounds.sweep_max:
        out.append(f"sweep max {summary.sweep_max:.2f} s > {bounds.sweep_max:g} s")
    if starved is None and summary.blind:
        out.append(f"{summary.blind} gateway(s) reported blind")
    if starved is not None and starved.blind_at_end:
        out.append(f"{starved.blind_at_end} gateway(s) still blind at the end")
    if starved is not None and not starved.blind_during and summary.lag_max > 30.0:
        out.append(f"the controller fell {summary.lag_max:.0f} s behind and said no gateway blind")
    if summary.wrong:
        out.append(f"{summary.wrong} node(s) disconnected that were flushed")
    if summary.silenced_in_time < summary.silenced:
        out.append(
            f"{summary.silenced - summary.silenced_in_time} silenced node(s) not disconnected "
            "within the stale threshold plus two sweeps"
        )
    if not summary.growth_percent <= bounds.size_growth_percent:
        out.append(f"session tables grew {summary.growth_percent:.1f} % after warm-up")
    out += [
        f"{name} RSS grows {slope:+.1f} MiB/h after warm-up"
        for name, slope in summary.rss_slopes.items()
        if slope > bounds.rss_slope_mib_per_hour
    ]
    return out
