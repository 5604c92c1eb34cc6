"""What a Hello carries for the replay: the done results the daemon holds, as the
`result` facts they stand for."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from schemas.facts import Hello, Result


def results_of(hello: Hello) -> list[Result]:
    """The done results a Hello carries, as the `result` facts they stand for (each with
    an id of its own, derived from the Hello's: the same Hello gives the same ids)."""
    return [
        Result(
            fact_id=uuid.uuid5(hello.fact_id, str(done.command_id)),
            gateway_id=hello.gateway_id,
            observed_at=hello.observed_at,
            node_id=hello.node_id,
            epoch=hello.epoch,
            command_id=done.command_id,
            outcome=done.outcome,
            result=done.result,
            error=done.error,
        )
        for done in hello.results
    ]


def pairs(hellos: Sequence[Hello]) -> list[tuple[Hello, Result]]:
    return [(hello, result) for hello in hellos for result in results_of(hello)]
