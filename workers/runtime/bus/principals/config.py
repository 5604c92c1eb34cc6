"""The bus principals as nats-server is told them (`bcw auth nats` writes the configuration
fragment: `write`) and as `docs/kubernetes.md` shows them (`markdown`), from `table`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from schemas.subjects import Subjects
from workers.runtime.base.settings_docs import rewrite_block
from workers.runtime.bus.principals.table import (
    INBOX,
    INBOX_PLACEHOLDER,
    Principal,
    check_gateways,
    check_subscribers,
    inbox_prefix,
    principals,
)
from workers.runtime.bus.seeds import public_key, seed_of


def _quoted(subjects: Sequence[str]) -> str:
    return ", ".join(f'"{s}"' for s in subjects)


def grants_of(principal: Principal, inbox: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What `principal` may publish and subscribe to, given its own inbox (`_INBOX.<key>.>`):
    its grants and its inbox, both ways. What the server is told, the docs show and the
    permissions test tries."""
    return (inbox, *principal.publish), (inbox, *principal.subscribe)


def render(users: Sequence[tuple[Principal, str]]) -> str:
    """The configuration fragment: one nkey user per (principal, public key)."""
    lines = [
        "# Written by `bcw auth nats`: nkey users of bc-workers with their permissions.",
        "# Include it from the nats-server configuration (`include auth.conf`); for",
        "# JetStream's durability, see jetstream.conf beside it (sync_interval: always).",
        "authorization {",
        "  users = [",
    ]
    for principal, key in users:
        publish, subscribe = grants_of(principal, f"{inbox_prefix(key)}.>")
        lines += [
            f"    # {principal.name}: {principal.does}",
            f'    {{ nkey: "{key}", permissions: {{',
            f"        publish: {{ allow: [{_quoted(publish)}] }},",
            f"        subscribe: {{ allow: [{_quoted(subscribe)}] }}",
            "    } },",
        ]
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


def write(
    directory: Path, subjects: Subjects, gateways: Sequence[str], subscribers: Sequence[str] = ()
) -> list[Path]:
    """`DIR/auth.conf` and `DIR/<principal>.nk` for every principal; the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    users, written = [], []
    apps = check_subscribers(subscribers)
    for principal in principals(subjects, check_gateways(gateways), apps):
        path = directory / f"{principal.name}.nk"
        users.append((principal, public_key(seed_of(path))))
        written.append(path)
    conf = directory / "auth.conf"
    conf.write_text(render(users))
    return [conf, *written]


def markdown(subjects: Subjects) -> str:
    """The principals as `docs/kubernetes.md` shows them (one gateway, `<id>`; one
    subscriber application, `<app>`)."""
    rows = ["| principal | used by | publish | subscribe |", "|---|---|---|---|"]
    for principal in principals(subjects, ["<id>"], ["<app>"]):
        publish, subscribe = grants_of(principal, f"{INBOX}.{INBOX_PLACEHOLDER}.>")
        rows.append(
            f"| `{principal.name}` | {principal.does} | "
            + ", ".join(f"`{s}`" for s in publish)
            + " | "
            + ", ".join(f"`{s}`" for s in subscribe)
            + " |"
        )
    return "\n".join(rows) + "\n"


def rewrite_doc(path: Path, subjects: Subjects) -> bool:
    """Put the generated table between a doc's principals markers; whether it changed."""
    return rewrite_block(path, "principals", markdown(subjects))
