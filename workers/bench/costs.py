"""What processes cost, read from /proc: a process's CPU seconds and peak memory, the
servers' CPU (every PostgreSQL and nats-server process on this machine), a reading by
who spent it (`CpuSpent`), and the most units a second such costs allow (`ceiling`).
Used by the runtime, storm and herd benches; Linux only.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


def memory_mib(pid: int, field: str) -> float:
    """A memory figure of a live process from /proc/<pid>/status (`VmRSS`, `VmHWM`, …),
    MiB; NaN once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def postgres_rss_mib() -> float:
    """The PostgreSQL processes' own memory and their shared memory counted once."""
    anon, shared = 0.0, 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:
            continue
        if fields.get("Name", "").strip() == "postgres":
            anon += int(fields.get("RssAnon", "0 kB").split()[0]) / 1024
            shared = max(shared, int(fields.get("RssShmem", "0 kB").split()[0]) / 1024)
    return anon + shared


def peak_rss_mib(pid: int) -> float:
    """A live process's peak resident set (VmHWM), MiB; NaN once it is gone."""
    return memory_mib(pid, "VmHWM")


def _proc_stat(pid: int | str) -> tuple[str, list[str]] | None:
    """A process's name and its `/proc/<pid>/stat` fields after the name (field 3 on);
    None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            text = stat.read()
    except OSError:
        return None
    name, _, rest = text[text.index("(") + 1 :].rpartition(")")
    return name, rest.split()


def _ticks(fields: list[str], count: int) -> float:
    """Seconds of the `count` CPU-time fields from utime on (utime, stime, cutime, cstime)."""
    return sum(int(f) for f in fields[11 : 11 + count]) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """A live process's user + system CPU time so far, seconds; NaN once it is gone."""
    stat = _proc_stat(pid)
    return float("nan") if stat is None else _ticks(stat[1], 2)


def children_cpu_seconds() -> float:
    """CPU seconds of this process's children that ended and were waited for."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def nats_server_pid(url: str) -> int | None:
    """The pid of the nats-server on this machine serving `url`'s port (`-p PORT`, as the
    embedded servers are started), or None."""
    port = url.rsplit(":", 1)[-1].strip("/")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                args = cmdline.read().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"nats-server") and b"-p" in args:
            at = args.index(b"-p")
            if at + 1 < len(args) and args[at + 1].decode() == port:
                return int(entry)
    return None


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds so far of process `pid` (a postmaster, say), the children it waited for,
    and its live children: one server's, not every server's on this machine. NaN once
    it is gone."""
    own = _proc_stat(pid)
    if own is None:
        return float("nan")
    total = _ticks(own[1], 4)
    for entry in os.listdir("/proc"):
        stat = _proc_stat(entry) if entry.isdigit() else None
        if stat is not None and int(stat[1][1]) == pid:  # its parent: the field after state
            total += _ticks(stat[1], 4)
    return total


SERVER_NAMES = ("postgres", "nats-server")


def servers_cpu_seconds() -> dict[str, float]:
    """CPU seconds so far of every PostgreSQL and nats-server process on this machine (the
    benches' servers run here): their live processes' own time, and the time of the
    children they waited for. A backend that exits between two readings takes its time
    with it, so a difference of two readings is a lower bound."""
    totals = dict.fromkeys(SERVER_NAMES, 0.0)
    for entry in os.listdir("/proc"):
        stat = _proc_stat(entry) if entry.isdigit() else None
        if stat is not None and stat[0] in totals:
            totals[stat[0]] += _ticks(stat[1], 4)
    return totals


@dataclass(frozen=True)
class CpuSpent:
    """CPU seconds, by who spent them: this process, its children that ended and were
    waited for (a relay process, say), and the servers. Readings subtract."""

    process: float
    children: float
    postgres: float
    nats: float

    @classmethod
    def now(cls) -> CpuSpent:
        servers = servers_cpu_seconds()
        return cls(
            time.process_time(),
            children_cpu_seconds(),
            servers["postgres"],
            servers["nats-server"],
        )

    def __sub__(self, before: CpuSpent) -> CpuSpent:
        return CpuSpent(
            self.process - before.process,
            self.children - before.children,
            self.postgres - before.postgres,
            self.nats - before.nats,
        )

    @property
    def total(self) -> float:
        return self.process + self.children + self.postgres + self.nats


