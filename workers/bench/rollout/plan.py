"""What a rollout does when, pure: the waves of drained gateways, the daemons' full-jitter
back-off (the seed's: attempt n waits a uniform delay in [0, min(60 s, 1 s x 2^n)]), and
how the commands kept in flight are spread over the waves."""

from __future__ import annotations

from collections.abc import Callable

#: the back-off's cap, seconds
MAX_BACK_OFF = 60.0


def back_off_cap(attempt: int) -> float:
    """The longest wait of redial attempt `attempt` (from 1): min(60 s, 1 s x 2^n). Pure."""
    return min(MAX_BACK_OFF, 2.0 ** min(max(attempt, 0), 32))


def back_off(attempt: int, draw: Callable[[], float]) -> float:
    """Attempt `attempt`'s wait: uniform in [0, cap] by `draw` (in [0, 1)): full jitter."""
    return draw() * back_off_cap(attempt)


def waves(gateways: int, parallel: int) -> list[list[int]]:
    """The gateways drained together, in turn: `parallel` at a time (the last wave holds
    what is left), every gateway exactly once. Pure."""
    if gateways < 2:
        raise ValueError("a rollout needs at least 2 gateways: the drained one's go elsewhere")
    if not 1 <= parallel < gateways:
        raise ValueError(f"--parallel must be in [1, {gateways - 1}], got {parallel}")
    return [list(range(k, min(k + parallel, gateways))) for k in range(0, gateways, parallel)]


def spread(commands: int, parts: int) -> list[int]:
    """`commands` split over `parts` as evenly as can be (the first ones take the rest). Pure."""
    if parts <= 0:
        return []
    share, rest = divmod(commands, parts)
    return [share + (1 if k < rest else 0) for k in range(parts)]


def capacity_left(nodes: int, gateways: int, parallel: int, max_streams: int) -> int:
    """Sessions the gateways not drained can still take while a wave is away (negative:
    the fleet does not fit; the run refuses it). Pure."""
    return (gateways - parallel) * max_streams - nodes
