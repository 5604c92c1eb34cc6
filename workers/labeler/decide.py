"""The capability labeler's rules, pure: no await, no clock, no I/O.

`sanitize` cleans what a daemon advertises; `decide` compares a Hello with its node's
row and says what to write. Applied by `workers.labeler.apply`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from schemas.facts import Hello, newest_per_node

CAPABILITY_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
MAX_CAPABILITIES = 64
LABEL_PREFIX = "bc.dev/cap."


def sanitize(advertised: Iterable[object]) -> tuple[str, ...]:
    """Valid names only, de-duplicated, sorted, at most 64. Never raises, whatever it is given.

    Pure. Invalid entries (wrong characters, too long, not strings) are dropped, not
    fatal; the 65th name and after (in sorted order) are not kept.
    """
    valid = {name for name in advertised if isinstance(name, str) and CAPABILITY_RE.fullmatch(name)}
    return tuple(sorted(valid))[:MAX_CAPABILITIES]


def label_key(capability: str) -> str:
    return LABEL_PREFIX + capability


@dataclass(frozen=True)
class SessionRow:
    """What the labeler reads of a node: its epoch, stored capabilities and system cap labels."""

    session_epoch: int
    capabilities: tuple[str, ...]
    system_cap_labels: frozenset[str]  # capability names with a system label


@dataclass(frozen=True)
class Labeling:
    """What to write for one current Hello."""

    node_id: str
    epoch: int
    capabilities: tuple[str, ...]
    labels_to_add: tuple[str, ...]  # capability names
    labels_to_remove: tuple[str, ...]
    added: tuple[str, ...]  # vs the stored capabilities: the event's fields
    removed: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed)


def decide(hello: Hello, row: SessionRow | None) -> Labeling | None:
    """The labeling of a current Hello; None when it is stale (or its node is unknown).

    Pure. Labels are reconciled with the sanitized set (so a missing label is repaired);
    the event reports the change against the stored capabilities.
    """
    if row is None or row.session_epoch != hello.epoch:
        return None
    wanted = sanitize(hello.capabilities)
    wanted_set, stored = set(wanted), set(row.capabilities)
    return Labeling(
        node_id=hello.node_id,
        epoch=hello.epoch,
        capabilities=wanted,
        labels_to_add=tuple(sorted(wanted_set - row.system_cap_labels)),
        labels_to_remove=tuple(sorted(row.system_cap_labels - wanted_set)),
        added=tuple(sorted(wanted_set - stored)),
        removed=tuple(sorted(stored - wanted_set)),
    )


def decide_batch(hellos: Sequence[Hello], rows: Mapping[str, SessionRow]) -> dict[str, Labeling]:
    """Labelings of a batch's current Hellos, by node. Pure."""
    out: dict[str, Labeling] = {}
    for node_id, hello in newest_per_node(hellos).items():
        labeling = decide(hello, rows.get(node_id))
        if labeling is not None:
            out[node_id] = labeling
    return out
