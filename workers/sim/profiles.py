"""What a fake daemon advertises: bcd's capability list as the seed names it, and the skew
profiles that differ.

A daemon's Hello carries its capabilities raw; the Hello transaction keeps the valid names
and the labeler labels them. The fake daemon says what bcd says (the seed's "Hello"
section), unless it runs a skew profile: an older release that lacks what came later, or
a node without the hardware. Every name here is a valid capability (`schemas.facts.sanitize`
keeps them all), so each becomes a system label `bc.dev/cap.<name>`.

Drivers are named `driver.<name>`, as this package always named them; the seed's kind of a
driver (`runtime`) has no place in a capability name. Where the seed page does not give
the names (the enforcement capabilities of a VPS host and of a GPU host), `STAND_INS`
holds placeholders, and nothing here claims them as bcd's.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

#: STAND-INS, not bcd's names: the seed says a VPS host's bcd advertises four capabilities
#: of what it enforces for instances, and a GPU host's bcd two for device assignments, but
#: its page does not list them. These placeholders keep the counts until it does.
STAND_INS = (
    "stand-in.vps-enforce-1",
    "stand-in.vps-enforce-2",
    "stand-in.vps-enforce-3",
    "stand-in.vps-enforce-4",
    "stand-in.gpu-enforce-1",
    "stand-in.gpu-enforce-2",
)
_VPS_ENFORCEMENT = tuple(c for c in STAND_INS if ".vps-" in c)
_GPU_ENFORCEMENT = tuple(c for c in STAND_INS if ".gpu-" in c)

#: On a node with GPUs (the seed): CDI, device limits and the Kubernetes binding, NVML
#: (when its inventory reports a CUDA driver version), the driver `nvidia`, and what it
#: enforces for device assignments.
GPU = ("cdi", "devices.limits", "binding.kubernetes", "nvml", "driver.nvidia", *_GPU_ENFORCEMENT)
#: The built-in instance runtimes a node agent lists as drivers of kind runtime (the seed).
RUNTIME_DRIVERS = ("driver.libvirt-kvm", "driver.cloud-hypervisor")
#: A node agent that runs an instance runtime (the seed): its drivers, instance tunnels
#: dialled to the instance's own address, and what it enforces for instances.
VPS = (*RUNTIME_DRIVERS, "tunnel.instance-dial", *_VPS_ENFORCEMENT)

#: bcd's list on a GPU host that also runs both instance runtimes, in the order it
#: advertises them.
BCD_CAPABILITIES: tuple[str, ...] = (*GPU, *VPS)

#: The daemon version that advertises `BCD_CAPABILITIES`.
BCD_VERSION = "1.0.0"


@dataclass(frozen=True)
class Profile:
    """A kind of daemon: its version and what it advertises."""

    name: str
    version: str
    capabilities: tuple[str, ...]


BCD = Profile("bcd", BCD_VERSION, BCD_CAPABILITIES)

#: Profiles of a fleet in skew: a release before instance tunnels and enforcement (an older
#: bcd drops both fields as unknown, the seed says), and a node without a GPU.
SKEW_PROFILES: tuple[Profile, ...] = (
    Profile(
        "bcd-0.9",
        "0.9.0",
        tuple(c for c in BCD_CAPABILITIES if c != "tunnel.instance-dial" and c not in STAND_INS),
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
