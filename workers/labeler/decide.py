"""The capability labeler's rules, pure: no await, no clock, no I/O.

`decide` compares a Hello with its node's labels and says what to write (`sanitize`, in
`schemas.facts`, cleans what a daemon advertises: the Hello transaction stores that). Applied by `workers.labeler.apply`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from schemas.facts import Hello, newest_per_node, sanitize

LABEL_PREFIX = "bc.dev/cap."


def label_key(capability: str) -> str:
    return LABEL_PREFIX + capability


@dataclass(frozen=True)
class SessionRow:
    """What the labeler reads of a node: its epoch and system cap labels (what the labeler
    last labeled: the node's capabilities before this Hello, whose transaction stored the
    session's own)."""

    session_epoch: int
    system_cap_labels: frozenset[str]  # capability names with a system label


@dataclass(frozen=True)
class Labeling:
    """What to write for one current Hello."""

    node_id: str
    epoch: int
    capabilities: tuple[str, ...]
    labels_to_add: tuple[str, ...]  # capability names
    labels_to_remove: tuple[str, ...]

    @property
    def added(self) -> tuple[str, ...]:
        """The event's: what the node gained, against its labels."""
        return self.labels_to_add

    @property
    def removed(self) -> tuple[str, ...]:
        return self.labels_to_remove

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed)


def decide(hello: Hello, row: SessionRow | None) -> Labeling | None:
    """The labeling of a current Hello; None when it is stale (or its node is unknown), or
    when it is an unproven Hello of a node that proves its Hellos (`proven` false, as its
    Hello transaction recorded it: a takeover attempt labels nothing, and its session
    stays unlabeled, so placement never offers it).

    Pure. Labels are reconciled with the sanitized set, and the event reports that change:
    the labels are what the node had before this Hello (the Hello transaction already
    stored this session's capabilities).
    """
    if row is None or row.session_epoch != hello.epoch or hello.proven is False:
        return None
    wanted = sanitize(hello.capabilities)
    wanted_set = set(wanted)
    return Labeling(
        node_id=hello.node_id,
        epoch=hello.epoch,
        capabilities=wanted,
        labels_to_add=tuple(sorted(wanted_set - row.system_cap_labels)),
        labels_to_remove=tuple(sorted(row.system_cap_labels - wanted_set)),
    )


def decide_batch(hellos: Sequence[Hello], rows: Mapping[str, SessionRow]) -> dict[str, Labeling]:
    """Labelings of a batch's current Hellos, by node. Pure."""
    out: dict[str, Labeling] = {}
    for node_id, hello in newest_per_node(hellos).items():
        labeling = decide(hello, rows.get(node_id))
        if labeling is not None:
            out[node_id] = labeling
    return out