def ceiling(single_threaded: Sequence[float], others: Sequence[float], cores: int) -> float:
    """The most units a second that these CPU costs (seconds per unit) allow on `cores`:
    each single-threaded process (a Python process) has one core at most, and everything
    together, the others included (the servers), has `cores`. An upper bound: it assumes
    the work spreads perfectly and nothing waits."""
    bounds = [1.0 / cost for cost in single_threaded if cost > 0]
    total = sum(single_threaded) + sum(others)
    if total > 0:
        bounds.append(cores / total)
    return min(bounds, default=float("inf"))


def what_parts_cost(per_fact: Mapping[str, float]) -> str:
    """What (a')'s parts cost per fact, all processes together: an inbox (which (a') keeps
    none of: its effects are idempotent by construction), and the message it publishes
    (its outbox pack and session history, the relay's claim, publish and delete). Pure."""
    inbox = per_fact["a1i"] - per_fact["a1"]
    message = per_fact["a1"] - per_fact["a1n"]
    rest = per_fact["a1n"] / per_fact["b"]
    return (
        f"parts of (a') per fact: a published message {1e6 * message:,.1f} µs; the rest "
        f"{rest:.2f} of (b); an inbox would add {1e6 * inbox:,.1f} µs"
    )


def cpu_ratios(per_fact: Mapping[str, float]) -> str:
    """The line that says how much CPU exactly-once costs: (a) and (a') per fact against
    the floor (b). Pure."""
    a, a1 = per_fact["a"] / per_fact["b"], per_fact["a1"] / per_fact["b"]
    return f"cpu a/b = {a:.2f}   a'/b = {a1:.2f}   (target <= 1.5 each)"


def cpu_ratios_per_round(spent: Mapping[str, list[CpuSpent]]) -> str:
    """(a)'s and (a')'s CPU against the floor's round by round — each ratio of the same
    round, so one moment of the machine — to show how far the ratio moves. Pure."""
    a, a1, b = (spent[key] for key in ("a", "a1", "b"))
    rounds = [
        f"{x.total / y.total:.2f}/{x1.total / y.total:.2f}"
        for x, x1, y in zip(a, a1, b, strict=True)
    ]
    return "cpu a/b, a'/b per round (same round): " + ", ".join(rounds)


def cost_rows(
    spent: Mapping[str, list[CpuSpent]],
    facts: int,
    floor: float,
    labels: Sequence[tuple[str, str]],
    cores: int,
) -> tuple[tuple[str, ...], list[tuple[str, ...]], dict[str, float]]:
    """The table of what each pipeline (key, label) spent per fact — medians of its rounds,
    by process and server — and the most facts/s that allows on `cores` against the
    floor's `floor` facts/s; and each pipeline's CPU seconds per fact in all. Pure."""
    rows, totals = [], {}
    for key, label in labels:

        def per_fact(part: str, key: str = key) -> float:
            return statistics.median(getattr(s, part) for s in spent[key]) / facts

        process, relay = per_fact("process"), per_fact("children")
        servers = [per_fact("postgres"), per_fact("nats")]
        most = ceiling([process, relay], servers, cores)
        totals[key] = process + relay + sum(servers)
        rows.append(
            (
                label,
                *(f"{1e6 * cost:,.0f}" for cost in (process, relay, *servers)),
                f"{1e6 * totals[key]:,.0f}",
                f"{most:,.0f}",
                f"{most / floor:.2f}",
            )
        )
    header = (
        "pipeline",
        "this process",
        "relay process",
        "postgres",
        "nats-server",
        "all",
        "at most",
        "vs (b)",
    )
    return header, rows, totals
