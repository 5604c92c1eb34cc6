"""A node's inventory as the gateway sees it, pure: which sections to ask the daemon for,
and whether a section it sends may be stored.

The daemon names each inventory section with a hash of its content: in its Hello, in
the first heartbeat after it collected its inventory again, and in every
`INVENTORY_EVERY`th heartbeat. The control plane keeps each section's last body and hash
(`node_inventory`); a section whose hash differs from the stored one, or that is not
stored, is asked for (the Welcome's `request_sections`, a heartbeat's answer), and the
daemon sends it in an inventory frame — or pushes the sections it found changed. The
gateway holds what it is sent and applies the inventory only once the stored sections and
what it holds agree with the hashes last reported (`agreed`): never half of a collection.
Applied by `workers.gateway.gateway.Gateway`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

#: every this many heartbeats the daemon sends its inventory hashes along
INVENTORY_EVERY = 10
#: what one section may weigh, as JSON
MAX_SECTION_BYTES = 256 * 1024
#: section names and hashes: printable ASCII, no space, 1 to 256 characters
_TOKEN = re.compile(r"[!-~]{1,256}")


def sections_to_request(presented: Mapping[str, str], stored: Mapping[str, str]) -> tuple[str, ...]:
    """The presented sections whose hash is not the stored one, in name order. A stored
    section the daemon no longer presents is not asked for. Pure."""
    return tuple(sorted(s for s, digest in presented.items() if stored.get(s) != digest))


def section_hashes(inventory: Mapping[str, Any]) -> dict[str, str]:
    """Each section's hash as a daemon names it: SHA-256 of its canonical JSON. Pure."""
    return {
        section: hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        for section, body in inventory.items()
    }


def agreed(reported: Mapping[str, str], stored: Mapping[str, str], held: Mapping[str, str]) -> bool:
    """Whether every reported section is there with its reported hash: stored, or held
    (sent and not yet applied). Pure."""
    return all(stored.get(s) == digest or held.get(s) == digest for s, digest in reported.items())


def to_apply(reported: Mapping[str, str], held: Mapping[str, str]) -> tuple[str, ...]:
    """The held sections to store once `agreed`: those held with their reported hash, in
    name order (another waits for a report that names it with its hash). Pure."""
    return tuple(sorted(s for s, digest in held.items() if reported.get(s) == digest))


def section_problem(section: str, digest: str, body: Any) -> str | None:
    """Why an inventory frame cannot be stored, or None. Pure."""
    if not _TOKEN.fullmatch(section):
        return "section: 1 to 256 printable characters without spaces"
    if not _TOKEN.fullmatch(digest):
        return "hash: 1 to 256 printable characters without spaces"
    if not isinstance(body, dict):
        return "body: a JSON object"
    try:
        size = len(json.dumps(body, separators=(",", ":"), allow_nan=False).encode())
    except (TypeError, ValueError) as error:
        return f"body: not JSON ({error})"
    if size > MAX_SECTION_BYTES:
        return f"body: {size} bytes, more than {MAX_SECTION_BYTES}"
    return None
