"""A node's inventory as the gateway sees it, pure: which sections to ask the daemon for,
and whether a section it sends may be stored.

The daemon names each inventory section with a hash of its content: in its Hello, and
in every `INVENTORY_EVERY`th heartbeat. The control plane keeps each section's last body
and hash (`node_inventory`); a section whose hash differs from the stored one, or that
is not stored, is asked for (the Welcome's `request_sections`, a heartbeat's answer), and
the daemon sends it in an inventory frame. Applied by `workers.gateway.gateway.Gateway`.
"""

from __future__ import annotations

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
