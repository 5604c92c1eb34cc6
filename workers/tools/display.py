"""What an operator's terminal is shown of data that came from nodes and gateways: never
a control character (an escape sequence could rewrite the screen or hide a line) and,
where rich renders it, never markup (`[bold]`, `[link=…]`) the data brought along."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: object) -> str:
    """`text` with every control character shown as its escape (`\\x1b`, `\\n`). Pure."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), str(text))


def plain(text: object) -> str:
    """`printable(text)`, and safe inside rich markup: its brackets are escaped. Pure."""
    from rich.markup import escape

    return escape(printable(text))
