"""What the rollout watches as it goes: the steady bench's flush lags, sweeps and
blindness, the disconnects (expected: the drain's; wrong: any other), the Hellos'
duplicate identities, and each process's CPU and memory read from /proc."""

from __future__ import annotations

import asyncio
import os
import time

from nats.aio.msg import Msg

from schemas import REGISTRY
from schemas.events import GatewayBlind, NodeConnected, NodeDisconnected
from workers.bench.costs import (
    cpu_seconds,
    memory_mib,
    nats_server_pid,
    postgres_rss_mib,
    servers_cpu_seconds,
    tree_cpu_seconds,
)
from workers.bench.rollout.tally import expected_disconnect
from workers.bench.steady.run import Watch


class RolloutWatch(Watch):
    """`bcw bench steady`'s watch, and what a rollout adds to it."""

    def __init__(self) -> None:
        super().__init__()
        self.drained: set[str] = set()  # gateways drained so far
        self.duplicates = 0  # Hellos of a duplicate identity (`node.connected` says)
        self.connected = 0
        self.blind_why: list[str] = []
        self.all_lags: list[float] = []  # every flush lag of the run (`lags`: since a line)

    async def event(self, msg: Msg) -> None:
        event = REGISTRY.decode(msg.headers, msg.data)
        if isinstance(event, NodeDisconnected):
            key = f"{event.node_id}@{event.epoch}"
            drain = expected_disconnect(event.reason, event.gateway_id, self.drained)
            (self.expected if drain else self.wrong).add(key)
            return
        if isinstance(event, NodeConnected):
            self.connected += 1
            self.duplicates += int(event.duplicate_identity)
            return
        if isinstance(event, GatewayBlind):
            self.blind_why.append(f"{event.gateway_id} blind ({event.reason})")
        await super().event(msg)

    def take_lags(self) -> list[float]:
        lags, self.lags = self.lags, []
        self.all_lags += lags
        return lags


class Processes:
    """CPU seconds and RSS of every process of the run: the workers', the servers' (on
    this machine) and this one's (gateways and daemons)."""

    def __init__(
        self, procs: dict[str, asyncio.subprocess.Process], nats_url: str, backend: int
    ) -> None:
        self.procs = procs
        self.nats_pid = nats_server_pid(nats_url)
        self.postmaster = parent_of(backend)  # None: PostgreSQL is not on this machine
        self.started = time.monotonic()
        self.rss_samples: dict[str, list[tuple[float, float]]] = {}

    def cpu(self) -> dict[str, float]:
        # the run's own servers where they can be told apart (a shared machine runs others)
        servers = servers_cpu_seconds()
        if self.postmaster is not None:
            servers["postgres"] = tree_cpu_seconds(self.postmaster)
        if self.nats_pid is not None:
            servers["nats-server"] = cpu_seconds(self.nats_pid)
        spent = {"postgres": servers["postgres"], "nats-server": servers["nats-server"]}
        spent |= {name: cpu_seconds(proc.pid) for name, proc in self.procs.items()}
        return spent | {"bench": time.process_time()}

    def rss(self) -> dict[str, float]:
        rss = {name: memory_mib(proc.pid, "VmRSS") for name, proc in self.procs.items()}
        rss |= {"postgres": postgres_rss_mib(), "bench": memory_mib(os.getpid(), "VmRSS")}
        if self.nats_pid is not None:
            rss["nats-server"] = memory_mib(self.nats_pid, "VmRSS")
        at = time.monotonic() - self.started
        for name in self.procs:  # the workers' slopes (the servers' caches fill for longer)
            self.rss_samples.setdefault(name, []).append((at, rss[name]))
        return rss


def parent_of(pid: int) -> int | None:
    """The parent of a process of this machine (a backend's: its postmaster), or None."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rpartition(")")[2].split()[1])
    except OSError:
        return None
