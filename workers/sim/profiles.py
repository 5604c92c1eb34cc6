"""What a fake daemon advertises: bcd's capability list, and the skew profiles that differ.

A daemon's Hello carries its capabilities raw; the Hello transaction keeps the valid names
and the labeler labels them. The fake daemon says what bcd says, unless it runs a skew
profile: an older release that lacks what came later, or a node without the hardware.
Every name here is a valid capability (`schemas.facts.sanitize` keeps them all), so each
becomes a system label `bc.dev/cap.<name>`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

#: The container runtimes bcd drives, advertised as drivers.
RUNTIME_DRIVERS = ("driver.runc", "driver.crun", "driver.kata")
#: What bcd can enforce on a command's process.
ENFORCEMENT = ("enforce.cgroups", "enforce.seccomp", "enforce.no-new-privileges")
#: The NVIDIA stack: the management library, the driver, and CDI to hand devices over.
GPU = ("cdi", "nvml", "nvidia")

#: bcd's own list, in the order it advertises them.
BCD_CAPABILITIES: tuple[str, ...] = (
    "cdi",
    "devices.limits",
    "binding.kubernetes",
    "nvml",
    "nvidia",
    *RUNTIME_DRIVERS,
    "tunnel.instance-dial",
    *ENFORCEMENT,
)

#: The daemon version that advertises `BCD_CAPABILITIES`.
BCD_VERSION = "1.0.0"


@dataclass(frozen=True)
class Profile:
    """A kind of daemon: its version and what it advertises."""

    name: str
    version: str
    capabilities: tuple[str, ...]


BCD = Profile("bcd", BCD_VERSION, BCD_CAPABILITIES)

#: Profiles of a fleet in skew: a release before instance tunnels and enforcement, and a
#: node without a GPU (no CDI, NVML or driver to advertise).
SKEW_PROFILES: tuple[Profile, ...] = (
    Profile(
        "bcd-0.9",
        "0.9.0",
        tuple(c for c in BCD_CAPABILITIES if c != "tunnel.instance-dial" and c not in ENFORCEMENT),
    ),
    Profile("bcd-cpu", BCD_VERSION, tuple(c for c in BCD_CAPABILITIES if c not in GPU)),
)


def pick(
    rng: random.Random, skew_share: float, skews: Sequence[Profile] = SKEW_PROFILES
) -> Profile:
    """bcd's profile, or with probability `skew_share` one of the skew profiles. Pure but
    for the generator it is given."""
    if skews and rng.random() < skew_share:
        return rng.choice(list(skews))
    return BCD
